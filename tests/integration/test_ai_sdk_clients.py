"""Stock AI SDK Chats (ai 6 and ai 7) against the gateway and the real ADK API server.

The driver (tests/js/chat-driver.mjs) runs the SDK's own Chat logic, with the automatic
continuation app developers configure, and checks every chunk with that version's own schema.
"""

from __future__ import annotations

import pytest

from tests.demo_rows import SCENARIOS as DEMO_ROWS
from tests.jsdriver import assert_clean, run_chats
from tests.procs import GatewayProcess, metric_value

pytestmark = [pytest.mark.integration, pytest.mark.js]

# The rows a gateway with native ADK confirmations can serve (no gateway-gated browser tools).
SCENARIOS = {name: DEMO_ROWS[name] for name in ("hello", "weather", "approve", "deny", "two", "moved_on")}


def tool_parts(result: dict) -> list[dict]:
    return [p for m in result["messages"] for p in m["parts"] if p["type"].startswith("tool-")]


def text_of(result: dict) -> str:
    return "".join(p.get("text", "") for m in result["messages"] if m["role"] == "assistant" for p in m["parts"])


@pytest.mark.parametrize("version", [6, 7])
def test_every_scenario_with_a_stock_chat(gateway: GatewayProcess, version: int) -> None:
    before = metric_value(gateway.base, "adk_gateway_approval_wait_seconds_count", {"tool": "process_payment", "outcome": "approved"})
    names = list(SCENARIOS)
    results = dict(zip(names, run_chats(
        [{"version": version, "api": f"{gateway.base}/api/chat", "steps": SCENARIOS[n]} for n in names], timeout=40
    )))
    for name, result in results.items():
        assert_clean(result)
        assert result["status"] == "ready", name

    assert '"hello there"' in text_of(results["hello"])
    assert "Tokyo" in text_of(results["weather"])

    [paid] = tool_parts(results["approve"])
    assert paid["state"] == "output-available" and paid["output"]["success"] is True
    assert paid["approval"]["approved"] is True
    assert "Hanako" in text_of(results["approve"])
    # One assistant message for the whole approval round trip, continued in place.
    assert [m["role"] for m in results["approve"]["messages"]] == ["user", "assistant"]

    [denied] = tool_parts(results["deny"])
    assert denied["state"] == "output-denied"

    states = [p["state"] for p in tool_parts(results["two"])]
    assert states == ["output-available", "output-denied"]

    moved_on = results["moved_on"]
    assert [m["role"] for m in moved_on["messages"]] == ["user", "assistant", "user", "assistant"]
    assert '"hello there"' in text_of(moved_on)

    after = metric_value(gateway.base, "adk_gateway_approval_wait_seconds_count", {"tool": "process_payment", "outcome": "approved"})
    assert after == before + 2  # "approve" and the first of "two"
