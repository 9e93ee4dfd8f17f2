"""Carrying out what a chat's machine answers: the I/O its outputs (core/chat_outputs.py) ask for.

A chat (chat/record.py) hands each event to its machine and passes the outputs here at once, with
no await in between: chunks are encoded into the run's log (chat/chunk_log.py), where the browser
requests follow them; responses open and close there; a released gated call's verdict goes to
the plugin's waiting request; metrics and log lines are recorded. Nothing is decided here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from ..core.approvals import CallState, GatedCall, Outcome
from ..core.protocol import encode_chunks
from ..core.turn import Bypassed, CallChanged, Chunks, CloseResponse, NativeAsked, OpenResponse, Output, Raised, RunEnded, UsageSeen
from ..ops.metrics import GatewayMetrics
from ..ops.tracing import Tracing
from ..approvals.reports import Notices

if TYPE_CHECKING:
    from ..core.deadlines import Deadline
    from .chunk_log import Run

__all__ = ["Carried", "RunHooks", "carry_out"]


class Carried(Protocol):
    """What of a chat (chat/record.py `Chat`) carrying out its machine's outputs reads and writes:
    named here so that this module does not import the chat that imports it."""

    agent: str
    chat_id: str
    user_id: str
    run: Run | None
    span: object | None
    first_token_from: float | None

log = structlog.get_logger("adk_gateway.chat.carry_out")

_BROWSER_OUTCOMES = {Outcome.OUTPUT: "output", Outcome.OUTPUT_ERROR: "error"}

# The chunks that carry the model's words (or voice) to the browser: the first one ends the time to first token.
_TOKEN_CHUNKS = frozenset({"text-delta", "reasoning-delta", "data-pcm"})
_PCM = "data-pcm"
_TYPE = itemgetter("type")


@dataclass(frozen=True)
class RunHooks:
    """What every chat of a chat service shares."""

    metrics: GatewayMetrics
    clock: Callable[[], float]
    # Hands a released call's verdict to the plugin's request waiting for it.
    release: Callable[[GatedCall], None]
    # Reports each approval's start and decision (metrics by who decided, audit trail, webhooks).
    notices: Notices | None = None
    # A span per turn (ops/tracing.py); the shared no-op unless traces are on.
    tracing: Tracing = Tracing.off()
    # The deadline queue (chat/ports.py, through the chat service): a chat's held calls' deadline
    # kept (added or moved), and dropped by its key once nothing waits. Nowhere for a chat alone.
    kept: Callable[[Deadline], None] = lambda deadline: None
    settled: Callable[[str], None] = lambda key: None
    # The queue's clock (wall, shared between hosts), which `clock` (the machine's) is turned into.
    wall: Callable[[], float] = time.time


def carry_out(chat: Carried, hooks: RunHooks, outputs: list[Output]) -> None:
    """Do what `outputs` ask for, in order, for `chat`."""
    for output in outputs:
        if type(output) is Chunks:
            _write(chat, hooks, output.chunks)
        elif type(output) is OpenResponse:
            _log(chat).next_response()
        elif type(output) is CloseResponse:
            _log(chat).end_response(hooks.clock())
        elif type(output) is UsageSeen:
            # A third of a tool-heavy stream's events: not through `_observe`'s match.
            hooks.metrics.count_tokens(chat.agent, output.model, output.usage)
        else:
            _observe(chat, hooks, output)


def _log(chat: Carried) -> Run:
    assert chat.run is not None  # a turn writes only after `start` gave it its run
    return chat.run


def _write(chat: Carried, hooks: RunHooks, chunks: list[dict[str, Any]]) -> None:
    # Per write, not per chunk: the types read and counted (a plain dict, read at scrape time)
    # and the chunks encoded, each in a loop that runs in C (docs/performance.md).
    kinds = list(map(_TYPE, chunks))
    metrics = hooks.metrics
    metrics.chunk_counts.update(kinds)  # a Counter: its C loop
    if _PCM in kinds:
        audio = metrics.audio_bytes.labels("out")
        for chunk in chunks:
            if chunk["type"] == _PCM:
                audio.inc(len(chunk["data"]["data"]) * 3 // 4)
    _log(chat).publish(encode_chunks(chunks))
    if chat.first_token_from is not None and not _TOKEN_CHUNKS.isdisjoint(kinds):
        started, chat.first_token_from = chat.first_token_from, None
        metrics.first_token.labels(chat.agent).observe(hooks.clock() - started, metrics.exemplar())


def _observe(chat: Carried, hooks: RunHooks, output: Output) -> None:
    metrics, agent = hooks.metrics, chat.agent
    match output:
        case CallChanged(call=call, before=before, waited=waited):
            _observe_call(metrics, agent, call, before, waited)
            if before is CallState.AWAITING_APPROVAL and call.state is not CallState.AWAITING_APPROVAL:
                if hooks.notices is not None:
                    hooks.notices.call_released(agent, call, waited)
            if call.outcome is Outcome.ABANDONED:
                log.warning("gated_call_abandoned", approval_id=call.id, tool=call.tool, reason=output.reason)
            if call.released:
                hooks.release(call)
        case Bypassed(tool=tool):
            metrics.policy_bypassed.labels(agent, tool).inc()
            log.warning("policy_bypassed", tool=tool, reason="the ADK plugin did not ask about a gated tool")
        case NativeAsked(confirmation=asked):
            if asked.approval:
                metrics.approvals_pending.labels(agent).inc()
                if hooks.notices is not None:
                    hooks.notices.native_waiting(agent, chat.chat_id, chat.user_id, asked, chat.span)
                log.info("approval_requested", approval_id=asked.approval_id, tool=asked.tool)
            else:
                # A browser tool nobody approves (confirm mode): it waits for the browser's output.
                log.info("browser_tool_requested", approval_id=asked.approval_id, tool=asked.tool)
        case UsageSeen(model=model, usage=usage):
            metrics.count_tokens(agent, model, usage)
        case RunEnded():
            chat.first_token_from = None
            if chat.span is not None:
                hooks.tracing.end_turn_outcome(chat.span, output.outcome)
            metrics.runs.labels(agent, output.outcome).inc()
            log.info("run_finished", outcome=output.outcome)
        case Raised(error=error):
            raise error


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
