"""@ag-ui/client's HttpAgent (1.0.0) against what `make run` runs: every row of the demo script over AG-UI.

The stack is `adk-gateway demo` with config/gateway.yaml (both agents in the stock ADK API server with
the gateway's plugin, the demo's rules and approvers), with the demo's ledger of real tool executions
(DEMO_TOOL_LEDGER) so that a denied or refused call is shown never to have run. The driver
(tests/js/agui-driver.mjs) is an app on the stock client: it answers interrupts with `resume`, hands
browser tools their output in tool messages, checks every event off the wire with @ag-ui/core's schema,
and the client's own pipeline (enforce, verify, apply) runs on them. Rows run concurrently in as few
Node processes as the refusals' order allows.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.demo_rows import LOCATION
from tests.jsdriver import assert_agui_clean, check_agui_streams, run_agui
from tests.procs import GatewayProcess, Ledger, make_run, metric_value, request

pytestmark = [pytest.mark.integration, pytest.mark.js]

SUPERVISOR = {"Authorization": "Bearer demo-supervisor"}  # what `adk-gateway demo` gives the supervisor
PAYMENT_HINT = "Money leaves the account when you approve."  # config/gateway.yaml's process_payment hint
PAYMENT_TIMEOUT = timedelta(minutes=5)  # and its timeout
RESPONSE_SCHEMA = {
    "type": "object",
    "properties": {"approved": {"type": "boolean"}, "reason": {"type": "string"}},
    "required": ["approved"],
    "additionalProperties": False,
}


def frontend_tool(name: str) -> dict[str, Any]:
    return {"name": name, "description": f"{name}, run by the app", "parameters": {"type": "object", "properties": {}}}


# tests/demo_rows.py's rows as an AG-UI app plays them: an unanswered approval is an interrupt, so
# moving on is answering it "cancelled" with the next message. The browser tools' rows declare them.
ROWS: dict[str, dict[str, Any]] = {
    "hello": {"steps": [{"send": "hello there"}]},
    "weather": {"steps": [{"send": "weather in Tokyo"}]},
    "approve": {"steps": [{"send": "pay 50 to Hanako", "approvals": "approve"}]},
    "deny": {"steps": [{"send": "pay 60 to Hanako", "approvals": "deny"}]},
    "two": {"steps": [{"send": "pay 10 to Alice and 20 to Bob", "approvals": ["approve", "deny"]}]},
    "location": {"tools": [frontend_tool("get_location")],
                 "steps": [{"send": "where am I", "approvals": "approve", "toolOutputs": {"get_location": LOCATION}}]},
    "location_denied": {"tools": [frontend_tool("get_location")],
                        "steps": [{"send": "where am I", "approvals": "deny", "toolOutputs": {"get_location": LOCATION}}]},
    "bgm": {"tools": [frontend_tool("change_bgm")],
            "steps": [{"send": "play track 2", "toolOutputs": {"change_bgm": {"playing": 2}}}]},
    # And the thread goes on: the cancelled call, left without a result, does not stand in the next one's way.
    "moved_on": {"steps": [{"send": "pay 70 to Hanako"}, {"send": "hello there", "cancelInterrupts": True},
                           {"send": "pay 80 to Bob", "approvals": "approve"}]},
    "multi_turn": {"steps": [{"send": "hello there"}, {"send": "weather in Tokyo"}]},
    # The demo's rules on process_payment: decided by the gateway, nobody asked.
    "small": {"steps": [{"send": "pay 2 to Hanako"}]},
    "too_large": {"steps": [{"send": "pay 20000 to Hanako"}]},
    "error": {"steps": [{"send": "trigger error"}]},
    # Above 100, support_agent's refunds wait for the supervisors (four-eyes): the test decides it.
    # Then the thread goes on, the activity in the client's messages.
    "refund": {"agent": "/agents/support_agent/ag-ui",
               "steps": [{"send": "refund 250 on order 1234"}, {"send": "where is order 1234"}]},
}


@dataclass
class Demo:
    gateway: GatewayProcess
    ledger: Ledger

    @property
    def base(self) -> str:
        return self.gateway.base

    def executions(self, result: dict) -> list[dict]:
        """The real tool executions of a run's thread (its ADK session)."""
        return [run for run in self.ledger.runs() if run["session_id"] == result["threadId"]]

    def runs_total(self, outcome: str) -> float:
        return metric_value(self.base, "adk_gateway_browser_runs_total", {"protocol": "ag_ui", "outcome": outcome})


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    tmp = tmp_path_factory.mktemp("agui")
    ledger = Ledger(tmp / "ledger.jsonl")
    with make_run(tmp, {"DEMO_TOOL_LEDGER": str(ledger.path)}) as gateway:
        yield Demo(gateway, ledger)


# ---- reading a report --------------------------------------------------------------------------


def said(result: dict) -> str:
    return "".join(m["content"] for m in result["messages"] if m["role"] == "assistant" and isinstance(m.get("content"), str))


def calls(result: dict) -> dict[str, str]:
    """toolCallId -> tool name, of every call the agent's messages hold."""
    return {c["id"]: c["function"]["name"] for m in result["messages"] if m["role"] == "assistant" for c in m.get("toolCalls") or []}


def results(result: dict) -> list[tuple[str, Any]]:
    """(tool name, parsed content) of each tool message, in order (the driver's own answers included)."""
    names = calls(result)
    return [(names[m["toolCallId"]], json.loads(m["content"])) for m in result["messages"] if m["role"] == "tool"]


def outcomes(result: dict) -> list[str | None]:
    return [o["outcome"] for o in result["outcomes"]]


def events(result: dict, kind: str) -> list[dict]:
    return [e for e in result["events"] if e["type"] == kind]


def check_interrupt(interrupt: dict, result: dict, tool: str, message: str, timeout: timedelta) -> None:
    """An interrupt is bound to its call, says what the tool's hint says, and expires when the tool's approval does."""
    approval_id = interrupt["metadata"]["approvalId"]
    assert interrupt["id"] == f"{approval_id}:{interrupt['toolCallId']}", interrupt
    assert calls(result)[interrupt["toolCallId"]] == tool, interrupt
    assert interrupt["reason"] == "tool_approval" and interrupt["metadata"]["tool"] == tool, interrupt
    assert interrupt["message"] == message, interrupt
    assert interrupt["responseSchema"] == RESPONSE_SCHEMA, interrupt
    expires = datetime.fromisoformat(interrupt["expiresAt"].replace("Z", "+00:00"))
    now = datetime.now(UTC)
    assert now < expires <= now + timeout, interrupt["expiresAt"]


def wait_for_metric(read: Any, at_least: float, timeout: float = 5) -> float:
    """The counter once it reaches `at_least` (it moves as each response's handler returns, just after the client read its end)."""
    deadline = time.monotonic() + timeout
    value = read()
    while value < at_least and time.monotonic() < deadline:
        time.sleep(0.05)
        value = read()
    return value


def approve_refund_when_listed(demo: Demo, decided: list[dict], stop: threading.Event) -> None:
    """The supervisor's part: the refund shows in their inbox (GET /api/approvals), and they approve it."""
    while not stop.is_set():
        pending = request(demo.base, "GET", "/api/approvals?state=pending&agent=support_agent", headers=SUPERVISOR).json()
        for approval in pending["approvals"]:
            reply = request(demo.base, "POST", f"/api/approvals/{approval['id']}", {"approved": True}, headers=SUPERVISOR)
            decided.append({"status": reply.status, **reply.json()})
            return
        stop.wait(0.2)


# ---- the demo's rows ---------------------------------------------------------------------------


def test_every_demo_row_through_the_stock_http_agent(demo: Demo) -> None:
    before = {outcome: demo.runs_total(outcome) for outcome in ("success", "interrupt", "error")}
    names = list(ROWS)
    decided: list[dict] = []
    stop = threading.Event()
    supervisor = threading.Thread(target=approve_refund_when_listed, args=(demo, decided, stop), daemon=True)
    supervisor.start()
    try:
        reports = run_agui([{"url": demo.base, **ROWS[name]} for name in names], timeout=40)
    finally:
        stop.set()
        supervisor.join(timeout=10)
    rows = dict(zip(names, reports))
    for name, result in rows.items():
        if name != "error":
            assert_agui_clean(result)
        assert all(o["interrupts"] == [] for o in result["outcomes"] if o["outcome"] != "interrupt"), name

    check_plain_rows(rows)
    check_approval_rows(demo, rows)
    check_browser_tool_rows(rows)
    check_rule_rows(demo, rows)
    check_error_row(rows["error"])
    check_refund_row(demo, rows["refund"], decided)

    # Nothing failed inside the gateway on the way (the agent's own failure is the error row's answer, not a crash).
    crashes = [line for line in demo.gateway.log_lines() if line.get("level") in ("error", "critical")]
    assert not crashes, crashes[:3]

    # Every run counted under its outcome, the protocol ag_ui.
    expected = {outcome: sum(outcomes(r).count(outcome) for r in reports) for outcome in before}
    for outcome, count in expected.items():
        moved = wait_for_metric(lambda o=outcome: demo.runs_total(o), before[outcome] + count) - before[outcome]
        assert moved == count, (outcome, moved, count)


def check_plain_rows(rows: dict[str, dict]) -> None:
    assert '"hello there"' in said(rows["hello"]) and outcomes(rows["hello"]) == ["success"]
    [(tool, weather)] = results(rows["weather"])
    assert tool == "get_weather" and weather["city"] == "Tokyo", weather
    assert "The weather in Tokyo is" in said(rows["weather"])
    multi = rows["multi_turn"]
    assert [m["role"] for m in multi["messages"]] == ["user", "assistant", "user", "assistant", "tool", "assistant"]
    assert '"hello there"' in said(multi) and "Tokyo" in said(multi) and outcomes(multi) == ["success", "success"]


def check_approval_rows(demo: Demo, rows: dict[str, dict]) -> None:
    approve, deny, two, moved_on = rows["approve"], rows["deny"], rows["two"], rows["moved_on"]
    for result in (approve, deny, two):
        assert outcomes(result) == ["interrupt", "success"], outcomes(result)
        for interrupt in result["outcomes"][0]["interrupts"]:
            check_interrupt(interrupt, result, "process_payment", PAYMENT_HINT, PAYMENT_TIMEOUT)

    [(tool, paid)] = results(approve)
    assert tool == "process_payment" and paid["success"] is True and paid["recipient"] == "Hanako", paid
    assert "Done: sent 50 USD to Hanako" in said(approve)
    assert [run["args"]["amount"] for run in demo.executions(approve)] == [50]

    assert results(deny) == [("process_payment", {"denied": True})]
    assert "The payment of 60 USD to Hanako was not made" in said(deny)
    assert demo.executions(deny) == [], "a payment the person denied ran"

    assert len(two["outcomes"][0]["interrupts"]) == 2
    assert [(tool, out.get("success", out)) for tool, out in results(two)] == [
        ("process_payment", True), ("process_payment", {"denied": True}),
    ]
    assert [run["args"]["recipient"] for run in demo.executions(two)] == ["Alice"]

    # Moving on: the open interrupt answered "cancelled" with the next message, which the agent answers.
    assert outcomes(moved_on) == ["interrupt", "success", "interrupt", "success"], outcomes(moved_on)
    assert moved_on["runs"][1]["input"]["resume"] == [
        {"interruptId": moved_on["outcomes"][0]["interrupts"][0]["id"], "status": "cancelled"}
    ]
    roles = [m["role"] for m in moved_on["messages"]]
    assert roles == ["user", "assistant", "tool", "user", "assistant", "user", "assistant", "tool", "assistant"], roles
    # The call moved on from gets its end in the next run, as the AI SDK's part shows it denied.
    assert moved_on["messages"][2]["content"] == '{"denied":true}'
    assert moved_on["messages"][2]["toolCallId"] == moved_on["messages"][1]["toolCalls"][0]["id"]
    assert moved_on["messages"][4]["content"].startswith('You said: "hello there"')
    assert "Done: sent 80 USD to Bob" in said(moved_on)
    assert [run["args"]["amount"] for run in demo.executions(moved_on)] == [80], "a payment the person moved on from ran"


def check_browser_tool_rows(rows: dict[str, dict]) -> None:
    location, denied, bgm = rows["location"], rows["location_denied"], rows["bgm"]
    # Approved first (an interrupt), then handed to the app (pendingToolCallIds), then answered.
    assert outcomes(location) == ["interrupt", "success", "success"], outcomes(location)
    [interrupt] = location["outcomes"][0]["interrupts"]
    check_interrupt(interrupt, location, "get_location", "Approve the call to get_location?", timedelta(minutes=2))
    assert location["outcomes"][1]["pendingToolCallIds"] == [interrupt["toolCallId"]]
    assert location["handed"] == [{"toolCallId": interrupt["toolCallId"], "toolName": "get_location"}]
    assert results(location) == [("get_location", LOCATION)]
    assert "35.6812" in said(location)

    assert outcomes(denied) == ["interrupt", "success"]
    assert all(not o["pendingToolCallIds"] for o in denied["outcomes"]), "a denied browser tool was handed over"
    assert denied["handed"] == [], "the app ran a tool the person denied"
    assert results(denied) == [("get_location", {"denied": True})]

    # No approval: handed over at once.
    assert outcomes(bgm) == ["success", "success"]
    [call_id] = bgm["outcomes"][0]["pendingToolCallIds"]
    assert calls(bgm)[call_id] == "change_bgm" and bgm["handed"] == [{"toolCallId": call_id, "toolName": "change_bgm"}]
    assert "track 2" in said(bgm)


def check_rule_rows(demo: Demo, rows: dict[str, dict]) -> None:
    small, large = rows["small"], rows["too_large"]
    for result in (small, large):
        assert outcomes(result) == ["success"], outcomes(result)
    [ran] = events(small, "CUSTOM")
    assert ran["name"] == "adk_gateway.approval" and ran["value"]["approved"] is True, ran
    [paid] = [m for m in small["messages"] if m["role"] == "tool"]
    assert ran["value"]["rule"] == "small" and ran["value"]["toolCallId"] == paid["toolCallId"], ran
    assert results(small)[0][1]["success"] is True and "Hanako" in said(small)
    assert [run["args"]["amount"] for run in demo.executions(small)] == [2]
    [refused] = events(large, "CUSTOM")
    assert refused["value"] == {"approvalId": refused["value"]["approvalId"], "approved": False, "rule": "too_large",
                                "toolCallId": refused["value"]["toolCallId"],
                                "reason": "Payments of 10,000 or more are refused."}, refused
    assert results(large) == [("process_payment", {"denied": True})]
    assert demo.executions(large) == [], "a payment the rule refused ran"


def check_error_row(result: dict) -> None:
    """The agent's failure is the run's RUN_ERROR, said as the AI SDK routes say it; the stream is still valid."""
    assert not result["schemaErrors"] and not result["pipelineErrors"] and not result["timedOut"]
    assert result["runErrors"] == [
        {"message": "DEMO_ERROR: The demo model was asked to fail (trigger error).", "code": "agent_error"}
    ]
    assert [e["type"] for e in result["events"]] == ["RUN_STARTED", "RUN_ERROR"]


def check_refund_row(demo: Demo, result: dict, decided: list[dict]) -> None:
    """No interrupt (the customer cannot answer it): an activity while the run stays open, then the refund."""
    assert [d["status"] for d in decided] == [200] and decided[0]["state"] == "decided", decided
    assert decided[0]["chat_id"] == result["threadId"]
    assert outcomes(result) == ["success", "success"]
    states = [a["content"]["state"] for a in result["activities"]]
    assert states == ["waiting", "decided"], result["activities"]
    waiting = result["activities"][0]
    assert waiting["activityType"] == "adk_gateway.approval"
    assert waiting["content"]["rule"] == "large_refund" and waiting["content"]["approvers"] == "supervisors"
    assert waiting["content"]["approvalId"] == decided[0]["id"]
    [(tool, refund), (looked_up, order)] = results(result)
    assert tool == "issue_refund" and refund["success"] is True and refund["amount"] == 250, refund
    assert looked_up == "lookup_order" and order["order_id"] == "1234", order
    assert "Refunded 250 USD on order 1234" in said(result)
    assert "activity" in [m["role"] for m in result["messages"]]
    assert [run["tool"] for run in demo.executions(result)] == ["issue_refund"]


# ---- refusals ----------------------------------------------------------------------------------


def post_run(demo: Demo, body: bytes | dict) -> Any:
    return request(demo.base, "POST", "/ag-ui", body, headers={"Accept": "text/event-stream"})


def test_refusals_are_run_errors_and_a_payment_runs_once(demo: Demo) -> None:
    refused_before = demo.runs_total("refused")
    twice, held, rocket = run_agui([
        # A client that sends its answer again, after the call ran.
        {"url": demo.base, "steps": [{"send": "pay 30 to Hanako", "approvals": "approve"}, {"resendResume": True}]},
        # An approval left open, for another thread to try to answer.
        {"url": demo.base, "steps": [{"send": "pay 40 to Hanako"}]},
        # A frontend tool the agent does not hand to the browser.
        {"url": demo.base, "tools": [frontend_tool("launch_rocket")], "steps": [{"send": "hello there"}]},
    ], timeout=30)

    assert outcomes(twice) == ["interrupt", "success", "error"]
    assert twice["runErrors"] == [
        {"message": "this approval was already answered; send a new message to go on", "code": "approval_gone"}
    ]
    assert [run["args"]["amount"] for run in demo.executions(twice)] == [30], "the payment ran more or less than once"

    assert rocket["runErrors"][0]["code"] == "unknown_tools" and "launch_rocket" in rocket["runErrors"][0]["message"]
    assert outcomes(rocket) == ["error"] and rocket["events"][0]["type"] == "RUN_STARTED"

    # Another thread names the held interrupt (and its call, as a client forging it would).
    assert outcomes(held) == ["interrupt"]
    [interrupt] = held["outcomes"][0]["interrupts"]
    forged = [m for m in held["messages"] if m["role"] in ("user", "assistant")]
    [other] = run_agui([{"url": demo.base, "messages": forged, "steps": [
        {"resume": [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": True}}]},
    ]}], timeout=30)
    assert other["threadId"] != held["threadId"]
    assert outcomes(other) == ["error"] and other["runErrors"][0]["code"] in ("forbidden", "approval_gone"), other["runErrors"]
    assert demo.executions(held) == [] and demo.executions(other) == [], "another thread's answer ran the payment"

    for result in (twice, rocket, other):
        assert not result["schemaErrors"] and not result["pipelineErrors"], result["schemaErrors"] or result["pipelineErrors"]
    moved = wait_for_metric(lambda: demo.runs_total("refused"), refused_before + 3) - refused_before
    assert moved == 3, moved


def test_unreadable_input_is_a_400_with_a_json_body(demo: Demo) -> None:
    for body, where in [
        (b"{not json", "body is not valid JSON"),
        ({"threadId": "t 1", "runId": "r", "messages": [{"id": "u", "role": "user", "content": "hi"}]}, "threadId"),
        ({"threadId": "t1", "runId": "r", "messages": []}, "messages"),
        ({"threadId": "t1", "runId": "r", "messages": [{"id": "u", "role": "user", "content": "hi"}],
          "resume": [{"interruptId": "nope", "status": "resolved", "payload": {"approved": True}}]}, "resume[0].interruptId"),
    ]:
        reply = post_run(demo, body)
        assert reply.status == 400, (body, reply.status, reply.body[:300])
        assert reply.headers["content-type"].startswith("application/json")
        error = reply.json()["error"]
        assert error["code"] == "invalid_request" and where in error["message"], error
    # And a refusal's stream is valid AG-UI for the protocol's own checker too.
    reply = post_run(demo, {"threadId": "agui-refused", "runId": "r1", "tools": [frontend_tool("launch_rocket")],
                            "messages": [{"id": "u", "role": "user", "content": "hi"}]})
    assert reply.status == 200 and reply.headers["content-type"] == "text/event-stream"
    [checked] = check_agui_streams([reply.chunks])
    assert checked["schemaErrors"] == [] and checked["verifyError"] is None, checked
    assert checked["runErrorEvent"] and "launch_rocket" in checked["runErrorEvent"]
