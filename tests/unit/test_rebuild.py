"""A waiting message rebuilt from ADK's session (gateway/rebuild.py), on sessions recorded from the
stock ADK API server, 2.13 and 1.22.1 (tests/fixtures/waiting_sessions/record.py)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from gateway.approvals.decision import DECIDER
from gateway.config.agent import ToolPolicy
from gateway.core.chat_machine import ChatMachine, Phase
from gateway.core.ledger import Ledger
from gateway.core.rebuild import MESSAGE_ID_STATE_KEY, replay, waiting_message

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "waiting_sessions"
VERSIONS = ("newest", "1.22.1")
HINT = "Money leaves the account when you approve."


def sessions(label: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{label}.json").read_text())


def types(chunks: list[dict[str, Any]]) -> list[str]:
    return [c["type"] for c in chunks]


def _confirmation_ids(session: dict[str, Any]) -> list[str]:
    return [
        p["functionCall"]["id"] for e in session["events"] for p in e["content"]["parts"]
        if p.get("functionCall", {}).get("name") == "adk_request_confirmation"
    ]


@pytest.mark.parametrize("label", VERSIONS)
@pytest.mark.parametrize("scenario", ["confirm_pay", "native_pay"])
def test_a_pending_payment_is_rebuilt_as_the_live_run_showed_it(label: str, scenario: str) -> None:
    session = sessions(label)[scenario]
    message = waiting_message(session)
    assert message is not None
    [approval_id] = _confirmation_ids(session)
    assert message.pending == {approval_id}
    # Stable: ADK's invocation id, the same on every replica and every resume.
    assert message.message_id == "msg-adk-" + session["events"][0]["invocationId"]
    assert waiting_message(copy.deepcopy(session)) == message

    ledger = Ledger()
    rebuilt = replay(message, machine=ChatMachine(ledger, decider=DECIDER), now=5.0)
    assert rebuilt is not None
    [response] = rebuilt.responses
    chunks = response.chunks
    # What a live run sends for these events (tests/integration/test_confirm_mode.py's first response).
    assert types(chunks) == [
        "start", "start-step", "tool-input-start", "tool-input-available", "tool-approval-request", "finish-step", "finish",
    ]
    assert chunks[0] == {"type": "start", "messageId": message.message_id}
    request = chunks[4]
    assert request["approvalId"] == approval_id and request["toolCallId"] == chunks[2]["toolCallId"]
    assert request.get("approvalDescriptor") == ({"hint": HINT} if scenario == "confirm_pay" else None)
    assert chunks[3]["input"] == {"amount": 50, "recipient": "Hanako", "currency": "USD"}
    assert chunks[-1]["finishReason"] == "tool-calls"
    # The ledger holds the confirmation as the end of the live run left it.
    assert [c.approval_id for c in rebuilt.pending] == [approval_id]
    assert ledger.native_pending(approval_id) and not ledger.native_answered(approval_id)
    assert rebuilt.pending[0].asked_at == 5.0 and rebuilt.pending[0].tool == "process_payment"


def _by_timestamp(session: dict[str, Any]) -> dict[str, Any]:
    """The session as ADK's SQLite store reads it back: its events by timestamp. ADK streams (and
    appends) a confirmation's request before the placeholder response of the call it asks about,
    but stamps the placeholder first."""
    session = copy.deepcopy(session)
    events = session["events"]
    ask = next(i for i, e in enumerate(events) if any(
        p.get("functionCall", {}).get("name") == "adk_request_confirmation" for p in e["content"]["parts"]
    ))
    placeholder = events.pop(ask + 1)
    assert all("functionResponse" in p for p in placeholder["content"]["parts"])
    events.insert(ask, placeholder)
    return session


@pytest.mark.parametrize("label", VERSIONS)
@pytest.mark.parametrize("scenario", ["confirm_pay", "native_pay"])
def test_a_session_read_back_by_timestamp_is_rebuilt_as_adk_streamed_it(label: str, scenario: str) -> None:
    """On ADK's SQLite store a reloaded page was shown the placeholder as a tool error
    ("This tool call requires confirmation") before the approval request."""
    session = sessions(label)[scenario]
    streamed = replay(waiting_message(session), machine=ChatMachine(Ledger(), decider=DECIDER), now=5.0)  # type: ignore[arg-type]
    read_back = waiting_message(_by_timestamp(session))
    assert read_back is not None
    rebuilt = replay(read_back, machine=ChatMachine(Ledger(), decider=DECIDER), now=5.0)
    assert rebuilt is not None and streamed is not None
    assert rebuilt.responses == streamed.responses
    assert "tool-output-error" not in types(rebuilt.responses[0].chunks)


@pytest.mark.parametrize("label", VERSIONS)
def test_two_pending_payments_are_both_asked(label: str) -> None:
    session = sessions(label)["confirm_two"]
    message = waiting_message(session)
    assert message is not None and message.pending == set(_confirmation_ids(session))
    rebuilt = replay(message, machine=ChatMachine(decider=DECIDER), now=0.0)
    assert rebuilt is not None
    [response] = rebuilt.responses
    assert types(response.chunks).count("tool-approval-request") == 2
    assert {c.approval_id for c in rebuilt.pending} == message.pending


@pytest.mark.parametrize("label", VERSIONS)
@pytest.mark.parametrize("scenario", ["confirm_paid", "hello", "confirm_two_one_answered"])
def test_nothing_waits(label: str, scenario: str) -> None:
    # Answered; no confirmation at all; one left unanswered but the model went on without it.
    assert waiting_message(sessions(label)[scenario]) is None


def test_a_later_message_leaves_an_old_confirmation_behind() -> None:
    session = copy.deepcopy(sessions("newest")["confirm_pay"])
    session["events"] += copy.deepcopy(sessions("newest")["hello"]["events"])
    assert waiting_message(session) is None


@pytest.mark.parametrize("bad", [None, [], {}, {"events": None}, {"events": [1, "x", None]}, {"events": []}])
def test_anything_else_waits_for_nothing(bad: Any) -> None:
    assert waiting_message(bad) is None


@pytest.mark.parametrize("args", [None, [], "x", {"originalFunctionCall": "x"}, {"originalFunctionCall": {"id": 3}}])
def test_a_confirmation_with_odd_arguments_is_read_without_a_crash(args: Any) -> None:
    session = copy.deepcopy(sessions("newest")["confirm_pay"])
    for event in session["events"]:
        for part in event["content"]["parts"]:
            if part.get("functionCall", {}).get("name") == "adk_request_confirmation":
                part["functionCall"]["args"] = args
    message = waiting_message(session)
    assert message is not None and len(message.pending) == 1
    replay(message, machine=ChatMachine(decider=DECIDER), now=0.0)  # the converter skips what it cannot show


def _answered_then_asked(label: str, approved: bool) -> dict[str, Any]:
    """A message that asked, was answered (the run went on: the tool's result) and asked again:
    confirm_paid's first run and answer, then confirm_pay's run, without its person message."""
    paid = copy.deepcopy(sessions(label)["confirm_paid"]["events"])
    answer = next(i for i, e in enumerate(paid) if e["author"] == "user" and i)
    paid[answer]["content"]["parts"][0]["functionResponse"]["response"] = {"confirmed": approved}
    again = copy.deepcopy(sessions(label)["confirm_pay"]["events"][1:])
    return {"events": [*paid[: answer + 2], *again]}


@pytest.mark.parametrize("label", VERSIONS)
@pytest.mark.parametrize("version", [6, 7])
def test_a_message_over_two_runs_is_rebuilt_as_two_responses(label: str, version: int) -> None:
    session = _answered_then_asked(label, approved=True)
    message = waiting_message(session)
    assert message is not None
    first_ask, second_ask = _confirmation_ids(session)
    assert message.pending == {second_ask} and len(message.segments) == 2
    ledger = Ledger()
    machine = ChatMachine(ledger, decider=DECIDER)
    rebuilt = replay(message, machine=machine, now=1.0, version=version)
    assert rebuilt is not None
    # The chat's machine is left as those runs' ends leave it: between runs, its last turn the message's.
    assert machine.phase is Phase.IDLE and machine.turn is not None and machine.turn.converter.version == version
    first, second = rebuilt.responses
    assert types(first.chunks)[-1] == "finish" and first.added == []
    # The answer between them, as a live replay shows it (ai 7 only: ai 6 has no chunk for it).
    assert second.added == ([{"type": "tool-approval-response", "approvalId": first_ask, "approved": True}] if version == 7 else [])
    paid_call = first.chunks[2]["toolCallId"]
    # The continuation starts on the same message; the paid call's result, then the new ask.
    assert second.chunks[0] == {"type": "start", "messageId": message.message_id}
    assert second.chunks[1]["type"] == "tool-output-available" and second.chunks[1]["toolCallId"] == paid_call
    assert second.chunks[1]["output"]["success"] is True
    assert "tool-approval-request" in types(second.chunks) and second.chunks[-1]["finishReason"] == "tool-calls"
    # The first is answered (a replay of it is refused), the second pending.
    assert ledger.native_answered(first_ask) and not ledger.native_pending(first_ask)
    assert [c.approval_id for c in rebuilt.pending] == [second_ask]


def test_a_denied_call_in_an_earlier_run_shows_as_denied() -> None:
    session = _answered_then_asked("newest", approved=False)
    rebuilt = replay(waiting_message(session), machine=ChatMachine(decider=DECIDER), now=1.0)
    assert rebuilt is not None
    second = rebuilt.responses[1].chunks
    assert second[1] == {"type": "tool-output-denied", "toolCallId": rebuilt.responses[0].chunks[2]["toolCallId"]}


def test_a_gated_tool_of_confirm_mode_is_not_waited_for_twice() -> None:
    # With the agent's policy (confirm mode): the payment is gated and confirmed by ADK.
    policy = ToolPolicy(approval=True)
    message = waiting_message(sessions("newest")["confirm_pay"])
    assert message is not None
    rebuilt = replay(message, machine=ChatMachine(decider=DECIDER), now=0.0, policy=lambda name: policy, confirms=lambda name: True)
    assert rebuilt is not None
    assert types(rebuilt.responses[0].chunks).count("tool-approval-request") == 1
    assert rebuilt.responses[0].chunks[-1]["finishReason"] == "tool-calls"


def _streamed_as(session: dict[str, Any], *ids: Any, author: str = "user") -> dict[str, Any]:
    """`session` as ADK keeps it when the gateway's runs sent these message ids as their state
    delta: one per event of `author`, in order (None: that run sent none)."""
    session = copy.deepcopy(session)
    events = [e for e in session["events"] if e["author"] == author]
    for event, message_id in zip(events, ids, strict=False):
        if message_id is not None:
            event.setdefault("actions", {}).setdefault("stateDelta", {})[MESSAGE_ID_STATE_KEY] = message_id
    return session


@pytest.mark.parametrize("label", VERSIONS)
@pytest.mark.parametrize("scenario", ["confirm_pay", "native_pay", "confirm_two"])
def test_the_message_keeps_the_id_the_gateway_streamed_it_under(label: str, scenario: str) -> None:
    # A page that kept the message resumes into it: the AI SDK replaces a message of the same id,
    # and adds one of another.
    session = _streamed_as(sessions(label)[scenario], "msg-live")
    message = waiting_message(session)
    assert message is not None and message.message_id == "msg-live"
    rebuilt = replay(message, machine=ChatMachine(decider=DECIDER), now=0.0)
    assert rebuilt is not None and rebuilt.message_id == "msg-live"
    assert rebuilt.responses[0].chunks[0] == {"type": "start", "messageId": "msg-live"}


@pytest.mark.parametrize("label", VERSIONS)
def test_over_two_runs_the_newest_run_s_id_is_the_message_s(label: str) -> None:
    session = _answered_then_asked(label, approved=True)
    # The answer continued the message the person's message started (the usual case).
    assert waiting_message(_streamed_as(session, "msg-1", "msg-1")).message_id == "msg-1"  # type: ignore[union-attr]
    # The answer's run wrote another id (its replica had no run of the chat): the page read that one.
    assert waiting_message(_streamed_as(session, "msg-1", "msg-2")).message_id == "msg-2"  # type: ignore[union-attr]
    # The answer's run carried none (an older gateway): the first run's still names the message.
    assert waiting_message(_streamed_as(session, "msg-1", None)).message_id == "msg-1"  # type: ignore[union-attr]


@pytest.mark.parametrize("value", [None, 7, "", "x" * 257, ["msg-1"]])
def test_without_a_usable_id_the_message_takes_adk_s_invocation_id(value: Any) -> None:
    session = sessions("newest")["confirm_pay"]
    expected = "msg-adk-" + session["events"][0]["invocationId"]
    assert waiting_message(_streamed_as(session, value)).message_id == expected  # type: ignore[union-attr]


def test_only_the_gateway_s_own_runs_name_the_message() -> None:
    session = sessions("newest")["confirm_pay"]
    expected = "msg-adk-" + session["events"][0]["invocationId"]
    # An agent's event writing the key (a tool's state) does not rename the message.
    agent_wrote = _streamed_as(session, "msg-tool", author="demo_agent")
    assert waiting_message(agent_wrote).message_id == expected  # type: ignore[union-attr]
    # Nor does an earlier message's: the id is the waiting message's.
    earlier = _streamed_as(sessions("newest")["hello"], "msg-hello")
    later = {"events": [*earlier["events"], *copy.deepcopy(session["events"])]}
    assert waiting_message(later).message_id == expected  # type: ignore[union-attr]


def test_each_asked_confirmation_knows_the_message_the_gateway_was_writing_when_adk_asked() -> None:
    """ADK's session as the gateway's confirmation bookkeeping reads it (upstream/client.py): the
    message id of the newest run that told ADK one, before the confirmation was asked."""
    from gateway.upstream.client import _asked_calls

    def user(message_id: str | None) -> dict[str, Any]:
        delta = {MESSAGE_ID_STATE_KEY: message_id} if message_id else {}
        return {"author": "user", "content": {"role": "user", "parts": [{"text": "pay"}]}, "actions": {"stateDelta": delta}}

    def asks(approval_id: str, call_id: str) -> dict[str, Any]:
        original = {"id": call_id, "name": "pay", "args": {}}
        call = {"id": approval_id, "name": "adk_request_confirmation", "args": {"originalFunctionCall": original}}
        return {"author": "a", "content": {"role": "model", "parts": [{"functionCall": call}]}, "timestamp": 1.0}

    session = {"events": [asks("a0", "c0"), user("msg-1"), asks("a1", "c1"), user(None), asks("a2", "c2"), user("msg-2"), asks("a3", "c3")]}
    calls = _asked_calls(session)
    assert {approval: call.message_id for approval, call in calls.items()} == {
        "a0": None, "a1": "msg-1", "a2": "msg-1", "a3": "msg-2",
    }
