"""The grants API: standing grants (approvals/grants.py) given, listed and revoked by those who
could have answered the calls they cover (docs/approvals.md "Standing grants").

- `GET /api/grants?agent=`: the caller's grants: a chatting user's own (and those over every user
  of an agent, which cover them too), and those of every approver group the caller is in.
- `POST /api/grants` `{agent, tool, ttl, chat_id?, user?, group?, condition?, uses?}`: a chatting
  user grants for their own calls in one chat (`chat_id` required, no `group`, `user` theirs if
  given), for a tool whose policy could ask them; an approver grants for their group (`group`
  required, theirs, and named by the tool's policy) over one user or every user of the agent. A
  condition that does not compile is 400 with CEL's message; `ttl` is bounded by `grants.max_ttl`;
  at most `grants.max_per_owner` grants per user or group (429).
- `DELETE /api/grants/{id}`: its granter, or any member of its group, revokes it.
Authentication is the approvals API's (approver keys, or the chat routes' identity:
approvals_api.py `caller`); a write spends the caller's token of the per-user rate, as a vote does.
"""

from __future__ import annotations

import time
from typing import Any

import structlog
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, ValidationError

from ..access.approvers import APPROVER_KEY, ApproverIdentity
from ..approvals.grants import USER_AUTHORITY, Grant, asked_of, new_grant_id
from ..approvals.store import StoreDown
from ..config.approvers import GROUP_NAME_PATTERN
from ..config.rules import MAX_CONDITION_CHARS, compile_condition
from ..core.refusals import HttpError
from .admit import preflight, read_body
from .approvals_api import caller, spend_rate, store_down
from .state import GATEWAY, Gateway

__all__ = ["routes"]

log = structlog.get_logger("adk_gateway.edge.grants_api")

_MAX_USES = 10_000


class _GrantAsked(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent: str = Field(min_length=1, max_length=64)
    tool: str = Field(min_length=1, max_length=256)
    ttl: StrictInt | StrictFloat = Field(gt=0)
    chat_id: str | None = Field(None, pattern=r"^[A-Za-z0-9_-]{1,128}$")
    user: str | None = Field(None, min_length=1, max_length=128)
    group: str | None = Field(None, pattern=GROUP_NAME_PATTERN)
    condition: str | None = Field(None, min_length=1, max_length=MAX_CONDITION_CHARS)
    uses: StrictInt | None = Field(None, ge=1, le=_MAX_USES)


def _invalid(text: str) -> HttpError:
    return HttpError(400, "invalid_request", text)


def _authority(gateway: Gateway, who: ApproverIdentity, asked: _GrantAsked) -> tuple[str, str | None]:
    """The authority the caller grants with, and whose calls it covers (None: every user's); 403
    for what the caller could not have answered."""
    if asked.group is None:
        if who.auth == APPROVER_KEY:
            raise _invalid("group: an approver grants for one of their groups")
        if asked.user not in (None, who.user_id):
            raise HttpError(403, "not_an_approver", "you may grant only for your own calls (or, as an approver, give `group`)")
        if asked.chat_id is None:
            raise _invalid("chat_id: a grant for your own calls names the chat it stands in")
        return USER_AUTHORITY, who.user_id
    if asked.group not in gateway.approver_auth().groups_of(who):
        raise HttpError(403, "not_an_approver", "you may grant only for a group you are a member of")
    return asked.group, asked.user


def _granted(gateway: Gateway, who: ApproverIdentity, asked: _GrantAsked) -> Grant:
    config = gateway.config
    agent = config.agents.get(asked.agent)
    if agent is None:
        raise _invalid(f"agent: the gateway serves no agent {asked.agent!r}")
    authority, user = _authority(gateway, who, asked)
    if authority == USER_AUTHORITY and not gateway.auth.may_use(who, agent.access):
        # Its calls could never come from this user: refused as the chat routes refuse the agent.
        raise HttpError(403, "agent_not_allowed", "this credential may not use this agent")
    if not asked_of(agent.tool_policy(asked.tool), authority):
        whom = "you" if authority == USER_AUTHORITY else f"the group {authority}"
        raise _invalid(f"tool: no call of {asked.tool} is asked of {whom}, so there is nothing to grant")
    if asked.ttl > config.grants.max_ttl:
        raise _invalid(f"ttl: at most {config.grants.max_ttl:g} seconds (grants.max_ttl)")
    if asked.condition is not None:
        try:
            compile_condition(asked.condition)
        except ValueError as exc:
            raise _invalid(f"condition: {exc}") from None
    now = time.time()
    return Grant(
        id=new_grant_id(), agent=asked.agent, tool=asked.tool, user_id=user, chat_id=asked.chat_id,
        condition=asked.condition, expires_at=now + float(asked.ttl), uses_left=asked.uses,
        granted_by={"user": who.user_id, "auth": who.auth, "principal": str(who.principal)}, authority=authority, created_at=now,
    )


async def create_grant(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    who = await caller(request)
    await spend_rate(request, who)
    try:
        asked = _GrantAsked.model_validate_json(await read_body(request))
    except ValidationError as exc:
        first = exc.errors()[0]
        raise _invalid(f"{'.'.join(map(str, first['loc'])) or 'body'}: {first['msg']}") from None
    grant = _granted(gateway, who, asked)
    store = gateway.cluster.state.grants
    try:
        held = await (store.grants_of(who.user_id) if grant.authority == USER_AUTHORITY else store.grants_by(grant.authority))
        if sum(1 for kept in held if kept.authority == grant.authority) >= gateway.config.grants.max_per_owner:
            raise HttpError(429, "too_many_grants", "too many standing grants already (grants.max_per_owner): revoke one first")
        await store.put_grant(grant)
    except StoreDown as exc:
        raise store_down(exc) from None
    log.info("grant_created", grant_id=grant.id, agent=grant.agent, tool=grant.tool, authority=grant.authority,
             chat_id=grant.chat_id, uses=grant.uses_left, expires_at=grant.expires_at)
    return web.json_response(grant.as_json(), status=201)


def _mine(gateway: Gateway, who: ApproverIdentity, grant: Grant) -> bool:
    """Whether the caller may see and revoke `grant`: theirs as a chatting user, or their group's."""
    if grant.authority == USER_AUTHORITY:
        return who.auth != APPROVER_KEY and grant.user_id == who.user_id
    return grant.authority in gateway.approver_auth().groups_of(who)


async def list_grants(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    who = await caller(request)
    agent = request.query.get("agent")
    store = gateway.cluster.state.grants
    found: dict[str, Grant] = {}
    try:
        if who.auth != APPROVER_KEY:
            found.update((grant.id, grant) for grant in await store.grants_of(who.user_id))
        for group in gateway.approver_auth().groups_of(who):
            found.update((grant.id, grant) for grant in await store.grants_by(group))
    except StoreDown as exc:
        raise store_down(exc) from None
    grants = sorted(found.values(), key=lambda grant: (grant.created_at, grant.id))
    return web.json_response({"grants": [_shown(g) for g in grants if agent is None or g.agent == agent]})


def _shown(grant: Grant) -> dict[str, Any]:
    return grant.as_json()


async def revoke_grant(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    who = await caller(request)
    await spend_rate(request, who)
    store = gateway.cluster.state.grants
    try:
        grant = await store.get_grant(request.match_info["id"])
        # Someone else's grant is answered as an unknown one: an id tells nothing to anyone else.
        if grant is None or not _mine(gateway, who, grant):
            raise HttpError(404, "grant_not_found", "no standing grant with this id is yours to revoke")
        revoked = await store.revoke_grant(grant.id)
    except StoreDown as exc:
        raise store_down(exc) from None
    log.info("grant_revoked", grant_id=grant.id, revoked=revoked, auth=who.auth)
    return web.json_response({"id": grant.id, "revoked": True})


def routes() -> list[web.RouteDef]:
    return [
        web.get("/api/grants", list_grants), web.post("/api/grants", create_grant), web.options("/api/grants", preflight),
        web.delete("/api/grants/{id}", revoke_grant), web.options("/api/grants/{id}", preflight),
    ]
