"""The chat machine (core/chat_machine.py): its phases as data, its transition table, its next deadline.

The turn's own behaviour is test_turn.py's; here, what the machine adds around it: which events each
phase takes (and that a refused event changes nothing), that `running` is the machine's state and not
a task's, and the one deadline the shell's timer waits for.
"""

from __future__ import annotations

from typing import Any, get_args

import orjson
import pytest

from gateway.approvals.decision import DECIDER
from gateway.config.schema import ToolPolicy
from gateway.core.approvals import GatedCall, Outcome, Verdict
from gateway.core.chat_events import (
    Answered, AnswersGoing, AnswersSent, Attached, AudioHeard, BrowserAsked, BrowserToolApproved, CallCancelled,
    ChatEvent, ConfirmationsSeen, DeadlineReached, EndAsked, GateOpened, NativeAnswered, Resumed, RunCancelled,
    RunClosed, RunDropped, RunFailed, RunStarts, RunWanted, Settled, SocketClosed, StateRestored, ToolAsked,
    UpstreamRead,
)
from gateway.core.ledger import NativeConfirmation
from gateway.core.ledger_snapshot import MalformedLedger
from gateway.core.chat_machine import TRANSITIONS, ChatMachine, MachineError, Phase
from gateway.core.gate_decider import ChatView
from gateway.core.turn import CallChanged, Chunks, CloseResponse, RunEnded
from gateway.core.chat_outputs import Admission, BrowserApproved, ConfirmationSeen, GateDecided, NativeSettled

PAY = ToolPolicy(approval=True, timeout=30)


def _policy(name: str) -> ToolPolicy:
    return PAY if name == "pay" else ToolPolicy()


def _start(now: float = 0.0) -> RunStarts:
    return RunStarts("m1", now, policy=_policy)


def _call(call_id: str, now: float = 0.0) -> GatedCall:
    return GatedCall.open(
        user_id="u", chat_id="c", session_id="c", tool_call_id=call_id, tool="pay", args={}, policy=PAY, now=now,
    )


def _tool_asked(call_id: str, now: float = 0.0, max_pending: int = 16) -> ToolAsked:
    """The plugin's ask about a call of `pay` (which a person approves) in chat `c`."""
    return ToolAsked(call_id, "pay", {}, PAY, "agent", "u", "c", "c", now, max_pending=max_pending)


def _refusal(outputs: list[Any]) -> str | None:
    [decided] = outputs
    assert isinstance(decided, GateDecided) and decided.action == "refuse" and decided.verdict is not None
    return decided.verdict.reason


def _asks(machine: ChatMachine, call_id: str, now: float = 0.0) -> GatedCall:
    """The model calls `pay`, the plugin asks: the call waits for a person."""
    event = {"author": "a", "content": {"role": "model", "parts": [{"functionCall": {"id": call_id, "name": "pay", "args": {}}}]}}
    machine.handle(UpstreamRead([event], now))
    [decided] = machine.handle(_tool_asked(call_id, now))
    assert isinstance(decided, GateDecided) and decided.action == "wait" and not decided.again
    call = decided.call
    assert call is not None and machine.ledger.call(call_id) is call
    machine.handle(GateOpened(call, now))
    return call


def _chunk_types(outputs: list[Any]) -> list[str]:
    return [c["type"] for o in outputs if isinstance(o, Chunks) for c in o.chunks]


def test_a_chat_is_new_then_running_then_idle_by_its_own_state() -> None:
    machine = ChatMachine(decider=DECIDER)
    assert machine.phase is Phase.NEW and not machine.running
    assert _chunk_types(machine.handle(_start())) == ["start"]
    assert machine.phase is Phase.RUNNING and machine.running
    out = machine.handle(RunClosed(1.0))
    assert machine.phase is Phase.IDLE and not machine.running
    assert [o.outcome for o in out if isinstance(o, RunEnded)] == ["completed"]
    # A second run starts from idle, on the same ledger.
    ledger = machine.ledger
    machine.handle(_start(2.0))
    assert machine.running and machine.ledger is ledger


@pytest.mark.parametrize("event", [UpstreamRead([], 0.0), Settled([], 0.0), RunClosed(0.0), Answered([], [], 0.0)])
def test_a_run_event_before_any_run_is_refused_and_changes_nothing(event: Any) -> None:
    machine = ChatMachine(decider=DECIDER)
    with pytest.raises(MachineError, match="new"):
        machine.handle(event)
    assert machine.phase is Phase.NEW and machine.turn is None


def test_one_run_at_a_time_a_new_run_waits_for_the_old_ones_end() -> None:
    machine = ChatMachine(decider=DECIDER)
    machine.handle(_start())
    turn = machine.turn
    with pytest.raises(MachineError, match="running does not take RunStarts"):
        machine.handle(RunStarts("m2", 1.0))
    assert machine.turn is turn and machine.running
    machine.handle(EndAsked(1, "abort"))
    machine.handle(RunCancelled(1.0))
    machine.handle(RunClosed(1.0))
    machine.handle(RunStarts("m2", 2.0))
    assert machine.turn is not turn


def test_an_ended_run_takes_no_more_upstream_events_and_refuses_an_attach() -> None:
    machine = ChatMachine(decider=DECIDER)
    assert machine.handle(Attached()) == [Admission("refuse", status=410, text="these calls were already answered and the run has ended")]
    assert machine.handle(Resumed()) == [] and machine.handle(GateOpened(_call("x"), 0.0)) == []  # no run: nothing to show
    machine.handle(_start())
    machine.handle(RunClosed(1.0))
    with pytest.raises(MachineError, match="idle"):
        machine.handle(UpstreamRead([], 2.0))
    [refused] = machine.handle(Attached())
    assert isinstance(refused, Admission) and refused.status == 410
    assert machine.handle(GateOpened(_call("x"), 2.0)) == []  # the run it was for ended: nobody to show it to


def test_the_table_lists_every_event_in_some_phase() -> None:
    assert {kind for _, kind in TRANSITIONS} == set(get_args(ChatEvent))


def test_the_next_deadline_is_the_earliest_call_waiting_and_none_once_released() -> None:
    machine = ChatMachine(decider=DECIDER)
    machine.handle(_start())
    assert machine.next_deadline() is None
    first = _asks(machine, "c1", now=0.0)
    assert machine.waiting_for_person and machine.next_deadline() == 30.0
    # The person's answer releases it: nothing left to time.
    out = machine.handle(Answered([(first, True, None)], [], 5.0))
    assert any(isinstance(o, CallChanged) and o.call is first for o in out)
    assert first.outcome is Outcome.APPROVED and machine.next_deadline() is None


def test_a_deadline_times_out_only_what_is_due() -> None:
    machine = ChatMachine(decider=DECIDER)
    machine.handle(_start())
    call = _asks(machine, "c1", now=0.0)
    assert machine.handle(DeadlineReached(29.9)) == [] and not call.released
    out = machine.handle(DeadlineReached(30.0))
    assert call.outcome is Outcome.TIMEOUT
    assert [o.call for o in out if isinstance(o, CallChanged)] == [call]
    assert machine.next_deadline() is None


def test_a_cancel_before_any_run_still_releases_the_call_for_its_plugin() -> None:
    machine = ChatMachine(decider=DECIDER)
    call = machine.ledger.add(_call("c1"))
    out = machine.handle(CallCancelled(call, "nobody is attached", 1.0))
    assert call.outcome is Outcome.CANCELLED and call.verdict is not None and not call.verdict.run
    assert [type(o) for o in out] == [CallChanged]


def test_the_end_of_a_run_cancels_what_waits_and_closes_its_response() -> None:
    machine = ChatMachine(decider=DECIDER)
    machine.handle(_start())
    call = _asks(machine, "c1")
    out = machine.handle(RunFailed("The agent service failed.", 3.0))
    out += machine.handle(RunClosed(3.0))
    assert call.outcome is Outcome.CANCELLED and not machine.running
    assert any(isinstance(o, CloseResponse) for o in out)
    assert [o.outcome for o in out if isinstance(o, RunEnded)] == ["error"]


def test_the_plugins_ask_is_refused_without_a_run_to_show_it_and_beyond_the_cap() -> None:
    machine = ChatMachine(decider=DECIDER)
    assert _refusal(machine.handle(_tool_asked("c1"))) == "no_browser"
    machine.handle(_start())
    first = _asks(machine, "c1")
    # Asked again (the plugin's request handed back, or cut): the same call, not a new one.
    assert machine.handle(_tool_asked("c1")) == [GateDecided("wait", call=first, again=True)]
    assert _refusal(machine.handle(_tool_asked("c2", max_pending=1))) == "too_many_pending"
    machine.handle(RunClosed(1.0))
    assert _refusal(machine.handle(_tool_asked("c3"))) == "no_browser"
    assert machine.ledger.call("c2") is None and machine.ledger.call("c3") is None


@pytest.mark.parametrize("phase", list(Phase))
def test_the_plugins_ask_is_the_machines_transition_in_every_phase(phase: Phase) -> None:
    assert (phase, ToolAsked) in TRANSITIONS


class _Told:
    """A decider (core/gate_decider.py) that says what it was told to, and notes what it was shown."""

    def __init__(self, *decisions: GateDecided) -> None:
        self.decisions = list(decisions)
        self.seen: list[tuple[str, ChatView]] = []

    def decide(self, ask: ToolAsked, chat: ChatView) -> GateDecided:
        self.seen.append((ask.tool_call_id, chat))
        return self.decisions.pop(0)


def test_the_machine_takes_the_decision_from_its_decider_and_records_only_what_waits() -> None:
    # The decision is the approvals room's (approvals/decision.py), handed in through the machine's
    # port: the machine shows it the chat and records what it leaves waiting, nothing else.
    call = _call("c1")
    refused = GateDecided("refuse", Verdict.refuse("no."))
    told = _Told(GateDecided("wait", call=call), refused, GateDecided("wait", call=call, again=True))
    machine = ChatMachine(decider=told)
    machine.handle(_start())
    assert machine.handle(_tool_asked("c1")) == [GateDecided("wait", call=call)]
    assert machine.handle(_tool_asked("c2")) == [refused]
    assert machine.handle(_tool_asked("c1")) == [GateDecided("wait", call=call, again=True)]
    assert told.seen == [
        ("c1", ChatView(run_under_way=True, waiting=0)), ("c2", ChatView(run_under_way=True, waiting=1)),
        ("c1", ChatView(run_under_way=True, waiting=1, asked_before=call)),
    ]
    assert machine.ledger.call("c1") is call and machine.ledger.call("c2") is None


def test_the_machine_records_what_its_decision_leaves_waiting_or_decided_and_nothing_it_hands_to_adk() -> None:
    refund = ToolPolicy.model_validate({"approval": True, "rules": [
        {"name": "small", "when": "args.amount < 5", "decide": "approve"},
        {"name": "large", "when": "args.amount > 100", "decide": "ask", "approvers": "leads"},
    ]})
    machine = ChatMachine(decider=DECIDER)
    machine.handle(_start())

    def asked(call_id: str, amount: int, **plugin: Any) -> list[Any]:
        return machine.handle(ToolAsked(call_id, "refund", {"amount": amount}, refund, "a", "u", "c", "c", 1.0, **plugin))

    # ADK's confirmation (marked with the approvers on sse): nothing recorded here.
    [confirm] = asked("c1", 250, confirm=True, approvers=True)
    assert isinstance(confirm, GateDecided) and confirm.action == "confirm" and machine.ledger.call("c1") is None
    [refused] = asked("c2", 250, confirm=True)
    assert refused.action == "refuse" and machine.ledger.call("c2") is None
    # A rule's decision: recorded released, its change reported, shown at once.
    ruled, changed, *_ = asked("c3", 2)
    assert ruled.action == "rule" and machine.ledger.call("c3") is ruled.call
    assert isinstance(changed, CallChanged) and changed.call is ruled.call and ruled.call.released
    # Held for its approvers in live mode: recorded, waiting.
    [held] = asked("c4", 250, mode="live")
    assert held.action == "wait" and machine.ledger.call("c4") is held.call and held.call.for_approver


def _asked(machine: ChatMachine, approval_id: str, *, in_browser: bool = False) -> NativeConfirmation:
    """A run asked ADK's confirmation and ended: it waits for the person."""
    machine.handle(_start())
    confirmation = NativeConfirmation(approval_id, "c-" + approval_id, "pay", in_browser=in_browser)
    machine.ledger.ask(confirmation)
    machine.handle(RunClosed(1.0))
    return confirmation


def test_confirmations_are_seen_once_answered_once_and_known_answered_after() -> None:
    machine = ChatMachine(decider=DECIDER)
    asked = _asked(machine, "a1")
    assert machine.handle(ConfirmationsSeen(100.0)) == [ConfirmationSeen(asked)] and asked.seen_at == 100.0
    assert machine.handle(ConfirmationsSeen(200.0)) == [] and asked.seen_at == 100.0
    assert machine.handle(NativeAnswered("a1", asked.tool_call_id)) == [NativeSettled("a1", asked)]
    assert machine.ledger.native_answered("a1") and not machine.ledger.native_pending("a1")
    # A replay is settled again but finds nothing pending: the caller forwards nothing twice.
    assert machine.handle(NativeAnswered("a1")) == [NativeSettled("a1", None)]


def test_a_replica_that_never_ran_the_chat_records_answers_too() -> None:
    machine = ChatMachine(decider=DECIDER)
    assert machine.handle(NativeAnswered("a9", "c9", timed_out=True)) == [NativeSettled("a9", None)]
    assert machine.ledger.native_timed_out("a9") and machine.phase is Phase.NEW


def test_a_browser_tool_is_approved_once_with_both_clocks() -> None:
    machine = ChatMachine(decider=DECIDER)
    asked = _asked(machine, "b1", in_browser=True)
    assert machine.handle(BrowserToolApproved("b1", 5.0, 1000.0)) == [BrowserApproved(asked)]
    assert asked.approved_at == 5.0 and asked.approved_wall == 1000.0 and asked.awaits_output
    assert machine.handle(BrowserToolApproved("b1", 6.0, 1001.0)) == [] and asked.approved_wall == 1000.0
    # One only ADK's session held (nothing of the chat was kept): learnt, and approved once.
    known = NativeConfirmation("b2", "c2", "get_location", in_browser=True)
    assert machine.handle(BrowserToolApproved("b2", 7.0, 1002.0, known)) == [BrowserApproved(known, learnt=True)]
    assert machine.ledger.native("b2") is known and known.approved_wall == 1002.0
    assert machine.handle(BrowserToolApproved("b2", 8.0, 1003.0, known)) == []


# ---- the machine's state as plain JSON ----------------------------------------------------------


def test_a_chat_state_restores_into_a_fresh_machine_as_plain_json() -> None:
    machine = ChatMachine(decider=DECIDER)
    asked = _asked(machine, "a1", in_browser=True)
    machine.handle(ConfirmationsSeen(100.0))
    machine.handle(BrowserToolApproved("a1", 5.0, 105.0))
    machine.handle(NativeAnswered("a0", "c0", timed_out=True))
    saved = orjson.loads(orjson.dumps(machine.snapshot()))

    other = ChatMachine(decider=DECIDER)
    assert other.handle(StateRestored(saved, 0.0)) == []
    assert other.snapshot() == saved
    restored = other.ledger.native("a1")
    assert restored is not None and restored.approved_wall == 105.0 and restored.awaits_output
    assert restored.seen_at == asked.seen_at and other.ledger.native_timed_out("a0")


def test_a_call_left_waiting_in_a_saved_state_is_cancelled_on_restore() -> None:
    machine = ChatMachine(decider=DECIDER)
    machine.handle(_start())
    _asks(machine, "c1")
    saved = machine.snapshot()  # as if saved mid-run (the shell saves at a run's end)

    other = ChatMachine(decider=DECIDER)
    out = other.handle(StateRestored(saved, 7.0))
    call = other.ledger.call("c1")
    assert call is not None and call.outcome is Outcome.CANCELLED and call.verdict is not None and not call.verdict.run
    assert [o.call for o in out if isinstance(o, CallChanged)] == [call]
    assert other.next_deadline() is None


@pytest.mark.parametrize("saved", [None, [], {"v": 2, "ledger": {}}, {"v": 1}, {"v": 1, "ledger": {"v": 1}}, {"v": 1, "ledger": {}, "x": 1}])
def test_a_state_that_does_not_validate_is_refused_and_changes_nothing(saved: Any) -> None:
    machine = ChatMachine(decider=DECIDER)
    ledger = machine.ledger
    with pytest.raises(MalformedLedger):
        machine.handle(StateRestored(saved, 0.0))
    assert machine.ledger is ledger and machine.phase is Phase.NEW


def test_a_state_is_restored_only_into_a_chat_that_has_done_nothing() -> None:
    saved = ChatMachine(decider=DECIDER).snapshot()
    answered = ChatMachine(decider=DECIDER)
    answered.handle(NativeAnswered("a1"))  # an answer recorded here must not be lost to an older state
    with pytest.raises(MachineError):
        answered.handle(StateRestored(saved, 0.0))
    assert answered.ledger.native_answered("a1")
    busy = ChatMachine(decider=DECIDER)
    _asked(busy, "a2")
    with pytest.raises(MachineError):
        busy.handle(StateRestored(saved, 0.0))
    assert busy.ledger.native_pending("a2")


# ---- what a browser request may do ------------------------------------------------------------


def _browser(new_message: bool = False, gated: bool = False, sent: tuple[str, ...] = (), open_: int = 0, live: bool = False) -> BrowserAsked:
    return BrowserAsked(new_message, gated, sent, open_, live)


def test_answers_to_the_running_runs_gated_calls_continue_it() -> None:
    machine = ChatMachine(decider=DECIDER)
    machine.handle(_start())
    assert machine.handle(_browser(gated=True)) == [Admission("continue")]


@pytest.mark.parametrize(("asked", "status", "words"), [
    (_browser(), 400, "nothing in the last assistant message"),
    (_browser(sent=("a1",), open_=1, live=True), 400, "do not exist in live mode"),
])
def test_answers_that_match_nothing_are_refused_400(asked: BrowserAsked, status: int, words: str) -> None:
    [admission] = ChatMachine(decider=DECIDER).handle(asked)
    assert admission.action == "refuse" and admission.status == status and words in admission.text


def test_an_answer_adk_no_longer_waits_for_is_gone_unless_the_gateway_timed_it_out() -> None:
    machine = ChatMachine(decider=DECIDER)
    [gone] = machine.handle(_browser(sent=("a1",)))
    assert gone.action == "refuse" and gone.status == 410 and "already answered" in gone.text
    machine.handle(NativeAnswered("a2", timed_out=True))
    assert machine.handle(_browser(sent=("a2",))) == [Admission("late")]


def test_confirmation_answers_while_another_run_runs_are_gone_and_leave_it_be() -> None:
    machine = ChatMachine(decider=DECIDER)
    machine.handle(_start())
    [gone] = machine.handle(_browser(sent=("a1",), open_=1))
    assert gone.action == "refuse" and gone.status == 410 and "not pending" in gone.text
    assert machine.running


def test_a_new_message_starts_a_run_and_live_mode_forwards_no_confirmation_answers() -> None:
    machine = ChatMachine(decider=DECIDER)
    assert machine.handle(_browser(new_message=True)) == [Admission("start")]
    assert machine.handle(_browser(sent=("a1",), open_=1)) == [Admission("start")]
    assert machine.handle(_browser(new_message=True, sent=("a1",), open_=1, live=True)) == [Admission("start", forward_native=False)]


def test_a_confirmation_is_answered_once_while_its_answer_goes_out() -> None:
    machine = ChatMachine(decider=DECIDER)
    assert machine.handle(AnswersGoing(("a1",), (False,), True)) == [Admission("start")]
    [busy] = machine.handle(AnswersGoing(("a1",), (False,), True))
    assert busy.action == "refuse" and busy.status == 409
    machine.handle(AnswersSent(("a1",)))
    assert machine.handle(AnswersGoing(("a1",), (False,), True)) == [Admission("start")]
    # The deadline's answer on its way: the person's late click reads its outcome instead.
    machine.handle(AnswersSent(("a1",)))
    machine.handle(AnswersGoing(("a2",), (True,), False))
    assert machine.handle(AnswersGoing(("a2",), (False,), True)) == [Admission("late")]
    assert machine.handle(AnswersGoing(("a2",), (True,), False))[0].status == 409  # the deadline's twice
    assert "answering" not in machine.snapshot()  # one request's business, not state to keep


def test_a_new_run_ends_the_old_one_as_an_abort_when_nobody_reads_it_else_settles_it() -> None:
    machine = ChatMachine(decider=DECIDER)
    assert machine.handle(RunWanted(open=True)) == [Admission("start")]  # nothing runs
    machine.handle(_start())
    assert machine.handle(RunWanted(open=True)) == [Admission("abort")]
    _asks(machine, "c1")  # the run now waits for a person
    assert machine.handle(RunWanted(open=False)) == [Admission("settle")]
    assert machine.handle(RunWanted(open=True)) == [Admission("settle")]  # its held response too


BUSY = Admission("refuse", status=409, text="a response is already streaming for this chat")


@pytest.mark.parametrize(
    ("wanted", "running", "answer"),
    [
        (RunWanted(open=True, read=True), False, BUSY),  # another request's run is being started and read
        (RunWanted(open=True, read=True), True, BUSY),  # one streaming response per chat
        (RunWanted(open=True), False, Admission("start")),  # a response nobody reads, and no run behind it
        (RunWanted(open=False, free=True), True, BUSY),  # asked again: a newer run got in meanwhile
        (RunWanted(open=True, free=True), False, BUSY),
        (RunWanted(open=False, free=True), False, Admission("start")),
    ],
)
def test_whether_a_request_may_start_a_run_is_the_machines_answer(wanted: RunWanted, running: bool, answer: Admission) -> None:
    machine = ChatMachine(decider=DECIDER)
    if running:
        machine.handle(_start())
    assert machine.handle(wanted) == [answer]


def test_a_run_being_started_keeps_the_chat_unsettled_until_it_starts_or_is_dropped() -> None:
    machine = ChatMachine(decider=DECIDER)
    assert machine.settled
    assert machine.handle(RunWanted(open=False, free=True, claim=False)) == [Admission("start")]
    assert machine.settled  # it only asked
    assert machine.handle(RunWanted(open=False)) == [Admission("start")]
    assert not machine.settled and not machine.running  # claimed: not forgotten, not handed over
    assert machine.handle(RunWanted(open=False, free=True)) == [BUSY]
    machine.handle(RunDropped())  # its upstream refused before the run started
    assert machine.settled
    machine.handle(RunWanted(open=False))
    machine.handle(_start())
    assert not machine.settled and not machine.claimed
    machine.handle(RunClosed(1.0))
    assert machine.settled


def test_what_a_run_made_to_end_says_later_is_dropped() -> None:
    machine = ChatMachine(decider=DECIDER)
    machine.handle(_start())
    assert machine.run == 1 and machine.under_way(1)
    machine.handle(EndAsked(1, "abort"))
    machine.handle(RunCancelled(1.0, run=1))
    machine.handle(RunClosed(1.0, run=1))  # a stuck task, ended by the shell for the machine
    assert not machine.under_way(1)
    machine.handle(RunStarts("m2", 2.0))
    turn = machine.turn
    text = {"author": "a", "content": {"role": "model", "parts": [{"text": "late"}]}}
    late_ones = (UpstreamRead([text], 3.0, 1), RunFailed("x", 3.0, run=1), EndAsked(1, "cancel", "x"), RunCancelled(3.0, 1), RunClosed(3.0, 1))
    for late in late_ones:
        assert machine.handle(late) == []
    assert machine.turn is turn and machine.under_way(2)
    assert "text-delta" in _chunk_types(machine.handle(UpstreamRead([text], 3.0, 2)))
    machine.handle(RunClosed(4.0, 2))
    assert machine.handle(RunClosed(4.0, 2)) == []  # reported once


def test_a_chat_waits_on_adk_between_runs_while_a_confirmation_is_pending() -> None:
    machine = ChatMachine(decider=DECIDER)
    assert not machine.waiting_on_adk
    _asked(machine, "a1")
    assert machine.waiting_on_adk
    machine.handle(RunStarts("m2", 2.0))
    assert not machine.waiting_on_adk  # a run under way says what it waits for itself
    machine.handle(RunClosed(3.0))
    machine.handle(NativeAnswered("a1", "c-a1"))
    assert not machine.waiting_on_adk


def test_a_live_chats_audio_starts_a_turn_only_between_turns() -> None:
    machine = ChatMachine(decider=DECIDER)
    assert machine.handle(AudioHeard(in_turn=False)) == [Admission("start")]
    assert machine.handle(AudioHeard(in_turn=True)) == [Admission("relay")]  # the live session is in a turn
    machine.handle(_start())
    assert machine.handle(AudioHeard(in_turn=False)) == [Admission("relay")]


def test_a_live_chats_closed_socket_closes_its_session_between_turns_else_at_the_turns_end() -> None:
    machine = ChatMachine(decider=DECIDER)
    assert machine.handle(SocketClosed(cancel=True)) == [Admission("close")]
    machine.handle(_start())
    assert machine.handle(SocketClosed(cancel=False)) == [Admission("wait")]
    assert machine.handle(SocketClosed(cancel=True)) == [Admission("abort")]
