"""What a reload may not loosen: one table of the settings that decide who gets in, each with the
direction a reload may move it, and the judgement of a new configuration against the running one.

A reload applies at once to new requests, so a file cut short or edited carelessly must never open
the gateway wider than it runs (DESIGN.md decision 11). `RULES` holds every setting that narrows
who gets in, or which tool calls wait for a person, with its direction:

- must stay equal: any other value lets other callers in (another key, another claim as the user id);
- may only narrow: after the reload, fewer callers get in (a key removed, an audience set where none was);
- may only grow: after the reload, more calls are gated (approval turned on).

Moving one the other way takes a restart. `UNJUDGED` holds the other settings of the same sections,
each with why it does not decide who gets in; tests/unit/test_reload.py fails on a field of those
sections that is in neither, and proves each rule refuses a loosening and accepts a tightening.

Who may answer an approval is access too: the approver keys, groups and auditors, and each tool's
and ask rule's `approvers`, `self_approval` and `quorum` may only narrow.

The auth settings are judged once, each while it is in force (the API keys in mode `api_key`, the
JWT settings in mode `jwt`; from mode `none`, which lets every caller in, anything narrows); the
`approvers:` section (who may answer approvals, and read decided ones) once, in every mode. An
agent's settings (its `access:` and its tools' gates) are judged for every agent that runs against
the agent that would take its place: the agent of the same name (its routes), the agent serving
the same ADK app (the plugin's policy is keyed by app: a renamed agent keeps its gates), and the
agent `/api/chat` would move to when that one is new (a single-agent file's agent is named after its
app, so a cut `upstream:` is a new agent on the same route). Two agents never share an app (config/schema.py).
An agent removed with its app is not judged: its routes and its app's policy are gone, and the
plugin refuses that app's gated calls.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .agent import AgentConfig
from .auth import AuthConfig
from .decision_loosening import (
    Finding, approver_keys_added, asks_widened, auditors_widened, groups_widened, tool_key, tool_names, tool_rules_loosened,
)
from .schema import GatewayConfig

__all__ = ["RULES", "UNJUDGED", "Direction", "Rule", "loosened"]


class Direction(enum.Enum):
    EQUAL = "must stay equal"
    NARROW = "may only narrow"
    GROW = "may only grow"


def _always(auth: AuthConfig) -> bool:
    return True


def _authenticating(auth: AuthConfig) -> bool:
    return auth.mode != "none"


def _api_keys(auth: AuthConfig) -> bool:
    return auth.mode == "api_key"


def _jwt(auth: AuthConfig) -> bool:
    return auth.mode == "jwt" and auth.jwt is not None


@dataclass(frozen=True)
class Rule:
    """One setting: its key path, its direction and why, how to read it and how to judge a change.

    `read` takes the `AuthConfig` (a path under `auth.`), the `ApproversConfig` (under `approvers.`)
    or the `AgentConfig` (under `agents.<name>.`);
    `judge(running, new)` lists what the change would loosen. `applies` says when an auth setting is
    in force; `covers` names the fields the rule judges as part of its own (an API key's id and key).
    """

    path: str
    direction: Direction
    why: str
    read: Callable[[Any], Any]
    judge: Callable[[Any, Any], list[Finding]]
    applies: Callable[[AuthConfig], bool] = _always
    covers: tuple[str, ...] = field(default=())

    @property
    def agent(self) -> bool:
        return self.path.startswith("agents.")

    @property
    def approvers(self) -> bool:
        return self.path.startswith("approvers.")


# ---- how values compare ------------------------------------------------------------------------


def _equal(key: str, what: str) -> Callable[[Any, Any], list[Finding]]:
    return lambda was, now: [] if now == was else [(key, what)]


def _subset(key: str, what: str) -> Callable[[Any, Any], list[Finding]]:
    return lambda was, now: [] if set(now) <= set(was) else [(key, f"{what} ({', '.join(sorted(set(now) - set(was)))})")]


def _not_above(key: str, what: str) -> Callable[[Any, Any], list[Finding]]:
    return lambda was, now: [] if now <= was else [(key, f"{what} (running: {was:g} s)")]


def _set_once(key: str, what: str) -> Callable[[Any, Any], list[Finding]]:
    """Unset means any value: a reload may set it, never drop or change it."""
    return lambda was, now: [] if was is None or now == was else [(key, f"{what} (running: {was})")]


def _off_only(key: str, what: str) -> Callable[[Any, Any], list[Finding]]:
    return lambda was, now: [(key, what)] if now and not was else []


def _claims(key: str, what: str) -> Callable[[Any, Any], list[Finding]]:
    """Claims and their allowed values: each claim stays, with no value it did not allow; claims may be added."""

    def judge(was: dict[str, list[str]] | None, now: dict[str, list[str]] | None) -> list[Finding]:
        now = now or {}
        return [(f"{key}.{claim}", what) for claim, allowed in (was or {}).items()
                if claim not in now or set(now[claim]) - set(allowed)]

    return judge


def _mode(was: str, now: str) -> list[Finding]:
    if was == "none" or now == was:
        return []
    if now == "none":
        return [("auth.mode", f"turn authentication off (running: {was})")]
    return [("auth.mode", f"change how callers authenticate (running: {was})")]


def _keys(auth: AuthConfig) -> frozenset[tuple[str, str]]:
    """The usable API keys as (digest, id): a key, however written, and the user it acts as."""
    pairs = set()
    for entry in auth.api_keys:
        if entry.key is not None and entry.key.get_secret_value():
            pairs.add((hashlib.sha256(entry.key.get_secret_value().encode()).hexdigest(), entry.id))
        elif entry.sha256:
            pairs.add((entry.sha256.lower(), entry.id))
    return frozenset(pairs)


def _keys_added(was: frozenset[tuple[str, str]], now: frozenset[tuple[str, str]]) -> list[Finding]:
    return [(f"auth.api_keys[{user}]", "let another key in (a key added, or given to another id)")
            for user in sorted({user for _, user in now - was})]


def _access_keys(was: list[str] | None, now: list[str] | None) -> list[Finding]:
    if was is None or (now is not None and set(now) <= set(was)):
        return []
    return [("access.api_keys", "let more keys use this agent")]


def _approval(was: AgentConfig, now: AgentConfig) -> list[Finding]:
    return [(tool_key(name), "stop requiring approval") for name in tool_names(was, now)
            if was.tool_policy(name).approval and not now.tool_policy(name).approval]


def _browser(was: AgentConfig, now: AgentConfig) -> list[Finding]:
    # Every call of a browser tool waits for the browser; rules alone (which gate a tool) let calls
    # no rule decides run unasked, so only approval keeps them all waiting on the server.
    return [(tool_key(name), "stop gating this tool") for name in tool_names(was, now)
            if was.tool_policy(name).runs_in == "browser"
            and now.tool_policy(name).runs_in != "browser" and not now.tool_policy(name).approval]


def _jwt_value(name: str) -> Callable[[AuthConfig], Any]:
    return lambda auth: getattr(auth.jwt, name)


# ---- the table -----------------------------------------------------------------------------------

_KEY_CHANGED = "change the key tokens are checked with"

RULES: tuple[Rule, ...] = (
    Rule("auth.mode", Direction.NARROW,
         "from none any mode narrows; off, or to the other mode, lets callers in on other grounds",
         lambda auth: auth.mode, _mode),
    Rule("auth.api_keys", Direction.NARROW,
         "a key added, or an id given to another key, lets its holder in as that user; a key removed shuts one out",
         _keys, _keys_added, _api_keys, covers=("auth.api_keys[].id", "auth.api_keys[].key", "auth.api_keys[].sha256")),
    Rule("auth.jwt.algorithms", Direction.NARROW, "another algorithm accepts tokens signed another way",
         _jwt_value("algorithms"), _subset("auth.jwt.algorithms", "accept another signing algorithm"), _jwt),
    Rule("auth.jwt.secret", Direction.EQUAL, "whoever holds another secret can sign tokens",
         lambda auth: auth.jwt.secret.get_secret_value() if auth.jwt.secret is not None else None,
         _equal("auth.jwt.secret", _KEY_CHANGED), lambda auth: _jwt(auth) and "HS256" in auth.jwt.algorithms),
    Rule("auth.jwt.public_key_file", Direction.EQUAL,
         "another key (judged by the key the file holds, not its path) accepts another signer's tokens",
         lambda auth: auth.jwt.public_key_pem, _equal("auth.jwt.public_key_file", _KEY_CHANGED),
         lambda auth: _jwt(auth) and auth.jwt.public_key_file is not None),
    Rule("auth.jwt.jwks_url", Direction.EQUAL, "another document publishes another signer's keys",
         lambda auth: str(auth.jwt.jwks_url) if auth.jwt.jwks_url is not None else None,
         _equal("auth.jwt.jwks_url", "change where the identity provider's keys come from"),
         lambda auth: _jwt(auth) and auth.jwt.jwks_url is not None),
    Rule("auth.jwt.discovery", Direction.EQUAL, "the keys would come from somewhere else",
         _jwt_value("discovery"), _equal("auth.jwt.discovery", "change where the identity provider's keys come from"),
         lambda auth: _jwt(auth) and auth.jwt.discovery),
    Rule("auth.jwt.jwks_hosts", Direction.NARROW, "another host may publish keys that sign tokens the gateway accepts",
         _jwt_value("jwks_hosts"), _subset("auth.jwt.jwks_hosts", "take keys from another host"), _jwt),
    Rule("auth.jwt.jwks_allow_http", Direction.NARROW, "keys fetched over plain http can be replaced on the way",
         _jwt_value("jwks_allow_http"), _off_only("auth.jwt.jwks_allow_http", "fetch keys over plain http"), _jwt),
    Rule("auth.jwt.audience", Direction.NARROW, "unset accepts any audience: tokens issued for other apps",
         _jwt_value("audience"), _set_once("auth.jwt.audience", "accept tokens for another audience"), _jwt),
    Rule("auth.jwt.issuer", Direction.NARROW, "unset accepts any issuer: tokens from other providers",
         _jwt_value("issuer"), _set_once("auth.jwt.issuer", "accept tokens from another issuer"), _jwt),
    Rule("auth.jwt.user_claim", Direction.EQUAL, "another claim makes tokens act as other users, with their chats",
         _jwt_value("user_claim"), _equal("auth.jwt.user_claim", "take the user id from another claim"), _jwt),
    Rule("auth.jwt.required_claims", Direction.NARROW, "a claim dropped, or another value allowed, lets more tokens in",
         _jwt_value("required_claims"), _claims("auth.jwt.required_claims", "accept tokens it refuses now"), _jwt),
    Rule("auth.jwt.leeway", Direction.NARROW, "more leeway accepts expired tokens for longer",
         _jwt_value("leeway"), _not_above("auth.jwt.leeway", "accept expired tokens for longer"), _jwt),
    Rule("auth.allowed_origins", Direction.NARROW, "another origin (or \"*\") lets other sites' pages call with the user's credential",
         lambda auth: ["*"] if "*" in auth.allowed_origins else auth.allowed_origins,
         lambda was, now: [] if "*" in was else _subset("auth.allowed_origins", "allow another origin")(was, now)),
    Rule("auth.cookie_name", Direction.NARROW,
         "a cookie is sent by the browser on its own, also on other sites' requests: one may be dropped, not added or renamed",
         lambda auth: auth.cookie_name,
         lambda was, now: [] if now is None or now == was else [("auth.cookie_name", "read the credential from another cookie")],
         _authenticating),
    Rule("auth.ws_ticket_ttl", Direction.NARROW, "a longer life lets a leaked ticket open a socket later",
         lambda auth: auth.ws_ticket_ttl, _not_above("auth.ws_ticket_ttl", "let a ticket live longer"), _authenticating),
    Rule("auth.allow_token_in_url", Direction.NARROW, "a credential in a URL is kept by proxies' logs and browsers' histories",
         lambda auth: auth.allow_token_in_url, _off_only("auth.allow_token_in_url", "start reading credentials from URLs"),
         _authenticating),
    Rule("agents.<name>.access.api_keys", Direction.NARROW, "unset lets every key in; another id lets its key in",
         lambda agent: agent.access.api_keys, _access_keys),
    Rule("agents.<name>.access.jwt_claims", Direction.NARROW, "a claim dropped, or another value allowed, lets more tokens in",
         lambda agent: agent.access.jwt_claims, _claims("access.jwt_claims", "widen who may use this agent")),
    Rule("agents.<name>.tools.<tool>.approval", Direction.GROW,
         "a truncated tools: section must never let payments run without approval (the tool left out, or `default`)",
         lambda agent: agent, _approval),
    Rule("agents.<name>.tools.<tool>.runs_in", Direction.GROW,
         "a browser tool moved to the server without approval would run unasked",
         lambda agent: agent, _browser),
    Rule("agents.<name>.tools.<tool>.rules", Direction.GROW,
         "rules decide which calls run unasked or are refused: kept in their order; deny rules may be added (not "
         "before a deny rule that stays), approve rules removed (not before one that stays, nor with approval off)",
         lambda agent: agent, tool_rules_loosened),
    Rule("agents.<name>.tools.<tool>.approvers", Direction.NARROW,
         "who answers an asked call (the tool's and each ask rule's approvers, self_approval, quorum): dropping the "
         "group lets the chatting user answer, a group where the chatting user answered or another group other people, "
         "self_approval on the requester, a lower quorum fewer",
         lambda agent: agent, asks_widened, covers=("agents.<name>.tools.<tool>.self_approval", "agents.<name>.tools.<tool>.quorum")),
    Rule("approvers.api_keys", Direction.NARROW,
         "a key added, or an id given to another key, lets its holder answer approvals as that person",
         lambda approvers: approvers, approver_keys_added,
         covers=("approvers.api_keys[].id", "approvers.api_keys[].key", "approvers.api_keys[].sha256")),
    Rule("approvers.groups", Direction.NARROW,
         "a user added (or an id read from another source), claims where none were, or a claim dropped or widened lets "
         "more people answer the group's approvals",
         lambda approvers: approvers, groups_widened,
         covers=("approvers.groups.<group>.users", "approvers.groups.<group>.jwt_claims")),
    Rule("approvers.auditors", Direction.NARROW,
         "a user added, claims where none were, or a claim dropped or widened lets more people read decided approvals",
         lambda approvers: approvers, auditors_widened, covers=("approvers.auditors.users", "approvers.auditors.jwt_claims")),
)

UNJUDGED: dict[str, str] = {
    "auth.anonymous_user": "only in mode none, which lets every caller in already (and a reload cannot turn it on)",
    "auth.jwt.jwks_refresh": "when the same provider's keys are fetched, not which are trusted",
    "auth.jwt.jwks_min_refetch": "when the same provider's keys are fetched, not which are trusted",
    "auth.jwt.jwks_timeout": "how long one fetch of the same provider's keys may take",
    "agents.<name>.upstream": "where the agent runs; agents are matched by name, by ADK app and by /api/chat instead; "
        "its approvals (each mode's one way: confirm on sse, hold on live) both gate every call the policy gates",
    "agents.<name>.limits": "how much a caller may do, not who may",
    "agents.<name>.tools.<tool>.timeout": "how long a gated call waits; it never runs unasked",
    "agents.<name>.tools.<tool>.on_timeout": "what a timeout shows; the tool does not run either way",
    "agents.<name>.tools.<tool>.hint": "text shown to the person deciding",
    "agents.<name>.tools.<tool>.non_blocking": "whether the conversation goes on while a gated call waits",
}


# ---- the judgement -------------------------------------------------------------------------------


def loosened(running: GatewayConfig, new: GatewayConfig, *, single_agent: bool = False) -> list[str]:
    """Every way `new` would let in what `running` keeps out, one line each; empty when none.

    `single_agent`: the new file has no `agents:` section, so its one agent's keys are named as the
    file has them (`tools.process_payment`, as start names them)."""
    problems = []
    for rule in RULES:
        if rule.approvers:
            # Approver keys and groups count in every auth mode (`none` included).
            problems += [_line(key, what) for key, what in rule.judge(rule.read(running.approvers), rule.read(new.approvers))]
            continue
        if rule.agent or not rule.applies(running.auth):
            continue
        if not rule.applies(new.auth) and new.auth.mode != running.auth.mode:
            continue  # another mode altogether: `auth.mode` says so
        now = rule.read(new.auth) if rule.applies(new.auth) else None
        problems += [_line(key, what) for key, what in rule.judge(rule.read(running.auth), now)]
    for was_name, now_name, context in _successors(running, new):
        where = "" if single_agent else f"agents.{now_name}."
        was, now = running.agents[was_name], new.agents[now_name]
        for rule in RULES:
            if rule.agent:
                problems += [_line(where + key, what, context) for key, what in rule.judge(rule.read(was), rule.read(now))]
    return problems


def _line(key: str, what: str, context: str = "") -> str:
    return f"{key}: a reload cannot {what}{context}; restart the gateway to change that"


def _successors(running: GatewayConfig, new: GatewayConfig) -> Iterator[tuple[str, str, str]]:
    """(running agent, the new agent in its place, how the two are linked): by name, by ADK app, by `/api/chat`."""
    seen = set()
    for name in running.agents:
        if name in new.agents:
            seen.add((name, name))
            yield name, name, ""
    for name, agent in running.agents.items():
        app = agent.upstream.app_name
        now = new.agent_for_app(app)
        if now is not None and (name, now) not in seen:
            seen.add((name, now))
            yield name, now, f" (ADK app {app}, served by the agent {name} until now)"
    was, now = running.default, new.default
    moved_to_new = now not in running.agents and running.agent_for_app(new.agents[now].upstream.app_name) is None
    if moved_to_new and (was, now) not in seen:
        yield was, now, f" (/api/chat, served by the agent {was} until now)"
