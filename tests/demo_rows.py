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
