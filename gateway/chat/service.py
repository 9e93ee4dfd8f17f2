"""Chat turns admitted: from a validated browser request to a running turn, and back as a response to read.

`ChatService` admits one streaming response per chat at a time (a new message in a chat whose
response nobody reads any more ends that run first, as an abort would), matches the answers a
request carries to what the chat's ledger says waits (core/ledger.py), makes sure the ADK session
exists, and starts each run as a turn (core/turn.py) with its driver's task (chat/driver.py), so the run
outlives the browser request. Two kinds of approval meet here (DESIGN.md decision 3):
- native ADK confirmations end the ADK run; the person's answer starts a new run that continues
  the same assistant message;
- gateway-gated calls (tool policy, enforced by the ADK plugin, chat/gates.py) pause the run while it
  stays open upstream; the answering request re-attaches to the same turn, which carries on.
Transports and the internal listener reach this service through the cluster router
(cluster/router.py), which sends work for a chat run by another replica there instead.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from ..upstream.agents import Agent, Agents
from .answers import LOST_APPROVAL, Forbidden, Gone, pending_outputs, split_answers
from ..core.approvals import CallState, GatedCall
from .record import Chat
from ..config.schema import GatewayConfig
from ..core.browser_confirmations import NAMESPACE, BrowserCalls, handover_chunks, output_answers, plan_browser
from .confirm_timeouts import EXPIRY_RETRY, ConfirmTimeouts
from ..core.deadlines import Deadline, deadline_key
from .driver import RunDriver, RunHooks
from ..core.refusals import Refusal
from .gates import Gates
from ..core.ledger import NativeConfirmation
from ..core.limits import Limited
from ..core.chat_request import (
    ApprovalAnswer,
    ChatRequest,
    InvalidRequest,
    ToolOutput,
    TurnPlan,
    plan_turn,
)
from ..ops.metrics import GatewayMetrics
from ..core.protocol import ClientVersion, encode_chunk
from ..core.rebuild import WaitingMessage, replay, waiting_message
from .registry import ChatNotFound, Registry, TooManyChats
from .chunk_log import Feed, Reader, Response, Run
from ..ops.stopping import cancel_and_wait, within
from ..core.turn import Turn
from ..upstream.client import AdkClient, SessionConfirmations, UpstreamError
from ..upstream.runs import AgentRuns, Batches

__all__ = ["Attachment", "ChatBusy", "ChatService", "Forbidden", "Gone"]

log = structlog.get_logger("adk_gateway.chat.service")

# How long a new message waits for the previous run to wind down after its calls were cancelled.
_SETTLE_SECONDS = 10.0
# How often a new message looks again whether a relayed reader of the chat's response left.
_READER_POLL = 0.05
# How long a shutdown waits for cancelled runs to publish their last chunks, and for live sessions to close.
_CLOSE_TIMEOUT = 2.0


class ChatBusy(Refusal):
    """The chat already has a response streaming that a request reads (another tab, say); the
    client should wait for it to end."""

    status = 409
    code = "chat_busy"
    retry_after = 1


@dataclass(frozen=True)
class Attachment:
    """What a browser request reads: `response` of `run` (no run here: it runs on another replica).

    `response` counts as a reader of the run's response until the request closes it: the
    transport closes it when it stops reading, whatever stopped it.
    """

    run: Run | None
    response: Feed


def _browser_added(version: ClientVersion, answers: list[ApprovalAnswer], outputs: list[ToolOutput]) -> list[bytes]:
    """What the browser put into the message between two of its responses, as chunks for a replay
    (chat/chunk_log.py), which the AI SDK rebuilds the message from: the browser tools' outputs and, for ai 7,
    the person's answers (ai 6 has no chunk for an answer: its replay shows an answered part's
    later states, without `approval.approved`)."""
    chunks: list[dict[str, object]] = []
    if version == 7:
        for answer in answers:
            chunk: dict[str, object] = {"type": "tool-approval-response", "approvalId": answer.approval_id, "approved": answer.approved}
            if answer.reason:
                chunk["reason"] = answer.reason
            chunks.append(chunk)
    for output in outputs:
        if output.error_text is not None:
            chunks.append({"type": "tool-output-error", "toolCallId": output.tool_call_id, "errorText": output.error_text})
        else:
            chunks.append({"type": "tool-output-available", "toolCallId": output.tool_call_id, "output": output.output})
    return [encode_chunk(chunk) for chunk in chunks]


def _may_wait_unseen(chat: Chat) -> bool:
    """Whether a resume that found nothing to replay in a chat this replica remembers should ask
    ADK's session: the chat has no run (it failed to start), or its last run ended on native
    confirmations still pending here and its message is past the replay's retention."""
    return chat.run is None or (not chat.running and bool(chat.ledger.pending_native()))


def new_message_id() -> str:
    return "msg-" + secrets.token_urlsafe(12)


class ChatService:
    """Admits browser requests to a chat's runs; the chat layer's face to the transports and the cluster."""

    def __init__(
        self,
        *,
        agents: Agents,
        registry: Registry,
        metrics: GatewayMetrics,
        config: GatewayConfig,
        clock: Callable[[], float] = time.monotonic,
        new_id: Callable[[], str] = new_message_id,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._registry = registry
        self.agents = agents
        self.metrics = metrics
        self.config = config
        self._clock = clock
        self._new_id = new_id
        # The run tasks going on, and whose: each tells the cluster when its run ends.
        self._tasks: dict[asyncio.Task[None], Chat] = {}
        self._closing_reason = "This response was cancelled."
        self.runs = AgentRuns(agents, metrics, clock)
        # The plugin's side of gated calls: the cluster's remote gate and the sweeper use it.
        self.gates = Gates(registry, agents, metrics, lambda: self.config, clock)
        agents.in_use = self._carries_run
        self._hooks = RunHooks(metrics, clock, self.gates.release)
        # Told when a chat's run starts (its message id) and ends (""): the cluster router
        # records it in the shared chat directory.
        self.on_run: Callable[[Chat, str], None] | None = None
        # Confirm mode's deadlines: the cluster keeps them (cluster/deadline_timer.py), told of
        # each new one, and of each confirmation answered before its deadline (by its key).
        self.timeouts = ConfirmTimeouts(agents, wall)
        self.on_deadline: Callable[[Deadline], None] | None = None
        self.on_settled: Callable[[str], None] | None = None
        # Confirmations whose answer is going out now (True: the deadline's), by approval id.
        self._answering: dict[str, bool] = {}

    def run_changed(self, chat: Chat, message_id: str) -> None:
        if self.on_run is not None:
            self.on_run(chat, message_id)

    def reconfigure(self, config: GatewayConfig) -> None:
        """New requests follow the new config; runs under way keep the policy they started with
        (except a removed agent's: `end_agent_runs`)."""
        self.config = config
        self._registry.max_chats_per_user = config.limits.max_chats_per_user

    def _carries_run(self, client: AdkClient) -> bool:
        return any(chat.upstream is client and chat.running for chat in self._registry.chats())

    def end_agent_runs(self, agent: str, reason: str) -> int:
        """End the runs of an agent a reload removed: each ends with an error chunk saying `reason`,
        and its calls waiting for a person are released fail-closed. Returns how many."""
        ended = 0
        loop = asyncio.get_running_loop()
        for chat in self._registry.chats():
            if chat.agent == agent and chat.running and chat.driver is not None and chat.driver.task is not None:
                chat.driver.closing_reason = reason
                # After the task's first step, not now: a run admitted a moment ago has not started
                # yet, and a task cancelled before its first step never writes its response's end.
                loop.call_soon(chat.driver.task.cancel)
                ended += 1
        return ended

    # ---- admission -----------------------------------------------------------------------

    async def submit(self, agent_name: str, user_id: str, request: ChatRequest) -> Attachment:
        """Start or continue the run a request asks for, on the chat of `agent_name`.

        Raises InvalidRequest (400), Forbidden (403), ChatNotFound or UnknownAgent (404), ChatBusy
        (409), Gone (410), Limited (413, 429) or UpstreamError (502) before anything streams.
        """
        agent = self.agents.need(agent_name)
        max_messages = self.config.max_messages(agent_name)
        if request.message_count > max_messages:
            raise Limited(413, "too_many_messages", f"at most {max_messages} messages per request")
        plan = plan_turn(request)
        chat = self._chat(agent, user_id, request.chat_id)
        structlog.contextvars.bind_contextvars(session_id=chat.session_id)
        gated, native = split_answers(self._registry, chat, plan.answers, strict=plan.new_message is None)
        outputs = pending_outputs(chat, plan.outputs)
        browser = BrowserCalls(chat.ledger, agent.config.tool_policy)
        carried: list[ToolOutput] = []
        held: SessionConfirmations | None = None
        if not agent.live:
            native, carried, held = await self._browser_outputs(chat, agent, plan, native, browser)
        if native and not agent.live:
            # Strict: nothing but these answers to go on with, so one ADK lost is the request's end.
            only_native = plan.new_message is None and not (gated or outputs)
            fresh = await self._unanswered_native(chat, native, strict=only_native, held=held)
            if plan.new_message is None and not fresh and not (gated or outputs):
                if any(chat.ledger.native_timed_out(a.approval_id) for a in native):
                    return self._late_native(chat)
                # ADK 1.x runs a confirmed tool again for a replayed answer (2.13 ignores it).
                raise Gone("this approval was already answered; send a new message to go on")
            native = fresh
        if plan.new_message is None and (gated or outputs):
            return self._continue_gated_run(chat, gated, outputs)
        if plan.new_message is None and not native:
            raise InvalidRequest("nothing in the last assistant message is waiting for an answer")
        if plan.new_message is None and chat.running:
            # A run in progress here is not paused on an ADK confirmation (those end their run), so
            # these answers match nothing; they must not disturb what the run does wait for.
            raise Gone("this approval is not pending; the chat's current run waits for something else")
        if native and agent.live:
            # ADK has no confirmations in live mode, and answers sent as function responses would
            # reach the model as tool results: never forward them.
            if plan.new_message is None:
                raise InvalidRequest("this approval is not pending (ADK confirmations do not exist in live mode)")
            native = []
        if not agent.live:
            split = plan_browser(
                native, browser.by_id, new_message=plan.new_message is not None, waiting=chat.ledger.pending_native(),
            )
            if split.handover:
                return self._hand_over(chat, plan, native, split.handover, request.version)
            native = split.forward
        sent = {a.tool_call_id for a in native}
        carried = [o for o in carried if o.tool_call_id in sent]
        return await self._start_run(agent, chat, plan, gated, native, request.version, carried)

    async def _browser_outputs(
        self, chat: Chat, agent: Agent, plan: TurnPlan, native: list[ApprovalAnswer], browser: BrowserCalls,
    ) -> tuple[list[ApprovalAnswer], list[ToolOutput], SessionConfirmations | None]:
        """Confirm mode: the browser tools' outputs as answers to their ADK confirmations, with the
        request's other native answers, and the outputs they carry. ADK's session is asked (and
        returned, for the answers' check) only when the chat's ledger does not know a browser
        tool's call or approval the request names (the gateway restarted, or never ran the chat)."""
        mine = [o for o in plan.outputs if chat.ledger.call(o.tool_call_id) is None]  # not a held gate's
        held = None
        if agent.config.upstream.approvals == "confirm" and browser.need_session(mine, native):
            held = await self.runs.confirmations(chat)
            browser.originals = held.originals
        answers, carried = output_answers(mine, browser.of_output)
        if not answers:
            return native, [], held
        taken = {a.approval_id for a in answers}
        return [*answers, *(a for a in native if a.approval_id not in taken)], carried, held

    def _hand_over(
        self, chat: Chat, plan: TurnPlan, answers: list[ApprovalAnswer], calls: list[NativeConfirmation],
        version: ClientVersion,
    ) -> Attachment:
        """Approved browser tools go to the browser to run, as hold mode hands them over; ADK hears
        of the approval with their output, so nothing is sent to it and nothing runs meanwhile."""
        if chat.run is not None and chat.run.streaming:
            raise ChatBusy("a response is already streaming for this chat")
        message_id = plan.continue_message_id or self._new_id()
        run = Run(message_id, limit=self.config.chat.run_buffer_chunks, earlier=self._message_so_far(chat, message_id))
        handed = {c.approval_id for c in calls}
        run.browser_added(_browser_added(version, [a for a in answers if a.approval_id in handed], []))
        reader = run.current.reader()
        run.publish([encode_chunk(chunk) for chunk in handover_chunks(message_id, calls, version)])
        now = self._clock()
        run.end_response(now)
        chat.run = run
        for call in calls:
            pending = chat.ledger.native(call.approval_id)
            if pending is not None and pending.in_browser and pending.approved_at is None:
                self._observe_native(chat.agent, pending, "approved", now)
                chat.ledger.approve_in_browser(call.approval_id, now)
                log.info("approval_answered", approval_id=call.approval_id, tool=call.tool, outcome="approved")
        return Attachment(run, reader)

    async def _start_run(
        self, agent: Agent, chat: Chat, plan: TurnPlan, gated: list[tuple[ApprovalAnswer, GatedCall]],
        native: list[ApprovalAnswer], version: ClientVersion, carried: list[ToolOutput] | None = None, *,
        browser: bool = True,
    ) -> Attachment:
        # A confirmation is answered once: from here until the ledger records it (or the run
        # fails to start), another answer to it (the person's, the deadline's) does not go out.
        ids = [a.approval_id for a in native]
        if any(i in self._answering for i in ids):
            if browser and any(self._answering.get(i) for i in ids):
                return self._late_native(chat)  # the deadline's answer is on its way: read its outcome
            raise ChatBusy("this approval is being answered")
        self._answering.update({a.approval_id: a.timed_out for a in native})
        try:
            return await self._start_answered_run(agent, chat, plan, gated, native, version, carried)
        finally:
            for i in ids:
                self._answering.pop(i, None)

    async def _start_answered_run(
        self, agent: Agent, chat: Chat, plan: TurnPlan, gated: list[tuple[ApprovalAnswer, GatedCall]],
        native: list[ApprovalAnswer], version: ClientVersion, carried: list[ToolOutput] | None,
    ) -> Attachment:
        before = chat.run
        if before is not None and before.streaming and not await self._nobody_reads(before.current):
            raise ChatBusy("a response is already streaming for this chat")
        if chat.run is not before:
            # Another new message got in while this one waited for a relayed reader to leave.
            raise ChatBusy("a response is already streaming for this chat")
        if chat.running:
            driver = chat.driver
            assert driver is not None
            if driver.run.streaming and not driver.turn.waiting_for_person:
                # Nobody reads the response any more (the AI SDK's stop() dropped its request and
                # the run went on, `chat.on_disconnect: continue`): end the run as an abort does.
                await self._stop_unread(chat, driver)
            else:
                # The person typed instead of answering: release what the old run waits for, let it end.
                await self._settle(chat, gated)
            if chat.run is not None and chat.run.streaming:
                # Another new message got in while the old run wound down: it runs, this one waits.
                raise ChatBusy("a response is already streaming for this chat")
        run = Run(
            plan.continue_message_id or self._new_id(), limit=self.config.chat.run_buffer_chunks,
            earlier=self._message_so_far(chat, plan.continue_message_id),
        )
        run.browser_added(_browser_added(version, [a for a in native if not a.implicit and a.payload is None], carried or []))
        # Claimed, and read, before the first await, so a concurrent request for this chat sees it busy.
        chat.run = run
        reader = run.current.reader()
        structlog.contextvars.bind_contextvars(message_id=run.message_id)
        try:
            await self.runs.take_upstream(chat, agent)
            await self.runs.ensure_session(chat)
        except UpstreamError as exc:
            self.metrics.upstream_errors.labels(agent.name, exc.kind).inc()
            chat.run = None
            raise
        self._record_native_answers(chat, native)
        turn = Turn(
            run.message_id, ledger=chat.ledger, version=version, known_tool_calls=plan.known_tool_calls,
            # A rejection carrying the gateway's error (a timeout's) ends as that error, not denied.
            denied_tool_calls=[a.tool_call_id for a in native if not a.approved and a.payload is None],
            policy=agent.config.tool_policy, confirms=agent.config.confirms,
            delivered_tool_calls=[o.tool_call_id for o in carried or ()],
        )
        driver = RunDriver(turn, run, self._hooks, agent.name)
        return self._launch(chat, driver, self.runs.turn(chat, plan.new_message, native, driver.upstream_wait), reader)

    @staticmethod
    def _message_so_far(chat: Chat, message_id: str | None) -> tuple[bytes, ...] | None:
        """What a resume replays before a new run's chunks: nothing for a new message; for one
        that continues (a native confirmation answered), the message as the earlier run wrote
        it, or None if that is not here (a restart, another replica): then none is resumable."""
        if message_id is None:
            return ()
        if chat.run is None or chat.run.message_id != message_id:
            return None
        return chat.run.message()

    def _chat(self, agent: Agent, user_id: str, chat_id: str) -> Chat:
        try:
            chat = self._registry.get(agent.name, user_id, chat_id, now=self._clock())
        except TooManyChats:
            raise Limited(429, "too_many_chats", f"at most {self.config.limits.max_chats_per_user} chats per user", 60) from None
        chat.browser_left = False  # a browser is back (see socket_closed)
        return chat

    def _launch(self, chat: Chat, driver: RunDriver, batches: Batches, reader: Reader | None = None) -> Attachment:
        """Make `driver` the chat's run and start its task; the run outlives the request, which
        reads its first response through `reader` (one is taken if not given)."""
        chat.run = driver.run
        chat.driver = driver
        driver.task = asyncio.create_task(driver.drive(batches, lambda: self._closing_reason))
        # One bound callback, not a coroutine around the drive or a closure: a held run keeps them.
        self._tasks[driver.task] = chat
        driver.task.add_done_callback(self._run_done)
        self.run_changed(chat, driver.run.message_id)
        return Attachment(driver.run, reader or driver.run.current.reader())

    def _run_done(self, task: asyncio.Task[None]) -> None:
        chat = self._tasks.pop(task, None)
        if chat is not None:
            self.run_changed(chat, "")
            for deadline in self.timeouts.new_deadlines(chat):
                if self.on_deadline is not None:
                    self.on_deadline(deadline)

    def resume(self, agent: str, user_id: str, chat_id: str) -> Attachment | None:
        """The response to replay and follow for a reconnecting browser; None if there is none."""
        chat = self._registry.find(agent, user_id, chat_id)
        if chat is None or chat.run is None:
            return None
        chat.browser_left = False  # a browser is back (see socket_closed)
        if chat.running and chat.driver is not None:
            # What the run wrote while a person decides is held for the next reader: this one.
            chat.driver.apply(chat.driver.turn.resume())
        reader = chat.run.resumable(self._clock(), self.config.chat.run_retention)
        return None if reader is None else Attachment(chat.run, reader)

    async def resume_waiting(
        self, agent_name: str, user_id: str, chat_id: str, version: ClientVersion | None = None
    ) -> Attachment | None:
        """`resume`; and if this replica has no run of the chat (it restarted, never ran it, or
        forgot it), the message ADK's session says waits for the person's answers to its
        confirmations, rebuilt (rebuild.py) for a client of `version` (default: the configured
        one) and read as that message's resume. None: nothing to read."""
        attachment = self.resume(agent_name, user_id, chat_id)
        if attachment is not None:
            return attachment
        agent = self.agents.need(agent_name)
        known = self._registry.find(agent_name, user_id, chat_id)
        seen = None if known is None else known.run
        if agent.live or (known is not None and not _may_wait_unseen(known)):
            return None  # no confirmations in live mode; a run here says all there is
        try:
            # The chat's ADK session id is its chat id, under the caller's own user (registry.py).
            session = await agent.client.session(user_id, chat_id)
        except UpstreamError as exc:
            # A resume is a page's probe at load: nothing to show beats an error on every load.
            self.metrics.upstream_errors.labels(agent.name, exc.kind).inc()
            log.warning("resume_session_unreadable", kind=exc.kind, reason=str(exc))
            return None
        message = waiting_message(session)
        if message is None:
            return None
        chat = self._chat(agent, user_id, chat_id)
        if chat.run is not seen or chat.running:
            # A request of the chat got in while ADK answered: that is what a resume follows.
            return self.resume(agent_name, user_id, chat_id)
        return self._rebuilt_run(agent, chat, message, version or self.config.chat.default_protocol)

    def _rebuilt_run(self, agent: Agent, chat: Chat, message: WaitingMessage, version: ClientVersion) -> Attachment | None:
        """Make the rebuilt message the chat's last run, as if its runs had ended here: the
        answer that follows continues it, and a replay of that answer is refused."""
        now = self._clock()
        before = {c.approval_id for c in chat.ledger.pending_native()}
        rebuilt = replay(
            message, ledger=chat.ledger, now=now, version=version,
            policy=agent.config.tool_policy, confirms=agent.config.confirms,
        )
        if rebuilt is None:
            log.warning("resume_rebuild_failed", reason="the session's events did not convert")
            return None
        run = Run(rebuilt.message_id, limit=self.config.chat.run_buffer_chunks)
        for index, response in enumerate(rebuilt.responses):
            if index:
                run.next_response()
            run.browser_added([encode_chunk(chunk) for chunk in response.added])
            run.publish([encode_chunk(chunk) for chunk in response.chunks])
            run.end_response(now)
        chat.run = run
        for pending in rebuilt.pending:
            if pending.approval_id not in before:
                self.metrics.approvals_pending.labels(agent.name).inc()
            log.info("approval_rebuilt", approval_id=pending.approval_id, tool=pending.tool, message_id=run.message_id)
        reader = run.resumable(now, self.config.chat.run_retention)
        return None if reader is None else Attachment(run, reader)

    def abort(self, agent: str, user_id: str, chat_id: str) -> bool:
        """The browser stopped the response: cancel the agent run behind it. True if one was running."""
        chat = self._registry.find_session(user_id, chat_id)
        if chat is None or chat.agent != agent or not chat.running or chat.driver is None or chat.driver.task is None:
            return False
        chat.driver.aborting = True
        chat.driver.task.cancel()
        log.info("run_aborted", chat_id=chat_id)
        return True

    async def send_audio(
        self, agent_name: str, user_id: str, chat_id: str, mime_type: str, data: str, version: ClientVersion
    ) -> Attachment | None:
        """Realtime audio for the chat's live session.

        Audio may start a turn by itself (the person just speaks): then the answer streams into a
        new assistant message, returned here for the caller to follow. During a turn, audio is
        only relayed and None is returned.
        """
        agent = self.agents.need(agent_name)
        if not agent.live:
            raise InvalidRequest("audio needs an agent in live mode (upstream.mode: live)")
        chat = self._chat(agent, user_id, chat_id)
        if not chat.running:
            await self.runs.take_upstream(chat, agent)
        link = await self.runs.live_link(chat)
        blob = {"blob": {"mimeType": mime_type, "data": data}}
        if link.in_turn or chat.running:
            await link.send(blob)
            return None
        run = Run(self._new_id(), limit=self.config.chat.run_buffer_chunks)
        turn = Turn(run.message_id, ledger=chat.ledger, version=version, policy=agent.config.tool_policy)
        return self._launch(chat, RunDriver(turn, run, self._hooks, agent.name), self.runs.audio_turn(chat, blob))

    async def socket_closed(self, agent: str, user_id: str, chat_id: str) -> None:
        """The browser socket that drove this chat went away (on this replica or another).

        A live chat's session is a model connection paid for while it is open, so it is not kept
        for a browser that left; but a turn under way outlives the socket, as over `/run_sse`, so
        that a resume on a new socket reads it and an approval it waits on stays answerable: the
        session closes when that turn ends, unless a request of the chat comes first. With
        `chat.on_disconnect: cancel` the turn is cancelled (an `abort` chunk) and the session closed.
        """
        chat = self._registry.find_session(user_id, chat_id)
        if chat is None or chat.agent != agent or not self.runs.live(chat):
            return
        task = chat.driver.task if chat.running and chat.driver is not None else None
        if task is not None and self.config.chat.on_disconnect == "cancel":
            self.abort(agent, user_id, chat_id)
            await asyncio.gather(task, return_exceptions=True)
        if chat.running:
            chat.browser_left = True
            return
        await self.runs.close_live(chat)

    async def close(self, reason: str = "The gateway is shutting down.") -> None:
        """Cancel every run still going and close live sessions (shutdown)."""
        self._closing_reason = reason
        await cancel_and_wait(list(self._tasks), _CLOSE_TIMEOUT, what="runs")
        live = [self.runs.close_live(chat) for chat in self._registry.chats()]
        if live:
            await within(asyncio.gather(*live, return_exceptions=True), _CLOSE_TIMEOUT, what="live sessions")

    # ---- answers ---------------------------------------------------------------------------

    def _continue_gated_run(
        self,
        chat: Chat,
        answers: list[tuple[ApprovalAnswer, GatedCall]],
        outputs: list[tuple[ToolOutput, GatedCall]],
    ) -> Attachment:
        driver = chat.driver
        # Answers to calls of an earlier run (a new message ended it) ride along in the history, or
        # come from a tab left behind: they must not attach to the run that runs now.
        answers = [(answer, call) for answer, call in answers if chat.ledger.of_current_run(call)]
        outputs = [(output, call) for output, call in outputs if chat.ledger.of_current_run(call)]
        if driver is None or not (answers or outputs):
            raise Gone("these calls were already answered and the run has ended")
        unread = driver.run.unread()
        if unread is None and not driver.alive:
            # The run ended while nobody was attached (a deadline passed): its last words are kept.
            raise Gone("these calls were already answered and the run has ended")
        added = _browser_added(
            driver.turn.converter.version,
            [answer for answer, call in answers if call.state is CallState.AWAITING_APPROVAL and not answer.implicit],
            [output for output, call in outputs if call.state is CallState.AWAITING_OUTPUT],
        )
        if unread is None:
            driver.apply(driver.turn.attach())
            unread = driver.run.current
            # Before anything can read the new response, so no position in a replay moves.
            driver.run.browser_added(added)
        elif not unread.closed:
            # The run wrote while the person decided: the answer comes in the middle of that
            # response, where it is written (the browser that sent it finds what it has).
            driver.run.publish(added)
        attachment = Attachment(driver.run, unread.reader())
        structlog.contextvars.bind_contextvars(message_id=driver.run.message_id)
        # As one input: a replayed answer changes nothing, and if the run still waits for a person
        # the response just opened is closed rather than left empty and open.
        driver.apply(driver.turn.answer(
            [(call, answer.approved, answer.reason) for answer, call in answers],
            [(call, output.output, output.error_text) for output, call in outputs],
            self._clock(),
        ))
        return attachment

    async def _nobody_reads(self, response: Response) -> bool:
        """Whether nobody reads `response` any more. A relay to another replica's browser is given
        the time that replica takes to notice its browser left and say so (cluster/relay.py): the
        same browser's next message may well arrive before that notice does."""
        if response.read_here:
            return False
        if not response.read:
            return True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 2 * self.config.sessions.heartbeat_interval
        while response.read and not response.closed:
            if response.read_here or loop.time() >= deadline:
                return False
            await asyncio.sleep(_READER_POLL)
        return True

    async def _stop_unread(self, chat: Chat, driver: RunDriver) -> None:
        """End the run whose response nobody reads, as a WebSocket `abort` does, and wait for it:
        its response ends with `abort`, a call it had open is cancelled, its upstream request is
        closed (ADK then cancels its invocation: docs/protocol.md says what the session keeps)."""
        task = driver.task
        assert task is not None
        driver.aborting = True
        task.cancel()
        log.info("run_aborted", reason="a new message came and nobody reads the response")
        await asyncio.wait((task,), timeout=_CLOSE_TIMEOUT)
        if not task.done():
            log.warning("previous_run_stuck", reason="it did not end after it was cancelled")
        if driver.run.streaming:
            # Its task was cancelled before its first step, or is stuck: nothing else would end the
            # response, and an open response keeps the chat busy for ever.
            now = self._clock()
            driver.apply(driver.turn.abort(now))
            driver.apply(driver.turn.end(now))

    async def _settle(self, chat: Chat, answers: list[tuple[ApprovalAnswer, GatedCall]]) -> None:
        driver = chat.driver
        if driver is None or driver.task is None:
            return
        # The person did decide where an answer is not implicit; the message carrying it just never went out on its own.
        decided = [(call, answer.approved, answer.reason) for answer, call in answers if not answer.implicit]
        driver.apply(driver.turn.settle(decided, self._clock()))
        try:
            await asyncio.wait_for(asyncio.shield(driver.task), _SETTLE_SECONDS)
        except TimeoutError:
            log.warning("previous_run_cancelled", reason="it did not end after its calls were cancelled")
            driver.task.cancel()
            await asyncio.gather(driver.task, return_exceptions=True)

    def local_chats(self) -> list[Chat]:
        return self._registry.chats()

    # ---- native approval bookkeeping -----------------------------------------------------

    async def _unanswered_native(
        self, chat: Chat, answers: list[ApprovalAnswer], *, strict: bool, held: SessionConfirmations | None = None,
    ) -> list[ApprovalAnswer]:
        """The answers to native confirmations that nobody gave before and ADK still waits for.

        Answered here: left out without asking ADK. Anything else, pending here or unknown (this
        replica restarted, or never ran the chat): ADK's session says, a round trip, as only it knows
        whether it still holds the paused call. An ADK that restarted on in-memory sessions does not,
        and an answer forwarded then fails inside ADK's run; such an answer is refused (`strict`:
        the request carries nothing else to go on with) or left out (a new message, or other
        answers, ride along), and the approval is settled here as cancelled. `held`: ADK's session,
        if the caller fetched it already.
        """
        ledger = chat.ledger
        open_ = [a for a in answers if not ledger.native_answered(a.approval_id)]
        if held is None:
            held = await self.runs.confirmations(chat) if open_ else SessionConfirmations()
        lost = [a for a in open_ if a.approval_id not in held.asked and a.approval_id not in held.answered]
        if lost:
            self._lose_native(chat, lost)
            if strict:
                raise Gone(LOST_APPROVAL)
        # Not answered here meanwhile either (the deadline's answer may have gone while ADK was asked).
        fresh = [
            a for a in open_
            if a.approval_id in held.asked and a.approval_id not in held.answered and not ledger.native_answered(a.approval_id)
        ]
        # Given after the deadline, which nobody answered (the gateway was down then): the timeout's answer goes instead.
        return self.timeouts.too_late(self.agents.need(chat.agent), chat, fresh, held)

    def _lose_native(self, chat: Chat, answers: list[ApprovalAnswer]) -> None:
        now = self._clock()
        for answer in answers:
            pending = chat.ledger.answer_native(answer.approval_id)
            if pending is not None:
                self._observe_cancelled(chat.agent, pending, now)
            log.warning("native_approval_lost", approval_id=answer.approval_id, reason="not in the agent's session")

    def _record_native_answers(self, chat: Chat, answers: list[ApprovalAnswer]) -> None:
        now = self._clock()
        for answer in answers:
            if self.on_settled is not None:
                self.on_settled(deadline_key(chat.chat_id, answer.approval_id))
            if answer.timed_out:
                pending = chat.ledger.time_out_native(answer.approval_id)
                self.metrics.approval_timeouts.labels(chat.agent, answer.tool_name).inc()
                log.info("approval_timed_out", approval_id=answer.approval_id, tool=answer.tool_name, payload=answer.payload is not None)
            else:
                pending = chat.ledger.answer_native(answer.approval_id, answer.tool_call_id)
            if pending is None:
                # Unknown here (e.g. the gateway restarted): ADK still holds the paused call, so the
                # answer is forwarded anyway; ADK matches it against its own session.
                continue
            if not answer.timed_out and (answer.payload is not None or pending.awaits_output):
                self._record_browser_answer(chat.agent, pending, answer, now)
                continue
            outcome = "timeout" if answer.timed_out else "cancelled" if answer.implicit else ("approved" if answer.approved else "denied")
            self._observe_native(chat.agent, pending, outcome, now)
            log.info("approval_answered", approval_id=answer.approval_id, tool=pending.tool, outcome=outcome)

    def _record_browser_answer(self, agent: str, pending: NativeConfirmation, answer: ApprovalAnswer, now: float) -> None:
        """A browser tool's confirmation answered: by its output or error, or rejected unrun."""
        if answer.payload is None:
            self._observe_browser(agent, pending, "cancelled", now)
            return
        if pending.approval and pending.approved_at is None:
            # Approved where this replica did not see it (the part shows the approval): counted now.
            self._observe_native(agent, pending, "approved", now)
            pending.approved_at = now
        outcome = "error" if "error" in answer.payload.get(NAMESPACE, {}) else "output"
        self._observe_browser(agent, pending, outcome, now)
        log.info("browser_tool_answered", approval_id=answer.approval_id, tool=pending.tool, outcome=outcome)

    def _observe_browser(self, agent: str, confirmation: NativeConfirmation, outcome: str, now: float) -> None:
        # A browser tool's wait for its output, timed as hold mode times it.
        since = confirmation.approved_at or confirmation.asked_at or now
        self.metrics.browser_tool_wait.labels(agent, confirmation.tool, outcome).observe(now - since)

    def _observe_cancelled(self, agent: str, confirmation: NativeConfirmation, now: float) -> None:
        if confirmation.awaits_output:
            self._observe_browser(agent, confirmation, "cancelled", now)
        else:
            self._observe_native(agent, confirmation, "cancelled", now)

    def _late_native(self, chat: Chat) -> Attachment:
        """A person's answer after the gateway answered its confirmation's timeout: as a late
        answer on the blocking path, it reads what followed the timeout if nobody read it yet."""
        run = chat.run
        unread = run.unread() if run is not None else None
        if run is None or unread is None:
            raise Gone("this approval timed out and the agent went on; send a new message to go on")
        return Attachment(run, unread.reader())

    async def expire_confirmation(self, deadline: Deadline) -> float | None:
        """A confirmation's deadline passed (this replica runs the chat): answer ADK with the
        tool's `on_timeout`, unless someone answered it already. ADK's session decides what is
        still asked, and when it was. Returns when to look again (the chat is busy, ADK did not
        answer, the deadline ADK's session gives is later), or None: answered, or nothing to do."""
        agent = self.agents.get(deadline.agent)
        if agent is None or agent.live:
            return None
        try:
            chat = self._registry.find(agent.name, deadline.user, deadline.chat) or self._chat(agent, deadline.user, deadline.chat)
        except (ChatNotFound, Limited):
            return None
        decided = await self.timeouts.decide(agent, chat, deadline.approval_id, self.runs.confirmations)
        if not isinstance(decided, tuple):
            return decided
        answer, call = decided
        message_id = chat.run.message_id if chat.run is not None else None
        # The browser holds the call in the message this continues, also when the chat moved here
        # (a new message id then: the AI SDK continues its last message whatever id comes).
        known = frozenset({call.tool_call_id})
        version = chat.driver.turn.converter.version if chat.driver is not None else 6
        try:
            attachment = await self._start_run(
                agent, chat, TurnPlan(None, (answer,), (), message_id, known), [], [answer], version, browser=False,
            )
        except (ChatBusy, UpstreamError):
            return self.timeouts.wall() + EXPIRY_RETRY
        # Nobody reads it now: kept for the browser's next attach (its late answer, or a resume).
        attachment.response.close()
        return None

    def _observe_native(self, agent: str, confirmation: NativeConfirmation, outcome: str, now: float) -> None:
        self.metrics.approvals_pending.labels(agent).dec()
        self.metrics.approval_wait.labels(agent, confirmation.tool, outcome).observe(now - (confirmation.asked_at or now))

    async def forget_idle(self, idle_before: float) -> list[Chat]:
        """Drop chats idle since `idle_before`; their unanswered approvals count as cancelled."""
        gone = self._registry.expire(idle_before=idle_before)
        self.gates.forget(gone)
        now = self._clock()
        for chat in gone:
            await self.runs.close_live(chat)
            for pending in chat.ledger.pending_native():
                self._observe_cancelled(chat.agent, pending, now)
        return gone
