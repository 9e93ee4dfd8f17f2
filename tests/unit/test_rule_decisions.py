"""A rule's decision inside the chat (sans-IO): the call recorded released, shown as the AI SDK's
automatic approval to ai 7 and as the call alone to ai 6, its refusal as each version can hold it;
and what a rule's decision adds to the wire between plugin, gateway and replicas."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.cluster.messages import Gate, Submit, from_json as read_message
from gateway.approvals.decision import DECIDER
from gateway.config.schema import ToolPolicy
from gateway.core.approvals import CONFIRM, RUN, GatedCall, Outcome, Verdict
from gateway.core.chat_events import RunStarts, ToolAsked, UpstreamRead
from gateway.core.chat_machine import ChatMachine
from gateway.core.chat_outputs import GateDecided
from gateway.core.ledger import Ledger
from gateway.core.turn import CallChanged, Chunks

PAY = ToolPolicy.model_validate({"approval": True, "rules": [
    {"name": "small", "when": "args.amount < 5", "decide": "approve"},
    {"name": "too_large", "when": "args.amount >= 10000", "decide": "deny", "reason": "Too much."},
]})


def _running(version: int) -> ChatMachine:
    machine = ChatMachine(decider=DECIDER)
    machine.handle(RunStarts("m1", 0.0, version=version, policy=lambda name: PAY))  # type: ignore[arg-type]
    call = {"functionCall": {"id": "t1", "name": "pay", "args": {"amount": 2}}}
    machine.handle(UpstreamRead([{"author": "a", "content": {"role": "model", "parts": [call]}}], 0.0))
    return machine


def _decided(approved: bool, rule: str | None = "small", reason: str | None = None) -> GatedCall:
    call = GatedCall.open(
        user_id="u", chat_id="c", session_id="c", tool_call_id="t1", tool="pay", args={"amount": 2}, policy=PAY, now=1.0,
    )
    assert call.decide_by_rule(approved, rule, reason)
    return call


def _chunks(outputs: list[Any]) -> list[dict[str, Any]]:
    return [c for o in outputs if isinstance(o, Chunks) for c in o.chunks]


def _ask(amount: float, policy: ToolPolicy = PAY, max_pending: int = 16) -> ToolAsked:
    """The plugin's ask about `pay` of `amount` (2: `small` approves, 20000: `too_large` denies)."""
    return ToolAsked("t1", "pay", {"amount": amount}, policy, "agent", "u", "c", "c", 1.0, max_pending=max_pending)


def _ruled(machine: ChatMachine, ask: ToolAsked) -> tuple[GatedCall, list[Any]]:
    """The ask decided by a rule: the call it recorded released, and the outputs."""
    outputs = machine.handle(ask)
    decided = outputs[0]
    assert isinstance(decided, GateDecided) and decided.action == "rule" and decided.call is not None
    assert decided.verdict is not None and decided.verdict.reason == "rule"
    return decided.call, outputs


def _result(machine: ChatMachine, response: dict[str, Any]) -> list[dict[str, Any]]:
    part = {"functionResponse": {"id": "t1", "name": "pay", "response": response}}
    return _chunks(machine.handle(UpstreamRead([{"author": "a", "content": {"role": "user", "parts": [part]}}], 2.0)))


def test_ai7_sees_an_automatic_approval_then_the_output() -> None:
    machine = _running(7)
    call, outputs = _ruled(machine, _ask(2))
    assert outputs[1] == CallChanged(call, outputs[1].before, 0.0)
    assert _chunks(outputs) == [
        {"type": "tool-approval-request", "approvalId": call.id, "toolCallId": "t1", "isAutomatic": True,
         "approvalDescriptor": {"rule": "small"}},
        {"type": "tool-approval-response", "approvalId": call.id, "approved": True},
    ]
    assert machine.ledger.call("t1") is call and not machine.waiting_for_person
    assert _result(machine, {"success": True}) == [{"type": "tool-output-available", "toolCallId": "t1", "output": {"success": True}}]


def test_ai6_sees_the_call_and_its_output_alone() -> None:
    machine = _running(6)
    assert _chunks(_ruled(machine, _ask(2))[1]) == []
    assert [c["type"] for c in _result(machine, {"success": True})] == ["tool-output-available"]


@pytest.mark.parametrize(("version", "shown"), [(7, "tool-output-denied"), (6, "tool-output-error")])
def test_a_rules_refusal_is_denied_to_ai7_and_an_error_to_ai6(version: int, shown: str) -> None:
    machine = _running(version)
    call, outputs = _ruled(machine, _ask(20000))
    assert call.outcome is Outcome.DENIED and call.source == "rule"
    assert call.verdict is not None and call.verdict.response is not None
    assert "Too much." in call.verdict.response["error"]
    chunks = _chunks(outputs)
    if version == 7:
        assert chunks[-1] == {"type": "tool-approval-response", "approvalId": call.id, "approved": False, "reason": "Too much."}
    [result] = _result(machine, call.verdict.response)
    assert result["type"] == shown
    if version == 6:
        assert "Too much." in result["errorText"]


def test_a_decided_call_is_not_held_to_the_cap_of_waiting_calls() -> None:
    machine = _running(7)
    assert _ruled(machine, _ask(2, max_pending=0))[0].verdict == RUN


def test_a_tool_allowed_by_its_own_default_shows_no_approval() -> None:
    plain = ToolPolicy.model_validate({"rules": [{"name": "no", "when": "args.amount > 9", "decide": "deny", "reason": "x"}]})
    assert _chunks(_ruled(_running(7), _ask(1, plain))[1]) == []


def test_who_decided_survives_a_snapshot_and_an_older_replicas_snapshot_reads_as_undecided() -> None:
    ledger = Ledger()
    ledger.add(_decided(False, "too_large", "Too much."))
    [again] = Ledger.restore(ledger.snapshot()).calls()
    assert (again.rule, again.reason, again.decided_by, again.source) == ("too_large", "Too much.", "rule", "rule")
    older = ledger.snapshot()
    for key in ("rule", "reason", "decided_by"):
        del older["calls"][0][key]
    [old] = Ledger.restore(older).calls()
    assert (old.rule, old.decided_by, old.source) == (None, None, "person")


def test_the_confirm_verdict_round_trips_and_reads_nothing_else_as_it() -> None:
    assert CONFIRM.as_json() == {"verdict": "confirm"}
    assert Verdict.from_json({"verdict": "confirm"}) is CONFIRM
    assert Verdict.from_json(RUN.as_json()) is RUN
    assert not Verdict.from_json({"verdict": "confirmed"}).run


def test_messages_of_a_replica_older_than_rules_read_with_their_defaults() -> None:
    gate = Gate("app", "u", "s", "t1", "pay", {"amount": 2}, True)
    raw = {"op": "gate", "from": "r1", "id": "x", **{k: getattr(gate, k) for k in ("app", "user", "session", "tool_call_id", "tool", "args")}}
    assert read_message(raw).work == Gate("app", "u", "s", "t1", "pay", {"amount": 2}, False)  # type: ignore[union-attr]
    assert read_message({**raw, "confirm": True}).work == gate  # type: ignore[union-attr]
    submit = {"op": "submit", "from": "r1", "id": "x", "user": "u", "agent": "a", "body": {}}
    assert read_message(submit).work == Submit("u", "a", {}, {})  # type: ignore[union-attr]
    assert read_message({**submit, "claims": {"groups": ["g"]}}).work.claims == {"groups": ["g"]}  # type: ignore[union-attr]
