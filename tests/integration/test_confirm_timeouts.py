"""Confirm mode's timeouts on the real stack: a deadline the gateway answers to ADK itself.

With `upstream.approvals: confirm` a gated call waits in ADK's session; its tool's `timeout` is a
deadline the gateway keeps (the process with the memory backend, Redis with several replicas) and
answers when it passes: `on_timeout: deny` as ADK's rejection, `error` as a rejection carrying the
gateway's error. Shown with the stock ADK API server and the plugin, on the newest ADK and the
oldest supported one, with the ledger of real executions (the demo's DEMO_TOOL_LEDGER):

- each timeout answered exactly once in ADK's session, the payment never made; the person's later
  Approve (deny) reading the outcome and the model's words, a reload (both) replaying the whole
  message, through ai 6's and ai 7's own parsers, and an Approve after that answered 410;
- an Approve after a kill -9 of the gateway and a restart past the deadline (nobody answered it):
  the timeout's answer goes to ADK instead, the payment is not made;
- two replicas on a real redis-server: the deadline of a chat whose owner was killed is answered
  by the survivor, exactly once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.chatflow import assistant_from, new_chat, post, types, user
from tests.integration.test_confirm_mode import _plugin_env, adk, agent, confirm_stack  # noqa: F401 - fixtures
from tests.integration.test_plugin_gave_up import sdk_check
from tests.jsdriver import check_streams
from tests.ops.stack import adk_events, replicas
from tests.procs import (
    AdkServer, Agent, GatewayProcess, Ledger, Reply, gateway_process, metric_value, request, resp_command,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

TIMEOUT = 2.0  # the payment's policy timeout, seconds
TIMED_OUT = "Timed out waiting for approval; the call was not run."


def stack(tmp: Path, agent: Agent, on_timeout: str) -> Iterator[tuple[AdkServer, GatewayProcess, str]]:
    return confirm_stack(tmp, agent, payment_timeout=f"{TIMEOUT}s", on_timeout=on_timeout)


def paid(ledger: Ledger, chat: str) -> int:
    return sum(1 for run in ledger.runs() if run["session_id"] == chat)


def ask_to_pay(gw: GatewayProcess) -> tuple[str, dict[str, Any], Reply, str, str]:
    chat, first_message = new_chat(), user("pay 50 to Hanako")
    first = post(gw, chat, [first_message])
    assert types(first)[-3:] == ["tool-approval-request", "finish-step", "finish"], first.body[-2000:]
    request_chunk = first.chunks[-3]
    assert request_chunk["approvalId"].startswith("adk-")
    return chat, first_message, first, request_chunk["approvalId"], request_chunk["toolCallId"]


def confirmation_answers(adk_base: str, chat: str, approval_id: str) -> list[dict[str, Any]]:
    """Every answer ADK's session holds to the confirmation."""
    out = []
    for event in adk_events(adk_base, chat):
        for part in (event.get("content") or {}).get("parts") or []:
            response = part.get("functionResponse") or part.get("function_response")
            if response and response.get("name") == "adk_request_confirmation" and response.get("id") == approval_id:
                out.append(response["response"])
    return out


def until(what: str, check: Any, timeout: float = 20.0) -> Any:
    end = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.2)


def sdk_message(first: Reply, later: list[dict[str, Any]], call_id: str) -> list[str]:
    """The call's states once the later chunks continue the first response's message, as ai 6's and
    ai 7's own parsers build it (the person answered Approve in the browser meanwhile)."""
    message = sdk_check(first, later)
    return [p["state"] for p in message["parts"] if p.get("toolCallId") == call_id]


def expected_outcome(on_timeout: str, call_id: str) -> tuple[dict[str, Any], str]:
    if on_timeout == "deny":
        return {"type": "tool-output-denied", "toolCallId": call_id}, "output-denied"
    return {"type": "tool-output-error", "toolCallId": call_id, "errorText": TIMED_OUT}, "output-error"


@pytest.mark.parametrize("on_timeout", ["deny", "error"])
def test_a_timeout_is_answered_to_adk_once_and_the_late_approve_reads_it(
    adk: tuple[str, Path | None], agent: Agent, tmp_path: Path, on_timeout: str,  # noqa: F811 - the fixtures
) -> None:
    ledger = agent.ledger
    with stack(tmp_path, agent, on_timeout) as (server, gw, _extra):
        chat, first_message, first, approval_id, call_id = ask_to_pay(gw)
        assert confirmation_answers(server.base, chat, approval_id) == []
        until("the gateway's timeout", lambda: metric_value(gw.base, "adk_gateway_approval_timeouts_total") == 1)
        answers = until("ADK's record of the answer", lambda: confirmation_answers(server.base, chat, approval_id))
        payload = {"payload": {"adk_gateway": {"error": TIMED_OUT}}} if on_timeout == "error" else {}
        assert answers == [{"confirmed": False, **payload}]
        assert metric_value(
            gw.base, "adk_gateway_approval_wait_seconds_count", {"tool": "process_payment", "outcome": "timeout"},
        ) == 1
        assert metric_value(gw.base, "adk_gateway_approvals_pending") == 0

        outcome, state = expected_outcome(on_timeout, call_id)
        reply = assistant_from(first, [True])
        if on_timeout == "deny":
            # The person clicks Approve after the deadline: it reads what followed the timeout.
            late = post(gw, chat, [first_message, reply], messageId=reply["id"])
            assert late.status == 200, late.body[-2000:]
            assert late.chunks[1] == outcome, late.chunks
            assert "tool-output-available" not in types(late) and late.chunks[-1]["finishReason"] == "stop"
            assert any(c["type"] == "text-delta" for c in late.chunks), late.chunks
            assert sdk_message(first, late.chunks, call_id) == [state]
        # A reload replays the whole message, the outcome last, and the SDK rebuilds it from that.
        resumed = request(gw.base, "GET", f"/api/chat/{chat}/stream")
        assert resumed.status == 200 and outcome in resumed.chunks, resumed.body[-2000:]
        assert resumed.chunks[-1]["type"] == "finish" and "tool-output-available" not in types(resumed)
        for rebuilt in check_streams([{"version": version, "chunks": resumed.chunks} for version in (6, 7)]):
            assert rebuilt["schemaErrors"] == [] and rebuilt["streamError"] is None, rebuilt
            assert [p["state"] for p in rebuilt["message"]["parts"] if p.get("toolCallId") == call_id] == [state]
        # The Approve now (after the reload read the outcome, or a replay of it): nothing pending any more.
        again = post(gw, chat, [first_message, reply], messageId=reply["id"])
        assert again.status == 410, again.body[-2000:]

        assert confirmation_answers(server.base, chat, approval_id) == answers  # once, never twice
        assert paid(ledger, chat) == 0
        assert metric_value(gw.base, "adk_gateway_approval_timeouts_total") == 1
        assert metric_value(gw.base, "adk_gateway_policy_bypassed_total") == 0
        timed_out = [line for line in gw.log_lines() if line.get("event") == "approval_timed_out"]
        assert [(line["approval_id"], line["tool"]) for line in timed_out] == [(approval_id, "process_payment")]


def test_an_approve_after_a_restart_past_the_deadline_gets_the_timeout(
    adk: tuple[str, Path | None], agent: Agent, tmp_path: Path,  # noqa: F811 - the fixtures
) -> None:
    ledger = agent.ledger
    with stack(tmp_path, agent, "deny") as (server, gw, extra):
        chat, first_message, first, approval_id, call_id = ask_to_pay(gw)
        due = time.monotonic() + TIMEOUT + 0.5  # the deadline has passed by then
        gw.proc.kill()  # kill -9 before the deadline: the memory backend's deadlines die with it
        gw.proc.wait()
        with gateway_process(tmp_path, server.base, extra, approvals="confirm", port=gw.port) as again:
            # The new gateway knows nothing of the call; its start-up counts towards the wait.
            time.sleep(max(0.0, due - time.monotonic()))
            assert confirmation_answers(server.base, chat, approval_id) == []  # nobody answered the timeout
            reply = assistant_from(first, [True])
            late = post(again, chat, [first_message, reply], messageId=reply["id"])
            assert late.status == 200, late.body[-2000:]
            assert late.chunks[0] == {"type": "start", "messageId": reply["id"]}
            assert late.chunks[1] == {"type": "tool-output-denied", "toolCallId": call_id}, late.chunks
            assert sdk_message(first, late.chunks, call_id) == ["output-denied"]
            assert confirmation_answers(server.base, chat, approval_id) == [{"confirmed": False}]
            assert paid(ledger, chat) == 0
            assert metric_value(again.base, "adk_gateway_approval_timeouts_total") == 1
            replay = post(again, chat, [first_message, reply], messageId=reply["id"])
            assert replay.status == 410, replay.body[-2000:]
            assert paid(ledger, chat) == 0


def test_with_two_replicas_the_survivor_answers_a_dead_owners_deadline_once(tmp_path: Path) -> None:
    with replicas(tmp_path, payment_timeout="3s", approvals="confirm", adk_env=_plugin_env()) as pair:
        chats = [ask_to_pay(pair.a) for _ in range(2)]
        # The owner writes a deadline to Redis once the run that asked ended, just after the
        # response did: wait for both in the queue (lost, the late-answer rule would cover it).
        until("both deadlines in Redis", lambda: resp_command(pair.redis.port, "ZCARD", "gw-test:deadlines") == 2)
        pair.a.proc.kill()  # the owner dies before the deadlines: its timer with it
        pair.a.proc.wait()
        for chat, _message, _first, approval_id, _call in chats:
            answers = until(
                "the survivor's answer", lambda: confirmation_answers(pair.adk, chat, approval_id), timeout=30,
            )
            assert answers == [{"confirmed": False}]
        time.sleep(4)  # time for a second answer, had there been one
        for chat, _message, _first, approval_id, _call in chats:
            assert confirmation_answers(pair.adk, chat, approval_id) == [{"confirmed": False}]
            assert len(pair.ledger.of(chat)) == 0
        assert metric_value(pair.b.base, "adk_gateway_approval_timeouts_total") == 2
        assert metric_value(pair.b.base, "adk_gateway_policy_bypassed_total") == 0
        # The person's Approve, on the survivor, reads the outcome.
        chat, first_message, first, _approval_id, call_id = chats[0]
        reply = assistant_from(first, [True])
        late = post(pair.b, chat, [first_message, reply], messageId=reply["id"])
        assert late.status == 200, late.body[-2000:]
        assert {"type": "tool-output-denied", "toolCallId": call_id} in late.chunks, late.chunks
        assert len(pair.ledger.of(chat)) == 0
