"""A chat, as this replica remembers it between requests, and the only caller of its machine.

A chat is keyed by (user id, AI SDK chat id): a browser can only ever reach chats of its own user.
It belongs to one agent (upstream/agents.py), whose routes alone reach it. It holds its ADK session
(on the client of its agent's upstream it was made with), its run log (that requests follow), its
live session in live mode, and its machine (core/chat_machine.py: the ledger of calls that wait
for a person, the current turn, which run is under way, as data), built with the approvals room's
decider (approvals/decision.py `DECIDER`), the one way the machine decides the plugin's asks.

Everything that changes the chat's approvals or runs reaches its machine through `handle`, which
applies one typed event and carries out the outputs at once (chat/carry_out.py), with no await in
between: on the one event loop the chat is its machine's only caller, one event at a time. Then
the upstream stream's idle timer is told whether the run waits for a person (a wait is not
idleness), and the machine's next deadline is kept in the cluster's deadline queue, the one every
call that waits for a person has its deadline in (core/deadlines.py, a `held` one per chat).

The chat learns what to keep there from the machine's `next_deadline()` after each `handle`: when
it differs from the one kept, the new one replaces it (a call decided, a browser tool's second
wait) or, once nothing waits, it is dropped. Compared after every event, it cannot be missed by an
output nobody thought of; the machine stays as it was, its clock (the chat service's, monotonic)
turned into the queue's wall clock here. When the deadline passes, the cluster has it answered
where the chat runs (`deadlines_due`): the machine is fed `DeadlineReached` and decides what times out.

A run's upstream stream is read by a task (`start`); the run outlives the browser request that
started it. Which run counts is the machine's to say: the task's events name its run's number, and
those of a run that was made to end are dropped by the machine. So is how a run made to end ends:
the chat tells the machine why (`EndAsked`: the browser's abort, or a sentence) before it cancels
the task, and that the task was cancelled (`RunCancelled`); it keeps no flag of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import structlog

from ..approvals.decision import DECIDER
from ..config.agent import ToolPolicy
from ..core.approvals import Outcome
from ..core.chat_events import (
    ChatEvent, DeadlineReached, EndAsked, EndHow, RunCancelled, RunClosed, RunFailed, RunStarts, RunWanted, UpstreamRead,
)
from ..core.chat_machine import ChatMachine
from ..core.chat_outputs import Admission
from ..core.deadlines import HELD, Deadline, held_key
from ..core.ledger import Ledger
from ..core.protocol import ClientVersion
from ..core.rebuild import Rebuilt, WaitingMessage, replay
from ..core.turn import CallChanged, Output
from ..upstream.client import AdkClient, UpstreamError
from ..upstream.idle_reader import WaitSignal
from ..upstream.live import LiveLink
from .carry_out import RunHooks, carry_out
from .chunk_log import Run

__all__ = ["Batches", "Chat", "RunHooks"]

log = structlog.get_logger("adk_gateway.chat.record")

Batches = AsyncIterator[Iterable[dict[str, Any]]]


# Slots: every remembered chat keeps one, and a held stream's is a new chat's (no per-instance dict).
@dataclass(eq=False, slots=True)
class Chat:
    user_id: str
    chat_id: str
    session_id: str
    last_active: float
    # The agent the chat belongs to (its name in the config): the `agent` label of what its runs count.
    agent: str = ""
    # What every chat of the chat service shares; None only for a chat built alone, which never runs.
    hooks: RunHooks | None = field(default=None, repr=False)
    # The upstream client its ADK session lives behind; a reload that changes the agent's upstream
    # gives the agent a new one, which the chat takes (and re-checks its session on) next turn.
    upstream: AdkClient | None = None
    session_ready: bool = False
    # The gateway cut the chat's last `/run_sse` stream before its end: ADK may still be writing
    # that run into the session, and the next run waits for it (upstream/cut_runs.py).
    upstream_cut: bool = False
    # The run log requests follow: the current (or last) run's, or the one a request claimed.
    run: Run | None = None
    # The chat's ADK live session, in live upstream mode.
    live: LiveLink | None = None
    # The browser socket that drove the chat closed while its run went on, and no request of the
    # chat came since: its live session closes when the run ends (chat/agent_runs.py).
    browser_left: bool = False
    # The chat's kept state was read (or is not needed) here: chat/kept_states.py.
    adopted: bool = False
    # The identity claims of the user's latest request (JWT; empty otherwise): the tool rules read them.
    claims: dict[str, Any] = field(default_factory=dict)
    # Its machine, handed the approvals room's decider: where each of the plugin's asks is decided.
    machine: ChatMachine = field(default_factory=partial(ChatMachine, decider=DECIDER))
    # The run's task, and the machine's number of the run it drives.
    task: asyncio.Task[None] | None = field(default=None, init=False, repr=False)
    task_run: int = field(default=0, init=False, repr=False)
    # Tells the upstream stream's idle timer when the run waits for a person.
    upstream_wait: WaitSignal = field(default_factory=WaitSignal, init=False, repr=False)
    # The machine's next deadline as kept in the deadline queue (the machine's clock), or None.
    due: float | None = field(default=None, init=False, repr=False)
    # When the current run started, until its first words are written (time to first token).
    first_token_from: float | None = field(default=None, init=False, repr=False)
    # The current (or last) run's span, while it is open; None with traces off.
    span: object | None = field(default=None, init=False, repr=False)

    @property
    def ledger(self) -> Ledger:
        return self.machine.ledger

    def _hooks(self) -> RunHooks:
        assert self.hooks is not None, "a chat built without its service's hooks does not run"
        return self.hooks

    def handle(self, event: ChatEvent) -> list[Output]:
        """Apply `event` to the machine and carry out what it asks for, in order."""
        hooks = self._hooks()
        outputs = self.machine.handle(event)
        try:
            carry_out(self, hooks, outputs)
        finally:
            # ADK's stream is silent while a call waits, whoever decides it: no idle timeout then.
            waiting = self.machine.waiting_for_decision
            self.upstream_wait.set(waiting)
            if waiting:
                # Words after a person's decision measure the person, not the model: not observed.
                self.first_token_from = None
            self._keep_deadline(hooks)
        return outputs

    def wanted(self, *, read: bool = False, free: bool = False, claim: bool = True) -> Admission:
        """The machine's answer to a request that wants a run of this chat (`RunWanted`), told
        whether the chat's response is still being written."""
        run = self.run
        [admission] = self.handle(RunWanted(run is not None and not run.current.closed, read, free, claim))
        assert isinstance(admission, Admission)
        return admission

    def message_under_way(self) -> str:
        """The message id the run under way here writes, "" when none (what the cluster's directory shows)."""
        run = self.run
        return run.message_id if run is not None and self.machine.under_way(self.machine.run) else ""

    def replay(
        self, message: WaitingMessage, *, now: float, version: ClientVersion,
        policy: Callable[[str], ToolPolicy], confirms: Callable[[str], bool],
    ) -> Rebuilt | None:
        """Rebuild the message ADK's session says waits (core/rebuild.py) through the machine, as
        its runs would have left it; the chunks are returned for a new run log, not carried out
        (nothing streams: no metrics, no verdicts). The chat has no run under way."""
        return replay(message, machine=self.machine, now=now, version=version, policy=policy, confirms=confirms)

    # ---- the run's task --------------------------------------------------------------------

    def start(self, run: Run, event: RunStarts, batches: Batches, wait: WaitSignal) -> asyncio.Task[None]:
        """Start a run writing into `run`, reading `batches` (whose idle timer `wait` tells of
        waits for a person); the chat has no run under way."""
        hooks = self._hooks()
        self.run, self.upstream_wait = run, wait
        self.first_token_from = event.now
        tracing = hooks.tracing
        span = self.span = tracing.start_turn(self.agent, self.chat_id) if tracing.enabled else None
        self.handle(event)
        number = self.task_run = self.machine.run
        drive = self._drive(number, batches)
        # The turn's span current in the task (a copy of the request's context, which the task outlives).
        task = self.task = asyncio.create_task(drive) if span is None else asyncio.create_task(drive, context=tracing.context_with(span))
        task.add_done_callback(partial(self._task_done, number, span))
        return task

    async def _drive(self, number: int, batches: Batches) -> None:
        """Feed the machine the run's upstream events until the run ends, whatever ends it."""
        hooks = self._hooks()
        clock, metrics, handle = hooks.clock, hooks.metrics, self.handle
        try:
            async for batch in batches:
                # One publish per upstream read: one encode list, one wake-up of the followers.
                handle(UpstreamRead(batch, clock(), number))
                batch = None  # type: ignore[assignment]  # a held run keeps no spent batch
            turn = self.machine.turn
            if self.machine.under_way(number) and turn is not None and turn.converter.failed:
                metrics.upstream_errors.labels(self.agent, "run_error").inc()
        except UpstreamError as exc:
            metrics.upstream_errors.labels(self.agent, exc.kind).inc()
            log.warning("upstream_failed", kind=exc.kind, status=exc.status, reason=str(exc))
            handle(RunFailed(f"The agent service failed: {exc}", clock(), run=number))
        except asyncio.CancelledError:
            # How it ends (an abort, or a sentence) is what the machine was told before the cancel.
            handle(RunCancelled(clock(), number))
            raise
        except Exception:
            # A bug here must not leave the browser hanging on an open stream.
            log.exception("run_crashed")
            handle(RunFailed("The gateway failed while streaming this response.", clock(), run=number))
        finally:
            handle(RunClosed(clock(), number))

    def _task_done(self, number: int, span: object | None, task: asyncio.Task[None]) -> None:
        # Cancelled before its first step, the task never ran its own end: the machine hears it
        # here (and drops it if the run had ended).
        hooks = self._hooks()
        now = hooks.clock()
        self.handle(RunCancelled(now, number))
        self.handle(RunClosed(now, number))
        if self.task is task:
            self.task = None
        if span is not None:
            hooks.tracing.end_turn(span)
            if self.span is span:
                self.span = None

    def end_asked(self, how: EndHow, reason: str | None = None) -> bool:
        """Tell the machine how the run under way is being ended (core/run_ending.py), before its
        task is cancelled: `abort` (the browser's stop) or `cancel` saying `reason`. True if a run
        is under way."""
        if self.task is None or not self.machine.under_way(self.task_run):
            return False
        self.handle(EndAsked(self.task_run, how, reason))
        return True

    def abort(self) -> bool:
        """The browser stopped the response: cancel the run. True if one was under way."""
        if self.task is None or not self.end_asked("abort"):
            return False
        self.task.cancel()
        return True

    def close_soon(self, reason: str) -> bool:
        """End the run with an error chunk saying `reason` (its agent was removed). True if one was under way."""
        if self.task is None or not self.end_asked("cancel", reason):
            return False
        # After the task's first step, not now: a run admitted a moment ago has not started yet.
        asyncio.get_running_loop().call_soon(self.task.cancel)
        return True

    async def stop(self, timeout: float, *, how: EndHow = "abort", reason: str | None = None) -> None:
        """Cancel the run (`how` it ends: as an abort does, or as the gateway closing it with
        `reason`) and wait up to `timeout` for its task; a run whose task is stuck is ended here,
        so that it cannot keep the chat busy for ever (the machine drops this end if the run
        ended, or a newer one started)."""
        task, number = self.task, self.task_run
        self.handle(EndAsked(number, how, reason))
        if task is not None:
            task.cancel()
            await asyncio.wait((task,), timeout=timeout)
        if self.machine.under_way(number):
            log.warning("previous_run_stuck", reason="it did not end after it was cancelled")
        now = self._hooks().clock()
        self.handle(RunCancelled(now, number))
        self.handle(RunClosed(now, number))

    async def ended(self, timeout: float) -> bool:
        """Wait up to `timeout` for the run's task to end; whether it did."""
        task = self.task
        if task is None:
            return True
        done, _ = await asyncio.wait((task,), timeout=timeout)
        return bool(done)

    # ---- the deadline in the queue -----------------------------------------------------------

    def _keep_deadline(self, hooks: RunHooks) -> None:
        """The machine's next deadline, kept in the deadline queue: added, moved, or dropped once
        nothing waits (the module docstring says why a diff after each event)."""
        due = self.machine.next_deadline()
        if due == self.due:
            return
        self.due = due
        if due is None:
            hooks.settled(held_key(self.chat_id))
            return
        deadline = self.queued_deadline()
        if deadline is not None:
            hooks.kept(deadline)

    def queued_deadline(self) -> Deadline | None:
        """The deadline the queue keeps for this chat's held calls (wall clock), None if none waits."""
        hooks, due = self.hooks, self.due
        waiting = self.ledger.unreleased()
        if hooks is None or due is None or not waiting:
            return None
        first = min(waiting, key=lambda call: call.deadline)
        wall = hooks.wall() + (due - hooks.clock())
        return Deadline(self.agent, self.user_id, self.chat_id, first.id, first.tool_call_id, first.tool, wall, kind=HELD)

    def drop_deadline(self) -> None:
        """Take the chat's deadline out of the queue (the chat is forgotten)."""
        if self.due is not None and self.hooks is not None:
            self.hooks.settled(held_key(self.chat_id))
        self.due = None

    def deadlines_due(self, now: float) -> Deadline | None:
        """The queue's deadline of this chat passed (the cluster says so where the chat runs, or a
        test with its own clock): the machine applies the deadlines due at `now`. Returns the
        deadline the queue keeps now (the next call's, or this one if the machine's clock had not
        reached it yet), None once nothing waits."""
        outputs = self.handle(DeadlineReached(now))
        expired = sum(1 for o in outputs if isinstance(o, CallChanged) and o.call.outcome is Outcome.TIMEOUT)
        if expired:
            log.info("gates_timed_out", count=expired)
        return self.queued_deadline()
