"""The plugin's wait ends without a verdict, with the stock ADK API server and the real plugin.

The plugin's long poll can end before anyone decides: its `ADK_GATEWAY_MAX_WAIT` runs out, the
replica holding the request dies, a proxy cuts it. The plugin then answers ADK itself (the tool
does not run) and the model goes on. The person's later answer must read what happened: the
plugin's error for that call, the model's whole text, a finish that matches. The plugin waits so
only on a live upstream (the held path); on `/run_sse` it asks ADK's confirmation and waits for
nobody, so its longest wait ends no call (played from recordings: tests/scenarios/test_confirm_mode.py).
Also: a plugin that cannot reach the gateway at all refuses every call, as the browser reads it
through the gateway and as ADK itself answers it, which is no policy bypass.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.chatflow import assistant_from, new_chat, post, types, user
from tests.faults.stack import demo_stack
from tests.jsdriver import check_streams
from tests.procs import PluginStack, Reply, free_port, metric_value, request

pytestmark = pytest.mark.integration

MAX_WAIT = 2  # the plugin's ADK_GATEWAY_MAX_WAIT, seconds; the tools' own timeouts are 60 s
TOOLS = """\
tools:
  process_payment: {approval: true, timeout: 60s, hint: Money leaves the account when you approve.}
  get_location: {approval: true, runs_in: browser, timeout: 60s}
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PluginStack]:
    with demo_stack(
        tmp_path_factory.mktemp("gave-up"), tools=TOOLS, adk_env={"ADK_GATEWAY_MAX_WAIT": str(MAX_WAIT)},
        upstream_mode="live",  # the plugin waits (and gives up) only on the blocking path, live's
    ) as running:
        yield running
        log = running.gateway.log_lines()
        assert not [line for line in log if line.get("level") in ("error", "critical")]


def wait_count(stack: PluginStack, tool: str, outcome: str) -> float:
    return metric_value(stack.gateway.base, "adk_gateway_approval_wait_seconds_count", {"tool": tool, "outcome": outcome})


def until_abandoned(stack: PluginStack, tool: str, before: float) -> None:
    deadline = time.monotonic() + MAX_WAIT + 10
    while wait_count(stack, tool, "abandoned") < before + 1:
        assert time.monotonic() < deadline, "the gateway never learnt that the plugin stopped waiting"
        time.sleep(0.2)


def sdk_check(first: Reply, later: list[dict[str, Any]]) -> dict[str, Any]:
    """Both responses through ai 6's and ai 7's own parser, the second onto the message the first built
    with the approval answered, as the browser's Chat holds it."""
    # Both versions in one Node call per response: each call is a Node start.
    messages = []
    for opened in check_streams([{"version": version, "chunks": first.chunks} for version in (6, 7)]):
        assert opened["schemaErrors"] == [] and opened["streamError"] is None, opened
        message = opened["message"]
        for part in message["parts"]:
            if part.get("state") == "approval-requested":
                part["state"] = "approval-responded"
                part["approval"]["approved"] = True
        messages.append(message)
    cases = [{"version": version, "chunks": later, "message": m} for version, m in zip((6, 7), messages)]
    for continued in check_streams(cases):
        assert continued["schemaErrors"] == [] and continued["streamError"] is None, continued
    return continued["message"]


@pytest.mark.parametrize(
    ("text", "tool", "says"),
    [("pay 50 to Hanako", "process_payment", "payment of 50 USD to Hanako was not made"),
     ("where am I", "get_location", "could not get your location")],
)
def test_approve_after_the_plugin_gave_up_gets_its_error_the_whole_text_and_a_matching_finish(
    stack: PluginStack, text: str, tool: str, says: str
) -> None:
    gw = stack.gateway
    before = {o: wait_count(stack, tool, o) for o in ("approved", "denied", "timeout", "cancelled", "abandoned")}
    chat, first_message = new_chat(), user(text)
    first = post(gw, chat, [first_message])
    assert types(first)[-3:] == ["tool-approval-request", "finish-step", "finish"], types(first)
    call_id = first.chunks[-3]["toolCallId"]

    until_abandoned(stack, tool, before["abandoned"])
    answer = assistant_from(first, [True])
    late = post(gw, chat, [first_message, answer], messageId=answer["id"])
    assert late.status == 200, late.body[:300]
    chunks = late.chunks
    assert types(late) == [
        "start", "tool-output-error", "start-step", "text-start",
        *["text-delta"] * types(late).count("text-delta"), "text-end", "finish-step", "finish",
    ], chunks
    assert chunks[0] == {"type": "start", "messageId": answer["id"]}
    assert chunks[1]["toolCallId"] == call_id and "ADK_GATEWAY_MAX_WAIT" in chunks[1]["errorText"], chunks[1]
    said = "".join(c["delta"] for c in chunks if c["type"] == "text-delta")
    assert says in said and said.endswith("the call was not run."), said  # the whole sentence, not its tail
    assert chunks[-1]["finishReason"] == "stop"
    assert "tool-output-available" not in types(late)  # never a run
    parts = [p for p in sdk_check(first, chunks)["parts"] if p.get("toolCallId") == call_id]
    assert [p["state"] for p in parts] == ["output-error"], parts

    # A reload replays the whole message: the response that asked (its finish kept as the message's
    # metadata, the stream ends once), then this one (issue 24, defect 11).
    resumed = request(gw.base, "GET", f"/api/chat/{chat}/stream")
    assert resumed.status == 200, resumed.body[:300]
    asked = len(first.chunks) - 1
    assert resumed.chunks[:asked] == first.chunks[:-1], resumed.chunks
    assert resumed.chunks[asked]["type"] == "message-metadata" and resumed.chunks[-len(chunks):] == chunks, resumed.chunks

    after = {o: wait_count(stack, tool, o) for o in before}
    assert after == {**before, "abandoned": before["abandoned"] + 1}, (before, after)
    assert metric_value(gw.base, "adk_gateway_policy_bypassed_total", {"tool": tool}) == 0
    assert any(
        line.get("event") == "gated_call_abandoned" and line.get("reason") == "max_wait" for line in gw.log_lines()
    )


def test_a_plugin_that_cannot_reach_the_gateway_refuses_and_that_is_no_bypass(tmp_path: Path) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    with demo_stack(tmp_path, adk_env={"ADK_GATEWAY_URL": nowhere, "ADK_GATEWAY_CONNECT_TIMEOUT": "1"}) as stack:
        gw = stack.gateway
        reply = post(gw, new_chat(), [user("pay 50 to Hanako")])
        errors = [c for c in reply.chunks if c["type"] == "tool-output-error"]
        assert len(errors) == 1 and "policy is unavailable" in errors[0]["errorText"], reply.chunks
        assert "adk_gateway_refusal" not in str(reply.chunks)
        assert reply.chunks[-1]["finishReason"] == "stop"
        assert metric_value(gw.base, "adk_gateway_policy_bypassed_total", {"tool": "process_payment"}) == 0
        assert not [line for line in gw.log_lines() if line.get("event") == "policy_bypassed"]
        check_fails_closed_in_adk(stack.adk)


def check_fails_closed_in_adk(adk: str) -> None:
    """ADK itself, asked directly (no gateway in front): the plugin that cannot reach the gateway
    answers the call with its error, and the model says the payment was not made. (Was
    tests/integration/test_gateway_approvals.py::test_plugin_fails_closed_when_the_gateway_is_down,
    which started an ADK server of its own for it.)"""
    session = "s-" + new_chat()
    created = request(adk, "POST", "/apps/demo_agent/users/u1/sessions", {"sessionId": session})
    assert created.status == 200
    run = request(adk, "POST", "/run_sse", {
        "appName": "demo_agent", "userId": "u1", "sessionId": session, "streaming": True,
        "newMessage": {"role": "user", "parts": [{"text": "pay 50 to Hanako"}]},
    })
    assert run.status == 200
    events = [json.loads(p) for p in run.payloads]
    responses = [
        part["functionResponse"] for e in events for part in (e.get("content") or {}).get("parts", [])
        if "functionResponse" in part
    ]
    assert responses and "unavailable" in responses[0]["response"]["error"]
    assert "not made" in "".join(
        part.get("text", "") for e in events if not e.get("partial") for part in (e.get("content") or {}).get("parts", [])
    )
