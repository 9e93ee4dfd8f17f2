"""Chat turns: from a validated browser request to a running upstream run, and back as chunks.

`ChatService` is the glue between the sans-IO core (messages, converter, approvals, runs) and the
upstream client. It admits one streaming response per chat at a time, makes sure the ADK session
exists, and starts each upstream run as a `RunDriver` task, so the run outlives the browser request.

Two kinds of approval meet here (DESIGN.md decision 3):
- native ADK confirmations end the ADK run; the person's answer starts a new run that continues
  the same assistant message;
- gateway-gated calls (tool policy, enforced by the ADK plugin) pause the run while it stays open
  upstream; the driver ends the browser's response so the AI SDK can answer, and the answering
  request re-attaches to the same run, which then carries on.
Transports only parse requests and follow runs; they, and internal.py for plugin requests, reach
this service through the cluster router (cluster/router.py), which sends work for a chat run by
another replica there instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import structlog

from .approvals import APPROVAL_ID_PREFIX, REFUSAL_KEY, RUN, CallState, GatedCall, Outcome, Verdict
from .config import GatewayConfig
from .converter import Converter
from .errors import Refusal
from .limits import Limited
from .live import LiveLink
from .messages import ApprovalAnswer, ChatRequest, InvalidRequest, ToolOutput, TurnPlan, confirmation_message, plan_turn
from .metrics import GatewayMetrics
from .protocol import ClientVersion, encode_chunk
from .registry import Chat, PendingApproval, Registry, TooManyChats
from .runs import Feed, Run
from .stopping import cancel_and_wait, within
from .upstream import AdkClient, UpstreamError, WaitSignal

__all__ = ["Attachment", "ChatBusy", "ChatService", "Forbidden", "Gone", "RunDriver"]

log = structlog.get_logger("adk_gateway.chats")

# How long a new message waits for the previous run to wind down after its calls were cancelled.
_SETTLE_SECONDS = 10.0
# How long a shutdown waits for cancelled runs to publish their last chunks, and for live sessions to close.
_CLOSE_TIMEOUT = 2.0


class ChatBusy(Refusal):
    """The chat already has a response streaming; the client should wait for it to end."""

    status = 409
    code = "chat_busy"
    retry_after = 1


class Forbidden(Refusal):
    """The request touches an approval that belongs to another chat."""

    status = 403
    code = "forbidden"


class Gone(Refusal):
    """The request answers an approval that is no longer pending (expired, or the gateway restarted)."""

    status = 410
    code = "approval_gone"


@dataclass(frozen=True)
class Attachment:
    """What a browser request reads: `response` of `run` (no run here: it runs on another replica)."""

    run: Run | None
    response: Feed


def new_message_id() -> str:
    return "msg-" + secrets.token_urlsafe(12)


class RunDriver:
    """One upstream run: events in through the converter, chunks out into the run's log.

    It ends the browser's response whenever the converter says the run waits for a person, and
    opens the next response when the run has more to say (the person answered, or a deadline
    passed while nobody was attached).
    """

    # A held or finished run keeps its driver: no per-instance dict.
    __slots__ = ("_count", "_holding", "_service", "aborting", "chat", "converter", "run", "task", "upstream_wait")

    def __init__(self, service: ChatService, chat: Chat, converter: Converter, run: Run) -> None:
        self._service = service
        self.chat = chat
        self.converter = converter
        self.run = run
        self.task: asyncio.Task[None] | None = None
        self._count = service.metrics.count_chunk
        self._holding = False
        # The browser asked to stop (WebSocket `abort`): the run ends with an `abort` chunk.
        self.aborting = False
        # Tells the upstream stream's idle timer when the run waits for a person.
        self.upstream_wait = WaitSignal()

    @property
    def alive(self) -> bool:
        return self.task is not None and not self.task.done()

    def _write(self, chunks: list[dict[str, Any]]) -> None:
        for chunk in chunks:
            kind = chunk["type"]
            self._count(kind)
            if kind == "data-pcm":
                self._service.metrics.audio_bytes.labels("out").inc(len(chunk["data"]["data"]) * 3 // 4)
        self.run.publish([encode_chunk(c) for c in chunks])

    def publish(self, chunks: list[dict[str, Any]]) -> None:
        """Write chunks into the current response (opening one if needed); pause if the run now waits."""
        if chunks:
            if not self.run.response_open:
                self._open_response()
            self._write(chunks)
        if self.converter.bypassed:
            for tool in self.converter.bypassed:
                self._service.metrics.policy_bypassed.labels(tool).inc()
                log.warning("policy_bypassed", tool=tool, reason="the ADK plugin did not ask about a gated tool")
            self.converter.bypassed.clear()
        if self.converter.abandoned:
            # Taken before acting: ending a call publishes again, which must find the list empty.
            abandoned, self.converter.abandoned = self.converter.abandoned, []
            for tool_call_id, code in abandoned:
                self._service.abandon(self.chat, tool_call_id, code)
        self.pause_if_waiting()

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """Apply several answers as one: the response must not pause between the first and the last."""
        self._holding = True
        try:
            yield
        finally:
            self._holding = False
            self.pause_if_waiting()

    def pause_if_waiting(self) -> None:
        """End the browser's response when the run waits for a person, so the AI SDK can answer.

        Called after every change to the converter, so it also keeps `upstream_wait` current."""
        waiting = self.converter.waiting_for_person
        self.upstream_wait.set(waiting)
        if waiting and not self._holding and self.run.response_open:
            self._write(self.converter.finish())
            self.run.end_response(waiting=True, now=self._service.now())

    def _open_response(self) -> None:
        self.run.next_response()
        self._write(self.converter.start())

    def attach(self) -> Attachment:
        """The response an answering request should read: a fresh one, or one nobody read yet."""
        response = self.run.unread()
        if response is None:
            self._open_response()
            response = self.run.current
        return Attachment(self.run, response)

    def finish(self) -> None:
        if self.run.response_open:
            self._write(self.converter.finish())
        self.run.end_response(waiting=False, now=self._service.now())
        self._service.run_changed(self.chat, "")


class ChatService:
    def __init__(
        self,
        *,
        upstream: AdkClient,
        registry: Registry,
        metrics: GatewayMetrics,
        config: GatewayConfig,
        clock: Callable[[], float] = time.monotonic,
        new_id: Callable[[], str] = new_message_id,
    ) -> None:
        self._upstream = upstream
        self._registry = registry
        self.metrics = metrics
        self.config = config
        self._clock = clock
        self._new_id = new_id
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing_reason = "This response was cancelled."
        # Told when a chat's run starts (its message id) and ends (""): the cluster router
        # records it in the shared chat directory.
        self.on_run: Callable[[Chat, str], None] | None = None

    def run_changed(self, chat: Chat, message_id: str) -> None:
        if self.on_run is not None:
            self.on_run(chat, message_id)

    def reconfigure(self, config: GatewayConfig) -> None:
        """New requests follow the new config; runs under way keep the policy they started with."""
        self.config = config
        self._registry.max_chats_per_user = config.limits.max_chats_per_user

    # ---- admission -----------------------------------------------------------------------

    async def submit(self, user_id: str, request: ChatRequest) -> Attachment:
        """Start or continue the run a request asks for.

        Raises InvalidRequest (400), Forbidden (403), ChatNotFound (404), ChatBusy (409), Gone (410),
        Limited (413, 429) or UpstreamError (502) before anything streams.
        """
        if len(request.messages) > self.config.limits.max_messages:
            raise Limited(413, "too_many_messages", f"at most {self.config.limits.max_messages} messages per request")
        plan = plan_turn(request)
        chat = self._chat(user_id, request.chat_id)
        structlog.contextvars.bind_contextvars(session_id=chat.session_id)
        gated, native = self._split_answers(chat, plan.answers, strict=plan.new_message is None)
        outputs = self._pending_outputs(chat, plan.outputs)
        if native:
            fresh = await self._unanswered_native(chat, native)
            if plan.new_message is None and not fresh and not (gated or outputs):
                # ADK 1.x runs a confirmed tool again for a replayed answer (2.13 ignores it).
                raise Gone("this approval was already answered; send a new message to go on")
            native = fresh
        if plan.new_message is None and (gated or outputs):
            return self._continue_gated_run(chat, gated, outputs)
        if plan.new_message is None and not native:
            raise InvalidRequest("nothing in the last assistant message is waiting for an answer")
        if plan.new_message is None and chat.driver is not None and chat.driver.alive:
            # A run in progress here is not paused on an ADK confirmation (those end their run), so
            # these answers match nothing; they must not disturb what the run does wait for.
            raise Gone("this approval is not pending; the chat's current run waits for something else")
        if native and self._live:
            # ADK has no confirmations in live mode, and answers sent as function responses would
            # reach the model as tool results: never forward them.
            if plan.new_message is None:
                raise InvalidRequest("this approval is not pending (ADK confirmations do not exist in live mode)")
            native = []

        if chat.run is not None and chat.run.streaming:
            raise ChatBusy("a response is already streaming for this chat")
        if chat.driver is not None and chat.driver.alive:
            # The person typed instead of answering: release what the old run waits for, let it end.
            await self._settle(chat, gated)
        run = Run(plan.continue_message_id or self._new_id(), limit=self.config.chat.run_buffer_chunks)
        # Claimed before the first await, so a concurrent request for this chat sees it busy.
        chat.run = run
        structlog.contextvars.bind_contextvars(message_id=run.message_id)
        try:
            if not chat.session_ready:
                await self._upstream.ensure_session(user_id, chat.session_id)
                chat.session_ready = True
        except UpstreamError as exc:
            self.metrics.upstream_errors.labels(exc.kind).inc()
            chat.run = None
            raise
        self._record_native_answers(chat, native)
        converter = Converter(
            run.message_id,
            version=request.version,
            known_tool_calls=plan.known_tool_calls,
            denied_tool_calls=frozenset(a.tool_call_id for a in native if not a.approved),
            policy=self.config.tool_policy,
        )
        return self._launch(RunDriver(self, chat, converter, run), lambda d: self._drive(d, plan, native))

    def _chat(self, user_id: str, chat_id: str) -> Chat:
        try:
            return self._registry.get(user_id, chat_id, now=self._clock())
        except TooManyChats:
            raise Limited(429, "too_many_chats", f"at most {self.config.limits.max_chats_per_user} chats per user", 60) from None

    def _launch(self, driver: RunDriver, work: Callable[[RunDriver], Any]) -> Attachment:
        """Make `driver` the chat's run and start its task; the run outlives the request."""
        driver.chat.run = driver.run
        driver.chat.driver = driver
        driver.task = asyncio.create_task(work(driver))
        self._tasks.add(driver.task)
        driver.task.add_done_callback(self._tasks.discard)
        self.run_changed(driver.chat, driver.run.message_id)
        return Attachment(driver.run, driver.run.current)

    def resume(self, user_id: str, chat_id: str) -> Attachment | None:
        """The response to replay and follow for a reconnecting browser; None if there is none."""
        chat = self._registry.find(user_id, chat_id)
        if chat is None or chat.run is None:
            return None
        response = chat.run.resumable(self._clock(), self.config.chat.run_retention)
        return None if response is None else Attachment(chat.run, response)

    def now(self) -> float:
        return self._clock()

    def abort(self, user_id: str, chat_id: str) -> bool:
        """The browser stopped the response: cancel the agent run behind it. True if one was running."""
        chat = self._registry.find_session(user_id, chat_id)
        if chat is None or chat.driver is None or not chat.driver.alive:
            return False
        chat.driver.aborting = True
        assert chat.driver.task is not None
        chat.driver.task.cancel()
        log.info("run_aborted", chat_id=chat_id)
        return True

    @property
    def _live(self) -> bool:
        return self.config.upstream.mode == "live"

    async def send_audio(self, user_id: str, chat_id: str, mime_type: str, data: str, version: ClientVersion) -> Attachment | None:
        """Realtime audio for the chat's live session.

        Audio may start a turn by itself (the person just speaks): then the answer streams into a
        new assistant message, returned here for the caller to follow. During a turn, audio is
        only relayed and None is returned.
        """
        if not self._live:
            raise InvalidRequest("audio needs an agent in live mode (upstream.mode: live)")
        chat = self._chat(user_id, chat_id)
        link = await self._live_link(chat)
        blob = {"blob": {"mimeType": mime_type, "data": data}}
        if link.in_turn or (chat.driver is not None and chat.driver.alive):
            await link.send(blob)
            return None
        run = Run(self._new_id(), limit=self.config.chat.run_buffer_chunks)
        converter = Converter(run.message_id, version=version, policy=self.config.tool_policy)
        return self._launch(RunDriver(self, chat, converter, run), lambda d: self._drive_audio_turn(d, blob))

    async def _drive_audio_turn(self, driver: RunDriver, blob: dict[str, Any]) -> None:
        driver.publish(driver.converter.start())
        try:
            link = await self._live_link(driver.chat)
            async for event in link.turn(blob):
                driver.publish(driver.converter.feed(event))
        except UpstreamError as exc:
            self.metrics.upstream_errors.labels(exc.kind).inc()
            driver.publish(driver.converter.error(f"The agent service failed: {exc}"))
        finally:
            driver.finish()

    async def socket_closed(self, user_id: str, chat_id: str) -> None:
        """The browser socket that drove this chat went away: its live session goes with it."""
        chat = self._registry.find_session(user_id, chat_id)
        if chat is not None:
            await self._close_live(chat)

    async def close(self, reason: str = "The gateway is shutting down.") -> None:
        """Cancel every run still going and close live sessions (shutdown)."""
        self._closing_reason = reason
        await cancel_and_wait(self._tasks, _CLOSE_TIMEOUT, what="runs")
        live = [self._close_live(chat) for chat in self._registry.chats()]
        if live:
            await within(asyncio.gather(*live, return_exceptions=True), _CLOSE_TIMEOUT, what="live sessions")

    def _split_answers(
        self, chat: Chat, answers: tuple[ApprovalAnswer, ...], *, strict: bool
    ) -> tuple[list[tuple[ApprovalAnswer, GatedCall]], list[ApprovalAnswer]]:
        """Answers to gateway-gated calls (with their call) and to native ADK confirmations.

        `strict`: the request only answers, so an answer to an unknown gateway approval is an error;
        alongside a new message such leftovers in the history are simply stale.
        """
        gated: list[tuple[ApprovalAnswer, GatedCall]] = []
        native: list[ApprovalAnswer] = []
        for answer in answers:
            call = self._registry.call(answer.approval_id)
            if call is None:
                if answer.approval_id.startswith(APPROVAL_ID_PREFIX):
                    if not strict:
                        continue
                    raise Gone(
                        "this approval is no longer pending (it expired or the gateway restarted); "
                        "send a new message to try again"
                    )
                native.append(answer)
                continue
            if call.user_id != chat.user_id or call.chat_id != chat.chat_id:
                log.warning("approval_of_another_chat", approval_id=answer.approval_id, owner_chat=call.chat_id)
                raise Forbidden("this approval belongs to another chat")
            gated.append((answer, call))
        return gated, native

    def _pending_outputs(self, chat: Chat, outputs: tuple[ToolOutput, ...]) -> list[tuple[ToolOutput, GatedCall]]:
        found = []
        for output in outputs:
            call = self._registry.call_for_tool_call(chat.user_id, chat.session_id, output.tool_call_id)
            # Outputs of server tools ride along in the history too; only browser delegates count.
            # An abandoned call's output is too late for the tool, but the request still reads what
            # became of it (the plugin's error and the model's words).
            if call is not None and call.runs_in_browser and (
                call.state is CallState.AWAITING_OUTPUT
                or call.outcome in (Outcome.OUTPUT, Outcome.OUTPUT_ERROR, Outcome.ABANDONED)
            ):
                found.append((output, call))
        return found

    def _continue_gated_run(
        self,
        chat: Chat,
        answers: list[tuple[ApprovalAnswer, GatedCall]],
        outputs: list[tuple[ToolOutput, GatedCall]],
    ) -> Attachment:
        driver = chat.driver
        if driver is None:
            raise Gone("these calls were already answered and the run has ended")
        if driver.alive:
            attachment = driver.attach()
        else:
            # The run ended while nobody was attached (a deadline passed): its last words are kept.
            unread = driver.run.unread()
            if unread is None:
                raise Gone("these calls were already answered and the run has ended")
            attachment = Attachment(driver.run, unread)
        structlog.contextvars.bind_contextvars(message_id=driver.run.message_id)
        now = self._clock()
        # Holding also covers a replayed answer, which changes nothing: if the run still waits for
        # a person, the response it opened is closed rather than left empty and open.
        with driver.holding():
            for answer, call in answers:
                self._transition(call, lambda c: c.decide(answer.approved, now, answer.reason))
            for output, call in outputs:
                self._transition(call, lambda c: c.deliver_output(output.output, output.error_text))
        return attachment

    async def _settle(self, chat: Chat, answers: list[tuple[ApprovalAnswer, GatedCall]]) -> None:
        now = self._clock()
        for answer, call in answers:
            if not answer.implicit:
                # The person did decide; the message carrying it just never went out on its own.
                self._transition(call, lambda c: c.decide(answer.approved, now, answer.reason))
        for call in self._registry.calls_of(chat.user_id, chat.chat_id):
            self._transition(call, lambda c: c.cancel("the user sent a new message instead of answering"))
        driver = chat.driver
        if driver is None or driver.task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(driver.task), _SETTLE_SECONDS)
        except TimeoutError:
            log.warning("previous_run_cancelled", reason="it did not end after its calls were cancelled")
            driver.task.cancel()
            await asyncio.gather(driver.task, return_exceptions=True)

    # ---- gated calls (the plugin's side) ---------------------------------------------------

    def local_chats(self) -> list[Chat]:
        return self._registry.chats()

    def runs_here(self, user_id: str, session_id: str) -> bool:
        """Whether this process is running the chat behind an ADK session right now."""
        chat = self._registry.find_session(user_id, session_id)
        return chat is not None and chat.driver is not None and chat.driver.alive

    def open_gate(
        self, *, user_id: str, session_id: str, tool_call_id: str, tool: str, args: dict[str, Any], announce: bool = True
    ) -> GatedCall | Verdict:
        """The plugin asks about a call: a stored call to wait on, or an immediate verdict.

        With `announce` false the browser is not told yet: the caller records the call somewhere
        first, then calls `announce`.
        """
        policy = self.config.tool_policy(tool)
        if not policy.gated:
            return RUN
        existing = self._registry.call_for_tool_call(user_id, session_id, tool_call_id)
        if existing is not None:
            return existing
        chat = self._registry.find_session(user_id, session_id)
        if chat is None or chat.driver is None or not chat.driver.alive:
            return Verdict(
                run=False, reason="no_browser",
                response={
                    "error": "No browser is attached to this session, so nobody can answer; the call was not run.",
                    REFUSAL_KEY: "no_browser",
                },
            )
        waiting = sum(1 for c in self._registry.calls_of(user_id, chat.chat_id) if not c.released)
        if waiting >= self.config.limits.max_pending_approvals_per_chat:
            return Verdict(
                run=False, reason="too_many_pending",
                response={
                    "error": "Too many tool calls are already waiting for the user in this chat; the call was not run.",
                    REFUSAL_KEY: "too_many_pending",
                },
            )
        call = self._registry.add_call(
            GatedCall.open(
                user_id=user_id, chat_id=chat.chat_id, session_id=session_id, tool_call_id=tool_call_id,
                tool=tool, args=args, policy=policy, now=self._clock(),
            )
        )
        if call.state is CallState.AWAITING_APPROVAL:
            self.metrics.approvals_pending.inc()
        log.info("gate_opened", approval_id=call.id, tool=tool, tool_call_id=tool_call_id, state=call.state.value)
        if announce:
            self.announce(call)
        return call

    def announce(self, call: GatedCall) -> None:
        """Show the call to the browser (once), asking for approval if it needs one."""
        chat = self._registry.find_session(call.user_id, call.session_id)
        if chat is None or chat.driver is None or not chat.driver.alive or call.released:
            return
        if chat.driver.converter.gate_announced(call.tool_call_id):
            return
        chat.driver.publish(chat.driver.converter.gate_opened(call))

    def cancel_call(self, call: GatedCall, why: str) -> None:
        self._transition(call, lambda c: c.cancel(why))

    def abandon(self, chat: Chat, tool_call_id: str, code: str | None) -> None:
        """ADK answered an announced call that no verdict released: the plugin stopped waiting
        (`code`: its refusal code, None from a plugin that does not mark its refusals)."""
        call = self._registry.call_for_tool_call(chat.user_id, chat.session_id, tool_call_id)
        if call is None:
            return
        if self._transition(call, lambda c: c.abandon(code)):
            log.warning("gated_call_abandoned", approval_id=call.id, tool=call.tool, reason=code)

    async def wait(self, call: GatedCall) -> Verdict:
        return await self._registry.wait(call)

    def expire_due(self) -> int:
        """Apply deadlines (the sweeper calls this); returns how many calls timed out."""
        now = self._clock()
        expired = 0
        for call in self._registry.open_calls():
            if now >= call.deadline:
                expired += self._transition(call, lambda c: c.expire(now))
        return expired

    def _transition(self, call: GatedCall, change: Callable[[GatedCall], bool]) -> bool:
        """Apply one change to a call and carry out its consequences: metrics, chunks, verdict."""
        before, since = call.state, call.waiting_since
        if not change(call):
            return False
        now = self._clock()
        waited = now - since
        tool = call.tool
        if before is CallState.AWAITING_APPROVAL:
            self.metrics.approvals_pending.dec()
            outcome = call.outcome.value if call.outcome else ("approved" if call.approved else "denied")
            self.metrics.approval_wait.labels(tool, outcome).observe(waited)
            if call.outcome is Outcome.TIMEOUT:
                self.metrics.approval_timeouts.labels(tool).inc()
        elif before is CallState.AWAITING_OUTPUT and call.released:
            outcome = {Outcome.OUTPUT: "output", Outcome.OUTPUT_ERROR: "error"}.get(call.outcome, call.outcome.value)  # type: ignore[union-attr,arg-type]
            self.metrics.browser_tool_wait.labels(tool, outcome).observe(waited)
        log.info(
            "gate_changed", approval_id=call.id, tool=tool, state=call.state.value,
            outcome=call.outcome.value if call.outcome else None, waited_s=round(waited, 3),
        )
        chat = self._registry.find_session(call.user_id, call.session_id)
        if chat is not None and chat.driver is not None and chat.driver.alive:
            chat.driver.publish(chat.driver.converter.gate_changed(call))
        if call.released:
            self._registry.release(call)
        return True

    # ---- the run task --------------------------------------------------------------------

    async def _drive(self, driver: RunDriver, plan: TurnPlan, native: list[ApprovalAnswer]) -> None:
        chat, converter = driver.chat, driver.converter
        driver.publish(converter.start())
        outcome = "completed"
        try:
            if native and plan.new_message is not None:
                # The person typed instead of answering: settle ADK's paused calls first, out of sight.
                await self._drain(chat, confirmation_message(native))
            message = plan.new_message if plan.new_message is not None else confirmation_message(native)
            del plan, native  # a held run keeps no request
            batches = self._live_events(chat, message) if self._live else self._events(chat, message)
            del message
            feed, publish = converter.feed, driver.publish
            async for batch in batches:
                # One publish per upstream read: one encode list, one wake-up of the followers.
                chunks: list[dict[str, Any]] = []
                # Only an open gate lets an event make the run wait (feed opens none): else no check.
                gated = converter.gates_open
                try:
                    for event in batch:
                        chunks += feed(event)
                        if gated and converter.waiting_for_person:
                            # The response ends right after this event's chunks, as if fed alone.
                            done, chunks = chunks, []
                            publish(done)
                finally:
                    # Also when feed fails: the chunks of the events before still go out.
                    publish(chunks)
                batch = chunks = event = None  # type: ignore[assignment]  # a held run keeps no event
            if converter.failed:
                self.metrics.upstream_errors.labels("run_error").inc()
        except UpstreamError as exc:
            self.metrics.upstream_errors.labels(exc.kind).inc()
            log.warning("upstream_failed", kind=exc.kind, status=exc.status, reason=str(exc))
            driver.publish(converter.error(f"The agent service failed: {exc}"))
        except asyncio.CancelledError:
            outcome = "cancelled"
            driver.publish(converter.abort() if driver.aborting else converter.error(self._closing_reason))
            raise
        except Exception:
            # A bug here must not leave the browser hanging on an open stream.
            log.exception("run_crashed")
            driver.publish(converter.error("The gateway failed while streaming this response."))
        finally:
            for call in self._registry.calls_of(chat.user_id, chat.chat_id):
                self._transition(call, lambda c: c.cancel("the agent run ended"))
            driver.finish()
            self._remember_native_approvals(chat, converter)
            if converter.failed and outcome != "cancelled":
                outcome = "error"
            elif converter.approvals:
                outcome = "waiting"
            self.metrics.runs.labels(outcome).inc()
            driver.run.finished_at = self._clock()
            log.info("run_finished", outcome=outcome)

    async def _events(self, chat: Chat, message: dict[str, Any]) -> AsyncIterator[Iterable[dict[str, Any]]]:
        """The run's events, a list per upstream read, re-creating the ADK session once if the
        upstream lost it (a restart)."""
        started = self._clock()
        first = True
        for attempt in (1, 2):
            try:
                async for batch in self._upstream.run_sse_batches(
                    user_id=chat.user_id, session_id=chat.session_id, new_message=message,
                    wait=chat.driver.upstream_wait if chat.driver is not None else None,
                ):
                    if first:
                        self.metrics.upstream_first_event.observe(self._clock() - started)
                        first = False
                        message = {}  # never sent again once events came: a held run keeps no message
                    yield batch
                    batch = None  # type: ignore[assignment]  # a held run keeps no spent batch
                return
            except UpstreamError as exc:
                if exc.kind != "session_missing" or attempt == 2 or not first:
                    raise
                self.metrics.upstream_errors.labels(exc.kind).inc()
                log.info("session_recreated", reason="upstream lost the session")
                chat.session_ready = False
                await self._upstream.ensure_session(chat.user_id, chat.session_id)
                chat.session_ready = True

    async def _live_events(self, chat: Chat, message: dict[str, Any] | None) -> AsyncIterator[Iterable[dict[str, Any]]]:
        """One live turn's events, a list per wake-up; `message` is the user's content (None: the
        turn is already under way)."""
        link = await self._live_link(chat)
        started = self._clock()
        first = True
        async for batch in link.turn_batches({"content": message} if message is not None else None):
            if first:
                self.metrics.upstream_first_event.observe(self._clock() - started)
                first = False
            yield batch

    async def _live_link(self, chat: Chat) -> LiveLink:
        if chat.live is not None and chat.live.alive:
            return chat.live
        if not chat.session_ready:
            await self._upstream.ensure_session(chat.user_id, chat.session_id)
            chat.session_ready = True
        connection = await self._upstream.open_live(
            user_id=chat.user_id, session_id=chat.session_id, modalities=list(self.config.upstream.live_modalities)
        )
        self.metrics.live_sessions.inc()
        chat.live = LiveLink(connection, on_closed=self.metrics.live_sessions.dec)
        log.info("live_session_opened")
        return chat.live

    async def _close_live(self, chat: Chat) -> None:
        link, chat.live = chat.live, None
        if link is not None:
            await link.close()
            log.info("live_session_closed", dropped_events=link.dropped)

    async def _drain(self, chat: Chat, message: dict[str, Any]) -> None:
        async for batch in self._events(chat, message):
            for event in batch:
                if "error" in event and "author" not in event:
                    log.warning("implicit_rejection_failed", reason=str(event.get("error")))

    # ---- native approval bookkeeping -----------------------------------------------------

    async def _unanswered_native(self, chat: Chat, answers: list[ApprovalAnswer]) -> list[ApprovalAnswer]:
        """The answers to native confirmations that nobody gave before.

        Known here: pending (asked, not answered) or answered. Unknown (this replica restarted, or
        never ran the chat): ADK's session says, by the confirmation responses it holds; asked only
        then, as it costs a round trip.
        """
        unknown = [a for a in answers if a.approval_id not in chat.pending and a.approval_id not in chat.answered_native]
        given = await self._upstream.answered_confirmations(chat.user_id, chat.session_id) if unknown else set()
        return [
            a for a in answers
            if a.approval_id in chat.pending or (a.approval_id not in chat.answered_native and a.approval_id not in given)
        ]

    def _record_native_answers(self, chat: Chat, answers: list[ApprovalAnswer]) -> None:
        now = self._clock()
        for answer in answers:
            chat.remember_answered(answer.approval_id)
            pending = chat.pending.pop(answer.approval_id, None)
            if pending is None:
                # Unknown here (e.g. the gateway restarted): ADK still holds the paused call, so the
                # answer is forwarded anyway; ADK matches it against its own session.
                continue
            outcome = "cancelled" if answer.implicit else ("approved" if answer.approved else "denied")
            self.metrics.approvals_pending.dec()
            self.metrics.approval_wait.labels(pending.tool_name, outcome).observe(now - pending.requested_at)
            log.info("approval_answered", approval_id=answer.approval_id, tool=pending.tool_name, outcome=outcome)

    def _remember_native_approvals(self, chat: Chat, converter: Converter) -> None:
        now = self._clock()
        for request in converter.approvals:
            if request.approval_id in chat.pending:
                continue
            chat.pending[request.approval_id] = PendingApproval(
                request.approval_id, request.tool_call_id, request.tool_name, now
            )
            self.metrics.approvals_pending.inc()
            log.info("approval_requested", approval_id=request.approval_id, tool=request.tool_name)

    async def forget_idle(self, idle_before: float) -> list[Chat]:
        """Drop chats idle since `idle_before`; their unanswered approvals count as cancelled."""
        gone = self._registry.expire(idle_before=idle_before)
        now = self._clock()
        for chat in gone:
            await self._close_live(chat)
            for pending in chat.pending.values():
                self.metrics.approvals_pending.dec()
                self.metrics.approval_wait.labels(pending.tool_name, "cancelled").observe(now - pending.requested_at)
        return gone
