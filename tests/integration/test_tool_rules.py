"""Rules on a call's arguments, end to end: a stock ai 7 Chat, the gateway, and the stock ADK API server
with the plugin (the demo's topology), in confirm mode over SSE (the plugin asks the gateway's rules
before ADK's confirmation) and, in tests/integration/test_live_mode.py, over live. What the rules
decide and what the browser and the audit trail see of it is played from recordings in
tests/scenarios/test_tool_rules.py; here, the signed webhook to a receiver over HTTP."""

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

from tests.integration.conftest import SharedAgents, plugin_agent
from tests.jsdriver import run_chats
from tests.procs import plugin_stack

pytestmark = [pytest.mark.integration, pytest.mark.js]


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
