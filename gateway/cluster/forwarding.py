"""Forwarding: a request for a chat that runs on another replica is asked of that replica, its
owner; and what other replicas forward here is done as if it had arrived here.

The replica holding the browser's (or the plugin's) request sends the work to the owner's inbox
(`Asker.ask`) and waits for the Reply, at most `sessions.forward_timeout` and no longer than the
owner lives; notices (`Asker.tell`) get no Reply. The owner does the work with one handler per kind
of work (`ForwardedRequests.DISPATCH`) and replies: the relay that carries the response, a gated
call's verdict, or the refusal a request of its own would have got.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Any, ClassVar

import structlog

from ..chat.service import ChatService
from ..core.approvals import RUN, Verdict
from ..core.refusals import HttpError, refusal
from ..core.limits import Limited
from ..core.chat_request import parse_chat_body
from ..ops.metrics import GatewayMetrics
from ..ops.tracing import Tracing
from .liveness import Liveness, OwnerDied, OwnerLost, OwnerSilent
from .messages import (
    Abort,
    Answer,
    Audio,
    Decide,
    Decided,
    Expire,
    Forwarded,
    Gate,
    Refused,
    Relayed,
    Reply,
    Resume,
    SocketClosed,
    Submit,
    Unfollow,
    Work,
)
from .relay import Relays
from .remote_gate import RemoteGate
from .shared import SharedState, SharedStateDown

__all__ = ["Asker", "ForwardedRequests"]

log = structlog.get_logger("adk_gateway.cluster.forwarding")

# A handler of one kind of work: (the service, the work, the message it came in) -> the answer.
Handler = Callable[[Any, Any, Forwarded], Awaitable[Answer | None]]


class Asker:
    """Sends work to a chat's owner, and hands each Reply to the request waiting for it."""

    def __init__(self, state: SharedState, liveness: Liveness, *, forward_timeout: float, tracing: Tracing | None = None) -> None:
        self._state = state
        # A span per forwarded request, its traceparent in the message (the owner's spans join it).
        self._tracing = tracing or Tracing.off()
        self._liveness = liveness
        self._forward_timeout = forward_timeout
        self._pending: dict[str, asyncio.Future[Answer]] = {}

    async def ask(self, owner: str, work: Work) -> Answer:
        """Forward `work` to `owner` and wait for its answer; a refusal comes back as HttpError."""
        with self._tracing.forward(work.op, owner) as call:
            answer = await self._ask(owner, work, (call.headers or {}).get("traceparent", ""))
        if isinstance(answer, Refused):
            raise answer.error()
        return answer

    async def _ask(self, owner: str, work: Work, trace: str) -> Answer:
        request_id = secrets.token_hex(8)
        future = self._pending[request_id] = asyncio.get_running_loop().create_future()
        try:
            await self._state.send(owner, Forwarded(self._state.replica_id, request_id, work, trace).to_json())
            return await self._liveness.wait(future, owner, timeout=self._forward_timeout)
        except OwnerDied:
            raise OwnerLost(
                503, "replica_unavailable", "the gateway replica running this chat stopped; retry", {"Retry-After": "1"}
            ) from None
        except OwnerSilent:
            raise HttpError(
                503, "replica_unavailable", "the gateway replica running this chat did not answer; retry", {"Retry-After": "1"}
            ) from None
        finally:
            self._pending.pop(request_id, None)

    async def tell(self, work: Abort | SocketClosed) -> bool:
        """Send a notice to the chat's owner, if another replica owns it; whether it was sent."""
        try:
            owner = await self._state.owner(work.user, work.chat)
            if owner is None or owner == self._state.replica_id:
                return False
            await self._state.send(owner, Forwarded(self._state.replica_id, secrets.token_hex(8), work).to_json())
        except SharedStateDown:
            return False
        return True

    def answered(self, reply: Reply) -> None:
        """A Reply from an owner (the inbox hands it here); one nobody waits for any more is dropped."""
        future = self._pending.get(reply.request_id)
        if future is not None and not future.done():
            future.set_result(reply.answer)


class ForwardedRequests:
    """The owner's side: work other replicas forward here, done as for a request of this replica's own."""

    def __init__(
        self, state: SharedState, chats: ChatService, metrics: GatewayMetrics, relays: Relays, gates: RemoteGate,
        *, expire: Callable[[str], None] = lambda deadline: None,
    ) -> None:
        self._state = state
        self._chats = chats
        self.metrics = metrics
        self._relays = relays
        self._gates = gates
        # Set by the drain: new work forwarded here is refused, as the transports refuse their own.
        self.draining = False
        # Takes a passed deadline another replica claimed for a chat run here (deadline_timer.py).
        self._expire_deadline = expire

    async def serve(self, asked: Forwarded) -> None:
        """Do the work, and reply to the replica that sent it (unless it is a notice)."""
        work = asked.work
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(forwarded_from=asked.sender, op=work.op, user_id=work.user)
        self.metrics.forwarded.labels("in").inc()
        tracing = self._chats.tracing
        started = tracing.serve_forwarded(asked.trace, work.op, asked.sender) if tracing.enabled else None
        answer: Answer | None = None
        try:
            answer = await self.DISPATCH[type(work)](self, work, asked)
        except Exception as exc:
            answer = self._refused(exc)
        finally:
            tracing.end_span(started, answer.code if isinstance(answer, Refused) else None)
        if answer is not None and not isinstance(work, (Abort, SocketClosed, Unfollow, Expire)):
            with contextlib.suppress(SharedStateDown):
                await self._state.send(asked.sender, Reply(asked.request_id, answer).to_json())

    def _refused(self, exc: Exception) -> Refused:
        error = refusal(exc)
        if error is None:
            log.exception("forwarded_request_failed")
            error = HttpError(500, "internal_error", "the gateway failed to handle this request")
        elif isinstance(exc, Limited):
            self.metrics.limited.labels(exc.code).inc()
        return Refused.of(error)

    def _refuse_new_work_while_draining(self) -> None:
        if self.draining:
            raise HttpError(503, "draining", "the gateway replica running this chat is shutting down; retry in a moment", {"Retry-After": "5"})

    async def _refuse_if_taken_over(self, user: str, chat: str) -> None:
        # Work that reached a busy owner late: the asker may have taken it for dead meanwhile and
        # taken the chat over (answering an approval there too). Sent on from here as well, the
        # same confirmation would reach ADK twice, and ADK runs the tool for each.
        owner = await self._state.owner(user, chat)
        if owner is not None and owner != self._state.replica_id:
            log.warning("forwarded_work_refused", reason="the chat was taken over", owner=owner)
            raise HttpError(409, "chat_moved", "another gateway replica took this chat over; retry")

    # ---- one handler per kind of work ------------------------------------------------------

    async def _submit(self, work: Submit, asked: Forwarded) -> Answer:
        self._refuse_new_work_while_draining()
        request = parse_chat_body(work.body, version_header=None, default_version=self._chats.config.chat.default_protocol)
        structlog.contextvars.bind_contextvars(chat_id=request.chat_id)
        await self._refuse_if_taken_over(work.user, request.chat_id)
        return Relayed(self._relays.open(await self._chats.submit(work.agent, work.user, request, claims=work.claims)))

    async def _resume(self, work: Resume, asked: Forwarded) -> Answer:
        return Relayed(self._relays.open(await self._chats.resume_waiting(work.agent, work.user, work.chat)))

    async def _audio(self, work: Audio, asked: Forwarded) -> Answer:
        self._refuse_new_work_while_draining()
        attachment = await self._chats.send_audio(work.agent, work.user, work.chat, work.mime, work.data, work.version)
        return Relayed(self._relays.open(attachment))

    async def _abort(self, work: Abort, asked: Forwarded) -> None:
        self._chats.abort(work.agent, work.user, work.chat)

    async def _socket_closed(self, work: SocketClosed, asked: Forwarded) -> None:
        await self._chats.socket_closed(work.agent, work.user, work.chat)

    async def _unfollow(self, work: Unfollow, asked: Forwarded) -> None:
        self._relays.unfollow(work.key)

    async def _expire(self, work: Expire, asked: Forwarded) -> None:
        self._expire_deadline(work.deadline)

    async def _gate(self, work: Gate, asked: Forwarded) -> Answer | None:
        return await self._gates.serve(work, asked)

    async def _decide(self, work: Decide, asked: Forwarded) -> Answer:
        if "chat" in work.deciders:  # an ADK confirmation (approval_desk.py): answered to ADK here
            result = await self._chats.desk_view.answer_for_approvers(
                str(work.deciders.get("agent", "")), work.user, str(work.deciders["chat"]), work.approval,
                approved=work.approved, reason=work.reason or None, deciders=list(work.deciders.get("deciders", [])),
            )
            return Decided(RUN if work.approved else Verdict.refuse("decided by approvers"), result)
        result = self._chats.desk_view.decide_for_approvers(
            user_id=work.user, session_id=work.session, approval_id=work.approval, approved=work.approved,
            reason=work.reason or None, deciders=list(work.deciders.get("deciders", [])),
        )
        return Decided(RUN if work.approved else Verdict.refuse("decided by approvers"), result)

    DISPATCH: ClassVar[Mapping[type[Work], Handler]] = MappingProxyType({
        Submit: _submit, Resume: _resume, Audio: _audio, Abort: _abort, SocketClosed: _socket_closed,
        Unfollow: _unfollow, Gate: _gate, Expire: _expire, Decide: _decide,
    })
