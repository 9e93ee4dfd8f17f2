"""Approvals by mail, end to end: a stock ai 7 Chat asks for a payment a rule hands to the
supervisors; the gateway mails the supervisor a one-time link (a real SMTP server, aiosmtpd, in the
test process); opening it decides nothing and the chat's stream stays open; the link's form
approves, the chat streams the outcome, and the audit trail says the supervisor decided by email.
The stock ADK API server with the plugin, in confirm mode (its default), as tests/integration/test_approvers.py."""

from __future__ import annotations

import concurrent.futures
import http.client
import re
import time
from collections.abc import Iterator
from email.message import EmailMessage
from urllib.parse import urlencode

import pytest
from tests.integration.conftest import SharedAgents, plugin_agent
from tests.integration.test_approvers import APPROVERS, KEY, _four_eyes_tools
from tests.jsdriver import assert_clean, run_chats
from tests.procs import PluginStack, plugin_stack, request
from tests.unit.test_email_approvals import Inbox, smtp_server

pytestmark = [pytest.mark.integration, pytest.mark.js]

LINK_BASE = "https://gateway.test"


def _wait(inbox: Inbox, address: str, timeout: float = 20) -> EmailMessage:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := inbox.to(address):
            return found[0]
        time.sleep(0.1)
    raise AssertionError(f"no mail to {address}")


@pytest.fixture(scope="module")
def smtp() -> Iterator[tuple[Inbox, int]]:
    with smtp_server() as server:
        yield server


@pytest.fixture(scope="module")
def mailed(tmp_path_factory: pytest.TempPathFactory, shared_agents: SharedAgents, smtp: tuple[Inbox, int]) -> Iterator[PluginStack]:
    notifications = f"""notifications:
  email:
    smtp: {{host: 127.0.0.1, port: {smtp[1]}, starttls: false}}
    from: gateway@example.com
    link_base: {LINK_BASE}
    signing_key: "email-links-signing-key-for-tests-0123456789"
    recipients:
      supervisor: supervisor@example.com
      anonymous: requester@example.com
"""
    agent = plugin_agent(shared_agents)
    with plugin_stack(tmp_path_factory.mktemp("mailed"), tools=_four_eyes_tools(), extra=APPROVERS + notifications, agent=agent) as stack:
        yield stack


def _form(stack: PluginStack, path: str, fields: dict[str, str]) -> tuple[int, str]:
    host, port = stack.gateway.base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", path, body=urlencode(fields), headers={"Content-Type": "application/x-www-form-urlencoded"})
        answer = conn.getresponse()
        return answer.status, answer.read().decode()
    finally:
        conn.close()


def test_a_supervisor_approves_from_the_mailed_link_and_the_chat_streams_the_outcome(mailed: PluginStack, smtp: tuple[Inbox, int]) -> None:
    inbox, _ = smtp
    run = {"version": 7, "api": f"{mailed.gateway.base}/api/chat", "headers": {"x-ai-sdk-version": "7"},
           "steps": [{"send": "pay 2000 to Hanako"}]}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        chat = pool.submit(run_chats, [run], timeout=60)
        message = _wait(inbox, "supervisor@example.com")
        text = message.get_body(("plain",)).get_content()  # type: ignore[union-attr]
        assert "Tool: process_payment" in text and "Rule: large" in text
        found = re.search(re.escape(LINK_BASE) + r"(/approve/[A-Za-z0-9_.-]+)", text)
        assert found, text
        path = found.group(1)
        # Opening the link (as a mail scanner would) decides nothing.
        page = request(mailed.gateway.base, "GET", path)
        assert page.status == 200, page.body
        nonce = re.search(r'name="nonce" value="([^"]+)"', page.body.decode())
        assert nonce
        time.sleep(0.5)
        assert not chat.done(), "the chat's stream waits for the supervisors, open"
        listed = request(mailed.gateway.base, "GET", "/api/approvals?state=pending", headers={"Authorization": f"Bearer {KEY}"})
        assert [a["votes"] for a in listed.json()["approvals"]] == [[]]
        status, body = _form(mailed, path, {"nonce": nonce.group(1), "decision": "approve"})
        assert status == 200 and "You approved the call" in body, body
        [result] = chat.result()
    assert_clean(result)
    parts = [p for m in result["messages"] for p in m["parts"]]
    [paid] = [p for p in parts if p["type"] == "tool-process_payment"]
    assert paid["state"] == "output-available" and paid["output"]["success"] is True
    # Used once.
    again, body = _form(mailed, path, {"nonce": nonce.group(1), "decision": "deny"})
    assert again == 410 and "used already" in body
    # Four-eyes: the requester (in the group, and mapped) got no link.
    assert not [m for rcpt, m in inbox.mails if "requester@example.com" in rcpt]
    [audit] = [line for line in mailed.gateway.log_lines() if line.get("event") == "approval_audit" and line.get("tool") == "process_payment"]
    assert audit["source"] == "approver" and audit["approvers"] == [{"user": "supervisor", "auth": "email"}]
    # The link is a credential: the access log names the route only.
    assert not any(path in str(line) for line in mailed.gateway.log_lines())
