"""Rules on a call's arguments, end to end: stock ai 6 and ai 7 Chats, the gateway, and the stock ADK
API server with the plugin (the demo's topology), in confirm mode over SSE (the plugin asks the
gateway's rules before ADK's confirmation) and, in tests/integration/test_live_mode.py, over live."""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.server
import json
import os
import threading
import time
from pathlib import Path

import pytest

from tests.demo_rows import RULE_SCENARIOS, check_rule_rows
from tests.integration.conftest import SharedAgents, plugin_agent
from tests.jsdriver import run_chats
from tests.procs import PluginStack, metric_value, plugin_stack

pytestmark = [pytest.mark.integration, pytest.mark.js]


@pytest.mark.parametrize("version", [6, 7])
def test_a_rule_approves_or_refuses_a_payment_without_asking_anyone(stack: PluginStack, version: int) -> None:
    base = stack.gateway.base
    labels = {"agent": "demo_agent", "source": "rule"}
    approved = metric_value(base, "adk_gateway_approval_decisions_total", {**labels, "outcome": "approved"})
    denied = metric_value(base, "adk_gateway_approval_decisions_total", {**labels, "outcome": "denied"})
    names = list(RULE_SCENARIOS)
    # ai 7's framing (its approval response chunk) needs the version said (docs/protocol.md 1.3).
    headers = {"x-ai-sdk-version": str(version)}
    results = dict(zip(names, run_chats(
        [{"version": version, "api": f"{base}/api/chat", "headers": headers, "steps": RULE_SCENARIOS[n]} for n in names],
        timeout=40,
    )))
    check_rule_rows(results, version)
    assert metric_value(base, "adk_gateway_approval_decisions_total", {**labels, "outcome": "approved"}) == approved + 1
    assert metric_value(base, "adk_gateway_approval_decisions_total", {**labels, "outcome": "denied"}) == denied + 1
    # Nobody was asked: no approval waited, none is pending.
    assert metric_value(base, "adk_gateway_approvals_pending", {"agent": "demo_agent"}) == 0
    # The audit trail has both, with the rule that decided and the policy it belongs to.
    audits = {
        line["rule"]: line for line in stack.gateway.log_lines()
        if line.get("event") == "approval_audit" and line.get("source") == "rule" and line.get("chat_id") in chats(results)
    }
    assert audits.keys() == {"small", "too_large"}
    assert audits["small"]["outcome"] == "approved" and audits["too_large"]["outcome"] == "denied"
    assert audits["too_large"]["reason"] == "Payments of 10,000 or more are refused."
    assert audits["small"]["args_digest"].startswith("hmac-sha256:") and "args" not in audits["small"]
    assert audits["small"]["agent"] == "demo_agent" and audits["small"]["app_name"] == "demo_agent"
    assert audits["small"]["policy_version"]


def chats(results: dict[str, dict]) -> set[str]:
    return {result["chatId"] for result in results.values()}


def test_a_person_s_answer_is_audited_with_its_source(stack: PluginStack) -> None:
    [result] = run_chats([{
        "version": 7, "api": f"{stack.gateway.base}/api/chat", "headers": {"x-ai-sdk-version": "7"},
        "steps": [{"send": "pay 50 to Hanako", "approvals": "deny"}],
    }], timeout=40)
    [audit] = [
        line for line in stack.gateway.log_lines()
        if line.get("event") == "approval_audit" and line.get("chat_id") == result["chatId"]
    ]
    assert (audit["source"], audit["outcome"], audit["rule"], audit["tool"]) == ("person", "denied", None, "process_payment")
    assert audit["waited"] >= 0


class _Receiver(http.server.BaseHTTPRequestHandler):
    """A webhook receiver: keeps each call's headers and body."""

    calls: list[tuple[dict[str, str], bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).calls.append(({k.lower(): v for k, v in self.headers.items()}, body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_a_webhook_is_told_signed_when_a_payment_waits_and_when_it_is_decided(tmp_path: Path, shared_agents: SharedAgents) -> None:
    secret = "webhook-secret-" + os.urandom(8).hex()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    extra = (
        "notifications:\n  public_url: http://gateway.example\n  webhooks:\n    - name: ops\n"
        f"      url: http://127.0.0.1:{server.server_port}/hook\n      secret: {secret}\n"
    )
    try:
        with plugin_stack(tmp_path, extra=extra, agent=plugin_agent(shared_agents)) as stack:
            [result] = run_chats([{
                "version": 7, "api": f"{stack.gateway.base}/api/chat", "steps": [{"send": "pay 50 to Hanako", "approvals": "approve"}],
            }], timeout=40)
            deadline = time.monotonic() + 10
            while len(_Receiver.calls) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        server.shutdown()
    bodies = []
    for headers, body in _Receiver.calls:
        signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
        expected = base64.b64encode(hmac.new(secret.encode(), signed, hashlib.sha256).digest()).decode()
        assert headers["webhook-signature"] == f"v1,{expected}"
        bodies.append(json.loads(body))
    assert [b["type"] for b in bodies] == ["approval.waiting", "approval.decided"]
    waiting, decided = (b["data"] for b in bodies)
    assert waiting["approval_id"] == decided["approval_id"] and decided["chat_id"] == result["chatId"]
    assert (decided["source"], decided["outcome"], decided["tool"]) == ("person", "approved", "process_payment")
    assert decided["links"]["approval"] == f"http://gateway.example/api/approvals/{decided['approval_id']}"
    assert "args" not in decided and decided["args_digest"].startswith("hmac-sha256:")
