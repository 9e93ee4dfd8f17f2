"""Confirm mode in the demo's topology (config/gateway.yaml's policy, the gateway's plugin in ADK asking
the gateway, then ADK's own confirmation), played from the recordings of the stock ADK API server with
the plugin: a call waits in ADK's session, not in a request the plugin holds, so a late answer runs it;
a browser tool that needs an approval is not handed to the browser before it. On the recordings of every
supported ADK. Moved from tests/integration/test_plugin_gave_up.py and test_gateway_approvals.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import structlog

from tests.chatflow import assistant_from, new_chat, types, user
from tests.scenarios.recordings import Recordings
from tests.scenarios.runner import Scenario, said

pytestmark = pytest.mark.js

# The plugin's longest wait in the integration row (ADK_GATEWAY_MAX_WAIT, seconds).
MAX_WAIT = 2
WAITS = "adk_gateway_approval_wait_seconds_count"


def states_of(call_id: str) -> Callable[[dict[str, Any]], None]:
    def check(message: dict[str, Any]) -> None:
        parts = [p for p in message["parts"] if p.get("toolCallId") == call_id]
        assert [p["state"] for p in parts] == ["output-available"], parts

    return check


async def test_on_run_sse_the_plugins_longest_wait_ends_no_call(shipped: Scenario) -> None:
    """The call waits as ADK's confirmation, the plugin's request answered at once: an Approve long
    after the plugin's ADK_GATEWAY_MAX_WAIT runs the payment, and nothing was abandoned."""
    chat, first_message = new_chat(), user("pay 50 to Hanako")
    with structlog.testing.capture_logs() as logs:
        first = await shipped.post(chat, [first_message], play="confirm_pay_late")
        assert types(first)[-3:] == ["tool-approval-request", "finish-step", "finish"], types(first)
        assert first.chunks[-3]["approvalId"].startswith("adk-")
        assert shipped.clock is not None
        shipped.clock.advance(MAX_WAIT + 1)  # past the longest the plugin would hold a request
        answer = assistant_from(first, [True])
        late = await shipped.post(
            chat, [first_message, answer], messageId=answer["id"], play="confirm_pay_late_approve",
            then=states_of(first.chunks[-3]["toolCallId"]),
        )
    assert late.status == 200, late.body[:300]
    assert late.chunks[0] == {"type": "start", "messageId": answer["id"]}
    assert late.chunks[1]["type"] == "tool-output-available" and late.chunks[1]["output"]["success"] is True, late.chunks[:3]
    assert late.chunks[-1]["finishReason"] == "stop"
    assert shipped.metric(WAITS, {"tool": "process_payment", "outcome": "abandoned"}) == 0
    assert shipped.metric(WAITS, {"tool": "process_payment", "outcome": "approved"}) == 1
    assert not [line for line in logs if line.get("event") == "gated_call_abandoned"]
    assert "Hanako" in said(late.chunks)


async def test_browser_tool_with_approval_is_not_handed_over_before_approval(shipped: Scenario, recordings: Recordings) -> None:
    chat, first_message = new_chat(), user("where am I")
    first = await shipped.post(chat, [first_message], play="where_am_i")
    assert types(first) == [
        "start", "start-step", "tool-input-start", "tool-input-delta", "tool-approval-request", "finish-step", "finish",
    ]
    denied = assistant_from(first, [False])
    second = await shipped.post(chat, [first_message, denied], messageId=denied["id"], play="where_am_i_deny")
    assert "tool-input-available" not in types(second)
    assert second.chunks[1]["type"] == "tool-output-denied"
    # The denial reached ADK as the recorder's did, the browser never having had the call.
    assert shipped.adk.messages[1] == recordings.request("where_am_i_deny")["newMessage"]
