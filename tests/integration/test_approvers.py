"""Approvers who are not the chatting user, end to end: a stock ai 7 Chat asks for a payment a rule
hands to the supervisors, the chat's stream stays open and says so, the requester's own approval
through the API is refused (four-eyes), the supervisor approves through the approvals API, and the
chat streams the outcome. The stock ADK API server with the plugin, in confirm mode (its default)."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.chatflow import new_chat, user
from tests.integration.conftest import SharedAgents, plugin_agent
from tests.jsdriver import assert_clean, run_chats
from tests.ops.stack import Replicas, replicas
from tests.procs import DEMO_TOOLS, GatewayProcess, PluginStack, metric_value, plugin_stack, request

pytestmark = [pytest.mark.integration, pytest.mark.js]

KEY = "supervisor-key-for-tests"
LARGE = """      - name: large
        when: args.amount > 1000
        decide: ask
        approvers: supervisors
        self_approval: false
"""
APPROVERS = f"""approvers:
  api_keys:
    - id: supervisor
      key: {KEY}
  groups:
    supervisors:
      # The requester (the demo's anonymous user) is in the group too: four-eyes keeps them out.
      users: [supervisor, anonymous]
  auditors:
    users: [supervisor]
"""


def _four_eyes_tools() -> str:
    """procs.DEMO_TOOLS (the demo's rules: below 5 approved, 10,000 or more denied) with one more rule
    on process_payment: payments above 1,000 wait for the supervisors."""
    denied = "        reason: Payments of 10,000 or more are refused.\n"
    assert denied in DEMO_TOOLS
    return DEMO_TOOLS.replace(denied, denied + LARGE, 1)


@pytest.fixture(scope="module")
def four_eyes(tmp_path_factory: pytest.TempPathFactory, shared_agents: SharedAgents) -> Iterator[PluginStack]:
    agent = plugin_agent(shared_agents)
    with plugin_stack(tmp_path_factory.mktemp("four-eyes"), tools=_four_eyes_tools(), extra=APPROVERS, agent=agent) as stack:
        yield stack


def _api(stack: PluginStack | GatewayProcess, method: str, path: str, body: dict[str, Any] | None = None,
         key: str | None = KEY) -> Any:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    base = stack.base if isinstance(stack, GatewayProcess) else stack.gateway.base
    return request(base, method, path, body, headers=headers)


def _pending(stack: PluginStack | GatewayProcess, timeout: float = 20) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reply = _api(stack, "GET", "/api/approvals?state=pending")
        assert reply.status == 200, reply.body
        if approvals := reply.json()["approvals"]:
            return approvals[0]
        time.sleep(0.1)
    raise AssertionError("no approval waited for the supervisors")


def test_a_supervisor_approves_what_the_requester_may_not_and_the_chat_streams_the_outcome(four_eyes: PluginStack) -> None:
    run = {"version": 7, "api": f"{four_eyes.gateway.base}/api/chat", "headers": {"x-ai-sdk-version": "7"},
           "steps": [{"send": "pay 2000 to Hanako"}]}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        chat = pool.submit(run_chats, [run], timeout=60)
        pending = _pending(four_eyes)
        assert (pending["tool"], pending["rule"], pending["approvers"], pending["self_approval"]) == (
            "process_payment", "large", "supervisors", False)
        assert pending["args"] == {"amount": 2000, "recipient": "Hanako", "currency": "USD"}
        assert pending["requester"] == "anonymous" and "owner" not in pending
        # The requester, a member of the group, may not approve their own call (no credential: auth none).
        mine = _api(four_eyes, "POST", f"/api/approvals/{pending['id']}", {"approved": True}, key=None)
        assert mine.status == 403 and mine.json()["error"]["code"] == "self_approval", mine.body
        assert not chat.done(), "the chat's stream waits for the supervisors, open"
        decided = _api(four_eyes, "POST", f"/api/approvals/{pending['id']}", {"approved": True})
        assert decided.status == 200, decided.body
        assert (decided.json()["state"], decided.json()["outcome"], decided.json()["source"]) == ("decided", "approved", "approver")
        [result] = chat.result()
    assert_clean(result)
    parts = [p for m in result["messages"] for p in m["parts"]]
    [paid] = [p for p in parts if p["type"] == "tool-process_payment"]
    assert paid["state"] == "output-available" and paid["output"]["success"] is True
    assert paid["approval"]["approved"] is True and paid["approval"]["descriptor"] == {"rule": "large", "approvers": "supervisors"}
    [waiting] = [p for p in parts if p["type"] == "data-approval"]
    assert waiting["data"]["state"] == "decided" and waiting["data"]["by"] == ["supervisor"]
    # Once: a second answer is refused, and the payment ran once.
    again = _api(four_eyes, "POST", f"/api/approvals/{pending['id']}", {"approved": True})
    assert again.status in (404, 409), again.body
    assert metric_value(four_eyes.gateway.base, "adk_gateway_approval_decisions_total",
                        {"source": "approver", "outcome": "approved"}) == 1
    [audit] = [line for line in four_eyes.gateway.log_lines()
               if line.get("event") == "approval_audit" and line.get("approval_id") == pending["id"]]
    assert audit["source"] == "approver" and audit["approvers"][0]["auth"] == "approver_key"


def test_a_supervisor_denies_with_a_reason(four_eyes: PluginStack) -> None:
    run = {"version": 7, "api": f"{four_eyes.gateway.base}/api/chat", "headers": {"x-ai-sdk-version": "7"},
           "steps": [{"send": "pay 3000 to Hanako"}]}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        chat = pool.submit(run_chats, [run], timeout=60)
        pending = _pending(four_eyes)
        denied = _api(four_eyes, "POST", f"/api/approvals/{pending['id']}", {"approved": False, "reason": "not today"})
        assert denied.status == 200 and denied.json()["outcome"] == "denied", denied.body
        [result] = chat.result()
    assert_clean(result)
    [paid] = [p for m in result["messages"] for p in m["parts"] if p["type"] == "tool-process_payment"]
    assert paid["state"] == "output-denied" and paid["approval"] == {**paid["approval"], "approved": False, "reason": "not today"}


def test_who_may_use_the_api(four_eyes: PluginStack) -> None:
    assert _api(four_eyes, "GET", "/api/approvals", key="wrong").status == 401
    assert _api(four_eyes, "GET", "/api/approvals/gw-nothing").status == 404
    assert _api(four_eyes, "GET", "/api/approvals?state=other").status == 400
    bad = _api(four_eyes, "POST", "/api/approvals/gw-nothing", {"approved": "yes"})
    assert bad.status == 400 and bad.json()["error"]["code"] == "invalid_request"
    # The anonymous requester is no auditor.
    assert _api(four_eyes, "GET", "/api/approvals?state=decided", key=None).status == 403
    decided = _api(four_eyes, "GET", "/api/approvals?state=decided&limit=10")
    assert decided.status == 200 and all(r["source"] for r in decided.json()["approvals"])


@pytest.fixture(scope="module")
def four_eyes_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    """Two replicas on Redis with the four-eyes rule, shared by the module's two replica rows (the
    one that kills A runs last; the other starts A again if it finds it dead)."""
    with replicas(tmp_path_factory.mktemp("four-eyes-replicas"), tools=_four_eyes_tools(), extra=APPROVERS) as pair:
        yield pair


def test_on_two_replicas_the_approval_is_listed_and_decided_on_the_one_that_does_not_run_the_chat(
    four_eyes_pair: Replicas,
) -> None:
    """The chat runs on A; the plugin asks through B (forwarded to A); the supervisor lists and
    approves through B (the directory in Redis, the decision carried to A); A streams the outcome."""
    pair = four_eyes_pair
    if pair.a.proc.poll() is not None:  # the row that kills A ran first (a selection's order)
        pair.start_again("a")
    run = {"version": 7, "api": f"{pair.a.base}/api/chat", "headers": {"x-ai-sdk-version": "7"},
           "steps": [{"send": "pay 2000 to Hanako"}]}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        chat = pool.submit(run_chats, [run], timeout=60)
        pending = _pending(pair.b)
        assert _api(pair.a, "GET", f"/api/approvals/{pending['id']}").json()["id"] == pending["id"]
        decided = _api(pair.b, "POST", f"/api/approvals/{pending['id']}", {"approved": True})
        assert decided.status == 200 and decided.json()["outcome"] == "approved", decided.body
        [result] = chat.result()
    assert_clean(result)
    [paid] = [p for m in result["messages"] for p in m["parts"] if p["type"] == "tool-process_payment"]
    assert paid["state"] == "output-available" and paid["output"]["success"] is True
    assert len(pair.ledger.of(result["chatId"])) == 1  # the agent's own count of real executions
    assert _api(pair.a, "POST", f"/api/approvals/{pending['id']}", {"approved": True}).status in (404, 409)
    # A rule decides on the chat's replica too, the plugin's ask forwarded from B.
    [small] = run_chats([{**run, "steps": [{"send": "pay 2 to Hanako"}]}], timeout=40)
    assert_clean(small)
    # The audit trail through either replica (the store in Redis): both decisions, by their source.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        trail = _api(pair.b, "GET", "/api/approvals?state=decided&limit=100").json()["approvals"]
        if {r["source"] for r in trail} >= {"approver", "rule"}:
            break
        time.sleep(0.1)
    sources = {r["chat_id"]: (r["source"], r["outcome"]) for r in trail}
    assert sources[result["chatId"]] == ("approver", "approved") and sources[small["chatId"]] == ("rule", "approved")
    # B carried the decision to A (the owner), which applied it.
    assert metric_value(pair.b.base, "adk_gateway_forwarded_total", {"direction": "out"}) >= 1
    assert any(line.get("event") == "approval_vote" for line in pair.b.log_lines())


def test_an_approval_whose_replica_died_is_decided_through_the_other_and_runs_once(four_eyes_pair: Replicas) -> None:
    """The approval waits as ADK's confirmation, in ADK's session: the replica that ran the chat
    killed, the supervisor's approval through the other one runs the payment, once, and the
    requester's resume there reads the outcome (docs/approvals.md, "What survives what")."""
    pair = four_eyes_pair
    run = {"version": 7, "api": f"{pair.a.base}/api/chat", "headers": {"x-ai-sdk-version": "7"},
           "steps": [{"send": "pay 2000 to Hanako"}]}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        chat = pool.submit(run_chats, [run], timeout=60)
        pending = _pending(pair.b)
        pair.a.proc.kill()
        pair.a.proc.wait()
        [result] = chat.result()
    assert _api(pair.b, "GET", f"/api/approvals/{pending['id']}").json()["id"] == pending["id"]
    assert pair.ledger.of(result["chatId"]) == []  # nothing ran while it waited
    decided = _api(pair.b, "POST", f"/api/approvals/{pending['id']}", {"approved": True})
    assert decided.status == 200 and decided.json()["outcome"] == "approved", decided.body
    deadline = time.monotonic() + 20
    while not pair.ledger.of(result["chatId"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(pair.ledger.of(result["chatId"])) == 1
    assert _api(pair.b, "POST", f"/api/approvals/{pending['id']}", {"approved": True}).status in (404, 409)
    assert _api(pair.b, "GET", "/api/approvals?state=pending").json()["approvals"] == []
    resumed = request(pair.b.base, "GET", f"/api/chat/{result['chatId']}/stream", headers={"x-ai-sdk-version": "7"})
    kinds = [json.loads(line[6:])["type"] for line in resumed.body.decode().splitlines() if line.startswith("data: {")]
    assert "tool-output-available" in kinds, (resumed.status, kinds)
    time.sleep(1.0)  # no second run of the payment follows
    assert len(pair.ledger.of(result["chatId"])) == 1


def test_a_requester_who_left_while_the_supervisors_decided_reads_the_outcome_on_resume(four_eyes: PluginStack) -> None:
    """The stream held open for the approvers outlives the browser that left it (chat.on_disconnect:
    continue): the resume replays it whole, the outcome included."""
    host, port = four_eyes.gateway.base.removeprefix("http://").split(":")
    chat_id = new_chat()
    body = json.dumps({"id": chat_id, "messages": [user("pay 4000 to Hanako")]})
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("POST", "/api/chat", body, {"Content-Type": "application/json", "x-ai-sdk-version": "7"})
    stream = conn.getresponse()
    seen = b""
    while b'"data-approval"' not in seen:
        seen += stream.read1(4096)
    conn.close()  # the browser leaves before anyone decided
    pending = _pending(four_eyes)
    assert _api(four_eyes, "POST", f"/api/approvals/{pending['id']}", {"approved": True}).status == 200
    deadline = time.monotonic() + 20
    while True:
        resumed = request(four_eyes.gateway.base, "GET", f"/api/chat/{chat_id}/stream", headers={"x-ai-sdk-version": "7"})
        chunks = [json.loads(line[6:]) for line in resumed.body.decode().splitlines() if line.startswith("data: {")]
        if any(c["type"] == "finish" for c in chunks) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    kinds = [c["type"] for c in chunks]
    assert "data-approval" in kinds and "tool-approval-response" in kinds and "tool-output-available" in kinds, kinds
    [decided] = [c for c in chunks if c["type"] == "data-approval" and c["data"]["state"] == "decided"]
    assert decided["data"]["approved"] is True and kinds[-1] == "finish"
