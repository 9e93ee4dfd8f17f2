"""The turn (gateway/core/turn.py) as the state machine it is: inputs in, outputs out, no I/O, no clock.

Every test drives a `Turn` by hand, as the chat's machine does for its chat (gateway/chat/record.py), and reads what it
hands back. `Shell` below does with the outputs what `Chat.handle` (chat/carry_out.py) does with them, minus the
I/O: chunks go into the current response, `OpenResponse` starts the next one, `CloseResponse`
ends it; everything else is recorded. Each response it assembles is checked against the AI SDK's
ordering rules (tests/support/recordings.py `check_stream_rules`).

The gated-call tests here replace the converter-level ones that predate the turn: the same
behaviour, asserted on the turn's outputs.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from gateway.core.approvals import REFUSAL_KEY, CallState, GatedCall, Outcome, Verdict
from gateway.config.schema import ToolPolicy
from gateway.core.ledger import Ledger
from gateway.core.turn import (
    TRANSITIONS,
    Bypassed,
    CallChanged,
    Chunks,
    CloseResponse,
    Move,
    NativeAsked,
    OpenResponse,
    Output,
    Raised,
    RunEnded,
    Turn,
    TurnError,
    TurnState,
)
from tests.support.recordings import check_stream_rules, events, types

MESSAGE_ID = "m1"
START = {"type": "start", "messageId": MESSAGE_ID}

POLICIES = {
    "pay": ToolPolicy(approval=True),  # a server tool that needs approval
    "where": ToolPolicy(approval=True, runs_in="browser"),  # a browser tool that needs approval
    "bgm": ToolPolicy(runs_in="browser"),  # a browser tool, no approval
}


def _policy(name: str) -> ToolPolicy:
    return POLICIES.get(name, ToolPolicy())


# ---- building blocks --------------------------------------------------------------------------


def _turn(**kwargs: Any) -> Turn:
    kwargs.setdefault("ledger", Ledger())
    kwargs.setdefault("policy", _policy)
    return Turn(MESSAGE_ID, **kwargs)


def _gate(
    tool: str, call_id: str, args: dict[str, Any] | None = None, *, now: float = 0.0, policy: ToolPolicy | None = None,
) -> GatedCall:
    return GatedCall.open(
        user_id="u", chat_id="c", session_id="c", tool_call_id=call_id, tool=tool, args=args or {},
        policy=policy or _policy(tool), now=now,
    )


def _opened(turn: Turn, call: GatedCall) -> GatedCall:
    """What the plugin side (gateway/chat/gates.py) does before the turn shows a call: record it."""
    return turn.ledger.add(call)


def _call_event(*calls: tuple[str, str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "author": "a",
        "content": {"role": "model", "parts": [{"functionCall": {"id": i, "name": n, "args": a}} for i, n, a in calls]},
    }


def _response_event(call_id: str, name: str, response: Any) -> dict[str, Any]:
    part = {"functionResponse": {"id": call_id, "name": name, "response": response}}
    return {"author": "a", "content": {"role": "user", "parts": [part]}}


def _text_events(*pieces: str) -> list[dict[str, Any]]:
    partials = [{"author": "a", "partial": True, "content": {"role": "model", "parts": [{"text": p}]}} for p in pieces]
    final = {"author": "a", "content": {"role": "model", "parts": [{"text": "".join(pieces)}]}, "finishReason": "STOP"}
    return [*partials, final]


def _partial(text: str) -> dict[str, Any]:
    return {"author": "a", "partial": True, "content": {"role": "model", "parts": [{"text": text}]}}


_TOOL_INTRODUCED = ("tool-input-start", "tool-input-available")


@dataclass
class Response:
    chunks: list[dict[str, Any]] = field(default_factory=list)
    closed: bool = False
    waiting: bool | None = None  # what the CloseResponse that ended it said


class Shell:
    """Chat.handle's carrying out without the I/O: the responses the browser would read, and the rest observed."""

    def __init__(self, turn: Turn) -> None:
        self.turn = turn
        self.responses: list[Response] = [Response()]
        self.observed: list[Output] = []

    @property
    def current(self) -> Response:
        return self.responses[-1]

    def apply(self, outputs: list[Output]) -> list[Output]:
        for output in outputs:
            if isinstance(output, OpenResponse):
                self.responses.append(Response())
            elif isinstance(output, Chunks):
                assert not self.current.closed, f"chunks written into a closed response: {output.chunks}"
                self.current.chunks += output.chunks
            elif isinstance(output, CloseResponse):
                # A closed response may be closed again (Run.end_response is idempotent).
                self.current.closed = True
                self.current.waiting = output.waiting
            else:
                self.observed.append(output)
        return outputs

    def check_rules(self) -> None:
        """Every closed response follows the AI SDK's rules, knowing the tool calls shown before it."""
        known: list[str] = []
        for response in self.responses:
            if response.closed and response.chunks and response.chunks[-1]["type"] == "finish":
                check_stream_rules(response.chunks, known=known)
            known += [c["toolCallId"] for c in response.chunks if c["type"] in _TOOL_INTRODUCED]


def _kinds(outputs: list[Output]) -> list[str]:
    return [type(o).__name__ for o in outputs]


def _changes(outputs: list[Output]) -> list[CallChanged]:
    return [o for o in outputs if isinstance(o, CallChanged)]


def _chunks(outputs: list[Output]) -> list[dict[str, Any]]:
    return [c for o in outputs if isinstance(o, Chunks) for c in o.chunks]


def _waiting_on(tool: str = "pay", call_id: str = "c1", **turn_kwargs: Any) -> tuple[Turn, Shell, GatedCall]:
    """A turn whose run shows one gated call and waits for the person; its first response closed."""
    turn = _turn(**turn_kwargs)
    shell = Shell(turn)
    shell.apply(turn.begin())
    shell.apply(turn.feed([_call_event((call_id, tool, {}))], 0.0))
    call = _opened(turn, _gate(tool, call_id))
    shell.apply(turn.show_gate(call, 0.0))
    assert turn.state is TurnState.WAITING
    return turn, shell, call


# ---- gated calls: waiting until shown (ported from the converter's tests) --------------------------


def test_a_gated_call_waits_until_the_plugin_shows_it() -> None:
    turn = _turn()
    shell = Shell(turn)
    shell.apply(turn.begin())
    out = shell.apply(turn.feed([_call_event(("c1", "pay", {"amount": 5}))], 0.0))
    assert _kinds(out) == ["Chunks"]  # seen, not yet shown by the plugin: the response goes on
    assert not turn.waiting_for_person and turn.state is TurnState.STREAMING

    gate = _opened(turn, _gate("pay", "c1", {"amount": 5}))
    out = shell.apply(turn.show_gate(gate, 0.0))
    assert turn.waiting_for_person and turn.state is TurnState.WAITING
    assert _kinds(out) == ["Chunks", "Chunks", "CloseResponse"]
    assert out[0] == Chunks([{"type": "tool-approval-request", "approvalId": gate.id, "toolCallId": "c1"}])
    assert shell.current.chunks[-1] == {"type": "finish", "finishReason": "tool-calls"}
    assert out[-1] == CloseResponse(waiting=True)
    assert len(shell.responses) == 1
    shell.check_rules()


def test_parallel_gated_calls_wait_until_every_one_is_shown() -> None:
    turn = _turn()
    shell = Shell(turn)
    shell.apply(turn.begin())
    shell.apply(turn.feed([_call_event(("c1", "pay", {}), ("c2", "pay", {}))], 0.0))
    out = shell.apply(turn.show_gate(_opened(turn, _gate("pay", "c1")), 0.0))
    assert not turn.waiting_for_person
    assert turn.state is TurnState.STREAMING and not any(isinstance(o, CloseResponse) for o in out)
    out = shell.apply(turn.show_gate(_opened(turn, _gate("pay", "c2")), 0.0))
    assert turn.waiting_for_person and turn.state is TurnState.WAITING
    assert out[-1] == CloseResponse(waiting=True)
    assert types(shell.current.chunks).count("tool-approval-request") == 2
    shell.check_rules()


def test_a_gate_shown_before_the_models_event_shows_the_call_once() -> None:
    turn = _turn()
    shell = Shell(turn)
    shell.apply(turn.begin())
    shell.apply(turn.show_gate(_opened(turn, _gate("pay", "c1", {"x": 1})), 0.0))
    assert turn.state is TurnState.WAITING
    # The model's event naming the call arrives afterwards: nothing new for the browser.
    assert shell.apply(turn.feed([_call_event(("c1", "pay", {"x": 1}))], 1.0)) == []
    assert turn.waiting_for_person and turn.state is TurnState.WAITING
    assert len(shell.responses) == 1
    assert types(shell.current.chunks).count("tool-input-available") == 1
    shell.check_rules()


def test_showing_the_same_gate_twice_shows_it_once() -> None:
    turn, shell, call = _waiting_on()
    assert turn.show_gate(call, 1.0) == []
    assert turn.state is TurnState.WAITING and len(shell.responses) == 1


def test_a_browser_tool_needing_approval_is_held_until_approved() -> None:
    turn = _turn()
    shell = Shell(turn)
    shell.apply(turn.begin())
    shell.apply(turn.feed([_call_event(("c1", "where", {"precise": True}))], 0.0))
    gate = _opened(turn, _gate("where", "c1", {"precise": True}))
    shell.apply(turn.show_gate(gate, 0.0))
    first = shell.responses[0].chunks
    assert "tool-input-available" not in types(first)  # the AI SDK would run it at once
    assert first[3] == {"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": '{"precise":true}'}
    assert first[-1]["finishReason"] == "tool-calls"

    # Approved: the answer's response hands the call to the browser without opening a new step.
    shell.apply(turn.attach())
    out = shell.apply(turn.answer([(gate, True, None)], [], 1.0))
    assert _kinds(out) == ["CallChanged", "Chunks", "Chunks", "CloseResponse"]
    assert out[0].before is CallState.AWAITING_APPROVAL and gate.state is CallState.AWAITING_OUTPUT
    cont = shell.responses[1].chunks
    assert types(cont) == ["start", "tool-input-available", "finish"]
    assert cont[1] == {
        "type": "tool-input-available", "toolCallId": "c1", "toolName": "where", "input": {"precise": True},
    }
    assert cont[-1]["finishReason"] == "tool-calls"  # now it waits for the browser's output
    assert turn.waiting_for_person and out[-1] == CloseResponse(waiting=True)

    # The browser's output releases the call; nothing more for the browser to see about it.
    shell.apply(turn.attach())
    out = shell.apply(turn.answer([], [(gate, {"lat": 1}, None)], 2.0))
    assert _kinds(out) == ["CallChanged"] and gate.outcome is Outcome.OUTPUT
    assert gate.verdict == Verdict(run=False, response={"lat": 1})
    assert not turn.waiting_for_person and turn.state is TurnState.STREAMING
    # ADK's echo of the browser's own output is not news to the client.
    assert shell.apply(turn.feed([_response_event("c1", "where", {"lat": 1})], 3.0)) == []
    shell.apply(turn.end(4.0))
    assert types(shell.responses[2].chunks) == ["start", "finish"]
    assert shell.responses[2].chunks[-1]["finishReason"] == "stop"
    shell.check_rules()


# ---- gated calls: how a released call renders -------------------------------------------------


def test_a_denied_gate_renders_as_tool_output_denied() -> None:
    turn, shell, gate = _waiting_on()
    shell.apply(turn.attach())
    out = shell.apply(turn.answer([(gate, False, "too much")], [], 1.0))
    assert _kinds(out) == ["CallChanged"] and gate.outcome is Outcome.DENIED
    assert gate.verdict is not None and gate.verdict.response is not None
    assert gate.verdict.response[REFUSAL_KEY] == "denied" and "too much" in gate.verdict.response["error"]
    out = shell.apply(turn.feed([_response_event("c1", "pay", gate.verdict.response)], 2.0))
    assert _chunks(out) == [{"type": "tool-output-denied", "toolCallId": "c1"}]
    shell.apply(turn.end(3.0))
    shell.check_rules()


def test_a_timed_out_gate_with_on_timeout_deny_renders_as_tool_output_denied() -> None:
    turn, shell, gate = _waiting_on()
    shell.apply(turn.expire(gate.deadline))
    assert gate.outcome is Outcome.TIMEOUT
    out = shell.apply(turn.feed([_response_event("c1", "pay", gate.verdict.response)], gate.deadline + 1))
    # Written while the run waited: a new response, which opens with `start`.
    assert _kinds(out) == ["OpenResponse", "Chunks"]
    assert _chunks(out) == [START, {"type": "tool-output-denied", "toolCallId": "c1"}]


def test_a_timed_out_gate_with_on_timeout_error_shows_the_reason_not_the_marker() -> None:
    turn = _turn()
    shell = Shell(turn)
    shell.apply(turn.begin())
    shell.apply(turn.feed([_call_event(("c1", "pay", {}))], 0.0))
    gate = _opened(turn, _gate("pay", "c1", policy=ToolPolicy(approval=True, on_timeout="error")))
    shell.apply(turn.show_gate(gate, 0.0))
    shell.apply(turn.expire(10_000.0))
    assert gate.outcome is Outcome.TIMEOUT and gate.verdict is not None and gate.verdict.response is not None
    out = shell.apply(turn.feed([_response_event("c1", "pay", gate.verdict.response)], 10_001.0))
    reason = gate.verdict.response["error"]
    assert _chunks(out) == [START, {"type": "tool-output-error", "toolCallId": "c1", "errorText": reason}]
    shell.apply(turn.end(10_002.0))
    shell.check_rules()


# ---- gated calls: the plugin giving up --------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "approve_first"),
    [("pay", False), ("where", False), ("where", True), ("bgm", False)],
    ids=["approval", "browser-tool-held-for-approval", "browser-tool-approved", "browser-tool"],
)
def test_the_plugin_giving_up_ends_the_wait_with_an_error_and_one_whole_continuation(
    tool: str, approve_first: bool,
) -> None:
    """The plugin's long poll ended without a verdict (ADK_GATEWAY_MAX_WAIT, a dead replica, a proxy):
    it answered ADK with its refusal. The call is over; the model's words that follow belong to one
    response that the person's late answer (or a resume) receives whole."""
    turn = _turn()
    shell = Shell(turn)
    shell.apply(turn.begin())
    shell.apply(turn.feed([_call_event(("c1", tool, {"x": 1}))], 0.0))
    gate = _opened(turn, _gate(tool, "c1", {"x": 1}))
    shell.apply(turn.show_gate(gate, 0.0))
    if approve_first:
        shell.apply(turn.attach())
        shell.apply(turn.answer([(gate, True, None)], [], 1.0))
        assert gate.state is CallState.AWAITING_OUTPUT
    assert turn.waiting_for_person and turn.state is TurnState.WAITING
    waited_in = gate.state
    responses_before = len(shell.responses)

    gave_up = "Nobody decided within the plugin's longest wait; the call was not run."
    refusal = {"error": gave_up, REFUSAL_KEY: "max_wait"}
    out = shell.apply(turn.feed([_response_event("c1", tool, refusal)], 5.0))
    assert _kinds(out) == ["OpenResponse", "Chunks", "CallChanged"]
    (changed,) = _changes(out)
    assert changed.call is gate and changed.before is waited_in
    assert gate.outcome is Outcome.ABANDONED and gate.verdict is not None and gate.verdict.response is not None
    assert gate.verdict.response[REFUSAL_KEY] == "abandoned" and "max_wait" in gate.verdict.response["error"]
    assert not turn.waiting_for_person and not turn.ledger.gates_open
    # Nobody reads it yet: it is held, whole, for the late answer or a resume.
    assert turn.state is TurnState.HELD
    for event in _text_events("The payment ", "was not made: ", "nobody decided."):
        out = shell.apply(turn.feed([event], 6.0))
        # The text must not be cut into responses of its own.
        assert not any(isinstance(o, (OpenResponse, CloseResponse)) for o in out)
    out = shell.apply(turn.end(7.0))
    assert _kinds(out) == ["Chunks", "CloseResponse", "RunEnded"] and out[-1] == RunEnded("completed")

    assert len(shell.responses) == responses_before + 1
    cont = shell.current.chunks
    assert types(cont) == [
        "start", "tool-output-error", "start-step", "text-start", "text-delta", "text-delta", "text-delta",
        "text-end", "finish-step", "finish",
    ]
    assert cont[1] == {"type": "tool-output-error", "toolCallId": "c1", "errorText": refusal["error"]}
    assert "".join(c["delta"] for c in cont if c["type"] == "text-delta") == "The payment was not made: nobody decided."
    assert cont[-1]["finishReason"] == "stop"
    assert not any(isinstance(o, Bypassed) for o in shell.observed)
    shell.check_rules()
    # The person's late answer (or the browser's late output) changes nothing any more.
    assert turn.answer([(gate, True, None)], [(gate, {"late": True}, None)], 8.0) == []


def test_an_old_plugins_unmarked_answer_at_an_open_gate_still_ends_the_wait() -> None:
    # The plugin asked (the gate is open), so it is installed: an answer the gateway never released
    # is the plugin giving up, whatever its version.
    turn, shell, gate = _waiting_on()
    text = "The approval gateway went away; the call was not run."
    out = shell.apply(turn.feed([_response_event("c1", "pay", {"error": text})], 1.0))
    assert _chunks(out) == [START, {"type": "tool-output-error", "toolCallId": "c1", "errorText": text}]
    assert [c.call for c in _changes(out)] == [gate] and gate.outcome is Outcome.ABANDONED
    assert "no reason given" in gate.verdict.response["error"]
    assert not turn.waiting_for_person and turn.state is TurnState.HELD
    assert not any(isinstance(o, Bypassed) for o in out)


# ---- gated calls the plugin never asked about: the bypass alarm -------------------------------


@pytest.mark.parametrize("response", [{"ok": 1}, {"error": "card declined"}], ids=["result", "own-error"])
def test_a_gated_tool_answering_without_the_plugin_asking_is_reported_as_bypassed(response: dict[str, Any]) -> None:
    # The tool ran (and maybe failed) though the plugin never asked: that is what the alarm is for.
    turn = _turn()
    turn.begin()
    turn.feed([_call_event(("c1", "pay", {}))], 0.0)
    out = turn.feed([_response_event("c1", "pay", response)], 1.0)
    assert [o for o in out if isinstance(o, Bypassed)] == [Bypassed("pay")]
    assert not turn.waiting_for_person and turn.state is TurnState.STREAMING


@pytest.mark.parametrize("code", ["policy_unavailable", "gateway_unreachable", "too_many_pending", "refused"])
def test_a_marked_refusal_of_a_gated_call_the_plugin_could_not_show_is_no_bypass(code: str) -> None:
    # The plugin failed closed before the gateway could show the call (gateway unreachable, no
    # policy) or the gateway refused it at once: the tool did not run, so nothing was bypassed.
    turn = _turn()
    turn.begin()
    turn.feed([_call_event(("c1", "pay", {}))], 0.0)
    out = turn.feed([_response_event("c1", "pay", {"error": "The call was not run.", REFUSAL_KEY: code})], 1.0)
    assert out == [Chunks([{"type": "tool-output-error", "toolCallId": "c1", "errorText": "The call was not run."}])]
    assert not turn.waiting_for_person and turn.converter.abandoned == []


# ---- the transition table ---------------------------------------------------------------------


def _in_state(state: TurnState) -> Turn:
    """A turn brought to `state` through its inputs, as a run would get there."""
    if state is TurnState.WAITING:
        return _waiting_on()[0]
    if state is TurnState.HELD:
        turn = _waiting_on()[0]
        turn.feed(_text_events("Meanwhile."), 1.0)
        assert turn.state is TurnState.HELD
        return turn
    turn = _turn()
    turn.begin()
    if state is TurnState.DONE:
        turn.end(1.0)
    elif state is TurnState.FAILED:
        turn.fail("boom", 1.0)
    elif state is TurnState.ABORTED:
        turn.abort(1.0)
    assert turn.state is state
    return turn


@pytest.mark.parametrize(
    ("state", "move"), list(itertools.product(TurnState, Move)), ids=lambda v: v.value,
)
def test_every_state_and_move_follows_the_transition_table(state: TurnState, move: Move) -> None:
    turn = _in_state(state)
    allowed = TRANSITIONS.get((state, move))
    if allowed is None:
        with pytest.raises(TurnError):
            turn._move(move)
        assert turn.state is TurnState.FAILED
    else:
        turn._move(move)
        assert turn.state is allowed


def test_an_ended_turn_has_no_move_left() -> None:
    ended = {TurnState.DONE, TurnState.FAILED, TurnState.ABORTED}
    assert not [pair for pair in TRANSITIONS if pair[0] in ended]
    # A run that waits ended its response: it cannot end it again, only write into a new one.
    assert (TurnState.WAITING, Move.PAUSE) not in TRANSITIONS
    assert TRANSITIONS[(TurnState.WAITING, Move.WRITE)] is TurnState.HELD


@pytest.mark.parametrize("ended", [TurnState.DONE, TurnState.FAILED, TurnState.ABORTED], ids=lambda s: s.value)
@pytest.mark.parametrize("late", ["feed", "feed-nothing", "attach"])
def test_an_event_or_an_attach_after_the_run_ended_raises_and_leaves_the_turn_failed(
    ended: TurnState, late: str,
) -> None:
    turn = _in_state(ended)
    with pytest.raises(TurnError):
        if late == "feed":
            turn.feed([_partial("too late")], 2.0)
        elif late == "feed-nothing":
            turn.feed([], 2.0)
        else:
            turn.attach()
    assert turn.state is TurnState.FAILED


@pytest.mark.parametrize("ended", [TurnState.DONE, TurnState.FAILED, TurnState.ABORTED], ids=lambda s: s.value)
def test_ending_inputs_after_the_run_ended_change_nothing(ended: TurnState) -> None:
    turn = _in_state(ended)
    turn.end(2.0)
    assert turn.fail("again", 3.0) == []
    assert turn.abort(3.0) == []
    assert turn.end(3.0) == []
    late = _opened(turn, _gate("pay", "c9"))
    assert turn.show_gate(late, 3.0) == []
    assert turn.state is ended


# ---- response boundaries ----------------------------------------------------------------------


def test_a_run_that_waits_for_a_person_ends_its_response_with_tool_calls() -> None:
    turn = _turn()
    out = turn.begin() + turn.feed(_text_events("Paying ", "now.") + [_call_event(("c1", "pay", {}))], 0.0)
    assert turn.state is TurnState.STREAMING and not any(isinstance(o, CloseResponse) for o in out)
    out = turn.show_gate(_opened(turn, _gate("pay", "c1")), 0.0)
    assert isinstance(out[-2], Chunks) and out[-2].chunks[-1] == {"type": "finish", "finishReason": "tool-calls"}
    assert out[-1] == CloseResponse(waiting=True)
    assert turn.state is TurnState.WAITING and turn.waiting_for_person


def test_late_events_while_waiting_go_into_one_held_response_that_the_next_reader_gets_whole() -> None:
    """A non-blocking tool's text, say, while the person decides: before, each event opened a
    response of its own that closed at once, and the run log kept only the last (the tail-only loss
    noted in issue 13)."""
    turn, shell, gate = _waiting_on()
    out = shell.apply(turn.feed(_text_events("Still ", "waiting."), 1.0))
    assert _kinds(out)[0] == "OpenResponse" and set(_kinds(out)[1:]) == {"Chunks"}
    out = shell.apply(turn.feed(_text_events(" And more."), 2.0))
    assert set(_kinds(out)) == {"Chunks"}  # into the same response
    assert turn.state is TurnState.HELD and turn.waiting_for_person
    held = shell.current
    assert held.chunks[0] == START and not held.closed
    assert "".join(c["delta"] for c in held.chunks if c["type"] == "text-delta") == "Still waiting. And more."
    # The person answers: the answering request reads the held response from its start, and it
    # streams on with what the answer brings.
    out = shell.apply(turn.answer([(gate, True, None)], [], 3.0))
    assert turn.state is TurnState.STREAMING and shell.current is held
    shell.apply(turn.end(4.0))
    shell.check_rules()


def test_a_resume_while_the_run_still_waits_ends_the_held_response_with_tool_calls() -> None:
    turn, shell, _gate_ = _waiting_on()
    shell.apply(turn.feed(_text_events("Meanwhile."), 1.0))
    out = shell.apply(turn.resume())
    assert _kinds(out) == ["Chunks", "CloseResponse"] and out[-1] == CloseResponse(waiting=True)
    assert out[0].chunks[-1] == {"type": "finish", "finishReason": "tool-calls"}
    assert turn.state is TurnState.WAITING
    assert turn.resume() == []  # nothing held any more
    shell.check_rules()


def test_a_resume_after_the_wait_ended_follows_the_held_response_as_it_streams() -> None:
    turn, shell, gate = _waiting_on()
    shell.apply(turn.expire(gate.deadline))
    shell.apply(turn.feed([_response_event("c1", "pay", gate.verdict.response)], gate.deadline + 1))
    assert turn.state is TurnState.HELD and not turn.waiting_for_person
    assert turn.resume() == [] and turn.state is TurnState.STREAMING


def test_an_answer_that_writes_while_waiting_without_a_reader_holds_its_chunks() -> None:
    # ChatService attaches first; without that (the request reads an older unread response) what
    # the answer writes is held for the next reader, not closed into a response nobody reads.
    turn, shell, gate = _waiting_on("where")
    out = shell.apply(turn.answer([(gate, True, None)], [], 1.0))
    assert _kinds(out) == ["CallChanged", "OpenResponse", "Chunks"]
    assert out[2].chunks[0] == START and out[2].chunks[1]["type"] == "tool-input-available"
    assert turn.state is TurnState.HELD and turn.waiting_for_person
    shell.apply(turn.resume())
    assert turn.state is TurnState.WAITING
    shell.check_rules()


def test_a_deadline_while_waiting_releases_the_call_and_adks_answer_opens_a_new_response() -> None:
    turn, shell, gate = _waiting_on()
    out = shell.apply(turn.expire(gate.deadline))
    assert _kinds(out) == ["CallChanged"]  # nothing to show until ADK answers the call
    assert turn.state is TurnState.WAITING and not turn.waiting_for_person
    out = shell.apply(turn.feed([_response_event("c1", "pay", gate.verdict.response)], gate.deadline + 1))
    assert isinstance(out[0], OpenResponse) and out[1].chunks[0] == START
    assert turn.state is TurnState.HELD


def test_end_after_the_wait_finishes_the_last_response_and_reports_completed() -> None:
    turn, shell, gate = _waiting_on()
    shell.apply(turn.attach())
    shell.apply(turn.answer([(gate, True, None)], [], 1.0))
    assert gate.verdict is not None and gate.verdict.run
    shell.apply(turn.feed([_response_event("c1", "pay", {"paid": True}), *_text_events("Done.")], 2.0))
    out = shell.apply(turn.end(3.0))
    assert _kinds(out) == ["Chunks", "CloseResponse", "RunEnded"]
    assert out[0].chunks[-1] == {"type": "finish", "finishReason": "stop"}
    assert out[1] == CloseResponse(waiting=False) and out[2] == RunEnded("completed")
    assert turn.state is TurnState.DONE
    assert len(shell.responses) == 2 and types(shell.responses[1].chunks)[:2] == ["start", "tool-output-available"]
    shell.check_rules()


def test_end_while_still_waiting_cancels_the_call_and_writes_no_second_finish() -> None:
    turn, shell, gate = _waiting_on()
    out = shell.apply(turn.end(4.0))
    assert _kinds(out) == ["CallChanged", "CloseResponse", "RunEnded"]
    assert gate.outcome is Outcome.CANCELLED and out[0].before is CallState.AWAITING_APPROVAL
    assert out[1] == CloseResponse(waiting=False) and out[2] == RunEnded("completed")
    assert turn.state is TurnState.DONE and len(shell.responses) == 1
    assert types(shell.responses[0].chunks).count("finish") == 1


# ---- answers that arrive early, late, twice, after the end --------------------------------------


def test_an_answer_before_the_gate_is_shown_releases_the_call_once_and_shows_nothing() -> None:
    turn = _turn()
    shell = Shell(turn)
    shell.apply(turn.begin())
    shell.apply(turn.feed([_call_event(("c1", "pay", {}))], 0.0))
    gate = _opened(turn, _gate("pay", "c1"))
    assert gate.state is CallState.AWAITING_APPROVAL
    out = shell.apply(turn.answer([(gate, True, None)], [], 1.0))
    assert _kinds(out) == ["CallChanged"] and gate.outcome is Outcome.APPROVED
    assert turn.answer([(gate, True, None)], [], 2.0) == []  # released once
    assert turn.show_gate(gate, 2.0) == []  # nothing left to ask
    assert not turn.waiting_for_person and turn.state is TurnState.STREAMING
    # The tool ran on the verdict: its result is no bypass.
    out = shell.apply(turn.feed([_response_event("c1", "pay", {"paid": True})], 3.0))
    assert _chunks(out) == [{"type": "tool-output-available", "toolCallId": "c1", "output": {"paid": True}}]
    assert not any(isinstance(o, Bypassed) for o in shell.observed)


def test_a_call_released_before_it_was_shown_is_not_expected_again_when_the_models_event_comes_late() -> None:
    # The remote gate cancels a call it recorded but could not store (gateway/cluster/remote_gate.py,
    # SharedStateDown) before showing it; a parallel call is shown and waits for the person; the
    # model's event naming both arrives after that (the plugin's requests can beat the event).
    turn = _turn()
    shell = Shell(turn)
    shell.apply(turn.begin())
    first = _opened(turn, _gate("pay", "c1"))
    shell.apply(turn.cancel(first, "the gateway's shared session store is unreachable", 0.0))
    assert turn.show_gate(first, 0.0) == []
    shell.apply(turn.show_gate(_opened(turn, _gate("pay", "c2")), 0.0))
    assert turn.state is TurnState.WAITING
    out = shell.apply(turn.feed([_call_event(("c1", "pay", {}), ("c2", "pay", {}))], 1.0))
    # c1's tool part is written (held for the next reader), and the run still waits for c2.
    assert _kinds(out) == ["OpenResponse", "Chunks"] and out[1].chunks[-1]["toolCallId"] == "c1"
    assert turn.waiting_for_person and turn.state is TurnState.HELD


def test_an_answer_after_the_deadline_changes_nothing() -> None:
    turn, shell, gate = _waiting_on()
    assert turn.expire(gate.deadline - 0.001) == []  # not yet
    out = shell.apply(turn.expire(gate.deadline))
    (changed,) = _changes(out)
    assert changed.before is CallState.AWAITING_APPROVAL and gate.outcome is Outcome.TIMEOUT
    assert gate.verdict is not None and not gate.verdict.run
    assert gate.verdict.response is not None and gate.verdict.response[REFUSAL_KEY] == "timeout"
    shell.apply(turn.attach())
    out = shell.apply(turn.answer([(gate, True, None)], [], gate.deadline + 1))
    assert _changes(out) == [] and gate.outcome is Outcome.TIMEOUT
    assert turn.expire(gate.deadline + 2) == []  # a deadline applies once


def test_a_second_identical_answer_changes_nothing() -> None:
    turn, shell, gate = _waiting_on()
    shell.apply(turn.attach())
    assert len(_changes(shell.apply(turn.answer([(gate, False, None)], [], 1.0)))) == 1
    assert turn.answer([(gate, False, None)], [], 2.0) == []
    assert gate.outcome is Outcome.DENIED


def test_a_replayed_answer_closes_the_response_it_opened_when_the_run_still_waits() -> None:
    turn = _turn()
    shell = Shell(turn)
    shell.apply(turn.begin())
    shell.apply(turn.feed([_call_event(("c1", "pay", {}), ("c2", "pay", {}))], 0.0))
    first, second = (_opened(turn, _gate("pay", i)) for i in ("c1", "c2"))
    shell.apply(turn.show_gate(first, 0.0) + turn.show_gate(second, 0.0))
    shell.apply(turn.attach())
    out = shell.apply(turn.answer([(first, True, None)], [], 1.0))
    assert len(_changes(out)) == 1 and out[-1] == CloseResponse(waiting=True)  # c2 still waits

    # The same answer again (a retried request): no change, and the response it reads is not left open.
    out = shell.apply(turn.attach() + turn.answer([(first, True, None)], [], 2.0))
    assert out == [
        OpenResponse(),
        Chunks([START]),
        Chunks([{"type": "finish", "finishReason": "tool-calls"}]),
        CloseResponse(waiting=True),
    ]
    assert turn.state is TurnState.WAITING and second.state is CallState.AWAITING_APPROVAL
    shell.check_rules()


# An answer for a call of another chat never reaches a turn: ChatService._split_answers refuses it
# (Forbidden) and only looks calls up in the chat's own ledger. Turn.answer trusts the calls it gets.


def test_abort_while_waiting_ends_with_an_abort_chunk_cancels_the_calls_and_reports_cancelled() -> None:
    turn, shell, gate = _waiting_on()
    out = shell.apply(turn.abort(2.0))
    assert _kinds(out) == ["OpenResponse", "Chunks", "CallChanged", "CloseResponse"]
    assert out[1].chunks == [START, {"type": "abort"}]
    assert "finish" not in types(_chunks(out))
    assert out[2].call is gate and gate.outcome is Outcome.CANCELLED and out[2].before is CallState.AWAITING_APPROVAL
    assert gate.verdict is not None and gate.verdict.response[REFUSAL_KEY] == "cancelled"
    assert out[-1] == CloseResponse(waiting=False) and turn.state is TurnState.ABORTED
    assert turn.answer([(gate, True, None)], [], 3.0) == []  # too late
    assert shell.apply(turn.end(4.0)) == [RunEnded("cancelled")]


def test_abort_while_streaming_closes_the_open_text_and_step_and_writes_no_finish() -> None:
    turn = _turn()
    shell = Shell(turn)
    shell.apply(turn.begin())
    shell.apply(turn.feed([_partial("Let me ")], 0.0))
    out = shell.apply(turn.abort(1.0))
    assert _kinds(out) == ["Chunks", "CloseResponse"] and out[-1] == CloseResponse(waiting=False)
    assert types(shell.current.chunks) == [
        "start", "start-step", "text-start", "text-delta", "text-end", "finish-step", "abort",
    ]
    assert turn.state is TurnState.ABORTED
    assert turn.end(2.0) == [RunEnded("cancelled")]


def test_a_reattach_while_waiting_opens_a_response_that_an_empty_answer_closes_again() -> None:
    turn, shell, _ = _waiting_on()
    assert shell.apply(turn.attach()) == [OpenResponse(), Chunks([START])]
    assert turn.state is TurnState.STREAMING
    out = shell.apply(turn.answer([], [], 1.0))
    assert out == [Chunks([{"type": "finish", "finishReason": "tool-calls"}]), CloseResponse(waiting=True)]
    assert turn.state is TurnState.WAITING
    shell.check_rules()


def test_a_reattach_while_streaming_hands_the_answer_a_whole_response() -> None:
    # TRANSITIONS: a response partly lost to the bounded log is finished; the answer reads a whole new one.
    turn = _turn()
    shell = Shell(turn)
    shell.apply(turn.begin())
    shell.apply(turn.feed([_partial("Hel")], 0.0))
    shell.apply(turn.attach())
    shell.apply(turn.feed([_partial("lo")], 1.0))
    shell.apply(turn.end(2.0))
    assert len(shell.responses) == 2 and all(r.closed for r in shell.responses)
    shell.check_rules()  # both whole: the replaced one finished, the new one opens its own block


# ---- settle, fail, end ------------------------------------------------------------------------


def test_settle_keeps_the_decisions_given_and_cancels_every_other_call() -> None:
    # ChatService._settle passes only the person's explicit (not implicit) decisions.
    turn = _turn()
    shell = Shell(turn)
    shell.apply(turn.begin())
    shell.apply(turn.feed([_call_event(("c1", "pay", {}), ("c2", "pay", {}), ("c3", "pay", {}))], 0.0))
    calls = [_opened(turn, _gate("pay", i)) for i in ("c1", "c2", "c3")]
    for call in calls:
        shell.apply(turn.show_gate(call, 0.0))
    out = shell.apply(turn.settle([(calls[0], False, "no"), (calls[1], True, None)], 5.0))
    assert [(c.call.tool_call_id, c.call.outcome) for c in _changes(out)] == [
        ("c1", Outcome.DENIED), ("c2", Outcome.APPROVED), ("c3", Outcome.CANCELLED),
    ]
    assert calls[2].verdict is not None and calls[2].verdict.response[REFUSAL_KEY] == "cancelled"
    assert "new message" in calls[2].verdict.response["error"]
    assert turn.ledger.unreleased() == [] and not turn.waiting_for_person
    assert turn.settle([], 6.0) == []  # nothing left to settle


@pytest.mark.parametrize("waiting", [False, True], ids=["streaming", "waiting"])
def test_fail_shows_the_error_finishes_with_reason_error_and_reports_error(waiting: bool) -> None:
    if waiting:
        turn, shell, gate = _waiting_on()
    else:
        turn = _turn()
        shell = Shell(turn)
        shell.apply(turn.begin())
        shell.apply(turn.feed([_partial("Hel")], 0.0))
    out = shell.apply(turn.fail("The agent service failed.", 1.0))
    chunks = shell.current.chunks
    assert {"type": "error", "errorText": "The agent service failed."} in chunks
    assert chunks[-1] == {"type": "finish", "finishReason": "error"}
    assert out[-1] == CloseResponse(waiting=False) and turn.state is TurnState.FAILED
    if waiting:
        assert isinstance(out[0], OpenResponse) and chunks[0] == START
        assert gate.outcome is Outcome.CANCELLED and [c.call for c in _changes(out)] == [gate]
    assert shell.apply(turn.end(2.0)) == [RunEnded("error")]
    shell.check_rules()


def test_fail_with_outcome_cancelled_reports_cancelled() -> None:
    turn = _turn()
    turn.begin()
    out = turn.fail("The gateway is shutting down.", 1.0, outcome="cancelled")
    assert _chunks(out)[-1] == {"type": "finish", "finishReason": "error"}
    assert turn.state is TurnState.FAILED
    assert turn.end(2.0) == [RunEnded("cancelled")]


def test_an_upstream_error_event_ends_the_run_failed() -> None:
    turn = _turn()
    shell = Shell(turn)
    shell.apply(turn.begin())
    shell.apply(turn.feed([{"error": "model exploded"}], 0.0))
    out = shell.apply(turn.end(1.0))
    assert types(shell.current.chunks) == ["start", "error", "finish"]
    assert shell.current.chunks[-1]["finishReason"] == "error"
    assert out[-1] == RunEnded("error") and turn.state is TurnState.FAILED


def test_end_twice_reports_once() -> None:
    turn = _turn()
    turn.begin()
    first = turn.end(1.0)
    assert [o for o in first if isinstance(o, RunEnded)] == [RunEnded("completed")]
    assert turn.end(2.0) == []
    assert turn.state is TurnState.DONE


# ---- a batch that raises midway ---------------------------------------------------------------


class _Boom(Exception):
    pass


def _raising_batch(error: Exception) -> Iterator[dict[str, Any]]:
    yield _partial("Hel")
    raise error


@pytest.mark.parametrize("batch", ["bad-event", "raising-reader"])
def test_a_batch_that_raises_midway_hands_back_the_first_events_chunks_then_the_error(batch: str) -> None:
    turn = _turn()
    shell = Shell(turn)
    shell.apply(turn.begin())
    error = _Boom("the upstream went away")
    events_in = [_partial("Hel"), None] if batch == "bad-event" else _raising_batch(error)
    out = turn.feed(events_in, 1.0)  # type: ignore[arg-type]
    assert _kinds(out) == ["Chunks", "Raised"] and isinstance(out[1], Raised)
    assert types(out[0].chunks) == ["start-step", "text-start", "text-delta"]  # the first event's
    if batch == "raising-reader":
        assert out[1].error is error
    else:
        assert isinstance(out[1].error, Exception)
    assert turn.state is TurnState.STREAMING  # the shell decides what the error means
    # What the shell does with it (Chat._drive): fail the turn, then end it.
    shell.apply(out[:1])
    shell.apply(turn.fail("The gateway failed while streaming this response.", 2.0))
    ended = shell.apply(turn.end(3.0))
    assert types(shell.current.chunks)[-4:] == ["text-end", "error", "finish-step", "finish"]
    assert shell.current.chunks[-1]["finishReason"] == "error"
    assert shell.current.closed and turn.state is TurnState.FAILED
    assert ended == [RunEnded("error")]
    shell.check_rules()


def test_a_batch_that_raises_after_the_run_began_waiting_keeps_the_wait() -> None:
    turn = _turn()
    turn.begin()
    gate = _opened(turn, _gate("pay", "c1"))
    turn.show_gate(gate, 0.0)
    out = turn.feed([_call_event(("c1", "pay", {})), None], 1.0)  # type: ignore[list-item]
    assert _kinds(out) == ["Raised"]
    assert turn.state is TurnState.WAITING and not gate.released


# ---- native ADK confirmations -------------------------------------------------------------------


def test_a_native_confirmation_ends_the_run_waiting_for_the_person() -> None:
    turn = Turn(MESSAGE_ID, ledger=Ledger())
    shell = Shell(turn)
    shell.apply(turn.begin())
    shell.apply(turn.feed(events("pay_hanako"), 1.0))
    assert turn.state is TurnState.STREAMING  # a native confirmation does not pause: it ends the run
    out = shell.apply(turn.end(5.0))
    assert _kinds(out) == ["Chunks", "CloseResponse", "NativeAsked", "RunEnded"]
    assert out[0].chunks[-1]["type"] == "finish" and out[0].chunks[-1]["finishReason"] == "tool-calls"
    assert isinstance(out[2], NativeAsked)
    asked = out[2].confirmation
    assert asked.tool == "process_payment" and asked.asked_at == 5.0
    (request,) = [c for c in shell.current.chunks if c["type"] == "tool-approval-request"]
    assert asked.approval_id == request["approvalId"] and asked.tool_call_id == request["toolCallId"]
    assert out[-1] == RunEnded("waiting") and turn.state is TurnState.DONE
    shell.check_rules()

    ledger = turn.ledger
    assert ledger.native_pending(asked.approval_id)
    assert ledger.answer_native(asked.approval_id) is asked
    assert ledger.answer_native(asked.approval_id) is None  # returned once
    assert not ledger.native_pending(asked.approval_id) and ledger.native_answered(asked.approval_id)


# ---- what CallChanged says ----------------------------------------------------------------------


def test_call_changed_reports_the_state_before_and_the_seconds_waited_in_it() -> None:
    turn = _turn()
    turn.begin()
    turn.feed([_call_event(("c1", "pay", {}), ("c2", "where", {}))], 2.0)
    pay = _opened(turn, _gate("pay", "c1", now=2.0))
    where = _opened(turn, _gate("where", "c2", now=2.0))
    turn.show_gate(pay, 2.0)
    turn.show_gate(where, 2.0)

    turn.attach()
    out = turn.answer([(pay, True, None), (where, True, None)], [], 9.5)
    assert [(c.call, c.before, c.waited) for c in _changes(out)] == [
        (pay, CallState.AWAITING_APPROVAL, 7.5), (where, CallState.AWAITING_APPROVAL, 7.5),
    ]
    assert where.state is CallState.AWAITING_OUTPUT and where.waiting_since == 9.5  # the browser's wait starts

    turn.attach()
    out = turn.answer([], [(where, None, "no GPS")], 12.0)
    (changed,) = _changes(out)
    assert changed.before is CallState.AWAITING_OUTPUT and changed.waited == 2.5
    assert where.outcome is Outcome.OUTPUT_ERROR and where.verdict == Verdict(run=False, response={"error": "no GPS"})
