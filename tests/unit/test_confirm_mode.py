"""`upstream.approvals: confirm` on the gateway's side: the setting, the policy the plugin reads,
and a run whose gated call ADK confirms (the plugin's side: tests/unit/test_agent_plugin.py; the
real stack on each ADK: tests/integration/test_confirm_mode.py)."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gateway.edge.app import create_app
from gateway.core.approvals import GatedCall
from gateway.config.schema import ConfigError, GatewayConfig, parse_config
from gateway.edge.internal import create_internal_app, merged_policy
from gateway.core.ledger import Ledger, NativeConfirmation
from gateway.core.turn import CloseResponse, NativeAsked, Turn, TurnState
from tests.support.recordings import events
from tests.unit.test_turn import Shell

CONFIRMING = """\
internal:
  secret: s3cret
default_agent: payments
agents:
  payments:
    upstream:
      url: http://adk-a:8000
      app_name: pay_app
      approvals: confirm
    tools:
      process_payment:
        approval: true
        hint: Money leaves the account.
      get_location:
        approval: true
        runs_in: browser
      change_bgm:
        runs_in: browser
  support:
    upstream:
      url: http://adk-b:8000
      app_name: support_app
      mode: live
      approvals: hold
    tools:
      process_payment:
        approval: true
"""


def config(text: str = CONFIRMING) -> GatewayConfig:
    return parse_config(text, source="gateway.yaml", env={})


# ---- the setting -------------------------------------------------------------------------------


def test_confirm_is_the_default_on_sse_and_hold_is_lives() -> None:
    agents = config().agents
    assert agents["support"].upstream.approvals == "hold"
    assert agents["payments"].upstream.approvals == "confirm"
    # Every gated tool: a browser tool's output travels as the confirmation's payload.
    assert agents["payments"].confirms("process_payment")
    assert agents["payments"].confirms("get_location") and agents["payments"].confirms("change_bgm")
    assert not agents["payments"].confirms("get_weather")
    assert not agents["support"].confirms("process_payment")


def test_unset_approvals_are_confirm_on_sse_and_hold_on_live() -> None:
    """A stock deploy keeps its pending approvals in ADK's session; live has only the blocking path."""
    text = CONFIRMING.replace("      approvals: confirm\n", "")
    assert config(text).agents["payments"].upstream.approvals == "confirm"
    assert config(text).agents["payments"].confirms("process_payment")
    live = config(text.replace("      app_name: pay_app\n", "      app_name: pay_app\n      mode: live\n"))
    assert live.agents["payments"].upstream.approvals == "hold"
    assert not live.agents["payments"].confirms("process_payment")
    assert GatewayConfig().agents[GatewayConfig().default].upstream.approvals == "confirm"


def test_the_default_follows_a_mode_set_later_and_an_explicit_value_stays() -> None:
    """`--upstream-mode live` on a file that leaves approvals unset takes hold; an explicit
    confirm is still refused there, and an explicit hold on sse."""
    unset = config(CONFIRMING.replace("      approvals: confirm\n", "")).agents["payments"].upstream
    assert unset.with_mode("live").approvals == "hold"
    assert unset.with_mode("live").with_mode("sse").approvals == "confirm"
    explicit = config().agents["payments"].upstream
    with pytest.raises(ValueError, match="live flow has no tool confirmations"):
        explicit.with_mode("live")
    held = config().agents["support"].upstream
    assert held.approvals == "hold"
    with pytest.raises(ValueError, match="approvals: hold is not available with mode: sse"):
        held.with_mode("sse")


def test_confirm_is_refused_on_a_live_upstream_with_the_reason() -> None:
    text = CONFIRMING.replace("      approvals: confirm\n", "      approvals: confirm\n      mode: live\n")
    with pytest.raises(ConfigError) as info:
        config(text)
    assert any(
        p.startswith("gateway.yaml: agents.payments.upstream:") and "live flow has no tool confirmations" in p
        for p in info.value.problems
    ), info.value.problems


def test_an_unknown_approvals_value_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        config(CONFIRMING.replace("approvals: confirm", "approvals: later"))
    assert any("agents.payments.upstream.approvals" in p for p in info.value.problems), info.value.problems


def test_the_single_agent_form_takes_it_too() -> None:
    single = parse_config(
        "internal:\n  secret: s\nupstream:\n  approvals: confirm\ntools:\n  pay:\n    approval: true\n",
        source="g.yaml", env={},
    )
    [agent] = single.agents.values()
    assert agent.confirms("pay")


# ---- the policy the plugin reads ---------------------------------------------------------------


async def test_the_policy_tells_the_plugin_which_tools_adk_confirms_and_with_what_hint() -> None:
    client = TestClient(TestServer(create_internal_app(create_app(config()))))
    await client.start_server()
    try:
        auth = {"Authorization": "Bearer s3cret"}
        current = {"features": "rules"}
        pay = (await (await client.get("/internal/v1/policy", params={"app_name": "pay_app", **current}, headers=auth)).json())["tools"]
        assert pay["process_payment"]["confirm"] is True and pay["process_payment"]["gated"] is True
        assert pay["process_payment"]["hint"] == "Money leaves the account."
        # Browser tools under their own key: a plugin from before it asks about them (it would run
        # the tool's server stand-in on a bare confirmation) and is refused; this one carries their output.
        assert pay["get_location"]["confirm"] is False and pay["change_bgm"]["confirm"] is False
        assert pay["get_location"]["confirm_browser"] is True and pay["change_bgm"]["confirm_browser"] is True
        assert pay["process_payment"]["confirm_browser"] is False
        assert pay["get_location"]["runs_in"] == pay["change_bgm"]["runs_in"] == "browser"
        support = (await (await client.get("/internal/v1/policy", params={"app_name": "support_app", **current}, headers=auth)).json())["tools"]
        assert support["process_payment"]["confirm"] is False and support["process_payment"]["gated"] is True
    finally:
        await client.close()


def test_a_plugin_that_names_no_app_asks_about_every_gated_call() -> None:
    merged = merged_policy(config())
    assert merged["process_payment"]["gated"] and merged["process_payment"]["confirm"] is False


# ---- a run whose gated call ADK confirms ---------------------------------------------------------


def confirming_turn(cfg: GatewayConfig) -> Turn:
    agent = cfg.agents["payments"]
    return Turn("m1", ledger=Ledger(), policy=agent.tool_policy, confirms=agent.confirms)


def _gate(tool: str, call_id: str, cfg: GatewayConfig) -> GatedCall:
    return GatedCall.open(
        user_id="u", chat_id="c", session_id="c", tool_call_id=call_id, tool=tool, args={},
        policy=cfg.agents["payments"].tool_policy(tool), now=0.0,
    )


def _call_event(*calls: tuple[str, str]) -> dict[str, Any]:
    return {"author": "a", "content": {"role": "model", "parts": [{"functionCall": {"id": i, "name": n, "args": {}}} for i, n in calls]}}


def _confirmation_events(call_id: str) -> list[dict[str, Any]]:
    """What ADK writes after the plugin asked its confirmation of `call_id` (both versions alike)."""
    return [
        {"author": "a", "longRunningToolIds": ["adk-1"], "content": {"role": "user", "parts": [{"functionCall": {
            "id": "adk-1", "name": "adk_request_confirmation",
            "args": {"originalFunctionCall": {"id": call_id, "name": "process_payment", "args": {}},
                     "toolConfirmation": {"hint": "Money leaves the account.", "confirmed": False}},
        }}]}},
        {"author": "a", "content": {"role": "user", "parts": [{"functionResponse": {
            "id": call_id, "name": "process_payment",
            "response": {"error": "This tool call requires confirmation, please approve or reject."},
        }}]}},
    ]


def test_a_browser_tool_waits_for_the_person_beside_a_call_adk_confirms() -> None:
    # ADK runs both calls of one model event in parallel: the browser tool's plugin blocks, while
    # the confirmation of the payment only comes after it. The browser must be able to answer the
    # browser tool meanwhile, so the payment must not count as a call the plugin has yet to open.
    cfg = config()
    turn = confirming_turn(cfg)
    shell = Shell(turn)
    shell.apply(turn.begin())
    shell.apply(turn.feed([_call_event(("c-pay", "process_payment"), ("c-loc", "get_location"))], 0.0))
    where = turn.ledger.add(_gate("get_location", "c-loc", cfg))
    out = shell.apply(turn.show_gate(where, 0.0))
    assert turn.state is TurnState.WAITING and out[-1] == CloseResponse(waiting=True)
    assert [c["type"] for c in shell.current.chunks].count("tool-approval-request") == 1


def test_the_same_run_with_every_gated_call_held_by_the_plugin_would_not_pause() -> None:
    # The contrast: in hold mode the payment is expected from the plugin, which has not opened it yet.
    cfg = config()
    turn = Turn("m1", ledger=Ledger(), policy=cfg.agents["payments"].tool_policy)
    shell = Shell(turn)
    shell.apply(turn.begin())
    shell.apply(turn.feed([_call_event(("c-pay", "process_payment"), ("c-loc", "get_location"))], 0.0))
    shell.apply(turn.show_gate(turn.ledger.add(_gate("get_location", "c-loc", cfg)), 0.0))
    assert turn.state is TurnState.STREAMING


def test_a_call_adk_confirms_is_shown_as_a_native_approval_with_the_policys_hint() -> None:
    cfg = config()
    turn = confirming_turn(cfg)
    shell = Shell(turn)
    shell.apply(turn.begin())
    shell.apply(turn.feed([_call_event(("c-pay", "process_payment")), *_confirmation_events("c-pay")], 0.0))
    shell.apply(turn.end(1.0))
    chunks = shell.current.chunks
    assert [c["type"] for c in chunks] == [
        "start", "start-step", "tool-input-start", "tool-input-available", "tool-approval-request", "finish-step", "finish",
    ]
    assert chunks[4] == {
        "type": "tool-approval-request", "approvalId": "adk-1", "toolCallId": "c-pay",
        "approvalDescriptor": {"hint": "Money leaves the account."},
    }
    assert chunks[-1]["finishReason"] == "tool-calls"
    # Waiting in ADK's session, counted as a native confirmation; no bypass alarm.
    kinds = [type(o).__name__ for o in shell.observed]
    assert "Bypassed" not in kinds
    [asked] = [o for o in shell.observed if isinstance(o, NativeAsked)]
    assert asked.confirmation.tool == "process_payment" and asked.confirmation.approval_id == "adk-1"
    shell.check_rules()


def test_a_native_confirmation_of_an_expected_call_ends_the_expectation() -> None:
    ledger = Ledger()
    ledger.expect("c1")
    ledger.expect("c2", confirmed_by_adk=True)
    assert ledger.expected("c1") and ledger.expected("c2")
    ledger.ask(NativeConfirmation("adk-1", "c1", "process_payment"))
    ledger.ask(NativeConfirmation("adk-2", "c2", "process_payment"))
    assert not ledger.expected("c1") and not ledger.expected("c2")


def _response_event(call_id: str, response: dict[str, Any]) -> dict[str, Any]:
    part = {"functionResponse": {"id": call_id, "name": "process_payment", "response": response}}
    return {"author": "a", "content": {"role": "user", "parts": [part]}}


def test_a_payment_that_ran_with_no_confirmation_asked_raises_the_bypass_alarm() -> None:
    # The plugin is not installed (or not loaded): ADK ran the tool unasked. The alarm must not
    # depend on which way the gateway expected the call to be asked about.
    turn = confirming_turn(config())
    shell = Shell(turn)
    shell.apply(turn.begin())
    shell.apply(turn.feed([_call_event(("c-pay", "process_payment")), _response_event("c-pay", {"success": True})], 0.0))
    assert [o.tool for o in shell.observed if type(o).__name__ == "Bypassed"] == ["process_payment"]


def test_a_refusal_by_the_plugin_of_a_call_adk_was_to_confirm_is_no_bypass() -> None:
    turn = confirming_turn(config())
    shell = Shell(turn)
    shell.apply(turn.begin())
    refusal = {"error": "not run", "adk_gateway_refusal": "confirm_unsupported"}
    shell.apply(turn.feed([_call_event(("c-pay", "process_payment")), _response_event("c-pay", refusal)], 0.0))
    assert not [o for o in shell.observed if type(o).__name__ == "Bypassed"]
    assert shell.current.chunks[-1] == {"type": "tool-output-error", "toolCallId": "c-pay", "errorText": "not run"}


def test_a_blocking_plugin_may_still_open_a_call_adk_was_to_confirm() -> None:
    # A plugin from before confirm mode blocks instead: its gate is shown and decided as in hold mode.
    cfg = config()
    turn = confirming_turn(cfg)
    shell = Shell(turn)
    shell.apply(turn.begin())
    shell.apply(turn.feed([_call_event(("c-pay", "process_payment"))], 0.0))
    gate = turn.ledger.add(_gate("process_payment", "c-pay", cfg))
    shell.apply(turn.show_gate(gate, 0.0))
    assert turn.state is TurnState.WAITING
    shell.apply(turn.answer([(gate, True, None)], [], 1.0))
    shell.apply(turn.feed([_response_event("c-pay", {"success": True})], 1.0))
    assert not [o for o in shell.observed if type(o).__name__ == "Bypassed"]


def test_the_recorded_native_run_reads_the_same_under_a_confirming_policy() -> None:
    # The plugin's confirmation is ADK's own: the events recorded with require_confirmation are what
    # ADK writes for it too (tests/integration/test_confirm_mode.py checks that on the real stack).
    cfg = config()
    native, confirming = Turn("m1", ledger=Ledger()), confirming_turn(cfg)
    outs = []
    for turn in (native, confirming):
        shell = Shell(turn)
        shell.apply(turn.begin())
        shell.apply(turn.feed(events("pay_hanako"), 0.0))
        shell.apply(turn.end(1.0))
        outs.append(shell.current.chunks)
    assert outs[0] == outs[1]


async def test_a_tool_whose_approvers_decide_is_asked_about_first_and_never_confirmed_by_an_older_plugin() -> None:
    """A tool with approvers of its own (no rules) must reach the gateway before ADK's confirmation:
    confirmed in the chat, the chatting user would answer for the approvers."""
    text = (
        "internal:\n  secret: s3cret\napprovers:\n  groups:\n    leads:\n      users: [lead]\n"
        "agents:\n  pay:\n    upstream: {app_name: pay_app, approvals: confirm}\n"
        "    tools:\n      wire:\n        approval: true\n        approvers: leads\n"
    )
    client = TestClient(TestServer(create_internal_app(create_app(parse_config(text, source="g.yaml", env={})))))
    await client.start_server()
    try:
        auth = {"Authorization": "Bearer s3cret"}
        new = (await (await client.get("/internal/v1/policy", params={"app_name": "pay_app", "features": "rules"}, headers=auth)).json())
        assert new["tools"]["wire"]["rules"] is True and new["tools"]["wire"]["confirm"] is True
        old = (await (await client.get("/internal/v1/policy", params={"app_name": "pay_app"}, headers=auth)).json())
        assert old["tools"]["wire"]["confirm"] is False, "an older plugin must ask, so that the gateway decides who answers"
    finally:
        await client.close()
