"""The demo script (DESIGN.md section 4) as stock-Chat scenarios, and what each must end with.

Shared by the SSE, WebSocket and live-mode suites, so every transport is held to the same rows.
"""

from __future__ import annotations

from tests.jsdriver import assert_clean

LOCATION = {"latitude": 35.6812, "longitude": 139.7671}

SCENARIOS = {
    "hello": [{"send": "hello there"}],
    "weather": [{"send": "weather in Tokyo"}],
    "approve": [{"send": "pay 50 to Hanako", "approvals": "approve"}],
    "deny": [{"send": "pay 50 to Hanako", "approvals": "deny"}],
    "two": [{"send": "pay 10 to Alice and 20 to Bob", "approvals": ["approve", "deny"]}],
    "location": [{"send": "where am I", "approvals": "approve", "toolOutputs": {"get_location": LOCATION}}],
    "bgm": [{"send": "play track 2", "toolOutputs": {"change_bgm": {"playing": 2}}}],
    "location_denied": [{"send": "where am I", "approvals": "deny", "toolOutputs": {"get_location": LOCATION}}],
    "moved_on": [{"send": "pay 50 to Hanako"}, {"send": "hello there"}],
    "multi_turn": [{"send": "hello there"}, {"send": "weather in Tokyo"}],
}


# The demo's rules on process_payment (config/gateway.yaml): decided by the gateway, nobody asked.
RULE_SCENARIOS = {
    "small": [{"send": "pay 2 to Hanako"}],
    "too_large": [{"send": "pay 20000 to Hanako"}],
}


def check_rule_rows(results: dict[str, dict], version: int) -> None:
    """A payment below 5 ran unasked; one of 10,000 or more was refused with the rule's reason. ai 7
    shows each as the AI SDK's automatic approval; ai 6, which has no approval response chunk, the
    call and its outcome alone (the refusal as an error)."""
    for name, result in results.items():
        assert_clean(result)
        assert result["status"] == "ready", name
        assert result["approvalRequests"] == 0 if "approvalRequests" in result else True
    [small] = [p for m in results["small"]["messages"] for p in m["parts"] if p["type"].startswith("tool-")]
    [large] = [p for m in results["too_large"]["messages"] for p in m["parts"] if p["type"].startswith("tool-")]
    assert small["state"] == "output-available" and small["output"]["success"] is True, small
    assert "Hanako" in said(results["small"])
    if version >= 7:
        assert small["approval"] == {"id": small["approval"]["id"], "isAutomatic": True, "approved": True,
                                     "descriptor": {"rule": "small"}}, small
        assert large["state"] == "output-denied", large
        assert large["approval"]["isAutomatic"] is True and large["approval"]["approved"] is False
        assert large["approval"]["reason"] == "Payments of 10,000 or more are refused."
    else:
        assert "approval" not in small, small
        assert large["state"] == "output-error" and "10,000 or more are refused" in large["errorText"], large


def tool_states(result: dict) -> list[str]:
    return [p["state"] for m in result["messages"] for p in m["parts"] if p["type"].startswith("tool-")]


def said(result: dict) -> str:
    return "".join(p.get("text", "") for m in result["messages"] if m["role"] == "assistant" for p in m["parts"])


def check_rows(results: dict[str, dict]) -> None:
    for name, result in results.items():
        assert_clean(result)
        assert result["status"] == "ready", name
    assert '"hello there"' in said(results["hello"])
    assert "Tokyo" in said(results["weather"])
    assert tool_states(results["approve"]) == ["output-available"] and "Hanako" in said(results["approve"])
    assert tool_states(results["deny"]) == ["output-denied"]
    assert sorted(tool_states(results["two"])) == ["output-available", "output-denied"]
    assert tool_states(results["location"]) == ["output-available"] and "35.6812" in said(results["location"])
    assert tool_states(results["location_denied"]) == ["output-denied"]
    assert results["location_denied"]["toolCalls"] == [], "the browser ran a tool the person denied"
    assert "track 2" in said(results["bgm"])
    assert [m["role"] for m in results["moved_on"]["messages"]] == ["user", "assistant", "user", "assistant"]
    assert [m["role"] for m in results["multi_turn"]["messages"]] == ["user", "assistant", "user", "assistant"]
