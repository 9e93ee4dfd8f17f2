"""Confirm mode's browser tools on the gateway's side, layer by layer (sans-IO): how a browser
tool's ADK confirmation is shown (as hold mode shows the same call), what the ledger keeps of it,
what a browser request's outputs and answers send to ADK, and the answer's wire format. The real
stack, with stock clients, on each ADK: tests/integration/test_confirm_mode.py. The plugin's side:
tests/unit/test_agent_plugin.py."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.core.approvals import GatedCall
from gateway.core.browser_confirmations import BrowserCalls, handover_chunks, output_answers, payload, plan_browser
from gateway.config.schema import GatewayConfig
from gateway.core.ledger import Ledger, NativeConfirmation
from gateway.core.chat_request import ApprovalAnswer, ToolOutput, confirmation_message, confirmation_response
from gateway.core.turn import NativeAsked, Turn, TurnState
from gateway.upstream.client import SessionConfirmations, _asked_calls
from tests.unit.test_confirm_mode import config
from tests.unit.test_turn import Shell

PLACEHOLDER = {"error": "This tool call requires confirmation, please approve or reject."}


def _call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"author": "a", "content": {"role": "model", "parts": [{"functionCall": {"id": call_id, "name": name, "args": args}}]}}


def _asked(approval_id: str, call_id: str, name: str, args: dict[str, Any]) -> list[dict[str, Any]]:
    """What ADK writes after the plugin asked a browser tool's confirmation (1.22 and 2.x alike)."""
    return [
        {"author": "a", "longRunningToolIds": [approval_id], "content": {"role": "user", "parts": [{"functionCall": {
            "id": approval_id, "name": "adk_request_confirmation",
            "args": {"originalFunctionCall": {"id": call_id, "name": name, "args": args},
                     "toolConfirmation": {"hint": "Please approve or reject the tool call x()", "confirmed": False,
                                          "payload": {"adk_gateway": {"runs_in": "browser"}}}},
        }}]}},
        {"author": "a", "content": {"role": "user", "parts": [
            {"functionResponse": {"id": call_id, "name": name, "response": PLACEHOLDER}},
        ]}},
    ]


def _turn(cfg: GatewayConfig, ledger: Ledger | None = None, **kwargs: Any) -> Turn:
    agent = cfg.agents["payments"]
    return Turn("m1", ledger=ledger or Ledger(), policy=agent.tool_policy, confirms=agent.confirms, **kwargs)


def _confirming(name: str, args: dict[str, Any], version: int = 6) -> tuple[Shell, Turn]:
    turn = _turn(config(), version=version)
    shell = Shell(turn)
    shell.apply(turn.begin())
    shell.apply(turn.feed([_call("c1", name, args), *_asked("adk-1", "c1", name, args)], 0.0))
    shell.apply(turn.end(1.0))
    return shell, turn


def _holding(name: str, args: dict[str, Any], version: int = 6) -> Shell:
    """The same call in hold mode: the plugin opens it and the run waits, open upstream."""
    cfg = config()
    agent = cfg.agents["payments"]
    turn = Turn("m1", ledger=Ledger(), policy=agent.tool_policy, version=version)
    shell = Shell(turn)
    shell.apply(turn.begin())
    shell.apply(turn.feed([_call("c1", name, args)], 0.0))
    gate = turn.ledger.add(GatedCall.open(
        user_id="u", chat_id="c", session_id="c", tool_call_id="c1", tool=name, args=args, policy=agent.tool_policy(name),
        now=0.0, approval_id="adk-1",
    ))
    shell.apply(turn.show_gate(gate, 0.0))
    return shell


# ---- shown as hold mode shows it -----------------------------------------------------------------


@pytest.mark.parametrize("version", [6, 7])
@pytest.mark.parametrize(("name", "args"), [("change_bgm", {"track": 2}), ("get_location", {})])
def test_a_browser_tools_confirmation_reads_chunk_for_chunk_as_hold_modes_gate(name: str, args: dict, version: int) -> None:
    confirming, _ = _confirming(name, args, version)
    holding = _holding(name, args, version)
    assert confirming.current.chunks == holding.current.chunks
    assert confirming.current.closed and confirming.current.waiting is False  # the run ended: nothing held open
    confirming.check_rules()


def test_a_browser_tool_without_approval_asks_nobody_and_with_one_asks_under_the_original_call() -> None:
    bgm, turn = _confirming("change_bgm", {"track": 2})
    types = [c["type"] for c in bgm.current.chunks]
    assert types == ["start", "start-step", "tool-input-start", "tool-input-available", "finish-step", "finish"]
    assert bgm.current.chunks[-1]["finishReason"] == "tool-calls"
    [asked] = [o.confirmation for o in bgm.observed if isinstance(o, NativeAsked)]
    assert (asked.in_browser, asked.approval, asked.args, asked.awaits_output) == (True, False, {"track": 2}, True)
    assert turn.ledger.native_of_call("c1") is asked
    location, _ = _confirming("get_location", {})
    assert [c["type"] for c in location.current.chunks][3:5] == ["tool-input-delta", "tool-approval-request"]
    assert location.current.chunks[4] == {"type": "tool-approval-request", "approvalId": "adk-1", "toolCallId": "c1"}
    assert not [o for o in location.observed if type(o).__name__ == "Bypassed"]


def test_the_policy_decides_what_runs_in_the_browser_not_adks_payload() -> None:
    # ADK's payload says browser, the gateway's policy says server: a native approval as any other.
    turn = _turn(config())
    shell = Shell(turn)
    shell.apply(turn.begin())
    shell.apply(turn.feed([_call("c1", "process_payment", {}), *_asked("adk-1", "c1", "process_payment", {})], 0.0))
    shell.apply(turn.end(1.0))
    [asked] = [o.confirmation for o in shell.observed if isinstance(o, NativeAsked)]
    assert not asked.in_browser and asked.approval


def test_the_run_the_output_starts_does_not_echo_it_to_the_browser_that_sent_it() -> None:
    ledger = Ledger()
    turn = _turn(config(), ledger, known_tool_calls=["c1"], delivered_tool_calls=["c1"])
    shell = Shell(turn)
    shell.apply(turn.begin())
    result = {"author": "a", "content": {"role": "user", "parts": [
        {"functionResponse": {"id": "c1", "name": "change_bgm", "response": {"playing": 2}}},
    ]}}
    words = {"author": "a", "content": {"role": "model", "parts": [{"text": "Now playing track 2."}]}}
    shell.apply(turn.feed([result, words], 0.0))
    shell.apply(turn.end(1.0))
    assert [c["type"] for c in shell.current.chunks] == [
        "start", "start-step", "text-start", "text-delta", "text-end", "finish-step", "finish",
    ]
    assert turn.state is TurnState.DONE and shell.current.chunks[-1]["finishReason"] == "stop"


# ---- the ledger -------------------------------------------------------------------------------------


def test_the_ledger_finds_a_browser_confirmation_by_call_approves_it_once_and_remembers_the_answer() -> None:
    ledger = Ledger()
    ledger.ask(NativeConfirmation("adk-1", "c1", "get_location", in_browser=True, approval=True, args={}))
    ledger.settle_asked(1.0)
    found = ledger.native_of_call("c1")
    assert found is not None and not found.awaits_output
    assert ledger.approve_in_browser("adk-1", 2.0) is found and found.awaits_output and found.approved_at == 2.0
    assert ledger.approve_in_browser("adk-1", 3.0) is None and found.approved_at == 2.0
    assert ledger.answer_native("adk-1") is found
    assert ledger.native_of_call("c1") is None and ledger.answered_of_call("c1") == "adk-1"
    # One the gateway did not ask (it restarted) is remembered by the call it answered too.
    ledger.answer_native("adk-9", "c9")
    assert ledger.answered_of_call("c9") == "adk-9" and ledger.native_answered("adk-9")


def test_an_approval_of_a_confirmation_only_adks_session_holds_is_taken_into_the_ledger_once() -> None:
    """The replica that asked died before the chat's state was kept: the approval is this ledger's
    to remember (ADK hears of it with the output), so the output finds it by its call."""
    ledger = Ledger()
    known = NativeConfirmation("adk-1", "c1", "get_location", in_browser=True, approval=True, args={})
    assert ledger.approve_in_browser("adk-1", 2.0, known) is known and known.approved_at == 2.0
    assert ledger.native_of_call("c1") is known and known.awaits_output
    assert ledger.approve_in_browser("adk-1", 3.0, known) is None and known.approved_at == 2.0
    # Never one this ledger answered already, nor a server tool's.
    ledger.answer_native("adk-2", "c2")
    answered = NativeConfirmation("adk-2", "c2", "get_location", in_browser=True)
    assert ledger.approve_in_browser("adk-2", 2.0, answered) is None and ledger.native_of_call("c2") is None
    server = NativeConfirmation("adk-3", "c3", "process_payment")
    assert ledger.approve_in_browser("adk-3", 2.0, server) is None and not ledger.native_pending("adk-3")


def test_a_server_tools_confirmation_is_never_approved_in_the_browser() -> None:
    ledger = Ledger()
    ledger.ask(NativeConfirmation("adk-1", "c1", "process_payment"))
    ledger.settle_asked(1.0)
    assert ledger.approve_in_browser("adk-1", 2.0) is None


# ---- what a browser request sends to ADK -------------------------------------------------------------


def _calls(*pending: NativeConfirmation, originals: dict | None = None) -> BrowserCalls:
    ledger = Ledger()
    for confirmation in pending:
        ledger.ask(confirmation)
    ledger.settle_asked(0.0)
    return BrowserCalls(ledger, config().agents["payments"].tool_policy, originals or {})


BGM = NativeConfirmation("adk-b", "c-b", "change_bgm", in_browser=True, approval=False, args={"track": 2})


def _location(approved: bool = False) -> NativeConfirmation:
    return NativeConfirmation("adk-l", "c-l", "get_location", in_browser=True, args={}, approved_at=1.0 if approved else None)


def test_an_output_answers_its_confirmation_with_the_output_or_the_error_as_payload() -> None:
    calls = _calls(BGM, _location(approved=True), NativeConfirmation("adk-p", "c-p", "process_payment"))
    answers, carried = output_answers([
        ToolOutput("c-b", "change_bgm", 2),
        ToolOutput("c-l", "get_location", None, "Permission denied"),
        ToolOutput("c-p", "change_bgm", {"success": True}),  # a server tool's call, whatever its name
        ToolOutput("c-x", "change_bgm", 1),  # nobody asked (another chat's, say)
    ], calls.of_output)
    assert [(a.approval_id, a.tool_call_id, a.approved, a.payload) for a in answers] == [
        ("adk-b", "c-b", True, {"adk_gateway": {"output": 2}}),
        ("adk-l", "c-l", True, {"adk_gateway": {"error": "Permission denied"}}),
    ]
    assert [o.tool_call_id for o in carried] == ["c-b", "c-l"]


def test_an_output_before_the_approval_it_needs_answers_nothing() -> None:
    calls = _calls(_location())
    assert output_answers([ToolOutput("c-l", "get_location", {})], calls.of_output) == ([], [])
    # The tool part shows the person's approval (the gateway restarted since it handed the call over).
    answers, _ = output_answers([ToolOutput("c-l", "get_location", {}, approved=True)], calls.of_output)
    assert [a.approval_id for a in answers] == ["adk-l"]


def test_after_a_restart_adks_session_names_the_call_and_the_policy_says_it_is_a_browser_tools() -> None:
    calls = _calls(originals={
        "adk-l": ("c-l", "get_location", {}), "adk-p": ("c-p", "process_payment", {"amount": 5}),
    })
    assert calls.need_session([ToolOutput("c-l", "get_location", 1)], [])
    assert not calls.need_session([ToolOutput("c-p", "process_payment", 1)], [])  # a server tool's output rides along
    found = calls.by_id("adk-l")
    assert found is not None and (found.tool_call_id, found.tool, found.approval) == ("c-l", "get_location", True)
    assert calls.by_id("adk-p") is None  # ADK's payload would not make a server tool a browser tool
    answers, _ = output_answers([ToolOutput("c-l", "get_location", 7, approved=True)], calls.of_output)
    assert answers[0].approval_id == "adk-l"


def test_a_replayed_output_is_the_answer_it_was_so_that_it_is_refused_as_answered() -> None:
    calls = _calls(BGM)
    calls.ledger.answer_native("adk-b")
    assert not calls.need_session([ToolOutput("c-b", "change_bgm", 2)], [])
    [answer], _ = output_answers([ToolOutput("c-b", "change_bgm", 2)], calls.of_output)
    assert answer.approval_id == "adk-b" and calls.ledger.native_answered("adk-b")


def _answer(approval_id: str, call_id: str, tool: str, approved: bool, **kw: Any) -> ApprovalAnswer:
    return ApprovalAnswer(approval_id, call_id, tool, approved, **kw)


def test_an_approval_alone_hands_the_call_over_and_holds_the_messages_other_answers_back() -> None:
    calls = _calls(_location())
    pay = _answer("adk-p", "c-p", "process_payment", True)
    split = plan_browser([_answer("adk-l", "c-l", "get_location", True), pay], calls.by_id, new_message=False)
    assert [c.approval_id for c in split.handover] == ["adk-l"] and split.forward == []


def test_a_denial_goes_to_adk_at_once() -> None:
    calls = _calls(_location())
    denied = _answer("adk-l", "c-l", "get_location", False)
    assert plan_browser([denied], calls.by_id, new_message=False).forward == [denied]


def test_the_output_goes_to_adk_with_the_messages_other_answers() -> None:
    calls = _calls(_location(approved=True))
    output = _answer("adk-l", "c-l", "get_location", True, payload=payload(ToolOutput("c-l", "get_location", 1)))
    pay = _answer("adk-p", "c-p", "process_payment", True)
    split = plan_browser([output, pay], calls.by_id, new_message=False)
    assert split.forward == [output, pay] and split.handover == []


def test_a_new_message_rejects_what_still_waits_for_the_browser() -> None:
    calls = _calls(BGM, _location(approved=True))
    approved = _answer("adk-l", "c-l", "get_location", True)  # still approval-responded: never ran
    split = plan_browser([approved], calls.by_id, new_message=True, waiting=calls.ledger.pending_native())
    assert [(a.approval_id, a.approved, a.implicit) for a in split.forward] == [("adk-l", False, True), ("adk-b", False, True)]
    assert split.handover == []


@pytest.mark.parametrize(("version", "reason"), [(6, "tool-calls"), (7, "tool-calls")])
def test_the_handover_is_hold_modes_continuation(version: int, reason: str) -> None:
    assert handover_chunks("m1", [_location()], version) == [
        {"type": "start", "messageId": "m1"},
        {"type": "tool-input-available", "toolCallId": "c-l", "toolName": "get_location", "input": {}},
        {"type": "finish", "finishReason": reason},
    ]


# ---- the answer's wire format (agreed with the deadlines' side) -------------------------------------


def test_the_confirmation_response_carries_a_payload_only_when_given() -> None:
    assert confirmation_response("adk-1", False) == {
        "functionResponse": {"id": "adk-1", "name": "adk_request_confirmation", "response": {"confirmed": False}},
    }
    assert confirmation_response("adk-1", True, {"adk_gateway": {"output": {"playing": 2}}}) == {
        "functionResponse": {"id": "adk-1", "name": "adk_request_confirmation",
                             "response": {"confirmed": True, "payload": {"adk_gateway": {"output": {"playing": 2}}}}},
    }
    message = confirmation_message([
        _answer("adk-1", "c1", "change_bgm", True, payload={"adk_gateway": {"output": 2}}),
        _answer("adk-2", "c2", "process_payment", False),
    ])
    assert message == {"role": "user", "parts": [
        confirmation_response("adk-1", True, {"adk_gateway": {"output": 2}}), confirmation_response("adk-2", False),
    ]}


def test_adks_session_names_each_confirmations_original_call_in_either_case() -> None:
    session = {"events": [
        {"content": {"parts": [{"functionCall": {"id": "adk-1", "name": "adk_request_confirmation", "args": {
            "originalFunctionCall": {"id": "c1", "name": "get_location", "args": {}}}}}]}},
        {"content": {"parts": [{"function_call": {"id": "adk-2", "name": "adk_request_confirmation", "args": {
            "original_function_call": {"id": "c2", "name": "change_bgm", "args": {"track": 2}}}}}]}},
        {"content": {"parts": [{"functionCall": {"id": "adk-3", "name": "adk_request_confirmation", "args": "junk"}}]}},
        {"content": {"parts": [{"functionCall": {"id": "c4", "name": "change_bgm", "args": {}}}]}},
    ]}
    originals = SessionConfirmations(calls=_asked_calls(session)).originals
    assert originals == {"adk-1": ("c1", "get_location", {}), "adk-2": ("c2", "change_bgm", {"track": 2})}
    assert _asked_calls({"events": "junk"}) == {} and _asked_calls(None) == {}
