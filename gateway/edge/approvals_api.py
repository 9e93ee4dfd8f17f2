"""The approvals API: approvers (and the chatting user) list, read and decide pending approvals from
any replica; auditors read the decided ones.

- `GET /api/approvals?state=pending&agent=&tool=&limit=`: the pending approvals the caller may decide.
- `GET /api/approvals?state=decided&since=&until=&agent=&tool=&after=&limit=`: the audit trail (auditors).
- `GET /api/approvals/{id}`: one pending approval, to those who may decide it and to its requester.
- `POST /api/approvals/{id}` `{"approved": bool, "reason"?: str}`: a vote; the quorum reached, the
  decision is applied where the call's chat runs (cluster/approval_desk.py).

Who the caller is and what they may do: access/approvers.py. What is listed: the shared directory of
pending approvals (cluster/shared.py). A second answer is 409, never a second execution: votes are
counted atomically, and the chat's machine releases a call once.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import structlog
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError

from ..access.approvers import ApproverIdentity
from ..cluster.shared import SharedStateDown
from ..cluster.approval_votes import needed
from ..config.approvers import AskSpec, Principal
from ..core.refusals import HttpError
from ..cluster.audit_trail import InvalidAuditQuery
from .admit import count_refusal, preflight
from .state import GATEWAY, Gateway

__all__ = ["routes"]

log = structlog.get_logger("adk_gateway.edge.approvals_api")

_MAX_LIMIT = 1000
# Kept in the directory for the owner's use, never shown.
_PRIVATE = ("owner", "session")
_STORE_DOWN = "the gateway's shared store is unreachable; retry"


class _Vote(BaseModel):
    model_config = ConfigDict(extra="forbid")

    approved: StrictBool
    reason: str | None = Field(None, max_length=1000)


async def _caller(request: web.Request) -> ApproverIdentity:
    gateway = request.app[GATEWAY]
    try:
        identity = await gateway.approver_auth().identify_approver(request)
        gateway.auth.check_origin(request, identity)
    except HttpError as exc:
        count_refusal(request, exc.code if exc.status == 403 else "unauthorized")
        raise
    structlog.contextvars.bind_contextvars(user_id=identity.user_id)
    return identity


def _spec(record: dict[str, Any]) -> AskSpec | None:
    group = record.get("approvers")
    return None if group is None else AskSpec(group, bool(record.get("self_approval", True)), int(record.get("quorum", 1)))


def _refusal(gateway: Gateway, who: ApproverIdentity, record: dict[str, Any]) -> str | None:
    return gateway.approver_auth().may_decide(who, _spec(record), record["requester"])


def _public(record: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**{k: v for k, v in record.items() if k not in _PRIVATE}, **changes}


def _limit(request: web.Request, default: int = 100) -> int:
    raw = request.query.get("limit", str(default))
    if not raw.isdigit() or not 1 <= int(raw) <= _MAX_LIMIT:
        raise HttpError(400, "invalid_query", f"limit: a whole number from 1 to {_MAX_LIMIT}")
    return int(raw)


def _time(request: web.Request, key: str) -> float | None:
    raw = request.query.get(key)
    if raw is None:
        return None
    try:
        return float(raw)
    except ValueError:
        raise HttpError(400, "invalid_query", f"{key}: UNIX seconds") from None


async def list_approvals(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    who = await _caller(request)
    state, agent, tool = request.query.get("state", "pending"), request.query.get("agent"), request.query.get("tool")
    limit = _limit(request)
    try:
        if state == "decided":
            if not gateway.approver_auth().may_audit(who):
                raise HttpError(403, "not_an_auditor", "reading decided approvals takes an auditor (approvers.auditors)")
            records = await gateway.audit.read(
                since=_time(request, "since"), until=_time(request, "until"), agent=agent, tool=tool, limit=limit,
                after=request.query.get("after"),
            )
            return web.json_response({"approvals": records, "next": records[-1]["cursor"] if len(records) == limit else None})
        if state != "pending":
            raise HttpError(400, "invalid_query", "state: pending or decided")
        pending = await gateway.cluster.state.list_approvals(agent=agent, tool=tool, limit=_MAX_LIMIT)
    except InvalidAuditQuery as exc:
        raise HttpError(400, "invalid_query", str(exc)) from None
    except SharedStateDown:
        raise HttpError(503, "sessions_unavailable", _STORE_DOWN, {"Retry-After": "1"}) from None
    mine = [_public(r) for r in pending if _refusal(gateway, who, r) is None]
    return web.json_response({"approvals": mine[:limit]})


async def _pending(gateway: Gateway, approval_id: str, who: ApproverIdentity) -> dict[str, Any]:
    """The pending approval `approval_id` if the caller may see it (may decide it, or asked for
    it); else 404, so that an id tells nothing to anyone else."""
    try:
        record = await gateway.cluster.state.get_approval(approval_id)
    except SharedStateDown:
        raise HttpError(503, "sessions_unavailable", _STORE_DOWN, {"Retry-After": "1"}) from None
    asked = record is not None and who.principal == gateway.approver_auth().requester(record["requester"])
    if record is None or (_refusal(gateway, who, record) is not None and not asked):
        raise HttpError(404, "approval_not_found", "no pending approval with this id is yours to see")
    return record


async def get_approval(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    who = await _caller(request)
    return web.json_response(_public(await _pending(gateway, request.match_info["id"], who)))


async def decide_approval(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    who = await _caller(request)
    try:
        vote = _Vote.model_validate_json(await request.read())
    except ValidationError as exc:
        first = exc.errors()[0]
        raise HttpError(400, "invalid_request", f"{'.'.join(map(str, first['loc'])) or 'body'}: {first['msg']}") from None
    record = await _pending(gateway, request.match_info["id"], who)
    refused = _refusal(gateway, who, record)
    if refused is not None:
        text = "the person who asked may not approve this call" if refused == "self_approval" else "you may not decide this approval"
        raise HttpError(403, refused, text)
    # Votes of people a reload took out of the group stop counting: the store needs that many more.
    counts = partial(gateway.approver_auth().counts, spec=_spec(record), requester=record["requester"])
    quorum = needed(record.get("votes", []), int(record["quorum"]), counts)
    try:
        tally = await gateway.cluster.state.vote_approval(record["id"], str(who.principal), vote.approved, quorum)
    except SharedStateDown:
        raise HttpError(503, "sessions_unavailable", _STORE_DOWN, {"Retry-After": "1"}) from None
    log.info("approval_vote", approval_id=record["id"], approved=vote.approved, tally=tally.state, auth=who.auth)
    if tally.state == "already":
        raise HttpError(409, "already_voted", "you already answered this approval")
    if tally.state == "gone":
        raise HttpError(409, "already_decided", "this approval is no longer pending: decided, expired or cancelled")
    votes = (tally.approval or record).get("votes", [])
    if tally.state == "counted":
        return web.json_response(_public(tally.approval or record))
    deciders = [{"user": who.user_id, "auth": who.auth}] + _earlier_deciders(votes, str(who.principal), vote.approved, counts)
    result = await gateway.cluster.approvals.decide(record, vote.approved, vote.reason, deciders)
    if result == "already":
        raise HttpError(409, "already_decided", "this approval was decided before (its deadline passed, or the run ended)")
    if result == "gone":
        # Nobody holds the call any more (its replica stopped with the plugin's request, which the
        # plugin then refused): no inbox should list it again.
        await gateway.cluster.approvals.closed(record["id"])
        raise HttpError(410, "approval_gone", "the chat or the run this approval belonged to is gone")
    outcome = "approved" if vote.approved else "denied"
    return web.json_response(_public(record, state="decided", outcome=outcome, source="approver", votes=votes))


def _earlier_deciders(votes: list[dict[str, Any]], mine: str, approved: bool, counts: Callable[[str], bool]) -> list[dict[str, str]]:
    """The other voters who gave the deciding answer and still count, by id and where it comes from
    (how they authenticated is not kept with a vote: an approver key's holder is `approver_key`)."""
    deciders = []
    for vote in votes:
        who = Principal.parse(vote["user"])
        if who is not None and vote["user"] != mine and vote["approved"] == approved and counts(vote["user"]):
            deciders.append({"user": who.id, "auth": who.source})
    return deciders


def routes() -> list[web.RouteDef]:
    return [
        web.get("/api/approvals", list_approvals), web.options("/api/approvals", preflight),
        web.get("/api/approvals/{id}", get_approval), web.post("/api/approvals/{id}", decide_approval),
        web.options("/api/approvals/{id}", preflight),
    ]
