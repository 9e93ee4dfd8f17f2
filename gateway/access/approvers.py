"""Who is answering an approval, and whether they may: the approvals API's side of identity.

An approver is whoever the chat routes would let in (access/auth.py `Authenticator.identify`), or a
holder of one of `approvers.api_keys`: people who answer through the API but never chat, in any
auth mode (`none` included: how the demo's supervisor signs in). `ApproverIdentity` is the chat
identity plus how it authenticated, which the audit trail records.

Whether they may answer one call is `may_decide`: without approvers on the rule or tool
(`AskSpec` None) only the chatting user (the requester) may; with a group, its members, the
requester among them only with `self_approval` (four-eyes). `may_audit`: who may read decided
approvals. Both are pure: the config section in, a reason code or a bool out.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from aiohttp import web

from ..config.approvers import ApproversConfig, AskSpec, key_digests
from ..core.approval_notice import Approver
# The chat routes' claim matching and 401: an approver is matched and refused as a chat caller is.
from .auth import Authenticator, Identity, claim_holds, unauthorized

__all__ = ["APPROVER_KEY", "ApproverAuth", "ApproverIdentity", "DecideRefusal"]

AuthKind = Literal["none", "api_key", "jwt", "cookie", "approver_key"]
# Why `may_decide` refuses, as the approvals API's error code (403).
DecideRefusal = Literal["not_an_approver", "self_approval"]

APPROVER_KEY: AuthKind = "approver_key"


@dataclass(frozen=True)
class ApproverIdentity(Identity):
    """A chat `Identity` and how it authenticated (`auth`): what an approval's votes and the
    audit trail say of the person."""

    auth: AuthKind = "none"

    @property
    def approver(self) -> Approver:
        """This person as a vote, a notice and the audit trail name them."""
        return Approver(self.user_id, self.auth)


class ApproverAuth:
    """The approvals API's authentication and permissions, built from the `auth:` side (an
    `Authenticator`) and the `approvers:` section; rebuilt with them on a reload."""

    def __init__(self, authenticator: Authenticator, config: ApproversConfig, *, auth_mode: str) -> None:
        self._authenticator = authenticator
        self._config = config
        self._auth_mode = auth_mode
        # (SHA-256 digest, id) of each usable key: an empty key is none (key_digests), so no bearer matches it.
        self._keys = key_digests(config.api_keys)

    async def identify_approver(self, request: web.Request) -> ApproverIdentity:
        """Who the caller is, or raise HttpError(401) as the chat routes do. A bearer (or x-api-key)
        that is an approver key names its id; anything else is the chat routes' business."""
        credential = _bearer(request)
        if credential:
            user = self._approver_key(credential)
            if user is not None:
                return ApproverIdentity(user, auth=APPROVER_KEY)
            if self._auth_mode == "none":
                # The chat routes ignore credentials here; a supervisor's mistyped key must not
                # quietly make them the anonymous chatting user.
                raise unauthorized("unknown_api_key", "unknown approver key")
        identity = await self._authenticator.identify(request)
        kind: AuthKind = "cookie" if identity.via_cookie else _KINDS[self._auth_mode]
        return ApproverIdentity(identity.user_id, identity.claims, identity.via_cookie, kind)

    def _approver_key(self, credential: str) -> str | None:
        digest = hashlib.sha256(credential.encode()).hexdigest()
        found = None
        # Every key compared, in constant time: neither timing nor order tells which key came close.
        for key, user in self._keys:
            if hmac.compare_digest(key, digest):
                found = user
        return found

    def may_decide(self, identity: ApproverIdentity, spec: AskSpec | None, requester: str) -> DecideRefusal | None:
        """None when `identity` may answer a call `requester` asked with `spec` (None: the chatting
        user only), else why not. An approver key is never the chatting user: it cannot chat."""
        if spec is None:
            if identity.user_id == requester and identity.auth != APPROVER_KEY:
                return None
            return "not_an_approver"
        group = self._config.groups.get(spec.group)
        # A group a reload removed answers nobody: the call waits for its deadline.
        if group is None or not _member(identity, group.users, group.jwt_claims):
            return "not_an_approver"
        if identity.user_id == requester and not spec.self_approval:
            return "self_approval"
        return None

    def groups_of(self, identity: ApproverIdentity) -> list[str]:
        """The groups `identity` is a member of: whose approvals `may_decide` may let them answer
        (the approvals API lists only those, and the requester's own calls without a group)."""
        return [name for name, group in self._config.groups.items() if _member(identity, group.users, group.jwt_claims)]

    def may_audit(self, identity: ApproverIdentity) -> bool:
        """Whether `identity` may read decided approvals (the audit trail)."""
        auditors = self._config.auditors
        return _member(identity, auditors.users, auditors.jwt_claims)


_KINDS: Mapping[str, AuthKind] = {"none": "none", "api_key": "api_key", "jwt": "jwt"}


def _member(identity: Identity, users: list[str], claims: Mapping[str, list[str]]) -> bool:
    """Listed by user id, or carrying every claim with an allowed value (as an agent's access list
    matches); no claims match nobody, so an empty list is never everyone."""
    if identity.user_id in users:
        return True
    return bool(claims) and all(claim_holds(identity.claims.get(claim), allowed) for claim, allowed in claims.items())


def _bearer(request: web.Request) -> str:
    """The credential of `Authorization: Bearer` or `x-api-key`; approver keys are never read from
    cookies or URLs."""
    header = request.headers.get("Authorization", "")
    if header[:7].lower() == "bearer ":
        return header[7:].strip()
    return request.headers.get("x-api-key", "").strip()
