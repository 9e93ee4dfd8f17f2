"""How a run made to end early ends, decided by the chat's machine (core/run_ending.py).

The shell tells the machine why it ends a run (`EndAsked`) before it cancels the run's task, then
that the task was cancelled (`RunCancelled`); the chunks and the outcome are the machine's. Each way
a run is ended early is here, with the chunks the browser gets: its abort and a new message nobody
reads the old response of (an `abort` chunk, no `finish`), the agent a reload removed and a shutdown
(an `error` chunk saying why, `finish {error}`), a task cancelled with nothing asked, and a task
stuck past its bound that the shell ends for it. Every one counts as outcome `cancelled`.
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway.approvals.decision import DECIDER
from gateway.config.schema import ToolPolicy
from gateway.core.approvals import Outcome
from gateway.core.chat_events import EndAsked, GateOpened, RunCancelled, RunClosed, RunStarts, RunWanted, ToolAsked, UpstreamRead
from gateway.core.chat_machine import TRANSITIONS, ChatMachine, MachineError, Phase
from gateway.core.chat_outputs import Admission, CallChanged, Chunks, CloseResponse, GateDecided, RunEnded
from gateway.core.run_ending import CANCELLED

PAY = ToolPolicy(approval=True, timeout=30)
REMOVED = "The agent support was removed from the gateway; this response was ended."
SHUTDOWN = "The gateway is shutting down."
TEXT = {"author": "a", "content": {"role": "model", "parts": [{"text": "Working "}]}}

# What the browser gets after the run's words, the run's end reported: an abort ends the step
# and says `abort`, with no `finish` (the AI SDK's stopped state); a cancel says why as an error.
ABORTED = [Chunks([{"type": "finish-step"}, {"type": "abort"}]), CloseResponse(waiting=False), RunEnded("cancelled")]


def _closed(sentence: str) -> list[Any]:
    return [
        Chunks([{"type": "error", "errorText": sentence}]),
        Chunks([{"type": "finish-step"}, {"type": "finish", "finishReason": "error"}]),
        CloseResponse(waiting=False), RunEnded("cancelled"),
    ]


def _writing() -> ChatMachine:
    """A chat whose run 1 has written some words."""
    machine = ChatMachine(decider=DECIDER)
    machine.handle(RunStarts("m1", 0.0, policy=lambda name: PAY if name == "pay" else ToolPolicy()))
    machine.handle(UpstreamRead([TEXT], 1.0, 1))
    return machine


def _cancelled(machine: ChatMachine, run: int = 1, now: float = 2.0) -> list[Any]:
    """The run's task was cancelled, then its stream is over: what the machine answers both."""
    return machine.handle(RunCancelled(now, run)) + machine.handle(RunClosed(now, run))


def test_the_browsers_abort_ends_the_run_with_an_abort_chunk() -> None:
    machine = _writing()
    assert machine.handle(EndAsked(1, "abort")) == []  # recorded: nothing is written until the task ends
    assert _cancelled(machine) == ABORTED
    assert machine.phase is Phase.IDLE


def test_a_new_message_for_a_response_nobody_reads_ends_the_old_run_as_an_abort() -> None:
    machine = _writing()
    assert machine.handle(RunWanted(open=True)) == [Admission("abort")]
    machine.handle(EndAsked(1, "abort"))  # chat/run_tasks.py stop_unread
    assert _cancelled(machine) == ABORTED


@pytest.mark.parametrize("sentence", [REMOVED, SHUTDOWN], ids=["agent-removed-by-reload", "shutdown"])
def test_the_gateway_closing_a_run_says_why_as_an_error(sentence: str) -> None:
    machine = _writing()
    machine.handle(EndAsked(1, "cancel", sentence))
    assert _cancelled(machine) == _closed(sentence)


def test_a_run_cancelled_with_nothing_asked_says_the_default_sentence() -> None:
    machine = _writing()
    assert _cancelled(machine) == _closed(CANCELLED) and CANCELLED == "This response was cancelled."
    machine = _writing()
    machine.handle(EndAsked(1, "cancel"))  # a settle's stop: no sentence of its own
    assert _cancelled(machine) == _closed(CANCELLED)


def test_a_stuck_task_is_ended_by_the_shell_and_what_it_says_later_is_dropped() -> None:
    machine = _writing()
    machine.handle(EndAsked(1, "cancel", SHUTDOWN))
    # `Chat.stop(0)`: the task did not end within its bound; the shell ends the run for it.
    assert _cancelled(machine, now=2.0) == _closed(SHUTDOWN)
    assert not machine.under_way(1)
    assert _cancelled(machine, now=5.0) == [] and machine.handle(EndAsked(1, "abort")) == []
    # The next run starts with nothing asked: the old run's sentence is not its.
    machine.handle(RunStarts("m2", 6.0))
    machine.handle(UpstreamRead([TEXT], 6.0, 2))
    assert _cancelled(machine, run=1) == [] and _cancelled(machine, run=2, now=7.0) == _closed(CANCELLED)


def test_a_run_waiting_for_a_person_releases_the_call_when_aborted() -> None:
    machine = _writing()
    event = {"author": "a", "content": {"role": "model", "parts": [{"functionCall": {"id": "c1", "name": "pay", "args": {}}}]}}
    machine.handle(UpstreamRead([event], 1.0, 1))
    [decided] = machine.handle(ToolAsked("c1", "pay", {}, PAY, "agent", "u", "c", "c", 1.0))
    assert isinstance(decided, GateDecided) and decided.call is not None
    machine.handle(GateOpened(decided.call, 1.0))
    machine.handle(EndAsked(1, "abort"))
    out = _cancelled(machine)
    assert decided.call.outcome is Outcome.CANCELLED and decided.call.verdict is not None and not decided.call.verdict.run
    assert [o.call for o in out if isinstance(o, CallChanged)] == [decided.call]
    assert out[-1] == RunEnded("cancelled")


@pytest.mark.parametrize(
    ("asks", "end"),
    [
        # The browser stops a run the gateway is closing: its own stop is what it expects to see.
        ([("cancel", SHUTDOWN), ("abort", None)], ABORTED),
        ([("abort", None), ("cancel", SHUTDOWN)], ABORTED),
        # The run was already being closed for its agent when the shutdown came: that sentence stands.
        ([("cancel", REMOVED), ("cancel", SHUTDOWN)], _closed(REMOVED)),
        ([("cancel", None), ("cancel", SHUTDOWN)], _closed(CANCELLED)),
    ],
)
def test_an_abort_outranks_a_cancel_and_the_first_sentence_stands(asks: list[tuple[Any, str | None]], end: list[Any]) -> None:
    machine = _writing()
    for how, reason in asks:
        machine.handle(EndAsked(1, how, reason))
    assert _cancelled(machine) == end


def test_a_run_is_told_how_it_ends_only_while_it_is_under_way() -> None:
    assert {phase for phase, kind in TRANSITIONS if kind is EndAsked} == {Phase.RUNNING}
    assert {phase for phase, kind in TRANSITIONS if kind is RunCancelled} == {Phase.RUNNING, Phase.IDLE}
    machine = ChatMachine(decider=DECIDER)
    assert machine.handle(EndAsked(0, "abort")) == []  # the shell's number of no run: nothing to end
    with pytest.raises(MachineError, match="new does not take EndAsked"):
        machine.handle(EndAsked(None, "abort"))
    machine = _writing()
    before = machine.snapshot()
    machine.handle(EndAsked(1, "abort"))
    assert machine.snapshot() == before  # how a run of this process ends is not the chat's kept state
