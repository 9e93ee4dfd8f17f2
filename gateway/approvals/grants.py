"""Standing grants: a person's approval given ahead of time, for the calls of one tool that match
(issue #41). Sans-IO: the grant as data, which grants could decide one call (`candidates`), and
whether one decides a call its rules ask about (`covers`).

A grant is given by whoever could have answered the calls it covers, never by anyone else:
- the chatting user (`authority` "user"), for their own calls in one chat: it covers only calls
  the chatting user would have been asked (a rule or tool that hands the call to approvers is not
  theirs to pass, nor is a rule's deny);
- an approver, for their group (`authority` the group's name), over one user's calls or every
  user's of the agent: it covers only calls asked of that same group with a quorum of one (a
  quorum of two wants two people, not one person's standing word), and never the requester's own
  call where the rule forbids self-approval, unless the granter is someone else.
A condition (CEL, config/rules.py's environment: `args`, `tool`, `agent`, `user`, `claims`) narrows
it; one that cannot be evaluated for a call does not match (fail closed: the call is asked). Uses
are counted in the store (approvals/store.py `GrantStore`), which reserves one before the decision
so that no use is spent twice.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ..config.agent import ToolPolicy
from ..config.approvers import ApproversConfig, AskSpec, Principal
from ..config.rules import compile_condition

__all__ = [
    "GRANT_RULE_PREFIX", "USER_AUTHORITY", "Grant", "asked_of", "candidates", "covers", "grant_rule", "granter_stands",
    "new_grant_id",
]

# The authority of a grant the chatting user gave; any other value names an approver group.
USER_AUTHORITY = "user"
# What a call's `rule` starts with when a grant decided it.
GRANT_RULE_PREFIX = "grant:"
# How an approver key signs in (access/approvers.py APPROVER_KEY): never a chatting user.
_APPROVER_KEY = "approver_key"


def new_grant_id() -> str:
    """An unguessable id: it is how a grant is revoked and how the audit trail names it."""
    return "gr-" + secrets.token_urlsafe(16)


def grant_rule(grant_id: str) -> str:
    """What a call decided by the grant says decided it (its `rule`, in the stream and the audit trail)."""
    return GRANT_RULE_PREFIX + grant_id


@dataclass(frozen=True)
class Grant:
    """One standing grant, as the store keeps it (JSON: `as_json`, `from_json`).

    `user_id`: the requester whose calls it covers (None: every user of the agent, an approver's
    grant only); `chat_id`: one chat of theirs (None: any; a chatting user's grant always names
    one); `expires_at` and `created_at`: wall-clock seconds; `uses_left`: None for no count;
    `granted_by`: {"user", "auth"} as the audit trail names people, and "principal" as groups
    compare them (config/approvers.py `Principal`)."""

    id: str
    agent: str
    tool: str
    user_id: str | None
    chat_id: str | None
    condition: str | None
    expires_at: float
    uses_left: int | None
    granted_by: Mapping[str, str]
    authority: str
    created_at: float

    def as_json(self) -> dict[str, Any]:
        record = asdict(self)
        record["granted_by"] = dict(self.granted_by)
        return record

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> Grant | None:
        """The grant a record holds, or None for one that is not (written by something else)."""
        try:
            grant = cls(**{name: record[name] for name in _FIELDS})
        except (KeyError, TypeError):
            return None
        uses = grant.uses_left
        if not isinstance(grant.id, str) or not isinstance(grant.granted_by, Mapping) or (
            uses is not None and (not isinstance(uses, int) or isinstance(uses, bool))
        ):
            return None
        return grant


_FIELDS = ("id", "agent", "tool", "user_id", "chat_id", "condition", "expires_at", "uses_left", "granted_by",
           "authority", "created_at")


def candidates(
    grants: Iterable[Grant], *, agent: str, tool: str, user: str, chat: str, args: Mapping[str, Any],
    claims: Mapping[str, Any], now: float,
) -> list[Grant]:
    """The grants that could decide one call of `tool` by `user` in `chat`: in scope, not expired,
    with a use left, their condition true (one that cannot be evaluated does not match), in the
    order given."""
    found = []
    for grant in grants:
        if grant.agent != agent or grant.tool != tool or grant.expires_at <= now:
            continue
        if grant.user_id not in (None, user) or grant.chat_id not in (None, chat):
            continue
        if grant.uses_left is not None and grant.uses_left <= 0:
            continue
        if grant.condition is not None and not _holds(grant.condition, args, tool, agent, user, claims):
            continue
        found.append(grant)
    return found


def _holds(text: str, args: Mapping[str, Any], tool: str, agent: str, user: str, claims: Mapping[str, Any]) -> bool:
    try:
        condition = compile_condition(text)
    except ValueError:
        return False  # a condition a later version cannot read: asked, as without the grant
    return condition.holds(args=args, tool=tool, agent=agent, user=user, claims=claims) is True


def covers(grant: Grant, asks: AskSpec | None, requester: str) -> bool:
    """Whether `grant` decides a call of `requester` that its rules ask of `asks` (None: the
    chatting user), as the person asked could have (the module's docstring says who)."""
    if grant.authority == USER_AUTHORITY:
        return asks is None and grant.user_id == requester
    if asks is None or asks.group != grant.authority or asks.quorum != 1:
        return False
    return asks.self_approval or not _is_requester(grant.granted_by, requester)


def _is_requester(granted_by: Mapping[str, str], requester: str) -> bool:
    """Whether the granter is the requester (as access/approvers.py `may_decide` compares them):
    an approver key never is; anyone else is the chatting user of the same id."""
    return granted_by.get("auth") != _APPROVER_KEY and granted_by.get("user") == requester


def asked_of(policy: ToolPolicy, authority: str) -> bool:
    """Whether some call of a tool with `policy` could be asked of `authority` (the chatting user,
    or a group): a grant of anyone else could never decide one, and is refused when asked for. A
    browser tool's calls are never a grant's: approved, they are handed to the browser, which a
    rule's decision (and so a grant's) cannot do."""
    if policy.runs_in == "browser":
        return False
    if authority != USER_AUTHORITY:
        return authority in policy.groups()
    asks_user = policy.approval and policy.approvers is None
    return asks_user or any(rule.decide == "ask" and rule.approvers is None for rule in policy.rules)


def granter_stands(grant: Grant, approvers: ApproversConfig) -> bool:
    """Whether a group's grant still speaks for its group, as the config is now: its granter still
    listed in it (or let in by its claims, which a reload can only narrow). A reload that takes
    someone out of a group stops their grants as it stops their votes counting (access/approvers.py
    `counts`). A chatting user's grant always stands."""
    if grant.authority == USER_AUTHORITY:
        return True
    group = approvers.groups.get(grant.authority)
    who = Principal.parse(str(grant.granted_by.get("principal", "")))
    if group is None or who is None:
        return False
    return who in approvers.group_members(grant.authority) or (bool(group.jwt_claims) and who.source == "jwt")
