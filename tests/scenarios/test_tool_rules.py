"""Rules on a call's arguments, in the demo's topology: config/gateway.yaml's policy, the gateway's
plugin in ADK asking the gateway before ADK's confirmation (confirm mode over `/run_sse`), played
from recordings of the stock ADK API server with the plugin (its asks and the verdicts it was
answered recorded with the runs; the replay fails if the gateway answers otherwise). Stock ai 6 and
ai 7 Chats are stood in for by the AI SDK's own parser, which assembles each response at the
module's end. A signed webhook, which needs a receiver over HTTP, stays in
tests/integration/test_tool_rules.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import structlog

from tests.chatflow import assistant_from, new_chat, user
from tests.scenarios.recordings import Recordings
from tests.scenarios.runner import Scenario

pytestmark = pytest.mark.js

DECISIONS = "adk_gateway_approval_decisions_total"


def tools(message: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in message["parts"] if p["type"].startswith("tool-")]


def said(message: dict[str, Any]) -> str:
    return "".join(p.get("text", "") for p in message["parts"])


def small_ran(version: int) -> Callable[[dict[str, Any]], None]:
    """A payment below 5 ran unasked; ai 7 shows it as the AI SDK's automatic approval, ai 6, which
    has no approval response chunk, the call and its outcome alone (tests/demo_rows.py check_rule_rows)."""

    def check(message: dict[str, Any]) -> None:
        [small] = tools(message)
        assert small["state"] == "output-available" and small["output"]["success"] is True, small
        assert "Hanako" in said(message)
        if version >= 7:
            assert small["approval"] == {"id": small["approval"]["id"], "isAutomatic": True, "approved": True,
                                         "descriptor": {"rule": "small"}}, small
        else:
            assert "approval" not in small, small

    return check


def large_refused(version: int) -> Callable[[dict[str, Any]], None]:
    """One of 10,000 or more was refused with the rule's reason."""

    def check(message: dict[str, Any]) -> None:
        [large] = tools(message)
        if version >= 7:
            assert large["state"] == "output-denied", large
            assert large["approval"]["isAutomatic"] is True and large["approval"]["approved"] is False
            assert large["approval"]["reason"] == "Payments of 10,000 or more are refused."
        else:
            assert large["state"] == "output-error" and "10,000 or more are refused" in large["errorText"], large

    return check


@pytest.mark.parametrize("version", [6, 7])
async def test_a_rule_approves_or_refuses_a_payment_without_asking_anyone(shipped: Scenario, version: int) -> None:
    labels = {"agent": "demo_agent", "source": "rule"}
    approved = shipped.metric(DECISIONS, {**labels, "outcome": "approved"})
    denied = shipped.metric(DECISIONS, {**labels, "outcome": "denied"})
    chats = {"small": new_chat(), "too_large": new_chat()}
    # ai 7's framing (its approval response chunk) needs the version said (docs/protocol.md 1.3).
    with structlog.testing.capture_logs() as logs:
        small = await shipped.post(chats["small"], [user("pay 2 to Hanako")], version=version, then=small_ran(version), play="rule_small")
        large = await shipped.post(chats["too_large"], [user("pay 20000 to Hanako")], version=version, then=large_refused(version), play="rule_too_large")
    for reply in (small, large):
        assert reply.status == 200 and reply.chunks[-1]["type"] == "finish", reply.chunks
    assert shipped.metric(DECISIONS, {**labels, "outcome": "approved"}) == approved + 1
    assert shipped.metric(DECISIONS, {**labels, "outcome": "denied"}) == denied + 1
    # Nobody was asked: no approval waited, none is pending.
    assert shipped.metric("adk_gateway_approvals_pending", {"agent": "demo_agent"}) == 0
    # The audit trail has both, with the rule that decided and the policy it belongs to.
    audits = {
        line["rule"]: line for line in logs
        if line.get("event") == "approval_audit" and line.get("source") == "rule" and line.get("chat_id") in chats.values()
    }
    assert audits.keys() == {"small", "too_large"}
    assert audits["small"]["outcome"] == "approved" and audits["too_large"]["outcome"] == "denied"
    assert audits["too_large"]["reason"] == "Payments of 10,000 or more are refused."
    assert audits["small"]["args_digest"].startswith("hmac-sha256:") and "args" not in audits["small"]
    assert audits["small"]["agent"] == "demo_agent" and audits["small"]["app_name"] == "demo_agent"
    assert audits["small"]["policy_version"]


async def test_a_person_s_answer_is_audited_with_its_source(shipped: Scenario, recordings: Recordings) -> None:
    chat, first_message = new_chat(), user("pay 50 to Hanako")
    with structlog.testing.capture_logs() as logs:
        first = await shipped.post(chat, [first_message], version=7, play="confirm_pay")
        answer = assistant_from(first, [False])
        await shipped.post(chat, [first_message, answer], version=7, messageId=answer["id"], play="confirm_pay_deny")
    [audit] = [line for line in logs if line.get("event") == "approval_audit" and line.get("chat_id") == chat]
    assert (audit["source"], audit["outcome"], audit["rule"], audit["tool"]) == ("person", "denied", None, "process_payment")
    assert audit["waited"] >= 0
    # The person's denial reached ADK as its confirmation's answer, as the recorder's did.
    assert shipped.adk.messages[1] == recordings.request("confirm_pay_deny")["newMessage"]
