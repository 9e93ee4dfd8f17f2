"""Who is answering an approval, and whether they may: the approvals API's side of identity.

An approver is whoever the chat routes would let in (access/auth.py `Authenticator.identify`), or a
holder of one of `approvers.api_keys`: people who answer through the API but never chat, in any
auth mode (`none` included: how the demo's supervisor signs in). `ApproverIdentity` is the chat
identity plus how it authenticated, which the audit trail records, and where its id comes from:
its `principal` (config/approvers.py), what every comparison of people uses, so that an IdP user
named like an approver key is not that key's holder.

Whether they may answer one call is `may_decide`: without approvers on the rule or tool
(`AskSpec` None) only the chatting user (the requester) may; with a group, its members, the
requester among them only with `self_approval` (four-eyes). `counts`: whether a vote given earlier
still counts towards a quorum (its voter may still decide, as the config is now). `may_audit`: who
may read decided approvals. All pure: the config section in, a reason code or a bool out.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from aiohttp import web

from ..config.approvers import ApproversConfig, AskSpec, Principal, Source, key_digests
from ..approvals.notice import Approver
# The chat routes' claim matching and 401: an approver is matched and refused as a chat caller is.
from .auth import Authenticator, Identity, claim_holds, unauthorized

__all__ = ["APPROVER_KEY", "EMAIL", "SLACK", "ApproverAuth", "ApproverIdentity", "DecideRefusal"]

# `slack`: a Slack user `notifications.slack.users` maps to an approver, pressing a button (edge/slack.py);
# `email`: a mailed decision link signed for that approver (edge/decision_page.py).
AuthKind = Literal["none", "api_key", "jwt", "cookie", "approver_key", "slack", "email"]
# Why `may_decide` refuses, as the approvals API's error code (403).
DecideRefusal = Literal["not_an_approver", "self_approval"]

APPROVER_KEY: AuthKind = "approver_key"
SLACK: AuthKind = "slack"
EMAIL: AuthKind = "email"


@dataclass(frozen=True)
class ApproverIdentity(Identity):
    """A chat `Identity`, how it authenticated (`auth`: what the audit trail says of the person)
    and where its id comes from (`source`: an approver key, or the chat side's auth.mode)."""

    auth: AuthKind = "none"
    source: Source = "none"

    @property
    def approver(self) -> Approver:
        """This person as a notice and the audit trail name them."""
        return Approver(self.user_id, self.auth)

    @property
    def principal(self) -> Principal:
        """This person as groups, votes and the four-eyes check compare them."""
        return Principal(self.source, self.user_id)


class ApproverAuth:
    """The approvals API's authentication and permissions, built from the `auth:` side (an
    `Authenticator`) and the `approvers:` section; rebuilt with them on a reload."""

    def __init__(self, authenticator: Authenticator, config: ApproversConfig, *, auth_mode: str) -> None:
        self._authenticator = authenticator
        self._config = config
        self._auth_mode = auth_mode
        # Where chatting users' ids come from: the requester of every call is one of them.
        self._chat: Source = _KINDS[auth_mode]
        # (SHA-256 digest, id) of each usable key: an empty key is none (key_digests), so no bearer matches it.
        self._keys = key_digests(config.api_keys)
        # Who each group and the auditors list, as principals: read once per config, not per approval listed.
        self._listed = {name: config.group_members(name) for name in config.groups}
        self._auditors = config.members(config.auditors.users)

    async def identify_approver(self, request: web.Request) -> ApproverIdentity:
        """Who the caller is, or raise HttpError(401) as the chat routes do. A bearer (or x-api-key)
        that is an approver key names its id; anything else is the chat routes' business."""
        credential = _bearer(request)
        if credential:
            user = self._approver_key(credential)
            if user is not None:
                return ApproverIdentity(user, auth=APPROVER_KEY, source="approver_key")
            if self._auth_mode == "none":
                # The chat routes ignore credentials here; a supervisor's mistyped key must not
                # quietly make them the anonymous chatting user.
                raise unauthorized("unknown_api_key", "unknown approver key")
        identity = await self._authenticator.identify(request)
        kind: AuthKind = "cookie" if identity.via_cookie else _KINDS[self._auth_mode]
        return ApproverIdentity(identity.user_id, identity.claims, identity.via_cookie, kind, self._chat)

    def by_link(self, entry: str) -> ApproverIdentity | None:
        """The approver a mailed link names (`entry`: a member as groups list them, or a principal
        as `str(Principal)` writes it), authenticated by the link; None for an entry naming nobody."""
        try:
            principal = Principal.parse(entry) or next(iter(self._config.members([entry])))
        except ValueError:
            return None
        return ApproverIdentity(principal.id, auth=EMAIL, source=principal.source)

    def _approver_key(self, credential: str) -> str | None:
        digest = hashlib.sha256(credential.encode()).hexdigest()
        found = None
        # Every key compared, in constant time: neither timing nor order tells which key came close.
        for key, user in self._keys:
            if hmac.compare_digest(key, digest):
                found = user
        return found

    def may_decide(self, identity: ApproverIdentity, spec: AskSpec | None, requester: str) -> DecideRefusal | None:
        """None when `identity` may answer a call `requester` (a chatting user's id) asked with
        `spec` (None: the chatting user only), else why not. An approver key is never the chatting
        user, whatever its id: it cannot chat."""
        me = identity.principal == self.requester(requester)
        if spec is None:
            return None if me else "not_an_approver"
        group = self._config.groups.get(spec.group)
        # A group a reload removed answers nobody: the call waits for its deadline.
        if group is None or not self._member(identity, self._listed[spec.group], group.jwt_claims):
            return "not_an_approver"
        if me and not spec.self_approval:
            return "self_approval"
        return None

    def requester(self, user_id: str) -> Principal:
        """The chatting user `user_id` (a call's requester) as a principal."""
        return Principal(self._chat, user_id)

    def counts(self, voter: str, spec: AskSpec | None, requester: str) -> bool:
        """Whether a vote given earlier by `voter` (a `Principal` as the vote keeps it) still counts:
        its voter listed in the call's group as the config is now (a reload may have removed them),
        or let in by the group's claims, which a reload can only narrow and which the vote did not
        keep. A vote of no principal (written by an older replica) counts for nothing."""
        who = Principal.parse(voter)
        if who is None:
            return False
        if spec is None:
            return who == self.requester(requester)
        group = self._config.groups.get(spec.group)
        if group is None or (who == self.requester(requester) and not spec.self_approval):
            return False
        listed = who in self._listed[spec.group]
        return listed or (bool(group.jwt_claims) and who.source == "jwt")

    def groups_of(self, identity: ApproverIdentity) -> list[str]:
        """The groups `identity` is a member of: whose approvals `may_decide` may let them answer
        (the approvals API lists only those, and the requester's own calls without a group)."""
        return [name for name, group in self._config.groups.items() if self._member(identity, self._listed[name], group.jwt_claims)]

    def may_audit(self, identity: ApproverIdentity) -> bool:
        """Whether `identity` may read decided approvals (the audit trail)."""
        auditors = self._config.auditors
        return self._member(identity, self._auditors, auditors.jwt_claims)

    @staticmethod
    def _member(identity: ApproverIdentity, listed: frozenset[Principal], claims: Mapping[str, list[str]]) -> bool:
        """Listed as the principal it is, or carrying every claim with an allowed value (as an
        agent's access list matches); no claims match nobody, so an empty list is never everyone."""
        if identity.principal in listed:
            return True
        return bool(claims) and all(claim_holds(identity.claims.get(claim), allowed) for claim, allowed in claims.items())


_KINDS: Mapping[str, Literal["none", "api_key", "jwt"]] = {"none": "none", "api_key": "api_key", "jwt": "jwt"}


def _bearer(request: web.Request) -> str:
    """The credential of `Authorization: Bearer` or `x-api-key`; approver keys are never read from
    cookies or URLs."""
    header = request.headers.get("Authorization", "")
    if header[:7].lower() == "bearer ":
        return header[7:].strip()
    return request.headers.get("x-api-key", "").strip()
