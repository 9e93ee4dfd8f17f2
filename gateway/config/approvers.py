"""Who may answer an approval besides the chatting user, and who may read decided ones: the
top-level `approvers:` section (its own API keys, its groups, its auditors), `AskSpec`, who
answers one asked call (config/agent.py `ToolPolicy.asks`), and `Principal`, one person as a
group names them.

An approver key, an `auth.api_keys` chat key and an identity provider's (JWT) user are three
sources of identity, each with its own ids: a group member is written with its source
(`approver_key:supervisor`, `api_key:web`, `jwt:alice`), or bare where only one source can hold
the id; a bare id that could be an approver key's and a JWT user's is refused at load.

The rules across sections (a group a tool names exists, claims need auth.mode jwt, an API key id is
a chat key's or an approver key's, never both) are GatewayConfig's (config/schema.py);
access/approvers.py carries the section out per request.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

from pydantic import BeforeValidator, Field, PrivateAttr, StringConstraints, model_validator

from .auth import ApiKey
from .values import ClaimValues, Section

__all__ = ["GROUP_NAME_PATTERN", "MAX_QUORUM", "ApproverGroup", "ApproversConfig", "AskSpec", "Auditors", "Principal",
           "Source", "key_digests", "member"]

GROUP_NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"
# Distinct approvers one call may need; more is a committee, not an approval.
MAX_QUORUM = 10



def _written_together(value: Any) -> Any:
    # YAML reads `- approver_key: supervisor` (a space after the colon) as a mapping.
    if isinstance(value, dict) and len(value) == 1:
        [(source, id_)] = value.items()
        raise ValueError(f"write {source}:{id_} without a space after the colon (YAML reads it as a mapping), or quote it")
    return value


# A member as a group lists it: `<source>:<id>`, or a bare id (see `member`). 128 for the id, and its source.
UserId = Annotated[str, BeforeValidator(_written_together), StringConstraints(strip_whitespace=True, min_length=1, max_length=160)]

# Where an identity comes from: an `approvers.api_keys` key, an `auth.api_keys` key, a JWT's user
# claim, or auth.mode none (the anonymous user). The chat side holds one of the last three, by
# auth.mode: `approver_key` is never a chatting user.
Source = Literal["approver_key", "api_key", "jwt", "none"]
# The sources a member may be written with; `none` has one user, written bare.
_PREFIXES = ("approver_key", "api_key", "jwt")


@dataclass(frozen=True, order=True, slots=True)
class Principal:
    """One person as the approvals API compares them: the same id from two sources is two people."""

    source: Source
    id: str

    def __str__(self) -> str:
        return f"{self.source}:{self.id}"

    @classmethod
    def parse(cls, text: str) -> Principal | None:
        """The principal `str()` wrote (a vote's voter), or None for anything else."""
        source, _, id_ = text.partition(":")
        return cls(source, id_) if source in get_args(Source) and id_ else None  # type: ignore[arg-type]


def member(entry: str, *, chat: Source, approver_keys: Collection[str], chat_keys: Collection[str] = ()) -> Principal:
    """The principal a group's member entry names, under a config whose chat users come from
    `chat` (its auth.mode); raise ValueError, with how to write it, when it names nobody for sure
    or could name two people. `chat_keys`: the ids of auth.api_keys."""
    source, colon, id_ = entry.partition(":")
    if colon and source in _PREFIXES:
        if not id_:
            raise ValueError(f"{entry}: an id follows {source}:")
        if source == "approver_key" and id_ not in approver_keys:
            raise ValueError(f"{entry}: approvers.api_keys has no id {id_}")
        if source != "approver_key" and source != chat:
            whose = "an auth.api_keys key's holder" if source == "api_key" else "an identity provider's user"
            raise ValueError(f"{entry} names {whose}, which needs auth.mode {source} (it is {chat})")
        if source == "api_key" and id_ not in chat_keys:
            raise ValueError(f"{entry}: auth.api_keys has no id {id_}")
        return Principal(source, id_)  # type: ignore[arg-type]
    if entry in approver_keys:
        if chat == "jwt":
            # Any IdP user may carry that id: the group would let them answer as the key's holder.
            raise ValueError(f"{entry} is an approver key's id (approvers.api_keys) and could be an identity provider's "
                             f"user too: write approver_key:{entry} for the key's holder, or jwt:{entry} for the IdP user")
        # Modes api_key and none cannot give a chatting user that id (config/schema.py refuses both).
        return Principal("approver_key", entry)
    return Principal(chat, entry)


@dataclass(frozen=True)
class AskSpec:
    """Who answers one asked call: a member of `group`; the requester too only with
    `self_approval`; `quorum` distinct members must approve (one deny denies)."""

    group: str
    self_approval: bool = True
    quorum: int = 1


class ApproverGroup(Section):
    """People who may answer the calls a rule or tool hands to this group: anyone listed in
    `users` (each with its source, `member`), or anyone whose JWT carries every claim of
    `jwt_claims` with an allowed value (as an agent's access list matches). Empty claims match
    nobody: a group is never everyone."""

    users: list[UserId] = Field(default_factory=list)
    jwt_claims: ClaimValues = Field(default_factory=dict)

    @model_validator(mode="after")
    def _names_someone(self) -> ApproverGroup:
        if not self.users and not self.jwt_claims:
            raise ValueError("a group names at least one user or one JWT claim")
        if empty := sorted(claim for claim, values in self.jwt_claims.items() if not values):
            raise ValueError(f"jwt_claims: {', '.join(empty)} allows no value (leave the claim out)")
        return self


class Auditors(Section):
    """Who may read decided approvals (the audit trail) through the approvals API; empty: nobody."""

    users: list[UserId] = Field(default_factory=list)
    jwt_claims: ClaimValues = Field(default_factory=dict)


class ApproversConfig(Section):
    # Credentials for people who answer through the approvals API but do not chat (any auth.mode,
    # `none` included). Same shape as auth.api_keys; an entry with an empty key (an unset
    # `${VAR:-}`) is no key at all.
    api_keys: list[ApiKey] = Field(default_factory=list)
    groups: dict[str, ApproverGroup] = Field(default_factory=dict)
    auditors: Auditors = Field(default_factory=Auditors)
    # Where the chatting users of this config come from (its auth.mode), which bare member ids name:
    # set by GatewayConfig, which holds both sections.
    _chat: Source = PrivateAttr("none")
    _chat_keys: frozenset[str] = PrivateAttr(frozenset())

    def members(self, users: list[str]) -> frozenset[Principal]:
        """The distinct principals a list of members names (a group's or the auditors' `users`)."""
        keys = {key.id for key in self.api_keys}
        return frozenset(member(entry, chat=self._chat, approver_keys=keys, chat_keys=self._chat_keys) for entry in users)

    def group_members(self, name: str) -> frozenset[Principal]:
        """The listed members of a group (none for a group not configured)."""
        group = self.groups.get(name)
        return self.members(group.users) if group is not None else frozenset()

    def bind(self, chat: Source, chat_keys: Collection[str]) -> list[str]:
        """Read bare member ids as this config's `auth` says (`chat`: its mode; `chat_keys`: the
        ids of auth.api_keys); the problems of the members, one line each."""
        self._chat, self._chat_keys = chat, frozenset(chat_keys)
        keys = {key.id for key in self.api_keys}
        lists = [(f"approvers.groups.{name}", group.users) for name, group in self.groups.items()]
        problems = []
        for where, users in [*lists, ("approvers.auditors", self.auditors.users)]:
            for entry in users:
                try:
                    member(entry, chat=chat, approver_keys=keys, chat_keys=self._chat_keys)
                except ValueError as exc:
                    problems.append(f"{where}.users: {exc}")
        return problems

    @model_validator(mode="after")
    def _well_formed(self) -> ApproversConfig:
        for name in self.groups:
            if not re.match(GROUP_NAME_PATTERN, name):
                raise ValueError(f"groups.{name}: a group name is 1-64 letters, digits, '_', '.' or '-'")
        for entry in self.api_keys:
            if entry.key is not None and entry.sha256 is not None:
                raise ValueError(f"api_keys[{entry.id}]: give key or sha256, not both")
        return self


def key_digests(keys: list[ApiKey]) -> list[tuple[str, str]]:
    """The usable keys of a list as (SHA-256 hex digest, id); an empty key is no key."""
    pairs = []
    for entry in keys:
        if entry.key is not None and entry.key.get_secret_value():
            pairs.append((hashlib.sha256(entry.key.get_secret_value().encode()).hexdigest(), entry.id))
        elif entry.sha256:
            pairs.append((entry.sha256.lower(), entry.id))
    return pairs
