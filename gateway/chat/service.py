"""Chat turns admitted: from a validated browser request to a running turn, and back as a response to read.

`ChatService` admits one streaming response per chat at a time (a new message in a chat whose
response nobody reads any more ends that run first, as an abort would), matches the answers a
request carries to what the chat's ledger says waits (core/ledger.py), makes sure the ADK session
exists, and starts each run through the chat (chat/record.py, the only caller of the chat's
machine, core/chat_machine.py) with its task, so the run outlives the browser request. Two kinds
of approval meet here (DESIGN.md decision 3):
- native ADK confirmations end the ADK run; the person's answer starts a new run that continues
  the same assistant message;
- gateway-gated calls (tool policy, enforced by the ADK plugin, chat/gates.py) pause the run while it
  stays open upstream; the answering request re-attaches to the same turn, which carries on.
Transports and the internal listener reach this service through the cluster router
(cluster/router.py), which sends work for a chat run by another replica there instead.

The service holds its parts, each given what it needs: the native confirmations' bookkeeping
(chat/confirmations.py), the answers to gated calls (chat/gated_answers.py), resumes
(chat/resume.py) and the run tasks, with every way a run ends early (chat/run_tasks.py); and the
chats' two faces to the cluster's approvals: the plugin's gated calls (chat/gates.py, the remote
gate's port) and the approval desk's view (chat/desk_view.py).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from typing import Any

import structlog

from ..config.schema import GatewayConfig
from ..core.approvals import GatedCall
from ..core.browser_confirmations import BrowserCalls, plan_browser
from ..core.chat_request import ApprovalAnswer, ChatRequest, InvalidRequest, ToolOutput, TurnPlan, plan_turn
from ..core.deadlines import Deadline
from ..core.limits import Limited
from ..core.protocol import ClientVersion
from ..core.chat_events import AnswersGoing, AnswersSent, BrowserAsked, RunDropped, RunStarts
from ..core.chat_outputs import Admission
from ..ops.metrics import GatewayMetrics
from ..ops.stopping import within
from ..ops.tracing import Tracing
from ..upstream.agents import Agent, Agents
from ..upstream.client import AdkClient, SessionConfirmations, UpstreamError
from ..upstream.idle_reader import WaitSignal
from .agent_runs import AgentRuns
from .answers import Forbidden, Gone, pending_outputs, split_answers
from .attachment import Attachment, ChatBusy, browser_added, message_so_far
from .chunk_log import Run
from .confirm_timeouts import ConfirmTimeouts
from ..approvals.reports import Notices
from .confirmations import NativeConfirmations
from .desk_view import DeskView
from .gated_answers import continue_gated_run
from .gates import Gates
from .gateway_answers import GatewayAnswers
from .approver_waits import ApproverWaits
from .kept_states import KeptStates
from .live_chats import LiveChats
from .ports import NO_DEADLINES, NO_RUN_WATCHER, DeadlineQueue, RunWatcher, attached
from .record import Chat, RunHooks
from .registry import ChatNotFound, Registry, TooManyChats
from .resume import Resumes
from .run_tasks import RunTasks

__all__ = ["Attachment", "ChatBusy", "ChatService", "Forbidden", "Gone"]

log = structlog.get_logger("adk_gateway.chat.service")

# How long a shutdown waits for live sessions to close.
_CLOSE_TIMEOUT = 2.0


def new_message_id() -> str:
    return "msg-" + secrets.token_urlsafe(12)


class ChatService:
    """Admits browser requests to a chat's runs; the chat layer's face to the transports and the
    cluster (to its approval desk through `desk_view`, chat/desk_view.py; to its remote gate
    through `gates`, chat/gates.py)."""

    def __init__(
        self, *, agents: Agents, registry: Registry, metrics: GatewayMetrics, config: GatewayConfig,
        clock: Callable[[], float] = time.monotonic, new_id: Callable[[], str] = new_message_id,
        wall: Callable[[], float] = time.time, tracing: Tracing | None = None,
    ) -> None:
        # The gateway's spans (ops/tracing.py); the cluster's forwarding uses them too.
        self.tracing = tracing = tracing or Tracing.off()
        self._registry = registry
        self.agents = agents
        self.metrics = metrics
        self.config = config
        self._clock = clock
        self._new_id = new_id
        self.runs = AgentRuns(agents, metrics, clock)
        # Each approval's start and decision, reported (metrics, audit trail, webhooks: add_sink).
        self.notices = Notices(metrics, lambda: self.config, wall, tracing)
        # The plugin's side of gated calls: the cluster's remote gate and the sweeper use it.
        self.gates = Gates(registry, agents, metrics, lambda: self.config, clock, self.notices)
        # The upstream's clients ask this service whether a chat's run still uses one (upstream/agents.py).
        agents.attach(self)
        self._hooks = RunHooks(metrics, clock, self.gates.release, self.notices, tracing, self._kept, self._settled, wall)
        registry.attach(self)
        # The cluster's ports (chat/ports.py, `attach`): each run's start (message id) and end ("") for the
        # chat directory; the deadline queue, told of each deadline kept and each answered (by its key).
        self._watcher: RunWatcher = NO_RUN_WATCHER
        self._deadlines: DeadlineQueue = NO_DEADLINES
        self.timeouts = ConfirmTimeouts(agents, wall)
        self._tasks = RunTasks(
            clock=clock, heartbeat=lambda: self.config.sessions.heartbeat_interval, started=self.run_changed, ended=self._run_done,
        )
        self._native = NativeConfirmations(
            agents=agents, runs=self.runs, metrics=metrics, timeouts=self.timeouts, config=lambda: self.config,
            clock=clock, new_id=new_id, settled=self._settled, kept=self._kept, notices=self.notices,
        )
        self._live = LiveChats(
            agents=agents, registry=registry, runs=self.runs, tasks=self._tasks, config=lambda: self.config, clock=clock,
            new_id=new_id, chat=self._chat, abort=self.abort,
        )
        # Each chat's state, kept in the shared store by the cluster (chat/kept_states.py).
        self.states = KeptStates(metrics, clock)
        self._resumes = Resumes(
            registry=registry, agents=agents, metrics=metrics, config=lambda: self.config, clock=clock, chat=self._chat,
            adopt=self.states.adopt,
        )
        # Runs that wait, open, for their approvers; the gateway's own answers to ADK's confirmations.
        self._waits = ApproverWaits(runs=self.runs, native=self._native, metrics=metrics, notices=self.notices,
                                    clock=clock, wall=wall, kept=self._kept, settled=self._settled)
        self._answers = GatewayAnswers(agents=agents, registry=registry, chat=self._chat, adopt=self.states.adopt,
                                       runs=self.runs, timeouts=self.timeouts, start_run=self._start_run, waits=self._waits,
                                       rebuild=self._resumes.resume_waiting)
        # These chats as the cluster's approval desk sees them (approvals/ports.py `ApprovalChats`).
        self.desk_view = DeskView(config=lambda: self.config, clock=clock, registry=registry, gates=self.gates,
                                  answers=self._answers)

    def attach(self, *, runs: RunWatcher, deadlines: DeadlineQueue) -> None:
        """The cluster's side of this replica's chats (chat/ports.py); once, by the cluster router."""
        attached(self._watcher, NO_RUN_WATCHER, "the chat service's run watcher")
        self._watcher, self._deadlines = runs, deadlines

    def new_chat(self, agent: str, user_id: str, chat_id: str, now: float) -> Chat:
        """The registry's `ChatMaker`: each new chat, with what its runs share."""
        return Chat(user_id, chat_id, chat_id, now, agent, self._hooks)

    def run_changed(self, chat: Chat, message_id: str) -> None:
        self._watcher.run_changed(chat, message_id)

    def _run_done(self, chat: Chat) -> None:
        self.run_changed(chat, "")
        self.states.changed(chat)
        for deadline in self.timeouts.new_deadlines(chat):
            self._kept(deadline)

    def _kept(self, deadline: Deadline) -> None:
        self._deadlines.add(deadline)

    def _settled(self, key: str) -> None:
        self._deadlines.drop(key)

    def reconfigure(self, config: GatewayConfig) -> None:
        """New requests follow the new config; runs under way keep the policy they started with
        (except a removed agent's: `end_agent_runs`)."""
        self.config = config
        self._registry.max_chats_per_user = config.limits.max_chats_per_user

    def carries_run(self, client: AdkClient) -> bool:
        """The agents' `ClientUsers`: whether a chat's run still goes through `client`."""
        return any(chat.upstream is client and not chat.machine.settled for chat in self._registry.chats())

    def end_agent_runs(self, agent: str, reason: str) -> int:
        """End the runs of an agent a reload removed: each ends with an error chunk saying `reason`,
        and its calls waiting for a person are released fail-closed. Returns how many."""
        return self._tasks.end_agent(self._registry.chats(), agent, reason)

    # ---- admission -----------------------------------------------------------------------

    async def submit(
        self, agent_name: str, user_id: str, request: ChatRequest, *, claims: dict[str, Any] | None = None
    ) -> Attachment:
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
        # The latest request's: the rules of a call the run makes read who asked for it.
        chat.claims = claims or {}
        structlog.contextvars.bind_contextvars(session_id=chat.session_id)
        await self.states.adopt(chat, needed=bool(plan.answers or plan.outputs))
        gated, native = split_answers(self._registry, chat, plan.answers, strict=plan.new_message is None)
        outputs = pending_outputs(chat, plan.outputs)
        browser = BrowserCalls(chat.ledger, agent.config.tool_policy)
        carried: list[ToolOutput] = []
        held: SessionConfirmations | None = None
        if not agent.live:
            native, carried, held = await self._native.browser_outputs(chat, agent, plan, native, browser)
        sent = tuple(a.approval_id for a in native)
        if native and not agent.live:
            # Strict: nothing but these answers to go on with, so one ADK lost is the request's end.
            only_native = plan.new_message is None and not (gated or outputs)
            native = await self._native.unanswered(chat, native, strict=only_native, held=held)
        asked = BrowserAsked(plan.new_message is not None, bool(gated or outputs), sent, len(native), agent.live)
        [admission] = chat.handle(asked)
        assert isinstance(admission, Admission)
        if admission.action == "refuse":
            raise (Gone if admission.status == 410 else InvalidRequest)(admission.text)
        if admission.action == "late":
            return self._native.late(chat)
        if admission.action == "continue":
            return continue_gated_run(chat, gated, outputs, self._clock())
        if not admission.forward_native:
            native = []
        if not agent.live:
            split = plan_browser(
                native, browser.by_id, new_message=plan.new_message is not None, waiting=chat.ledger.pending_native(),
            )
            if split.handover:
                handed = self._native.hand_over(chat, plan, native, split.handover, request.version)
                # The approval is recorded nowhere else (ADK hears of it with the output, and an
                # AG-UI tool message does not repeat it): kept before the browser reads the end.
                await self.states.keep(chat)
                return handed
            native = split.forward
        sent = {a.tool_call_id for a in native}
        carried = [o for o in carried if o.tool_call_id in sent]
        return await self._start_run(agent, chat, plan, gated, native, request.version, carried)

    async def _start_run(
        self, agent: Agent, chat: Chat, plan: TurnPlan, gated: list[tuple[ApprovalAnswer, GatedCall]],
        native: list[ApprovalAnswer], version: ClientVersion, carried: list[ToolOutput] | None = None, *,
        browser: bool = True,
    ) -> Attachment:
        # A confirmation is answered once: from here until the ledger records it (or the run
        # fails to start), another answer to it (the person's, the deadline's) does not go out.
        ids = tuple(a.approval_id for a in native)
        [claim] = chat.handle(AnswersGoing(ids, tuple(a.timed_out for a in native), browser))
        assert isinstance(claim, Admission)
        if claim.action == "late":
            return self._native.late(chat)
        if claim.action == "refuse":
            raise ChatBusy(claim.text)
        try:
            return await self._start_answered_run(agent, chat, plan, gated, native, version, carried)
        finally:
            chat.handle(AnswersSent(ids))

    async def _start_answered_run(
        self, agent: Agent, chat: Chat, plan: TurnPlan, gated: list[tuple[ApprovalAnswer, GatedCall]],
        native: list[ApprovalAnswer], version: ClientVersion, carried: list[ToolOutput] | None,
    ) -> Attachment:
        wanted = chat.wanted(read=await self._tasks.somebody_reads(chat))
        if wanted.action in ("abort", "settle"):
            if wanted.action == "abort":
                await self._tasks.stop_unread(chat)
            else:
                await self._tasks.settle(chat, gated)
            # Asked again: another new message may have got in while the old run wound down.
            wanted = chat.wanted(free=True)
        if wanted.action == "refuse":
            raise ChatBusy(wanted.text)
        try:
            return await self._claimed_run(agent, chat, plan, gated, native, version, carried)
        except BaseException:
            chat.handle(RunDropped())  # the run never started: the chat is not claimed any more
            raise

    async def _claimed_run(
        self, agent: Agent, chat: Chat, plan: TurnPlan, gated: list[tuple[ApprovalAnswer, GatedCall]],
        native: list[ApprovalAnswer], version: ClientVersion, carried: list[ToolOutput] | None,
    ) -> Attachment:
        run = Run(
            plan.continue_message_id or self._new_id(), limit=self.config.chat.run_buffer_chunks,
            earlier=message_so_far(chat, plan.continue_message_id),
        )
        run.browser_added(browser_added(version, [a for a in native if not a.implicit and a.payload is None], carried or []))
        # Claimed, and read, before the first await, so a concurrent request for this chat sees it busy.
        chat.run = run
        reader = run.current.reader()
        structlog.contextvars.bind_contextvars(message_id=run.message_id)
        try:
            await self.runs.take_upstream(chat, agent)
            await self.runs.before_turn(chat)
        except UpstreamError as exc:
            self.metrics.upstream_errors.labels(agent.name, exc.kind).inc()
            chat.run = None
            raise
        self._native.record_answers(chat, native)
        start = RunStarts(
            run.message_id, self._clock(), version=version, known_tool_calls=plan.known_tool_calls,
            # A rejection carrying the gateway's error (a timeout's) ends as that error, not denied.
            denied_tool_calls=[a.tool_call_id for a in native if not a.approved and a.payload is None],
            policy=agent.config.tool_policy, confirms=agent.config.confirms,
            delivered_tool_calls=[o.tool_call_id for o in carried or ()],
        )
        wait = WaitSignal()
        batches = self.runs.turn(chat, plan.new_message, native, wait, run.message_id)
        if not agent.live:
            batches = self._waits.follow(chat, agent, batches, wait, run.message_id)
        return self._tasks.launch(chat, run, start, batches, wait, reader)

    def _chat(self, agent: Agent, user_id: str, chat_id: str) -> Chat:
        try:
            chat = self._registry.get(agent.name, user_id, chat_id, now=self._clock())
        except TooManyChats:
            raise Limited(429, "too_many_chats", f"at most {self.config.limits.max_chats_per_user} chats per user", 60) from None
        chat.browser_left = False  # a browser is back (see socket_closed)
        return chat

    def resume(self, agent: str, user_id: str, chat_id: str) -> Attachment | None:
        """The response to replay and follow for a reconnecting browser; None if there is none."""
        return self._resumes.resume(agent, user_id, chat_id)

    async def resume_waiting(
        self, agent_name: str, user_id: str, chat_id: str, version: ClientVersion | None = None
    ) -> Attachment | None:
        """`resume`, or the message ADK's session says waits for the person's answers, rebuilt
        (chat/resume.py). None: nothing to read."""
        return await self._resumes.resume_waiting(agent_name, user_id, chat_id, version)

    def abort(self, agent: str, user_id: str, chat_id: str) -> bool:
        """The browser stopped the response: cancel the agent run behind it. True if one was running."""
        chat = self._registry.find_session(user_id, chat_id)
        return chat is not None and chat.agent == agent and self._tasks.abort(chat)

    async def send_audio(
        self, agent_name: str, user_id: str, chat_id: str, mime_type: str, data: str, version: ClientVersion
    ) -> Attachment | None:
        """Realtime audio for the chat's live session; the new turn it starts, if it starts one (chat/live_chats.py)."""
        return await self._live.send_audio(agent_name, user_id, chat_id, mime_type, data, version)

    async def socket_closed(self, agent: str, user_id: str, chat_id: str) -> None:
        """The browser socket that drove this chat went away, on this replica or another (chat/live_chats.py)."""
        await self._live.socket_closed(agent, user_id, chat_id)

    async def close(self, reason: str = "The gateway is shutting down.") -> None:
        """Cancel every run still going and close live sessions (shutdown)."""
        await self._tasks.close(reason)
        live = [self.runs.close_live(chat) for chat in self._registry.chats()]
        if live:
            await within(asyncio.gather(*live, return_exceptions=True), _CLOSE_TIMEOUT, what="live sessions")

    def local_chats(self) -> list[Chat]:
        return self._registry.chats()

    # ---- the deadline queue's side of these chats ------------------------------------------------

    def held_deadline_passed(self, deadline: Deadline) -> Deadline | None:
        """A chat's held calls' deadline passed: chat/record.py `deadlines_due`. ChatNotFound: none waits here."""
        if (chat := self._registry.find(deadline.agent, deadline.user, deadline.chat)) is None or chat.due is None:
            raise ChatNotFound(deadline.chat)
        return chat.deadlines_due(self._clock())

    async def forget_idle(self, idle_before: float) -> list[Chat]:
        """Drop chats idle since `idle_before`; their unanswered approvals count as cancelled."""
        gone = self._registry.expire(idle_before=idle_before)
        self.gates.forget(gone)
        now = self._clock()
        for chat in gone:
            await self.runs.close_live(chat)
            for pending in chat.ledger.pending_native():
                self._native.observe_cancelled(chat, pending, now)
        return gone
