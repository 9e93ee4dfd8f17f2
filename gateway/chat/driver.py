"""The I/O shell of one turn: its task, its run log, and what the turn's outputs ask for.

A `RunDriver` feeds a `Turn` (core/turn.py) the upstream events of its run as they are read, and carries
out each output the turn returns: chunks are encoded into the run's log (chat/chunk_log.py), where the
browser requests follow them; responses open and close there; a released gated call's verdict goes
to the plugin's waiting request; metrics and log lines are recorded. It also keeps the upstream
stream's idle timer told whether the run waits for a person (a wait is not idleness).

Everything here is thin on purpose: what happens next is decided in the turn, not here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import structlog

from ..core.approvals import CallState, GatedCall, Outcome
from ..upstream.idle_reader import WaitSignal
from ..ops.metrics import GatewayMetrics
from ..core.protocol import encode_chunk
from .chunk_log import Run
from ..core.turn import (
    Bypassed,
    CallChanged,
    Chunks,
    CloseResponse,
    NativeAsked,
    OpenResponse,
    Output,
    Raised,
    RunEnded,
    Turn,
)
from ..upstream.client import UpstreamError

__all__ = ["RunDriver", "RunHooks"]

log = structlog.get_logger("adk_gateway.chat.driver")

_BROWSER_OUTCOMES = {Outcome.OUTPUT: "output", Outcome.OUTPUT_ERROR: "error"}


@dataclass(frozen=True)
class RunHooks:
    """What every driver of a chat service shares."""

    metrics: GatewayMetrics
    clock: Callable[[], float]
    # Hands a released call's verdict to the plugin's request waiting for it.
    release: Callable[[GatedCall], None]


class RunDriver:
    """One turn's run: upstream events in, the turn's outputs carried out."""

    # A held or finished run keeps its driver: no per-instance dict.
    __slots__ = ("_counts", "_hooks", "aborting", "agent", "closing_reason", "run", "task", "turn", "upstream_wait")

    def __init__(self, turn: Turn, run: Run, hooks: RunHooks, agent: str) -> None:
        self.turn = turn
        self.run = run
        # The chat's agent: the `agent` label of what this run counts.
        self.agent = agent
        self._hooks = hooks
        self._counts = hooks.metrics.chunk_counts
        self.task: asyncio.Task[None] | None = None
        # The browser asked to stop (WebSocket `abort`): the run ends with an `abort` chunk.
        self.aborting = False
        # Tells the upstream stream's idle timer when the run waits for a person.
        self.upstream_wait = WaitSignal()
        # Why the run is being cancelled, when it is this run alone (its agent was removed).
        self.closing_reason: str | None = None

    @property
    def alive(self) -> bool:
        return self.task is not None and not self.task.done()

    def apply(self, outputs: list[Output]) -> None:
        """Carry out what the turn asked for, in order."""
        for output in outputs:
            if type(output) is Chunks:
                self._write(output.chunks)
            elif type(output) is OpenResponse:
                self.run.next_response()
            elif type(output) is CloseResponse:
                self.run.end_response(self._hooks.clock())
            else:
                self._observe(output)
        self.upstream_wait.set(self.turn.waiting_for_person)

    def _write(self, chunks: list[dict[str, Any]]) -> None:
        # One pass: counted (a plain dict, read at scrape time) and encoded together.
        counts = self._counts
        encoded = []
        for chunk in chunks:
            kind = chunk["type"]
            counts[kind] = counts.get(kind, 0) + 1
            if kind == "data-pcm":
                self._hooks.metrics.audio_bytes.labels("out").inc(len(chunk["data"]["data"]) * 3 // 4)
            encoded.append(encode_chunk(chunk))
        self.run.publish(encoded)

    def _observe(self, output: Output) -> None:
        metrics = self._hooks.metrics
        match output:
            case CallChanged(call=call, before=before, waited=waited):
                _observe_call(metrics, self.agent, call, before, waited)
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
                    log.info("approval_requested", approval_id=asked.approval_id, tool=asked.tool)
                else:
                    # A browser tool nobody approves (confirm mode): it waits for the browser's output.
                    log.info("browser_tool_requested", approval_id=asked.approval_id, tool=asked.tool)
            case RunEnded():
                metrics.runs.labels(self.agent, output.outcome).inc()
                log.info("run_finished", outcome=output.outcome)
            case Raised(error=error):
                raise error

    async def drive(self, batches: AsyncIterator[Iterable[dict[str, Any]]], closing_reason: Callable[[], str]) -> None:
        """Run the turn over the upstream's events until the run ends, whatever ends it."""
        turn, apply, clock, metrics = self.turn, self.apply, self._hooks.clock, self._hooks.metrics
        apply(turn.begin())
        try:
            async for batch in batches:
                # One publish per upstream read: one encode list, one wake-up of the followers.
                apply(turn.feed(batch, clock()))
                batch = None  # type: ignore[assignment]  # a held run keeps no spent batch
            if turn.converter.failed:
                metrics.upstream_errors.labels(self.agent, "run_error").inc()
        except UpstreamError as exc:
            metrics.upstream_errors.labels(self.agent, exc.kind).inc()
            log.warning("upstream_failed", kind=exc.kind, status=exc.status, reason=str(exc))
            apply(turn.fail(f"The agent service failed: {exc}", clock()))
        except asyncio.CancelledError:
            apply(turn.abort(clock()) if self.aborting else turn.fail(self.closing_reason or closing_reason(), clock(), outcome="cancelled"))
            raise
        except Exception:
            # A bug here must not leave the browser hanging on an open stream.
            log.exception("run_crashed")
            apply(turn.fail("The gateway failed while streaming this response.", clock()))
        finally:
            apply(turn.end(clock()))


def _observe_call(metrics: GatewayMetrics, agent: str, call: GatedCall, before: CallState, waited: float) -> None:
    tool = call.tool
    if before is CallState.AWAITING_APPROVAL:
        metrics.approvals_pending.labels(agent).dec()
        outcome = call.outcome.value if call.outcome else ("approved" if call.approved else "denied")
        metrics.approval_wait.labels(agent, tool, outcome).observe(waited)
        if call.outcome is Outcome.TIMEOUT:
            metrics.approval_timeouts.labels(agent, tool).inc()
    elif before is CallState.AWAITING_OUTPUT and call.outcome is not None:
        metrics.browser_tool_wait.labels(agent, tool, _BROWSER_OUTCOMES.get(call.outcome, call.outcome.value)).observe(waited)
    log.info(
        "gate_changed", approval_id=call.id, tool=tool, state=call.state.value,
        outcome=call.outcome.value if call.outcome else None, waited_s=round(waited, 3),
    )
