"""The Slack approvals channel end to end: a stock ai 7 Chat asks for a payment a rule hands to the
supervisors; the gateway posts it to Slack (a local stand-in for the Web API and the `response_url`s);
the requester, mapped to a Slack user too, is refused by four-eyes; the supervisor's signed press of
Approve decides; the chat streams the payment; the Slack message is updated with who decided. The
stock ADK API server with the plugin, in confirm mode (its default): the call waits as an ADK
confirmation and the press's decision answers ADK.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlencode

import pytest

from tests.integration.conftest import SharedAgents, plugin_agent
from tests.integration.test_approvers import APPROVERS, _four_eyes_tools
from tests.jsdriver import assert_clean, run_chats
from tests.procs import PluginStack, metric_value, plugin_stack, request

pytestmark = [pytest.mark.integration, pytest.mark.js]

SIGNING = "slack-signing-secret-for-tests-0001"


class SlackStandIn(ThreadingHTTPServer):
    """Slack's Web API (`/api/<method>`: recorded, answered `{"ok": true, "ts": …}`) and `response_url`s (`/actions/…`)."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.responses: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def of(self, method: str) -> list[dict[str, Any]]:
        with self.lock:
            return [body for name, body in self.calls if name == method]

    def wait(self, what: Any, timeout: float = 20) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                found = what()
            if found:
                return found
            time.sleep(0.05)
        raise AssertionError("Slack's stand-in was not called as expected")


class _Handler(BaseHTTPRequestHandler):
    server: SlackStandIn

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        answer: dict[str, Any] = {}
        with self.server.lock:
            if self.path.startswith("/api/"):
                self.server.calls.append((self.path.removeprefix("/api/"), body))
                answer = {"ok": True, "channel": body["channel"], "ts": body.get("ts", "1800000000.000100")}
            else:
                self.server.responses.append(body)
        raw = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture(scope="module")
def slack() -> Iterator[SlackStandIn]:
    server = SlackStandIn()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, shared_agents: SharedAgents, slack: SlackStandIn) -> Iterator[PluginStack]:
    channel = f"""notifications:
  slack:
    bot_token: xoxb-integration-test
    signing_secret: {SIGNING}
    channel: C0APPROVALS
    api_base: {slack.base}/api
    response_url_prefix: {slack.base}/actions/
    users: {{U0SUPER: supervisor, U0ANON: anonymous}}
"""
    with plugin_stack(tmp_path_factory.mktemp("slack"), tools=_four_eyes_tools(), extra=APPROVERS + channel,
                      agent=plugin_agent(shared_agents)) as running:
        yield running


def press(stack: PluginStack, slack: SlackStandIn, user: str, approval_id: str) -> int:
    """A signed block_actions press of Approve, as Slack posts it."""
    payload = {"type": "block_actions", "user": {"id": user, "team_id": "T0"}, "team": {"id": "T0"},
               "response_url": f"{slack.base}/actions/T0/1/x", "trigger_id": "1.2.3",
               "actions": [{"type": "button", "action_id": "adk_gateway.approve", "block_id": "adk_gateway.answer",
                            "value": approval_id, "action_ts": "1800000001.0"}]}
    body = urlencode({"payload": json.dumps(payload)}).encode()
    stamp = str(int(time.time()))
    signature = "v0=" + hmac.new(SIGNING.encode(), f"v0:{stamp}:".encode() + body, hashlib.sha256).hexdigest()
    return request(stack.gateway.base, "POST", "/api/slack/interactions", body, headers={
        "Content-Type": "application/x-www-form-urlencoded", "X-Slack-Request-Timestamp": stamp,
        "X-Slack-Signature": signature}).status


def test_a_supervisor_approves_in_slack_and_the_chat_streams_the_payment(stack: PluginStack, slack: SlackStandIn) -> None:
    run = {"version": 7, "api": f"{stack.gateway.base}/api/chat", "headers": {"x-ai-sdk-version": "7"},
           "steps": [{"send": "pay 2000 to Hanako"}]}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        chat = pool.submit(run_chats, [run], timeout=60)
        [posted] = slack.wait(lambda: [body for name, body in slack.calls if name == "chat.postMessage"])
        [buttons] = [b for b in posted["blocks"] if b["type"] == "actions"]
        approval_id = buttons["elements"][0]["value"]
        shown = json.dumps(posted["blocks"])
        assert "process_payment" in shown and "1 of supervisors" in shown and "Hanako" not in shown  # args: digest only
        # The requester, mapped in Slack too, may not approve their own call.
        assert press(stack, slack, "U0ANON", approval_id) == 200
        slack.wait(lambda: slack.responses)
        assert slack.responses[0]["text"].startswith("You asked for this call yourself")
        assert not chat.done(), "the chat's stream waits for the supervisors, open"
        assert press(stack, slack, "U0SUPER", approval_id) == 200
        [result] = chat.result()
    assert_clean(result)
    parts = [p for m in result["messages"] for p in m["parts"]]
    [paid] = [p for p in parts if p["type"] == "tool-process_payment"]
    assert paid["state"] == "output-available" and paid["output"]["success"] is True
    [updated] = slack.wait(lambda: [body for name, body in slack.calls if name == "chat.update"])
    assert updated["ts"] == "1800000000.000100" and not [b for b in updated["blocks"] if b["type"] == "actions"]
    assert "*Approved* by <@U0SUPER>" in json.dumps(updated["blocks"])
    slack.wait(lambda: len(slack.responses) == 2)
    assert slack.responses[1]["text"] == "You approved this call."
    # A late press decides nothing more.
    assert press(stack, slack, "U0SUPER", approval_id) == 200
    slack.wait(lambda: len(slack.responses) == 3)
    # (Answered, the approval left the listing: the API's 404, which a press in the channel reads as decided.)
    assert slack.responses[2]["text"].startswith("This approval was already decided")
    assert metric_value(stack.gateway.base, "adk_gateway_approval_decisions_total", {"source": "approver", "outcome": "approved"}) == 1
    [audit] = [line for line in stack.gateway.log_lines()
               if line.get("event") == "approval_audit" and line.get("approval_id") == approval_id]
    assert audit["approvers"] == [{"user": "supervisor", "auth": "slack"}]
