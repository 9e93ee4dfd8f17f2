"""The actor of one chat: the only caller of its machine, and the I/O of what the machine asks for.

Each chat has one `ChatActor` (made with it by the registry). Everything that changes the chat's
approvals or runs reaches its machine (core/chat_machine.py) through `handle`, which applies one
typed event and carries out the outputs at once, with no await in between: on the one event loop
that makes the actor the machine's only caller, one event at a time. Carrying out means: chunks
are encoded into the run's log (chat/chunk_log.py), where the browser requests follow them;
responses open and close there; a released gated call's verdict goes to the plugin's waiting
request; metrics and log lines are recorded; the upstream stream's idle timer is told whether the
run waits for a person (a wait is not idleness); and one timer is kept for the machine's next
deadline.

A run's upstream stream is read by a task (`start`); the run outlives the browser request that
started it. Whether a run goes on is the machine's to say, not the task's: when the task ends
before the machine heard the run's end (cancelled before its first step), the actor tells it.

Everything here is thin on purpose: what happens next is decided in the machine, not here.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from functools import partial
from operator import itemgetter
from typing import Any

import structlog

from ..config.agent import ToolPolicy
from ..core.approvals import CallState, GatedCall, Outcome
from ..core.chat_events import Aborted, ChatEvent, DeadlineReached, RunClosed, RunFailed, RunStarts, UpstreamRead
from ..core.chat_machine import ChatMachine
from ..core.protocol import ClientVersion, encode_chunks
from ..core.rebuild import Rebuilt, WaitingMessage, replay
from ..core.turn import (
    Bypassed, CallChanged, Chunks, CloseResponse, NativeAsked, OpenResponse, Output, Raised, RunEnded, UsageSeen,
)
from ..ops.metrics import GatewayMetrics
from ..ops.tracing import Tracing
from ..upstream.client import UpstreamError
from ..upstream.idle_reader import WaitSignal
from .chunk_log import Run
from ..approvals.reports import Notices

__all__ = ["ChatActor", "RunHooks"]

log = structlog.get_logger("adk_gateway.chat.actor")

Batches = AsyncIterator[Iterable[dict[str, Any]]]

_BROWSER_OUTCOMES = {Outcome.OUTPUT: "output", Outcome.OUTPUT_ERROR: "error"}

# The chunks that carry the model's words (or voice) to the browser: the first one ends the time to first token.
_TOKEN_CHUNKS = frozenset({"text-delta", "reasoning-delta", "data-pcm"})
_PCM = "data-pcm"
_TYPE = itemgetter("type")


@dataclass(frozen=True)
class RunHooks:
    """What every actor of a chat service shares."""

    metrics: GatewayMetrics
    clock: Callable[[], float]
    # Hands a released call's verdict to the plugin's request waiting for it.
    release: Callable[[GatedCall], None]
    # Reports each approval's start and decision (metrics by who decided, audit trail, webhooks).
    notices: Notices | None = None
    # A span per turn (ops/tracing.py); the shared no-op unless traces are on.
    tracing: Tracing = Tracing.off()


class ChatActor:
    """One chat's machine, driven: events in, the machine's outputs carried out."""

    # Every remembered chat keeps its actor: no per-instance dict.
    __slots__ = (
        "_counts", "_due", "_first_token_from", "_hooks", "_task", "_timer", "aborting", "agent", "chat_id",
        "closing_reason", "machine", "run", "span", "upstream_wait", "user_id",
    )

    def __init__(self, machine: ChatMachine, hooks: RunHooks, agent: str, chat_id: str = "", user_id: str = "") -> None:
        self.machine = machine
        # The chat's agent: the `agent` label of what its runs count.
        self.agent = agent
        # Whose chat it is, for the approvals' notices.
        self.chat_id, self.user_id = chat_id, user_id
        self._hooks = hooks
        self._counts = hooks.metrics.chunk_counts
        # The run log the current (or last) run writes to.
        self.run: Run | None = None
        self._task: asyncio.Task[None] | None = None
        # The browser asked to stop (WebSocket `abort`): the run ends with an `abort` chunk.
        self.aborting = False
        # Tells the upstream stream's idle timer when the run waits for a person.
        self.upstream_wait = WaitSignal()
        # Why the run is being cancelled, when it is this run alone (its agent was removed).
        self.closing_reason: str | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._due: float | None = None
        # When the current run started, until its first words are written (time to first token).
        self._first_token_from: float | None = None
        # The current (or last) run's span, while it is open; None with traces off.
        self.span: object | None = None

    @property
    def running(self) -> bool:
        return self.machine.running

    def handle(self, event: ChatEvent) -> list[Output]:
        """Apply `event` to the machine and carry out what it asks for, in order."""
        outputs = self.machine.handle(event)
        try:
            self._carry_out(outputs)
        finally:
            # ADK's stream is silent while a call waits, whoever decides it: no idle timeout then.
            waiting = self.machine.waiting_for_decision
            self.upstream_wait.set(waiting)
            if waiting:
                # Words after a person's decision measure the person, not the model: not observed.
                self._first_token_from = None
            self._arm()
        return outputs

    def replay(
        self, message: WaitingMessage, *, now: float, version: ClientVersion,
        policy: Callable[[str], ToolPolicy], confirms: Callable[[str], bool],
    ) -> Rebuilt | None:
        """Rebuild the message ADK's session says waits (core/rebuild.py) through the machine, as
        its runs would have left it; the chunks are returned for a new run log, not carried out
        (nothing streams: no metrics, no verdicts). The chat has no run under way."""
        return replay(message, machine=self.machine, now=now, version=version, policy=policy, confirms=confirms)

    # ---- the run's task --------------------------------------------------------------------

    def start(
        self, run: Run, event: RunStarts, batches: Batches, wait: WaitSignal, closing_reason: Callable[[], str]
    ) -> asyncio.Task[None]:
        """Start a run writing into `run`, reading `batches` (whose idle timer `wait` tells of
        waits for a person); the chat has no run under way."""
        self.run, self.upstream_wait = run, wait
        self.aborting, self.closing_reason = False, None
        self._first_token_from = event.now
        tracing = self._hooks.tracing
        span = self.span = tracing.start_turn(self.agent, self.chat_id) if tracing.enabled else None
        self.handle(event)
        drive = self._drive(run, batches, closing_reason)
        # The turn's span current in the task (a copy of the request's context, which the task outlives).
        task = self._task = asyncio.create_task(drive) if span is None else asyncio.create_task(drive, context=tracing.context_with(span))
        task.add_done_callback(partial(self._task_done, run, closing_reason, span))
        return task

    async def _drive(self, run: Run, batches: Batches, closing_reason: Callable[[], str]) -> None:
        """Feed the machine the run's upstream events until the run ends, whatever ends it."""
        clock, metrics, handle = self._hooks.clock, self._hooks.metrics, partial(self._of_run, run)
        try:
            async for batch in batches:
                # One publish per upstream read: one encode list, one wake-up of the followers.
                handle(UpstreamRead(batch, clock()))
                batch = None  # type: ignore[assignment]  # a held run keeps no spent batch
            turn = self.machine.turn
            if self.run is run and turn is not None and turn.converter.failed:
                metrics.upstream_errors.labels(self.agent, "run_error").inc()
        except UpstreamError as exc:
            metrics.upstream_errors.labels(self.agent, exc.kind).inc()
            log.warning("upstream_failed", kind=exc.kind, status=exc.status, reason=str(exc))
            handle(RunFailed(f"The agent service failed: {exc}", clock()))
        except asyncio.CancelledError:
            handle(self._cancelled(closing_reason))
            raise
        except Exception:
            # A bug here must not leave the browser hanging on an open stream.
            log.exception("run_crashed")
            handle(RunFailed("The gateway failed while streaming this response.", clock()))
        finally:
            handle(RunClosed(clock()))

    def _of_run(self, run: Run, event: ChatEvent) -> None:
        # A run that was made to end (a new message could not wait for it) says nothing more.
        if self.run is run and self.machine.running:
            self.handle(event)

    def _cancelled(self, closing_reason: Callable[[], str]) -> ChatEvent:
        now = self._hooks.clock()
        if self.aborting:
            return Aborted(now)
        return RunFailed(self.closing_reason or closing_reason(), now, outcome="cancelled")

    def _task_done(self, run: Run, closing_reason: Callable[[], str], span: object | None, task: asyncio.Task[None]) -> None:
        # Cancelled before its first step, the task never ran its own end: the machine hears it here.
        self._of_run(run, self._cancelled(closing_reason))
        self._of_run(run, RunClosed(self._hooks.clock()))
        if self._task is task:
            self._task = None
        if span is not None:
            self._hooks.tracing.end_turn(span)
            if self.span is span:
                self.span = None

    def abort(self) -> bool:
        """The browser stopped the response: cancel the run. True if one was under way."""
        if not self.running or self._task is None:
            return False
        self.aborting = True
        self._task.cancel()
        return True

    def close_soon(self, reason: str) -> bool:
        """End the run with an error chunk saying `reason` (its agent was removed). True if one was under way."""
        if not self.running or self._task is None:
            return False
        self.closing_reason = reason
        # After the task's first step, not now: a run admitted a moment ago has not started yet.
        asyncio.get_running_loop().call_soon(self._task.cancel)
        return True

    async def stop(self, timeout: float, *, abort: bool = True, reason: str = "This response was cancelled.") -> None:
        """Cancel the run (as an abort does, or as a shutdown does: `abort` false) and wait up to
        `timeout` for its task; a run whose task is stuck is ended here, so that it cannot keep
        the chat busy for ever."""
        task, run = self._task, self.run
        if task is not None:
            self.aborting = abort
            task.cancel()
            await asyncio.wait((task,), timeout=timeout)
        if self.run is run and self.running:  # not a run started since by another request
            log.warning("previous_run_stuck", reason="it did not end after it was cancelled")
            now = self._hooks.clock()
            self.handle(Aborted(now) if abort else RunFailed(reason, now, outcome="cancelled"))
            self.handle(RunClosed(now))

    async def ended(self, timeout: float) -> bool:
        """Wait up to `timeout` for the run's task to end; whether it did."""
        task = self._task
        if task is None:
            return True
        done, _ = await asyncio.wait((task,), timeout=timeout)
        return bool(done)

    # ---- carrying out ----------------------------------------------------------------------

    def _carry_out(self, outputs: list[Output]) -> None:
        for output in outputs:
            if type(output) is Chunks:
                self._write(output.chunks)
            elif type(output) is OpenResponse:
                self._log().next_response()
            elif type(output) is CloseResponse:
                self._log().end_response(self._hooks.clock())
            elif type(output) is UsageSeen:
                # A third of a tool-heavy stream's events: not through `_observe`'s match.
                self._hooks.metrics.count_tokens(self.agent, output.model, output.usage)
            else:
                self._observe(output)

    def _log(self) -> Run:
        assert self.run is not None  # a turn writes only after `start` gave it its run
        return self.run

    def _write(self, chunks: list[dict[str, Any]]) -> None:
        # Per write, not per chunk: the types read and counted (a plain dict, read at scrape time)
        # and the chunks encoded, each in a loop that runs in C (docs/performance.md, issue 29).
        kinds = list(map(_TYPE, chunks))
        self._counts.update(kinds)  # a Counter: its C loop
        if _PCM in kinds:
            audio = self._hooks.metrics.audio_bytes.labels("out")
            for chunk in chunks:
                if chunk["type"] == _PCM:
                    audio.inc(len(chunk["data"]["data"]) * 3 // 4)
        self._log().publish(encode_chunks(chunks))
        if self._first_token_from is not None and not _TOKEN_CHUNKS.isdisjoint(kinds):
            started, self._first_token_from = self._first_token_from, None
            metrics = self._hooks.metrics
            metrics.first_token.labels(self.agent).observe(self._hooks.clock() - started, metrics.exemplar())

    def _observe(self, output: Output) -> None:
        metrics = self._hooks.metrics
        match output:
            case CallChanged(call=call, before=before, waited=waited):
                _observe_call(metrics, self.agent, call, before, waited)
                if before is CallState.AWAITING_APPROVAL and call.state is not CallState.AWAITING_APPROVAL:
                    if self._hooks.notices is not None:
                        self._hooks.notices.call_released(self.agent, call, waited)
                if call.outcome is Outcome.ABANDONED:
                    log.warning("gated_call_abandoned", approval_id=call.id, tool=call.tool, reason=output.reason)
                if call.released:
                    self._hooks.release(call)
            case Bypassed(tool=tool):
                metrics.policy_bypassed.labels(self.agent, tool).inc()
                log.warning("policy_bypassed", tool=tool, reason="the ADK plugin did not ask about a gated tool")
            case NativeAsked(confirmation=asked):
                if asked.approval:
                    metrics.approvals_pending.labels(self.agent).inc()
                    if self._hooks.notices is not None:
                        self._hooks.notices.native_waiting(self.agent, self.chat_id, self.user_id, asked, self.span)
                    log.info("approval_requested", approval_id=asked.approval_id, tool=asked.tool)
                else:
                    # A browser tool nobody approves (confirm mode): it waits for the browser's output.
                    log.info("browser_tool_requested", approval_id=asked.approval_id, tool=asked.tool)
            case UsageSeen(model=model, usage=usage):
                metrics.count_tokens(self.agent, model, usage)
            case RunEnded():
                self._first_token_from = None
                if self.span is not None:
                    self._hooks.tracing.end_turn_outcome(self.span, output.outcome)
                metrics.runs.labels(self.agent, output.outcome).inc()
                log.info("run_finished", outcome=output.outcome)
            case Raised(error=error):
                raise error

    # ---- the deadline timer ----------------------------------------------------------------

    def _arm(self) -> None:
        """One timer, for the machine's next deadline (none while nothing waits for a person)."""
        due = self.machine.next_deadline()
        if due == self._due:
            return
        self.disarm()
        if due is None:
            return
        self._due = due
        delay = max(0.0, due - self._hooks.clock())
        # In a context of its own: whatever request last armed the timer is not the timeout's.
        self._timer = asyncio.get_running_loop().call_later(delay, self.deadline_passed, context=contextvars.Context())

    def disarm(self) -> None:
        """Stop the deadline timer (the chat is forgotten)."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._due = None, None

    def deadline_passed(self) -> int:
        """The timer fired (or a test with its own clock says so): apply the deadlines due now;
        how many calls timed out."""
        self._timer, self._due = None, None
        outputs = self.handle(DeadlineReached(self._hooks.clock()))
        expired = sum(1 for o in outputs if isinstance(o, CallChanged) and o.call.outcome is Outcome.TIMEOUT)
        if expired:
            log.info("gates_timed_out", count=expired)
        return expired


def _observe_call(metrics: GatewayMetrics, agent: str, call: GatedCall, before: CallState, waited: float) -> None:
    tool = call.tool
    if call.decided_by == "rule":
        pass  # decided before anyone waited: counted by the notices alone
    elif before is CallState.AWAITING_APPROVAL:
        metrics.approvals_pending.labels(agent).dec()
        outcome = call.outcome.value if call.outcome else ("approved" if call.approved else "denied")
        metrics.approval_wait.labels(agent, tool, outcome).observe(waited, metrics.approval_exemplar(call.id))
        if call.outcome is Outcome.TIMEOUT:
            metrics.approval_timeouts.labels(agent, tool).inc()
    elif before is CallState.AWAITING_OUTPUT and call.outcome is not None:
        metrics.browser_tool_wait.labels(agent, tool, _BROWSER_OUTCOMES.get(call.outcome, call.outcome.value)).observe(waited)
    log.info(
        "gate_changed", approval_id=call.id, tool=tool, state=call.state.value,
        outcome=call.outcome.value if call.outcome else None, waited_s=round(waited, 3),
    )
