"""Who may answer an approval besides the chatting user, and who may read decided ones: the
top-level `approvers:` section (its own API keys, its groups, its auditors), and `AskSpec`, who
answers one asked call (config/agent.py `ToolPolicy.asks`).

The rules across sections (a group a tool names exists, claims need auth.mode jwt, an API key id is
a chat key's or an approver key's, never both) are GatewayConfig's (config/schema.py);
access/approvers.py carries the section out per request.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Annotated

from pydantic import Field, StringConstraints, model_validator

from .auth import ApiKey
from .values import ClaimValues, Section

__all__ = ["GROUP_NAME_PATTERN", "MAX_QUORUM", "ApproverGroup", "ApproversConfig", "AskSpec", "Auditors", "key_digests"]

GROUP_NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"
# Distinct approvers one call may need; more is a committee, not an approval.
MAX_QUORUM = 10

# A user id as a credential yields it: an API key id, or a JWT's user_claim value.
UserId = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=128)]


@dataclass(frozen=True)
class AskSpec:
    """Who answers one asked call: a member of `group`; the requester too only with
    `self_approval`; `quorum` distinct members must approve (one deny denies)."""

    group: str
    self_approval: bool = True
    quorum: int = 1


class ApproverGroup(Section):
    """People who may answer the calls a rule or tool hands to this group: anyone listed in
    `users`, or anyone whose JWT carries every claim of `jwt_claims` with an allowed value (as an
    agent's access list matches). Empty claims match nobody: a group is never everyone."""

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
    auditors: Auditors = Auditors()

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
