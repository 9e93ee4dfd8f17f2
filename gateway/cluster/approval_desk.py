"""The approvals API's side of the cluster: the shared directory of pending approvals, and a decision
carried to the replica that runs the call's chat.

The replica running a chat writes each gated call that starts waiting for a decision into the shared
directory (`opened`), so that any replica can list it and read it, and drops it once released
(`closed`). A decision through the API (any replica) is counted there first (`vote`: atomic, so two
replicas never both decide, and one approver never counts twice); once the quorum is reached, the
owner applies it (`Decide`), as the chatting person's answer would be applied, and the plugin's
request waiting for the verdict gets it. The desk reaches this replica's chats only through the
approvals room's port to them (approvals/ports.py `ApprovalChats`, which the chat's desk view,
chat/desk_view.py, implements and the router hands in): a decision is applied through it
(`ApprovalDecisions`), whichever way the call waits, and what a listing needs of a chat is read
through it as plain values.

On `/run_sse` a call its approvers decide waits as an ADK confirmation instead (chat/approver_waits.py):
it is listed under ADK's id when its deadline is kept (`confirmation_waiting`), with no owner, since
ADK's session holds it whichever replica dies; its decision goes to whichever replica claims the chat
then (`_decide_confirmation`: the owner, or this one taking over a dead owner's chat), which answers ADK.
The decision is the approval's once the quorum is counted in the store: a chat that stays busy
keeps it there (`queued`), with the reason and who decided, and its deadline is made due at once;
whoever answers the deadline (`deadline_passed`) answers ADK with that decision, never `on_timeout`.
Answered either way, the approval leaves the listing at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from ..approvals.ports import ApprovalChats
from ..config.approvers import Principal
from ..core.approvals import GatedCall
from ..core.approver_confirmations import ApproverMark
from ..core.deadlines import Deadline
from ..core.native_confirmation import NativeConfirmation
from ..core.refusals import HttpError, Refusal
from .messages import Answer, Decide, Decided, Work
from .shared import SharedState, SharedStateDown

__all__ = ["CONFIRM_ENGINE", "ApprovalDesk", "native_record", "pending_record"]

log = structlog.get_logger("adk_gateway.cluster.approval_desk")

# A record outlives its call's deadline by this much: a late reader still finds what it was.
_MARGIN = 60.0
# An ADK confirmation's record (`engine`): answered from ADK's session by whichever replica runs the chat.
CONFIRM_ENGINE = "confirm"
# A decision for a chat that streams is tried again this often, this many times, before it is
# left to the deadline queue (`queued`), which tries it again every second until the chat frees.
_BUSY_WAIT = 0.5
_BUSY_TRIES = 60
# A decision that waits for its chat to free is kept this long past the approval's deadline (then
# the chat itself is long idle): the deadline queue applies it, whenever the chat frees before.
_DECIDED_KEEP = 3600.0
# A passed deadline whose chat is busy, or whose store is down, is tried again this much later.
_RETRY = 1.0


def pending_record(call: GatedCall, *, agent: str, app_name: str, owner: str, wall: float, now: float) -> dict[str, Any]:
    """A waiting call as the approvals API shows it (its times on the wall clock), plus where it runs."""
    return {
        "id": call.id, "state": "pending", "agent": agent, "app_name": app_name, "tool": call.tool,
        "tool_call_id": call.tool_call_id, "chat_id": call.chat_id, "requester": call.user_id, "args": call.args,
        "rule": call.rule, "hint": call.policy.hint, "approvers": call.approvers, "self_approval": call.self_approval,
        "quorum": call.quorum, "votes": [], "created": wall - (now - call.created), "deadline": wall + (call.deadline - now),
        "owner": owner, "session": call.session_id,
    }


class ApprovalDesk:
    def __init__(
        self, state: SharedState, chats: ApprovalChats, ask: Callable[[str, Work], Awaitable[Answer]],
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._state = state
        # This replica's chats, through the room's port: where a decision is applied once it reaches here.
        self._chats = chats
        self._ask = ask
        self._wall = wall

    # ---- the owner's side ------------------------------------------------------------------

    async def opened(self, call: GatedCall) -> bool:
        """A call waits for a decision: listed for the API (best effort: the chat still shows it).
        False when its user has the agent's `max_pending_approvals_per_user` listed already: the
        caller refuses the call. A call the store cannot list is not refused: it crowds nobody out."""
        agent = self._chats.agent_of(call.user_id, call.session_id)
        config = self._chats.config
        settings = config.agents.get(agent)
        record = pending_record(
            call, agent=agent, app_name=settings.upstream.app_name if settings else "", owner=self._state.replica_id,
            wall=self._wall(), now=self._chats.now(),
        )
        ttl = max(call.deadline - self._chats.now(), 0.0) + _MARGIN
        try:
            return await self._state.put_approval(record, ttl=ttl, cap=config.max_pending_approvals_per_user(agent))
        except SharedStateDown:
            log.warning("approval_not_listed", approval_id=call.id, reason="the shared store is unreachable")
            return True

    async def closed(self, approval_id: str) -> None:
        with contextlib.suppress(SharedStateDown):
            await self._state.drop_approval(approval_id)

    # ---- any replica's side ----------------------------------------------------------------

    async def decide(self, record: dict[str, Any], approved: bool, reason: str | None, deciders: list[dict[str, str]]) -> str:
        """Apply approvers' decision where the call's chat runs: `decided`, `already` or `gone`; for
        an ADK confirmation whose chat stays busy, `queued` (applied when it frees) or `busy`."""
        if record.get("engine") == CONFIRM_ENGINE:
            return await self._decide_confirmation(record, approved, reason, deciders)
        work = Decide(record["requester"], record["session"], record["id"], approved, reason or "", {"deciders": deciders})
        if record["owner"] == self._state.replica_id:
            return self._chats.decide_for_approvers(
                user_id=work.user, session_id=work.session, approval_id=work.approval, approved=approved,
                reason=reason, deciders=deciders,
            )
        try:
            answer = await self._ask(record["owner"], work)
        except HttpError as exc:
            # The owner died with the plugin's request (or cannot be reached): nobody holds the call.
            log.warning("approval_owner_unreachable", approval_id=work.approval, error=exc.code)
            return "gone"
        return answer.result if isinstance(answer, Decided) else "gone"

    # ---- ADK's confirmations its approvers answer (`/run_sse`) -------------------------------

    async def confirmation_waiting(self, deadline: Deadline) -> None:
        """A run here left an ADK confirmation its approvers answer (its deadline just kept): listed
        for the API under ADK's own id, which every replica reads again from ADK's session. Listed
        again (a replica that took the chat over sees it anew), its votes stay (put keeps them)."""
        if deadline.held:
            return  # a chat's held calls: listed as each opens (`opened`)
        found = self._chats.native_waiting(deadline.agent, deadline.user, deadline.chat, deadline.approval_id)
        if found is None:
            return
        confirmation = found.confirmation
        assert confirmation.mark is not None
        settings = self._chats.config.agents.get(found.agent)
        wall = self._wall()
        record = native_record(
            confirmation, confirmation.mark, agent=found.agent, app_name=settings.upstream.app_name if settings else "",
            chat_id=found.chat_id, requester=found.user_id, session=found.session_id,
            hint=settings.tool_policy(confirmation.tool).hint if settings else None,
            created=confirmation.seen_at or wall, deadline=deadline.due,
        )
        try:
            await self._state.put_approval(record, ttl=max(deadline.due - wall, 0.0) + _MARGIN)
        except SharedStateDown:
            # Not lost: ADK's session keeps it, and the next run's end or take-over lists it again.
            log.warning("approval_not_listed", approval_id=record["id"], reason="the shared store is unreachable")

    async def _decide_confirmation(
        self, record: dict[str, Any], approved: bool, reason: str | None, deciders: list[dict[str, str]],
    ) -> str:
        """Approvers decided an ADK confirmation: the replica that runs the chat (any one, when its
        owner died: the chat is taken over) answers ADK. A chat busy streaming is waited for a
        while, then the decision is queued for it (`_queue`)."""
        agent, user, chat = str(record["agent"]), str(record["requester"]), str(record["chat_id"])
        for _ in range(_BUSY_TRIES):
            try:
                claim = await self._state.claim(
                    user, chat, agent=agent, default_agent=self._chats.config.default,
                    ttl=self._chats.config.chat.idle_chat_ttl,
                )
            except SharedStateDown:
                # Not gone (a Refusal too, so caught first): the store is out of reach, or settling
                # after every replica was down (no chat is taken over for `owner_timeout`). Tried
                # again as a busy chat is.
                claim = None
            except Refusal:
                # The store's refusal is chat/registry.py's ChatNotFound: another user's or agent's chat id.
                return "gone"
            if claim is None:
                result = "busy"
            elif claim.local:
                result = await self._chats.answer_for_approvers(
                    agent, user, chat, str(record["id"]), approved=approved, reason=reason, deciders=deciders,
                )
            else:
                work = Decide(user, str(record["session"]), str(record["id"]), approved, reason or "",
                              {"deciders": deciders, "agent": agent, "chat": chat})
                try:
                    answer = await self._ask(claim.owner, work)
                except HttpError:
                    result = "busy"  # the owner died meanwhile: the next try takes the chat over
                else:
                    result = answer.result if isinstance(answer, Decided) else "gone"
            if result != "busy":
                if result in ("decided", "already"):
                    await self.closed(str(record["id"]))
                return result
            await asyncio.sleep(_BUSY_WAIT)
        return await self._queue(record, approved, reason, deciders)

    async def _queue(self, record: dict[str, Any], approved: bool, reason: str | None, deciders: list[dict[str, str]]) -> str:
        """The chat stayed busy: the decision stays the approval's, kept with it in the store (its
        reason and deciders too, which the votes do not hold), and its deadline is due now, so the
        replica that answers deadlines applies it when the chat frees. `queued`; `busy` when the
        store cannot keep it (the approval's verdict is in the store all the same)."""
        wall = self._wall()
        kept = {**record, "decision": {"approved": approved, "reason": reason, "deciders": deciders}}
        deadline = Deadline(
            str(record["agent"]), str(record["requester"]), str(record["chat_id"]), str(record["id"]),
            str(record["tool_call_id"]), str(record["tool"]), wall + _RETRY,
        )
        try:
            await self._state.put_approval(kept, ttl=max(float(record["deadline"]) - wall, 0.0) + _DECIDED_KEEP)
            await self._state.add_deadline(deadline)
        except SharedStateDown:
            log.warning("approval_not_answered", approval_id=record["id"], reason="the chat stayed busy")
            return "busy"
        log.info("approval_decision_queued", approval_id=record["id"], reason="the chat is busy")
        return "queued"

    async def deadline_passed(self, deadline: Deadline) -> float | None:
        """A confirmation's deadline, claimed where its chat runs (here): the approvers' decision
        if the store holds one that has not reached ADK yet, else the tool's `on_timeout`
        (chat/gateway_answers.py). Answered, the approval leaves the listing at once, as a decided
        one does. Returns when to look again, or None (the deadline timer's contract)."""
        try:
            record = await self._state.get_approval(deadline.approval_id)
        except SharedStateDown:
            return self._wall() + _RETRY
        ours = record is not None and record.get("engine") == CONFIRM_ENGINE and (
            record.get("chat_id"), record.get("requester"), record.get("agent")
        ) == (deadline.chat, deadline.user, deadline.agent)
        if ours and record is not None and record.get("state") == "decided":
            decision = record.get("decision") or {}
            result = await self._chats.answer_for_approvers(
                deadline.agent, deadline.user, deadline.chat, deadline.approval_id,
                approved=record.get("outcome") == "approved", reason=decision.get("reason"),
                deciders=list(decision.get("deciders") or _voters(record)),
            )
            if result == "busy":
                return self._wall() + _RETRY
            await self.closed(deadline.approval_id)
            return None
        again = await self._chats.expire_confirmation(deadline)
        if ours and again is None:
            await self.closed(deadline.approval_id)
        return again


def _voters(record: dict[str, Any]) -> list[dict[str, str]]:
    """Who decided an approval whose decision the store kept without them (the replica that
    counted the deciding vote stopped before it could keep them): the voters of its outcome."""
    approved = record.get("outcome") == "approved"
    voters = [Principal.parse(str(v["user"])) for v in record.get("votes", []) if v.get("approved") is approved]
    return [{"user": who.id, "auth": who.source} for who in voters if who is not None]


def native_record(
    confirmation: NativeConfirmation, mark: ApproverMark, *, agent: str, app_name: str, chat_id: str, requester: str,
    session: str, hint: str | None, created: float, deadline: float,
) -> dict[str, Any]:
    """An ADK confirmation its approvers answer, as the approvals API shows it (wall clock times).
    No owner: any replica answers it, from ADK's session (`engine: confirm`)."""
    return {
        "id": confirmation.approval_id, "state": "pending", "agent": agent, "app_name": app_name,
        "tool": confirmation.tool, "tool_call_id": confirmation.tool_call_id, "chat_id": chat_id, "requester": requester,
        "args": dict(confirmation.args or {}), "rule": mark.rule, "hint": hint, "approvers": mark.approvers,
        "self_approval": mark.self_approval, "quorum": mark.quorum, "votes": [], "created": created,
        "deadline": deadline, "owner": "", "session": session, "engine": CONFIRM_ENGINE,
    }
