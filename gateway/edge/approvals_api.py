"""The approvals API: approvers (and the chatting user) list, read and decide pending approvals from
any replica; auditors read the decided ones.

- `GET /api/approvals?state=pending&agent=&tool=&limit=&cursor=`: the pending approvals the caller
  may decide, read from the directory's indexes of the groups they belong to and of their own calls
  (approvals/index.py), a page at a time (`next_cursor`).
- `GET /api/approvals?state=decided&since=&until=&agent=&tool=&after=&limit=`: the audit trail (auditors).
- `GET /api/approvals/{id}`: one pending approval, to those who may decide it and to its requester.
- `POST /api/approvals/{id}` `{"approved": bool, "reason"?: str}`: a vote; the quorum reached, the
  decision is applied where the call's chat runs (cluster/approval_desk.py).

Who the caller is and what they may do: access/approvers.py. What is listed: the shared directory of
pending approvals (cluster/shared.py). A second answer is 409, never a second execution: votes are
counted atomically, and the chat's machine releases a call once. A query value that is not what it
says is 400 naming it; a vote's body is read within `chat.body_timeout` (408), and spends the
caller's token of the chat routes' per-user rate (429), as a chat request does.

The vote (`cast_vote`) and its rate (`spend_rate`) are the one path of every channel: the Slack
presses (edge/slack.py) and the mailed links' decision page (edge/decision_page.py) vote through them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from typing import Any

import structlog
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError

from ..access.approvers import APPROVER_KEY, ApproverIdentity
from ..approvals.index import (
    ApprovalQuery, InvalidCursor, decode_cursor, encode_cursor, group_audience, requester_audience,
)
from ..cluster.shared import SharedStateBusy, SharedStateDown
from ..approvals.votes import needed
from ..config.approvers import AskSpec, Principal
from ..core.refusals import HttpError
from ..approvals.audit_trail import InvalidAuditQuery
from ..approvals.store import StoreDown
from ..core.limits import Limited
from .admit import count_refusal, preflight, read_body
from .state import GATEWAY, Gateway

__all__ = ["caller", "cast_vote", "may_vote", "read_pending", "routes", "spend_rate", "store_down"]

log = structlog.get_logger("adk_gateway.edge.approvals_api")

_MAX_LIMIT = 1000
# Kept in the directory for the owner's use, never shown.
_PRIVATE = ("owner", "session", "engine", "decision")
_STORE_DOWN = "the gateway's shared store is unreachable; retry"


class _Vote(BaseModel):
    model_config = ConfigDict(extra="forbid")

    approved: StrictBool
    reason: str | None = Field(None, max_length=1000)


async def caller(request: web.Request) -> ApproverIdentity:
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


# Query values are ASCII: int() and float() also take "²", "١", "1_0", "nan", "inf" and "1e308".
_WHOLE = re.compile(r"[0-9]{1,6}")
_SECONDS = re.compile(r"[0-9]{1,11}(?:\.[0-9]{1,6})?")
# Agent and tool names are short; anything longer names nothing.
_MAX_NAME = 256


def _invalid(key: str, text: str) -> HttpError:
    return HttpError(400, "invalid_query", f"{key}: {text}")


def _limit(request: web.Request, default: int = 100) -> int:
    raw = request.query.get("limit", str(default))
    if _WHOLE.fullmatch(raw) is None or not 1 <= int(raw) <= _MAX_LIMIT:
        raise _invalid("limit", f"a whole number from 1 to {_MAX_LIMIT}")
    return int(raw)


def _time(request: web.Request, key: str) -> float | None:
    raw = request.query.get(key)
    if raw is None:
        return None
    if _SECONDS.fullmatch(raw) is None:
        raise _invalid(key, "UNIX seconds, digits with an optional fraction (e.g. 1764547200.5)")
    return float(raw)


def _name(request: web.Request, key: str) -> str | None:
    raw = request.query.get(key)
    if raw is not None and not 1 <= len(raw) <= _MAX_NAME:
        raise _invalid(key, f"a name of 1 to {_MAX_NAME} characters")
    return raw


def store_down(exc: StoreDown) -> HttpError:
    # An overloaded replica says so (503 gateway_overloaded), not that Redis is down.
    if isinstance(exc, SharedStateBusy):
        return exc.http()
    return HttpError(503, "sessions_unavailable", _STORE_DOWN, {"Retry-After": "1"})


async def list_approvals(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    who = await caller(request)
    state, agent, tool = request.query.get("state", "pending"), _name(request, "agent"), _name(request, "tool")
    limit = _limit(request)
    if state == "decided":
        return await _decided(request, who, agent, tool, limit)
    if state != "pending":
        raise _invalid("state", "pending or decided")
    try:
        after = decode_cursor(request.query["cursor"]) if "cursor" in request.query else None
    except InvalidCursor as exc:
        raise HttpError(400, "invalid_query", str(exc)) from None
    auth = gateway.approver_auth()
    # Only the indexes of what the caller may decide: their groups', and their own calls that no
    # group decides (an approver key never chats). The check per approval stays: four-eyes.
    audiences = [group_audience(group) for group in auth.groups_of(who)]
    if who.auth != APPROVER_KEY:
        audiences.append(requester_audience(who.user_id))
    query = ApprovalQuery(
        audiences=tuple(audiences), agent=agent, tool=tool, after=after, limit=limit,
        accept=lambda record: _refusal(gateway, who, record) is None,
    )
    try:
        page = await gateway.cluster.state.page_approvals(query)
    except SharedStateDown as exc:
        raise store_down(exc) from None
    return web.json_response({
        "approvals": [_public(r) for r in page.approvals],
        "next_cursor": encode_cursor(page.next) if page.next is not None else None,
    })


async def _decided(request: web.Request, who: ApproverIdentity, agent: str | None, tool: str | None, limit: int) -> web.Response:
    gateway = request.app[GATEWAY]
    if not gateway.approver_auth().may_audit(who):
        raise HttpError(403, "not_an_auditor", "reading decided approvals takes an auditor (approvers.auditors)")
    since, until = _time(request, "since"), _time(request, "until")
    try:
        records = await gateway.audit.read(
            since=since, until=until, agent=agent, tool=tool, limit=limit, after=request.query.get("after"),
        )
    except InvalidAuditQuery as exc:
        raise HttpError(400, "invalid_query", f"after: {exc}") from None
    except StoreDown as exc:
        raise store_down(exc) from None
    return web.json_response({"approvals": records, "next": records[-1]["cursor"] if len(records) == limit else None})


async def _pending(gateway: Gateway, approval_id: str, who: ApproverIdentity) -> dict[str, Any]:
    """The pending approval `approval_id` if the caller may see it (may decide it, or asked for
    it); else 404, so that an id tells nothing to anyone else."""
    try:
        record = await gateway.cluster.state.get_approval(approval_id)
    except SharedStateDown as exc:
        raise store_down(exc) from None
    asked = record is not None and who.principal == gateway.approver_auth().requester(record["requester"])
    if record is None or (_refusal(gateway, who, record) is not None and not asked):
        raise HttpError(404, "approval_not_found", "no pending approval with this id is yours to see")
    return record


async def get_approval(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    who = await caller(request)
    return web.json_response(_public(await _pending(gateway, request.match_info["id"], who)))


async def decide_approval(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    who = await caller(request)
    await spend_rate(request, who)
    raw = await read_body(request)
    try:
        ballot = _Vote.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise HttpError(400, "invalid_request", f"{'.'.join(map(str, first['loc'])) or 'body'}: {first['msg']}") from None
    status, decided = await cast_vote(gateway, who, request.match_info["id"], ballot.approved, ballot.reason)
    return web.json_response(decided, status=status)


async def spend_rate(request: web.Request, who: ApproverIdentity) -> None:
    """Spend the writer's token of the chat routes' per-user rate, or raise 429: the one rate of
    votes and grants, whichever channel brings them (this API, a Slack press, a mailed link, the
    grants API)."""
    gateway = request.app[GATEWAY]
    # By where the voter's id comes from, not by the channel: a person has one bucket whichever way
    # they vote. A chatting user's votes share their chat bucket; an approver key's holder has its
    # own, never that of a chatting user whose id happens to equal the key's.
    bucket = str(who.principal) if who.source == APPROVER_KEY else who.user_id
    try:
        await gateway.admission.check_rate(bucket, gateway.clock())
    except Limited as exc:
        count_refusal(request, exc.code)
        raise


async def cast_vote(gateway: Gateway, who: ApproverIdentity, approval_id: str, approved: bool, reason: str | None) -> tuple[int, dict[str, Any]]:
    """`who`'s vote on the pending approval `approval_id`, counted in the store and, once it decides,
    applied where the call's chat runs: (status, the approval as the API shows it); the status is
    200, or 202 when the decision waits for its chat to free. The one path every channel votes
    through (this API, a Slack press, a mailed link): the first decision wins. Every refusal is an
    HttpError: 404 (not theirs to see), 403 (not an approver, four-eyes), 409 (voted already,
    decided already: a late vote), 410 (gone), 503."""
    record = await _pending(gateway, approval_id, who)
    refused = _refusal(gateway, who, record)
    if refused is not None:
        text = "the person who asked may not approve this call" if refused == "self_approval" else "you may not decide this approval"
        raise HttpError(403, refused, text)
    # Votes of people a reload took out of the group stop counting: the store needs that many more.
    counts = partial(gateway.approver_auth().counts, spec=_spec(record), requester=record["requester"])
    quorum = needed(record.get("votes", []), int(record["quorum"]), counts)
    try:
        tally = await gateway.cluster.state.vote_approval(record["id"], str(who.principal), approved, quorum)
    except SharedStateDown as exc:
        raise store_down(exc) from None
    log.info("approval_vote", approval_id=record["id"], approved=approved, tally=tally.state, auth=who.auth)
    if tally.state == "already":
        raise HttpError(409, "already_voted", "you already answered this approval")
    if tally.state == "gone":
        raise HttpError(409, "already_decided", "this approval is no longer pending: decided, expired or cancelled")
    votes = (tally.approval or record).get("votes", [])
    if tally.state == "counted":
        return 200, _public(tally.approval or record)
    deciders = [{"user": who.user_id, "auth": who.auth}] + _earlier_deciders(votes, str(who.principal), approved, counts)
    result = await gateway.cluster.approvals.decide(record, approved, reason, deciders)
    if result == "already":
        raise HttpError(409, "already_decided", "this approval was decided before (its deadline passed, or the run ended)")
    if result == "gone":
        # Nobody holds the call any more (its replica stopped with the plugin's request, which the
        # plugin then refused): no inbox should list it again.
        await gateway.cluster.approvals.closed(record["id"])
        raise HttpError(410, "approval_gone", "the chat or the run this approval belonged to is gone")
    if result == "busy":
        # Counted, but neither applied nor kept for later (the store failed meanwhile): the
        # approval's verdict is in the store, which its deadline reads.
        raise HttpError(503, "chat_busy", "the decision is counted, but the chat stayed busy and the agent was not answered")
    outcome = "approved" if approved else "denied"
    decided = _public(record, state="decided", outcome=outcome, source="approver", votes=votes, applied=result != "queued")
    # `queued`: the decision is the approval's; the chat runs something else, and gets it when it frees.
    return (202 if result == "queued" else 200), decided


def may_vote(gateway: Gateway, who: ApproverIdentity, record: dict[str, Any]) -> bool:
    """Whether `who` may decide the approval `record` now (its group, four-eyes)."""
    return _refusal(gateway, who, record) is None


async def read_pending(gateway: Gateway, approval_id: str, who: ApproverIdentity) -> dict[str, Any]:
    """The approval as the API shows it to `who`, pending or decided and not yet answered; 404 for
    one they may not see (or that is gone)."""
    return _public(await _pending(gateway, approval_id, who))


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
