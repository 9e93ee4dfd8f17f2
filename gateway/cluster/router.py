"""Which replica does the work for a request (docs/scaling.md): `Cluster`, what the transports and
the internal listener call instead of the chat service.

Every chat runs on one replica, its owner: the replica that holds the ADK connection of its run,
its converter, its run log and its gated calls. The shared chat directory says which replica
that is. A browser request (a message, an approval, a resume, an abort) or a plugin request may
land on any replica behind the load balancer:

- on the owner, or for a chat nobody owns yet: it is handled here, as with a single replica;
- elsewhere: it is forwarded to the owner (forwarding.py), which does the work and relays the
  response's chunks back through the shared state (relay.py); a plugin request waits here for
  the verdict the owner sends back (remote_gate.py), unless this replica drains: then it is
  handed back to the plugin, which asks again elsewhere.

When the owner is dead (no heartbeat for `sessions.owner_timeout`), the next request for the chat
moves it here; an answer or a resume forwarded to an owner that dies meanwhile is taken over too,
once the owner is known dead. The dead replica's run is lost with its ADK connection: a resume of
it is answered 410 `run_lost`, an answer to one of its gated calls 410 `approval_gone` saying so,
and a new message works as usual (ADK keeps the session). An answer to an ADK confirmation (confirm
mode) is not lost: ADK's session holds it, and it is answered here; a resume here rebuilds the
waiting message from that session (chat/service.py `resume_waiting`). A plugin request waiting on the
dead owner is released fail-closed: the tool does not run. A draining replica lets go of the chats
it runs nothing for, so that their next request is taken over at once rather than refused.

This module also keeps the directory current: which run goes on in each chat this replica owns.
With the memory backend there is one replica and every chat is local: nothing is forwarded.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import structlog

from ..core.approvals import Verdict
from ..chat.record import Chat
from ..chat.service import Attachment, ChatService, Gone
from ..core.refusals import HttpError
from ..core.chat_request import ChatRequest
from ..ops.metrics import GatewayMetrics
from ..core.protocol import ClientVersion
from .deadline_answers import DeadlineAnswers
from .forwarding import Asker, ForwardedRequests
from .liveness import Liveness, OwnerLost
from .messages import (
    Abort, Answer, Audio, Forwarded, Gate, MalformedMessage, Relayed, Released, Reply, Resume, SocketClosed, Submit,
    from_json,
)
from .relay import Relays
from .approval_desk import ApprovalDesk
from .remote_gate import RemoteGate, store_refused
from .shared import Claim, LocalChat, SharedState, SharedStateDown
from .state_keeper import StateKeeper
from .tasks import Tasks

__all__ = ["Cluster"]

log = structlog.get_logger("adk_gateway.cluster.router")

_RUN_LOST = (
    "The gateway replica that was running this chat's response stopped before it finished; "
    "send your message again."
)
_APPROVAL_LOST = (
    "The gateway replica that held this approval stopped; the tool was not run. "
    "Send a new message to try again."
)
# How long close() waits for its cancelled tasks: they stop at once unless a cancellation was lost.
_STOP_GRACE = 1.0
# How long a request admitted here has to start its run (or fail) before a drain hands its chat
# over: its look at ADK's session and the start of its run take well under a second.
_ADMISSION_SETTLE = 1.0


class Cluster:
    def __init__(self, state: SharedState, chats: ChatService, metrics: GatewayMetrics) -> None:
        self.state = state
        self.chats = chats
        self.metrics = metrics
        settings = chats.config.sessions  # a reload keeps the running sessions settings
        self._tasks = Tasks()
        liveness = Liveness(state, settings.heartbeat_interval)
        self._interval = settings.heartbeat_interval
        self._forward_timeout = settings.forward_timeout
        self._asker = Asker(state, liveness, forward_timeout=settings.forward_timeout, tracing=chats.tracing)
        # The responses this replica relays, and those it follows from others (relay.py).
        self.relays = Relays(state, self._tasks, liveness, metrics)
        # The approvals API's directory and decisions (approval_desk.py); the gate lists its calls.
        self.approvals = ApprovalDesk(state, chats.desk_view, self._asker.ask)
        self._gates = RemoteGate(
            state, chats.gates, metrics, self._tasks, liveness, self._asker.ask, forward_timeout=settings.forward_timeout,
            desk=self.approvals,
        )
        # The deadline queue's timer, and where each passed deadline is answered (deadline_answers.py;
        # an approvers' confirmation is listed as its deadline is kept).
        self._deadlines = DeadlineAnswers(state, chats, self.approvals, self._tasks, self._claim, recheck=settings.owner_timeout)
        self._forwarded = ForwardedRequests(
            state, chats, metrics, self.relays, self._gates, expire=self._deadlines.expire_forwarded,
        )
        # Run marks waiting to be written to the directory: only the latest per chat matters.
        self._marks: dict[tuple[str, str], str] = {}
        self._marks_due = asyncio.Event()
        # The chat service's ports (chat/ports.py): this router keeps the run marks, the timer the deadlines.
        chats.attach(runs=self, deadlines=self._deadlines.timer)
        if state.outlives_process:
            StateKeeper(state, chats, self._tasks, timeout=settings.forward_timeout)

    @property
    def replica_id(self) -> str:
        return self.state.replica_id

    @property
    def available(self) -> bool:
        return self.state.available

    @property
    def restoring(self) -> bool:
        return self.state.restoring

    @property
    def draining(self) -> bool:
        """Set by the drain: new work forwarded here is refused, as the transports refuse their own,
        and the plugin requests held here for chats other replicas own are handed back (HandedOver)."""
        return self._forwarded.draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self._forwarded.draining = value
        self._gates.hand_over(value)
        if value:
            self._tasks.spawn(self._hand_over_idle_chats())

    async def _hand_over_idle_chats(self) -> None:
        """Let go of each chat this replica runs nothing for (an ADK confirmation waits in ADK's
        session, which any replica reads), so its next request is taken over at once instead of
        refused `draining` until this replica stops. A running chat goes when its run ends
        (_write_marks); one a request reached under _ADMISSION_SETTLE ago, once that request had
        time to start its run: it may still be asking ADK whether its answer is pending, and the
        same answer sent to the new owner would reach ADK twice. Every heartbeat while draining."""
        handed: set[tuple[str, str]] = set()
        while not self._tasks.closed:
            settled = time.monotonic() - _ADMISSION_SETTLE  # the chat service's clock
            for chat in self.chats.local_chats():
                key = (chat.user_id, chat.chat_id)
                if key in handed or not chat.machine.settled or chat.last_active > settled:
                    continue
                if self._tasks.closed:
                    return
                with contextlib.suppress(SharedStateDown):
                    await self.state.release(chat.user_id, chat.chat_id)
                    handed.add(key)
            await asyncio.sleep(self._interval)

    async def start(self) -> None:
        await self.state.start(self._deliver, self._local_chats)
        self._tasks.spawn(self._write_marks())
        self._deadlines.timer.start()

    async def close(self) -> None:
        """Stop this replica's tasks, then leave the shared state; bounded, whatever the tasks do."""
        # The mark writer wakes after the tasks are marked closed (close() does that before its
        # first await), and sees it.
        self._marks_due.set()
        self._deadlines.timer.close()
        await self._tasks.close(_STOP_GRACE)
        await self.state.close()

    # ---- browser requests ------------------------------------------------------------------

    async def submit(self, agent: str, user_id: str, request: ChatRequest, *, claims: dict[str, Any] | None = None) -> Attachment:
        """`ChatService.submit`, wherever the chat runs; `claims`: the caller's identity claims (rules read them)."""
        claim = await self._claim(agent, user_id, request.chat_id)
        deadline = asyncio.get_running_loop().time() + self._forward_timeout
        while not claim.local:
            try:
                return await self._submit_to(claim.owner, agent, user_id, request, claims or {})
            except HttpError as exc:
                # The owner died with the request (kill -9), or drains (SIGTERM) and lets go of the
                # chat once it runs nothing for it: an answer alone waits for that and is done
                # here. Doing it twice is safe: what it answers is either gone with the owner (a
                # gated call: refused) or in ADK's session, which says whether it is still pending.
                # A new message is not: the dead owner may have sent it to ADK already.
                answer_only = request.recent[-1].role == "assistant"
                going = isinstance(exc, OwnerLost) or exc.code == "draining"
                if not (answer_only and going) or asyncio.get_running_loop().time() >= deadline:
                    raise
                if not isinstance(exc, OwnerLost):
                    await asyncio.sleep(self._interval)
            claim = await self._claim(agent, user_id, request.chat_id)
        try:
            return await self.chats.submit(agent, user_id, request, claims=claims or {})
        except Gone:
            if claim.orphaned_run is None:
                raise
            self.metrics.owner_lost.labels("approval").inc()
            raise Gone(_APPROVAL_LOST) from None

    async def _submit_to(self, owner: str, agent: str, user_id: str, request: ChatRequest, claims: dict[str, Any]) -> Attachment:
        answer = await self._asker.ask(owner, Submit(user_id, agent, request.as_body(), claims))
        attachment = self._attachment(owner, answer, user_id)
        if attachment is None:
            raise HttpError(502, "replica_failed", "the gateway replica running this chat answered without a response")
        return attachment

    async def resume(
        self, agent: str, user_id: str, chat_id: str, version: ClientVersion | None = None
    ) -> Attachment | None:
        """`ChatService.resume_waiting`, wherever the chat runs (the owner of another replica's chat
        rebuilds a forgotten message for its configured client version)."""
        claim = await self._claim(agent, user_id, chat_id, create=False)
        if not claim.local:
            try:
                answer = await self._asker.ask(claim.owner, Resume(user_id, chat_id, agent))
                return self._attachment(claim.owner, answer, user_id)
            except OwnerLost:
                # The owner died with the request: a resume only reads, so it is taken over here.
                claim = await self._claim(agent, user_id, chat_id, create=False)
                if not claim.local:
                    raise
        if claim.orphaned_run is not None:
            raise OwnerLost(410, "run_lost", _RUN_LOST)
        return await self.chats.resume_waiting(agent, user_id, chat_id, version)

    async def send_audio(
        self, agent: str, user_id: str, chat_id: str, mime_type: str, data: str, version: ClientVersion
    ) -> Attachment | None:
        claim = await self._claim(agent, user_id, chat_id)
        if claim.local:
            return await self.chats.send_audio(agent, user_id, chat_id, mime_type, data, version)
        answer = await self._asker.ask(claim.owner, Audio(user_id, chat_id, agent, mime_type, data, version))
        return self._attachment(claim.owner, answer, user_id)

    async def abort(self, agent: str, user_id: str, chat_id: str) -> bool:
        """Stop the chat's run, wherever it runs. True if one was running (here) or asked to stop."""
        if self.chats.abort(agent, user_id, chat_id):
            return True
        return await self._asker.tell(Abort(user_id, chat_id, agent))

    async def socket_closed(self, agent: str, user_id: str, chat_id: str) -> None:
        await self.chats.socket_closed(agent, user_id, chat_id)
        await self._asker.tell(SocketClosed(user_id, chat_id, agent))

    async def forget_idle(self, idle_before: float) -> int:
        gone = await self.chats.forget_idle(idle_before)
        for chat in gone:
            with contextlib.suppress(SharedStateDown):
                await self.state.release(chat.user_id, chat.chat_id)
        return len(gone)

    async def _claim(self, agent: str, user_id: str, chat_id: str, *, create: bool = True) -> Claim:
        config = self.chats.config
        claim = await self.state.claim(
            user_id, chat_id, agent=agent, default_agent=config.default, ttl=config.chat.idle_chat_ttl, create=create
        )
        if claim.orphaned_run is not None:
            self.metrics.owner_lost.labels("run").inc()
            log.warning("chat_taken_over", chat_id=chat_id, lost_message_id=claim.orphaned_run)
        elif not claim.local:
            self.metrics.forwarded.labels("out").inc()
        return claim

    def _attachment(self, owner: str, answer: Answer, user_id: str) -> Attachment | None:
        if not isinstance(answer, Relayed) or not answer.key:
            return None
        return Attachment(None, self.relays.feed(owner, answer.key, user_id))

    # ---- plugin requests -------------------------------------------------------------------

    async def gate(
        self, *, app_name: str, user_id: str, session_id: str, tool_call_id: str, tool: str, args: dict[str, Any],
        confirm: bool = False, approvers: bool = False,
    ) -> tuple[Verdict, str]:
        """The verdict for a gated call the plugin of ADK app `app_name` asks about, and its label for the metrics.

        Raises HandedOver (503 `retry_elsewhere`) once this replica drains, for a chat another
        replica owns: the plugin asks again, and lands on a replica that stays.
        """
        request = Gate(app_name, user_id, session_id, tool_call_id, tool, args, confirm, approvers)
        if not self.chats.gates.runs_here(user_id, session_id):
            try:
                owner = await self.state.owner(user_id, session_id)
            except SharedStateDown as exc:
                return store_refused(exc)
            if owner is not None and owner != self.replica_id:
                return await self._gates.ask_owner(owner, request)
        return await self._gates.here(request)

    # ---- the inbox -------------------------------------------------------------------------

    def _deliver(self, raw: dict[str, Any]) -> None:
        try:
            message = from_json(raw)
        except MalformedMessage as exc:
            log.warning("inbox_message_malformed", reason=str(exc))
            return
        match message:
            case Forwarded():
                self._tasks.spawn(self._forwarded.serve(message))
            case Reply():
                self._asker.answered(message)
            case Released():
                self._gates.released(message)

    # ---- relays ----------------------------------------------------------------------------

    @property
    def relays_active(self) -> int:
        """Responses run here that another replica streams to its browser: the drain waits for them
        as for its own streams."""
        return self.relays.active

    async def end_relays(self, timeout: float = 2.0) -> None:
        """Let the relays of responses that just ended write their ends (the drain, once runs are
        cancelled), so a relayed browser gets its terminal chunks and the relay's end, not a cut."""
        await self.relays.end(timeout)

    # ---- the directory ---------------------------------------------------------------------

    def run_changed(self, chat: Chat, message_id: str) -> None:
        """The chat service's `RunWatcher`: the run mark to write to the directory."""
        self._marks[(chat.user_id, chat.chat_id)] = message_id
        self._marks_due.set()

    async def _write_marks(self) -> None:
        # Ends on close as well as on cancellation: a cancellation lost inside mark_run would
        # otherwise leave this loop waiting on _marks_due for ever.
        while not self._tasks.closed:
            await self._marks_due.wait()
            self._marks_due.clear()
            marks, self._marks = self._marks, {}
            for (user_id, chat_id), message_id in marks.items():
                if self._tasks.closed:
                    return
                try:
                    if message_id or not self.draining:
                        await self.state.mark_run(user_id, chat_id, message_id)
                    else:
                        await self.state.release(user_id, chat_id)
                except SharedStateDown:
                    pass  # written back with every local chat once the store is back (_local_chats)

    def _local_chats(self) -> list[LocalChat]:
        """The chats to write back after the store lost its data; their kept states are written
        again too (in the background), so a takeover after that loss still starts from them, and
        their held calls' deadlines, which only this replica can put back."""
        out = []
        for chat in self.chats.local_chats():
            self.chats.states.changed(chat)
            held = chat.queued_deadline()
            if held is not None:
                self._deadlines.timer.add(held)
            out.append(LocalChat(chat.user_id, chat.chat_id, chat.agent, chat.message_under_way()))
        return out
