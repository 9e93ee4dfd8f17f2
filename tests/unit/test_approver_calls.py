"""A call its approvers decide (sans-IO): the chatting person's response does not end for it, a
data part says whom it waits for, the decision arrives as the approvers' (ai 7: an approval pair),
and what a replica sends another to apply it."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.approvals.decision import DECIDER
from gateway.chat.record import Chat
from gateway.cluster.messages import Decide, from_json
from gateway.config.schema import ToolPolicy
from gateway.core.approvals import CallState, GatedCall, Outcome
from gateway.core.chat_events import ApproversDecided, DeadlineReached, GateOpened, RunStarts, ToolAsked, UpstreamRead
from gateway.core.chat_outputs import GateDecided
from gateway.core.chat_machine import ChatMachine
from gateway.core.ledger import Ledger
from gateway.core.turn import CloseResponse, Chunks

REFUND = ToolPolicy.model_validate({"approval": True, "timeout": 60, "hint": "Card credited.", "rules": [
    {"name": "large_refund", "when": "args.amount > 100", "decide": "ask", "approvers": "supervisors", "self_approval": False},
]})


class _Chats:
    """The registry's `ChatMaker` (gateway/chat/ports.py) when nothing drives its chats."""

    def new_chat(self, agent: str, user_id: str, chat_id: str, now: float) -> Chat:
        return Chat(user_id, chat_id, chat_id, now, agent)


def _waiting(version: int) -> tuple[ChatMachine, GatedCall]:
    machine = ChatMachine(decider=DECIDER)
    machine.handle(RunStarts("m1", 0.0, version=version, policy=lambda name: REFUND))  # type: ignore[arg-type]
    part = {"functionCall": {"id": "t1", "name": "refund", "args": {"amount": 250}}}
    machine.handle(UpstreamRead([{"author": "a", "content": {"role": "model", "parts": [part]}}], 0.0))
    # Live mode (ADK has no confirmation there): the call waits here, held in the plugin's request.
    ask = ToolAsked("t1", "refund", {"amount": 250}, REFUND, "agent", "u", "c", "c", 0.0, mode="live")
    [decided] = machine.handle(ask)
    assert isinstance(decided, GateDecided) and decided.action == "wait" and decided.call is not None
    call = decided.call
    assert (call.rule, call.approvers, call.self_approval, call.quorum) == ("large_refund", "supervisors", False, 1)
    return machine, call


def _chunks(outputs: list[Any]) -> list[dict[str, Any]]:
    return [c for o in outputs if isinstance(o, Chunks) for c in o.chunks]


@pytest.mark.parametrize("version", [6, 7])
def test_the_response_goes_on_with_a_data_part_saying_whom_the_call_waits_for(version: int) -> None:
    machine, call = _waiting(version)
    outputs = machine.handle(GateOpened(call, 0.0))
    assert not any(isinstance(o, CloseResponse) for o in outputs), "the response must not end for approvers"
    assert [c["type"] for c in _chunks(outputs)] == ["data-approval"]
    [part] = _chunks(outputs)
    assert part["id"] == call.id and part["data"] == {
        "approvalId": call.id, "toolCallId": "t1", "state": "waiting", "approvers": "supervisors", "quorum": 1,
        "rule": "large_refund", "hint": "Card credited.",
    }
    assert not machine.waiting_for_person and machine.waiting_for_decision


def test_approvers_approve_ai7_sees_the_pair_and_the_part_updated() -> None:
    machine, call = _waiting(7)
    machine.handle(GateOpened(call, 0.0))
    call.decided_by, call.deciders = "approver", [{"user": "sup", "auth": "approver_key"}]
    outputs = machine.handle(ApproversDecided(call, True, None, 5.0))
    assert call.outcome is Outcome.APPROVED and call.source == "approver" and call.verdict is not None and call.verdict.run
    chunks = _chunks(outputs)
    assert [c["type"] for c in chunks] == ["data-approval", "tool-approval-request", "tool-approval-response"]
    assert chunks[0]["data"]["state"] == "decided" and chunks[0]["data"]["by"] == ["sup"]
    assert chunks[2] == {"type": "tool-approval-response", "approvalId": call.id, "approved": True}


def test_approvers_deny_ai6_sees_the_part_updated_then_an_error_for_the_output() -> None:
    machine, call = _waiting(6)
    machine.handle(GateOpened(call, 0.0))
    call.decided_by = "approver"
    chunks = _chunks(machine.handle(ApproversDecided(call, False, "not this one", 5.0)))
    assert [c["type"] for c in chunks] == ["data-approval"] and chunks[0]["data"]["reason"] == "not this one"
    assert call.verdict is not None and call.verdict.response is not None
    assert call.verdict.response["error"].startswith("An approver rejected this tool call")
    part = {"functionResponse": {"id": "t1", "name": "refund", "response": call.verdict.response}}
    [result] = _chunks(machine.handle(UpstreamRead([{"author": "a", "content": {"role": "user", "parts": [part]}}], 6.0)))
    assert result["type"] == "tool-output-error"


def test_a_deadline_ends_it_with_the_part_saying_so() -> None:
    machine, call = _waiting(7)
    machine.handle(GateOpened(call, 0.0))
    chunks = _chunks(machine.handle(DeadlineReached(61.0)))
    assert call.outcome is Outcome.TIMEOUT and call.source == "timeout"
    assert chunks[0]["data"]["state"] == "timeout" and chunks[2]["approved"] is False


def test_a_second_decision_changes_nothing() -> None:
    machine, call = _waiting(7)
    machine.handle(GateOpened(call, 0.0))
    machine.handle(ApproversDecided(call, True, None, 5.0))
    assert machine.handle(ApproversDecided(call, False, None, 6.0)) == []
    assert call.approved and call.state is CallState.RELEASED


def test_who_answers_survives_a_snapshot() -> None:
    ledger = Ledger()
    _, call = _waiting(7)
    call.deciders = [{"user": "sup", "auth": "jwt"}]
    ledger.add(call)
    [again] = Ledger.restore(ledger.snapshot()).calls()
    assert (again.approvers, again.self_approval, again.quorum, again.deciders) == ("supervisors", False, 1, call.deciders)


def test_the_decision_travels_to_the_owner_and_back() -> None:
    work = Decide("u", "s", "gw-1", True, "", {"deciders": [{"user": "sup", "auth": "jwt"}]})
    raw = {"op": "decide", "from": "r1", "id": "x", "user": "u", "session": "s", "approval": "gw-1", "approved": True,
           "reason": "", "deciders": {"deciders": [{"user": "sup", "auth": "jwt"}]}}
    assert from_json(raw).work == work  # type: ignore[union-attr]


def test_the_chat_cannot_answer_for_the_approvers() -> None:
    from gateway.chat.answers import ForApprovers, split_answers
    from gateway.chat.registry import Registry
    from gateway.core.chat_request import ApprovalAnswer

    registry = Registry()
    registry.attach(_Chats())  # chats that never run here
    chat = registry.get("agent", "u", "c", now=0.0)
    _, call = _waiting(7)
    chat.machine.ledger.add(call)
    registry.index_approval(call.id, chat)
    answer = ApprovalAnswer(call.id, "t1", "refund", True)
    with pytest.raises(ForApprovers) as refused:
        split_answers(registry, chat, (answer,), strict=True)
    assert refused.value.status == 403 and refused.value.code == "approval_for_approvers"
    call.approvers = None  # the chatting person's own approval: answered in the chat as before
    assert split_answers(registry, chat, (answer,), strict=True) == ([(answer, call)], [])
