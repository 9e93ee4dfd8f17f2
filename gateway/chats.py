"""Chat turns: from a validated browser request to a running upstream run, and back as chunks.

`ChatService` is the glue between the sans-IO core (messages, converter, runs) and the upstream
client. It admits one streaming response per chat at a time, makes sure the ADK session exists,
starts the run as its own task (so it outlives the browser request), feeds upstream events through
the converter into the run's log, and keeps the approval bookkeeping and metrics.
Transports (SSE now, WebSocket later) only parse requests and follow runs.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import structlog

from .config import ChatConfig
from .converter import Converter
from .messages import ChatRequest, TurnPlan, confirmation_message, plan_turn
from .metrics import GatewayMetrics
from .protocol import encode_chunk
from .registry import Chat, PendingApproval, Registry
from .runs import Run
from .upstream import AdkClient, UpstreamError

__all__ = ["Attachment", "ChatBusy", "ChatService"]

log = structlog.get_logger("adk_gateway.chats")


class ChatBusy(Exception):
    """The chat already has a response streaming; the client should wait for it to end."""


@dataclass(frozen=True)
class Attachment:
    """Where a browser request reads its response: run `run`, response `index`."""

    run: Run
    index: int


def new_message_id() -> str:
    return "msg-" + secrets.token_urlsafe(12)


class ChatService:
    def __init__(
        self,
        *,
        upstream: AdkClient,
        registry: Registry,
        metrics: GatewayMetrics,
        config: ChatConfig,
        clock: Callable[[], float] = time.monotonic,
        new_id: Callable[[], str] = new_message_id,
    ) -> None:
        self._upstream = upstream
        self._registry = registry
        self._metrics = metrics
        self._config = config
        self._clock = clock
        self._new_id = new_id
        self._tasks: set[asyncio.Task[None]] = set()

    # ---- admission -----------------------------------------------------------------------

    async def submit(self, user_id: str, request: ChatRequest) -> Attachment:
        """Start the run a request asks for.

        Raises InvalidRequest (400), ChatBusy (409) or UpstreamError (502) before anything streams.
        """
        plan = plan_turn(request)
        chat = self._registry.get(user_id, request.chat_id, now=self._clock())
        if chat.run is not None and chat.run.streaming:
            raise ChatBusy("a response is already streaming for this chat")
        run = Run(plan.continue_message_id or self._new_id(), limit=self._config.run_buffer_chunks)
        # Claimed before the first await, so a concurrent request for this chat sees it busy.
        chat.run = run
        structlog.contextvars.bind_contextvars(session_id=chat.session_id, message_id=run.message_id)
        try:
            if not chat.session_ready:
                await self._upstream.ensure_session(user_id, chat.session_id)
                chat.session_ready = True
        except UpstreamError as exc:
            self._metrics.upstream_errors.labels(exc.kind).inc()
            chat.run = None
            raise
        self._record_answers(chat, plan)
        converter = Converter(
            run.message_id,
            version=request.version,
            known_tool_calls=plan.known_tool_calls,
            denied_tool_calls=plan.denied_tool_calls,
        )
        task = asyncio.create_task(self._drive(chat, run, converter, plan))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return Attachment(run, run.response_index)

    def resume(self, user_id: str, chat_id: str) -> Attachment | None:
        """The response still being written for this chat, to replay and follow; None if idle."""
        chat = self._registry.find(user_id, chat_id)
        if chat is None or chat.run is None:
            return None
        index = chat.run.resumable()
        return None if index is None else Attachment(chat.run, index)

    async def close(self) -> None:
        """Cancel every run still going (shutdown)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # ---- the run task --------------------------------------------------------------------

    async def _drive(self, chat: Chat, run: Run, converter: Converter, plan: TurnPlan) -> None:
        publish = self._publisher(run)
        publish(converter.start())
        outcome = "completed"
        try:
            if plan.answers and plan.new_message is not None:
                # The person typed instead of answering: settle ADK's paused calls first, out of sight.
                await self._drain(chat, confirmation_message(plan.answers))
            message = plan.new_message if plan.new_message is not None else confirmation_message(plan.answers)
            async for event in self._events(chat, message):
                publish(converter.feed(event))
            if converter.failed:
                self._metrics.upstream_errors.labels("run_error").inc()
        except UpstreamError as exc:
            self._metrics.upstream_errors.labels(exc.kind).inc()
            log.warning("upstream_failed", kind=exc.kind, status=exc.status, reason=str(exc))
            publish(converter.error(f"The agent service failed: {exc}"))
        except asyncio.CancelledError:
            outcome = "cancelled"
            publish(converter.error("The gateway is shutting down."))
            raise
        except Exception:
            # A bug here must not leave the browser hanging on an open stream.
            log.exception("run_crashed")
            publish(converter.error("The gateway failed while streaming this response."))
        finally:
            publish(converter.finish())
            waiting = bool(converter.approvals)
            self._remember_approvals(chat, converter)
            if converter.failed:
                outcome = "error"
            elif waiting:
                outcome = "waiting"
            self._metrics.runs.labels(outcome).inc()
            # A native confirmation ends ADK's run: the answer starts a new run, so this one is done.
            run.end_response(waiting=False)
            run.finished_at = self._clock()
            log.info("run_finished", outcome=outcome, approvals=len(converter.approvals))

    async def _events(self, chat: Chat, message: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """The run's events, re-creating the ADK session once if the upstream lost it (a restart)."""
        started = self._clock()
        first = True
        for attempt in (1, 2):
            try:
                async for event in self._upstream.run_sse(
                    user_id=chat.user_id, session_id=chat.session_id, new_message=message
                ):
                    if first:
                        self._metrics.upstream_first_event.observe(self._clock() - started)
                        first = False
                    yield event
                return
            except UpstreamError as exc:
                if exc.kind != "session_missing" or attempt == 2:
                    raise
                self._metrics.upstream_errors.labels(exc.kind).inc()
                log.info("session_recreated", reason="upstream lost the session")
                chat.session_ready = False
                await self._upstream.ensure_session(chat.user_id, chat.session_id)
                chat.session_ready = True

    async def _drain(self, chat: Chat, message: dict[str, Any]) -> None:
        async for event in self._events(chat, message):
            if "error" in event and "author" not in event:
                log.warning("implicit_rejection_failed", reason=str(event.get("error")))

    def _publisher(self, run: Run) -> Callable[[list[dict[str, Any]]], None]:
        count = self._metrics.count_chunk

        def publish(chunks: list[dict[str, Any]]) -> None:
            if chunks:
                for chunk in chunks:
                    count(chunk["type"])
                run.publish([encode_chunk(c) for c in chunks])

        return publish

    # ---- approval bookkeeping ------------------------------------------------------------

    def _record_answers(self, chat: Chat, plan: TurnPlan) -> None:
        now = self._clock()
        for answer in plan.answers:
            pending = chat.pending.pop(answer.approval_id, None)
            if pending is None:
                # Unknown here (e.g. the gateway restarted): ADK still holds the paused call, so the
                # answer is forwarded anyway; ADK matches it against its own session.
                continue
            outcome = "cancelled" if answer.implicit else ("approved" if answer.approved else "denied")
            self._metrics.approvals_pending.dec()
            self._metrics.approval_wait.labels(pending.tool_name, outcome).observe(now - pending.requested_at)
            log.info("approval_answered", approval_id=answer.approval_id, tool=pending.tool_name, outcome=outcome)

    def _remember_approvals(self, chat: Chat, converter: Converter) -> None:
        now = self._clock()
        for request in converter.approvals:
            if request.approval_id in chat.pending:
                continue
            chat.pending[request.approval_id] = PendingApproval(
                request.approval_id, request.tool_call_id, request.tool_name, now
            )
            self._metrics.approvals_pending.inc()
            log.info("approval_requested", approval_id=request.approval_id, tool=request.tool_name)

    def forget_idle(self, idle_before: float) -> int:
        """Drop chats idle since `idle_before`; their unanswered approvals count as cancelled."""
        gone = self._registry.expire(idle_before=idle_before)
        now = self._clock()
        for chat in gone:
            for pending in chat.pending.values():
                self._metrics.approvals_pending.dec()
                self._metrics.approval_wait.labels(pending.tool_name, "cancelled").observe(now - pending.requested_at)
        return len(gone)
