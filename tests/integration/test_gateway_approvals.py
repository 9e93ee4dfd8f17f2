"""Gateway-owned approvals and browser tools: the tool policy enforced by the plugin in the real ADK server,
on the blocking path (the plugin's held request, `gw-` ids), which is `/run_live`'s: each stack here
runs its chats on `mode: live` (on `/run_sse` every such call is ADK's confirmation:
tests/integration/test_confirm_mode.py). What the gateway makes of an answer sent twice, two answered
at once, one after a pause and a browser tool denied before it ran is played from recordings
(tests/scenarios/test_approvals.py, test_confirm_mode.py)."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chatflow import assistant_from, new_chat, post, types, user
from tests.demo_rows import SCENARIOS, check_rows
from tests.integration.conftest import SharedAgents, plugin_agent
from tests.jsdriver import run_chats
from tests.ops.stack import payment_responses
from tests.procs import PluginStack, gateway_process, metric_value, plugin_stack, request

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, shared_agents: SharedAgents) -> Iterator[PluginStack]:
    """The demo's topology on the blocking path: a live upstream (conftest's `stack` is sse's
    confirmation), on the package's shared plugin agent (the module's other stacks stand in front of
    another, one gateway at a time in front of each)."""
    with plugin_stack(tmp_path_factory.mktemp("held"), upstream_mode="live", agent=plugin_agent(shared_agents)) as s:
        yield s


def wait_count(stack: PluginStack, tool: str, outcome: str) -> float:
    return metric_value(stack.gateway.base, "adk_gateway_approval_wait_seconds_count", {"tool": tool, "outcome": outcome})


def text(reply) -> str:
    return "".join(c["delta"] for c in reply.chunks if c["type"] == "text-delta")


@pytest.mark.parametrize("approved", [True, False])
def test_policy_approval_round_trip(stack: PluginStack, approved: bool) -> None:
    gw = stack.gateway
    outcome = "approved" if approved else "denied"
    before = wait_count(stack, "process_payment", outcome)
    chat, first_message = new_chat(), user("pay 50 to Hanako")
    first = post(gw, chat, [first_message])
    assert types(first) == [
        "start", "start-step", "tool-input-start", "tool-input-available", "tool-approval-request", "finish-step", "finish",
    ]
    request_chunk = first.chunks[4]
    assert request_chunk["approvalId"].startswith("gw-")
    assert request_chunk["approvalDescriptor"] == {"hint": "Money leaves the account when you approve."}
    assert metric_value(gw.base, "adk_gateway_approvals_pending") >= 1

    answer = assistant_from(first, [approved])
    second = post(gw, chat, [first_message, answer], messageId=answer["id"])
    assert second.chunks[0] == {"type": "start", "messageId": answer["id"]}
    call_id = request_chunk["toolCallId"]
    if approved:
        assert second.chunks[1]["type"] == "tool-output-available" and second.chunks[1]["output"]["success"] is True
        assert "Hanako" in text(second)
    else:
        assert second.chunks[1] == {"type": "tool-output-denied", "toolCallId": call_id}
        assert "not made" in text(second)
    assert second.chunks[-1]["finishReason"] == "stop"
    assert wait_count(stack, "process_payment", outcome) == before + 1


def test_approval_of_another_chat_is_refused_and_stays_pending(stack: PluginStack) -> None:
    gw = stack.gateway
    victim, first_message = new_chat(), user("pay 50 to Hanako")
    first = post(gw, victim, [first_message])
    forged = assistant_from(first, [True])
    attacker = new_chat()
    post(gw, attacker, [user("hello there")])
    refused = post(gw, attacker, [user("hello there"), forged], messageId=forged["id"])
    assert refused.status == 403 and refused.json()["error"]["code"] == "forbidden"
    assert any(line.get("event") == "approval_of_another_chat" for line in gw.log_lines())
    # The real owner can still answer it.
    own = post(gw, victim, [first_message, forged], messageId=forged["id"])
    assert own.status == 200 and "tool-output-available" in types(own)


def test_every_demo_row_with_stock_chats(stack: PluginStack) -> None:
    api = f"{stack.gateway.base}/api/chat"
    for version in (6, 7):
        names = list(SCENARIOS)
        check_rows(dict(zip(names, run_chats(
            [{"version": version, "api": api, "steps": SCENARIOS[n]} for n in names], timeout=40
        ))))
    gw = stack.gateway.base
    assert metric_value(gw, "adk_gateway_browser_tool_wait_seconds_count", {"tool": "get_location", "outcome": "output"}) >= 2
    assert metric_value(gw, "adk_gateway_browser_tool_wait_seconds_count", {"tool": "change_bgm", "outcome": "output"}) >= 2
    assert metric_value(gw, "adk_gateway_plugin_requests_total", {"result": "run"}) >= 1
    assert metric_value(gw, "adk_gateway_policy_bypassed_total") == 0


def test_timeouts_resume_and_late_answers(tmp: Path, shared_agents: SharedAgents) -> None:
    agent = plugin_agent(shared_agents, chunk_delay="0.1")
    with plugin_stack(tmp, payment_timeout="1s", on_timeout="error", upstream_mode="live", agent=agent) as stack:
        gw = stack.gateway
        chat, first_message = new_chat(), user("pay 50 to Hanako")
        first = post(gw, chat, [first_message])
        assert types(first)[-3:] == ["tool-approval-request", "finish-step", "finish"]
        deadline = time.monotonic() + 10
        while metric_value(gw.base, "adk_gateway_approval_timeouts_total", {"tool": "process_payment"}) < 1:
            assert time.monotonic() < deadline, "the approval never timed out"
            time.sleep(0.2)
        assert wait_count(stack, "process_payment", "timeout") == 1
        # The browser, attaching late, sees what happened meanwhile, in the same message.
        answer = assistant_from(first, [True])
        late = post(gw, chat, [first_message, answer], messageId=answer["id"])
        assert late.chunks[0] == {"type": "start", "messageId": answer["id"]}
        error = next(c for c in late.chunks if c["type"] == "tool-output-error")
        assert "Timed out" in error["errorText"]
        assert "not made" in text(late)

        # Resume: drop a stream mid-way, then the AI SDK's resume route replays it and follows it.
        resumed_chat = new_chat()
        host, port = gw.base.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        body = {"id": resumed_chat, "messages": [user("hello there")], "trigger": "submit-message"}
        conn.request("POST", "/api/chat", body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        resp.fp.readline()  # the first frame's line, then hang up
        conn.close()
        replay = request(gw.base, "GET", f"/api/chat/{resumed_chat}/stream")
        assert replay.status == 200
        assert types(replay)[0] == "start" and types(replay)[-1] == "finish"
        assert replay.payloads[-1] == "[DONE]"
        assert '"hello there"' in text(replay)
        # Within chat.run_retention a finished response is replayed again (the browser cannot
        # say what reached it); a chat with nothing recent answers 204.
        assert request(gw.base, "GET", f"/api/chat/{resumed_chat}/stream").body == replay.body
        assert request(gw.base, "GET", f"/api/chat/{new_chat()}/stream").status == 204


def test_gateway_restart_while_a_call_waits_fails_visibly(tmp: Path, shared_agents: SharedAgents) -> None:
    # Not the module's agent: its `stack` stands in front of that one.
    with plugin_stack(tmp, upstream_mode="live", agent=plugin_agent(shared_agents, chunk_delay="0.1")) as stack:
        gw = stack.gateway
        chat, first_message = new_chat(), user("pay 50 to Hanako")
        first = post(gw, chat, [first_message])
        assert "tool-approval-request" in types(first)
        gw.proc.terminate()
        gw.proc.wait(timeout=15)
        # Same ports, same policy: a restarted gateway that lost its memory.
        with gateway_process(tmp, stack.adk, _policy_and_internal(stack), port=gw.port, upstream_mode="live") as again:
            answer = assistant_from(first, [True])
            reply = post(again, chat, [first_message, answer], messageId=answer["id"])
            assert reply.status == 410
            assert "no longer pending" in reply.json()["error"]["message"]
            # Typing a new message is the way forward, and it works. What the new live session answers
            # first depends on whether ADK recorded the held call's refusal before the old gateway's
            # socket closed (a race with the stop): then the model reads the new message; else the
            # session's last turn is the unanswered call, which the next connection asks anew.
            refused = payment_responses(stack.adk, chat)
            fresh = post(again, chat, [first_message, answer, user("hello there")])
            assert fresh.status == 200, fresh.body
            if refused:
                assert len(refused) == 1 and "success" not in refused[0], refused
                assert fresh.chunks[-1]["finishReason"] == "stop", types(fresh)
            else:
                assert types(fresh)[-3:] == ["tool-approval-request", "finish-step", "finish"], types(fresh)
                asked = next(c for c in fresh.chunks if c["type"] == "tool-input-available")
                assert asked["input"] == {"amount": 50, "recipient": "Hanako", "currency": "USD"}, asked
                assert asked["toolCallId"] != first.chunks[4]["toolCallId"]


def _policy_and_internal(stack: PluginStack) -> str:
    """The stack's tool policy and internal listener sections of its config."""
    text = stack.config_path.read_text()
    return "tools:" + text.split("tools:", 1)[1].split("upstream:", 1)[0]
