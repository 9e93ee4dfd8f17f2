"""A live session's turns as a machine (core/live_turns.py), driven by hand: every (state, input)
pair against the table, where a turn ends (tool results), the cut turn, and the socket closing
mid-turn and mid-cut. No socket, no event loop."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gateway.core.live_turns import (
    TRANSITIONS, LiveInput, LiveState, LiveTurnError, LiveTurns, Step, Verdict, after_tools,
)
from tests.support.adk import LIVE_CALL, LIVE_RESULT, TURN_COMPLETE, live_text

S, I, V = LiveState, LiveInput, Verdict



# The whole table, written out again: a change to live_turns.TRANSITIONS must be made here too.
# None: refused (LiveTurnError, nothing changed).
EXPECTED: dict[tuple[LiveState, LiveInput], Step | None] = {
    (S.IDLE, I.BEGIN): Step(S.IN_TURN, V.START),
    (S.IDLE, I.EVENT): Step(S.IDLE, V.DROP),
    (S.IDLE, I.END): Step(S.IDLE, V.DROP),
    (S.IDLE, I.LEFT): None,
    (S.IDLE, I.WITHDRAWN): None,
    (S.IDLE, I.CLOSE): Step(S.CLOSED, V.NOTHING),
    (S.IN_TURN, I.BEGIN): Step(S.IN_TURN, V.BUSY),
    (S.IN_TURN, I.EVENT): Step(S.IN_TURN, V.DELIVER),
    (S.IN_TURN, I.END): Step(S.ENDED, V.TURN_ENDED),
    (S.IN_TURN, I.LEFT): Step(S.CUT, V.CUT),
    (S.IN_TURN, I.WITHDRAWN): Step(S.IDLE, V.NOTHING),
    (S.IN_TURN, I.CLOSE): Step(S.CLOSING, V.CLOSE_TURN),
    (S.ENDED, I.BEGIN): Step(S.ENDED, V.BUSY),
    (S.ENDED, I.EVENT): None,
    (S.ENDED, I.END): None,
    (S.ENDED, I.LEFT): Step(S.IDLE, V.NOTHING),
    (S.ENDED, I.WITHDRAWN): None,
    (S.ENDED, I.CLOSE): Step(S.CLOSED, V.NOTHING),
    (S.CUT, I.BEGIN): Step(S.CUT, V.UNSETTLED),
    (S.CUT, I.EVENT): Step(S.CUT, V.DROP_CUT),
    (S.CUT, I.END): Step(S.IDLE, V.CUT_ENDED),
    (S.CUT, I.LEFT): None,
    (S.CUT, I.WITHDRAWN): None,
    (S.CUT, I.CLOSE): Step(S.CLOSED, V.CUT_ENDED),
    (S.CLOSING, I.BEGIN): Step(S.CLOSING, V.BUSY),
    (S.CLOSING, I.EVENT): Step(S.CLOSING, V.DELIVER),
    (S.CLOSING, I.END): Step(S.CLOSED, V.TURN_ENDED),
    (S.CLOSING, I.LEFT): Step(S.CLOSED, V.NOTHING),
    (S.CLOSING, I.WITHDRAWN): Step(S.CLOSED, V.NOTHING),
    (S.CLOSING, I.CLOSE): Step(S.CLOSING, V.NOTHING),
    (S.CLOSED, I.BEGIN): Step(S.CLOSED, V.CLOSED),
    (S.CLOSED, I.EVENT): None,
    (S.CLOSED, I.END): None,
    (S.CLOSED, I.LEFT): Step(S.CLOSED, V.NOTHING),
    (S.CLOSED, I.WITHDRAWN): Step(S.CLOSED, V.NOTHING),
    (S.CLOSED, I.CLOSE): Step(S.CLOSED, V.NOTHING),
}

# How each state is reached from a new session.
PATHS: dict[LiveState, Callable[[LiveTurns], object]] = {
    S.IDLE: lambda t: None,
    S.IN_TURN: lambda t: t.begin(),
    S.ENDED: lambda t: (t.begin(), t.event(TURN_COMPLETE)),
    S.CUT: lambda t: (t.begin(), t.left(True)),
    S.CLOSING: lambda t: (t.begin(), t.closed()),
    S.CLOSED: lambda t: t.closed(),
}

INPUTS: dict[LiveInput, Callable[[LiveTurns], Verdict]] = {
    I.BEGIN: lambda t: t.begin(),
    I.EVENT: lambda t: t.event(live_text("hi")),
    I.END: lambda t: t.event(TURN_COMPLETE),
    I.LEFT: lambda t: t.left(True),
    I.WITHDRAWN: lambda t: t.left(False),
    I.CLOSE: lambda t: t.closed(),
}


def in_state(state: LiveState) -> LiveTurns:
    turns = LiveTurns()
    PATHS[state](turns)
    assert turns.state is state
    return turns


def test_the_table_is_the_one_written_out_here() -> None:
    assert {pair: step for pair, step in EXPECTED.items() if step is not None} == TRANSITIONS
    assert len(EXPECTED) == len(LiveState) * len(LiveInput)


@pytest.mark.parametrize(("state", "move"), list(EXPECTED), ids=lambda v: v.name)
def test_every_state_and_input_is_taken_or_refused_as_the_table_says(state: LiveState, move: LiveInput) -> None:
    turns = in_state(state)
    dropped = turns.dropped
    expected = EXPECTED[(state, move)]
    if expected is None:
        with pytest.raises(LiveTurnError):
            INPUTS[move](turns)
        assert turns.state is state and turns.dropped == dropped  # nothing changed
        return
    assert INPUTS[move](turns) is expected.verdict
    assert turns.state is expected.after
    assert turns.in_turn == (expected.after in {S.IN_TURN, S.ENDED, S.CLOSING})
    # Counted: what was nobody's, or the cut turn's.
    assert turns.dropped - dropped == (expected.verdict in {V.DROP, V.DROP_CUT, V.CUT_ENDED} and move in {I.EVENT, I.END})


def test_a_turn_ends_at_turn_complete() -> None:
    turns = LiveTurns()
    assert turns.begin() is V.START
    assert [turns.event(e) for e in (live_text("a"), TURN_COMPLETE)] == [V.DELIVER, V.TURN_ENDED]
    assert turns.left(True) is V.NOTHING and turns.state is S.IDLE and turns.dropped == 0


def test_turn_complete_right_after_tool_results_does_not_end_the_turn() -> None:
    turns = in_state(S.IN_TURN)
    verdicts = [turns.event(e) for e in (LIVE_CALL, LIVE_RESULT, TURN_COMPLETE, live_text("answer"), TURN_COMPLETE)]
    assert verdicts == [V.DELIVER, V.DELIVER, V.DELIVER, V.DELIVER, V.TURN_ENDED]


def test_a_new_turn_does_not_inherit_the_tool_results_of_the_last() -> None:
    turns = in_state(S.IN_TURN)
    turns.event(LIVE_RESULT)
    turns.left(True)
    assert turns.event(TURN_COMPLETE) is V.DROP_CUT  # the cut turn still waits for its answer
    assert turns.event(live_text("answer")) is V.DROP_CUT
    assert turns.event(TURN_COMPLETE) is V.CUT_ENDED
    turns.event(LIVE_RESULT)  # nobody's, between turns
    assert turns.begin() is V.START
    assert turns.event(TURN_COMPLETE) is V.TURN_ENDED  # answered again at the new turn's start


@pytest.mark.parametrize(
    ("event", "answered", "after"),
    [
        (LIVE_RESULT, True, False),
        (LIVE_CALL, False, True),
        (live_text("x"), False, True),
        ({"content": {"role": "user", "parts": [{"text": "x"}]}}, False, False),  # a transcript is not the model
        ({"content": {"role": "model", "parts": []}}, False, False),  # nothing said
        ({"content": "not an object"}, True, True),
        (TURN_COMPLETE, False, False),
        ({"content": {"role": "model", "parts": [{"text": "x"}, {"functionResponse": {}}]}}, True, False),
    ],
)
def test_after_tools(event: dict[str, Any], answered: bool, after: bool) -> None:
    assert after_tools(event, answered) is after


def test_events_with_no_turn_in_progress_are_dropped_and_counted() -> None:
    turns = LiveTurns()
    assert turns.event(live_text("unprompted")) is V.DROP and turns.event(TURN_COMPLETE) is V.DROP
    assert turns.dropped == 2 and turns.state is S.IDLE


def test_a_cut_turn_is_dropped_up_to_its_end_and_refuses_the_next_turn_until_then() -> None:
    turns = in_state(S.IN_TURN)
    turns.event(live_text("Hel"))
    assert turns.left(True) is V.CUT and turns.cut and not turns.in_turn
    assert turns.begin() is V.UNSETTLED and turns.state is S.CUT
    assert [turns.event(e) for e in (live_text("lo"), TURN_COMPLETE)] == [V.DROP_CUT, V.CUT_ENDED]
    assert turns.dropped == 2 and not turns.cut
    assert turns.event(live_text("later")) is V.DROP  # after the cut's end: nobody's
    assert turns.begin() is V.START


def test_a_cut_turn_waiting_on_tool_results_ends_at_the_turn_complete_after_the_answer() -> None:
    turns = in_state(S.IN_TURN)
    turns.event(LIVE_CALL)
    turns.event(LIVE_RESULT)
    turns.left(True)
    assert [turns.event(e) for e in (TURN_COMPLETE, live_text("Paid."), TURN_COMPLETE)] == [V.DROP_CUT, V.DROP_CUT, V.CUT_ENDED]


def test_a_turn_whose_request_never_went_out_leaves_nothing_cut() -> None:
    turns = in_state(S.IN_TURN)
    assert turns.left(False) is V.NOTHING and turns.state is S.IDLE
    assert turns.begin() is V.START


def test_the_socket_closing_mid_turn_fails_the_turn_after_what_came_before() -> None:
    turns = in_state(S.IN_TURN)
    assert turns.closed() is V.CLOSE_TURN and turns.in_turn
    assert turns.begin() is V.BUSY  # its reader is still there
    assert turns.event(live_text("a")) is V.DELIVER  # taken before the close
    assert turns.left(True) is V.NOTHING and turns.state is S.CLOSED  # not cut: nothing more comes
    assert turns.begin() is V.CLOSED


def test_a_turn_end_that_came_before_the_close_still_ends_the_turn() -> None:
    turns = in_state(S.IN_TURN)
    turns.closed()
    assert turns.event(TURN_COMPLETE) is V.TURN_ENDED and turns.state is S.CLOSED
    assert turns.left(True) is V.NOTHING


def test_the_socket_closing_mid_cut_ends_the_cut() -> None:
    turns = in_state(S.IN_TURN)
    turns.left(True)
    assert turns.closed() is V.CUT_ENDED and turns.state is S.CLOSED
    assert turns.begin() is V.CLOSED and turns.dropped == 0


def test_a_refused_input_changes_nothing() -> None:
    turns = in_state(S.IN_TURN)
    turns.event(TURN_COMPLETE)
    with pytest.raises(LiveTurnError, match="ended"):
        turns.event(live_text("after the end"))
    assert turns.state is S.ENDED and turns.in_turn and turns.dropped == 0
