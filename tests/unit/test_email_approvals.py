"""The email channel of approvals in process (approvals/email.py, edge/decision_page.py), against a
real SMTP server (aiosmtpd on a free port) and the memory backend: a waiting approval its approvers
decide mails each mapped approver who may decide it a one-time signed link; opening the link decides
nothing; posting its form votes through the approvals API's path, once; a link altered, expired, used
or sent from another origin decides nothing; a decision taken elsewhere makes the link say so.

The approval is put in the directory as the chat's owner puts it, and its `waiting` notice is made
by the chat's notices (approvals/reports.py) as for a held call; the desk's `decide` (which applies
a counted decision where the chat runs: tests/unit/test_approver_decisions.py) is recorded.
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import re
import secrets
import socket
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from email.message import EmailMessage
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from aiosmtpd.controller import Controller

from gateway.approvals.email_links import LinkToken, link_key, nonce_key, sign_link
from gateway.config.agent import ToolPolicy
from gateway.config.schema import parse_config
from gateway.core.approvals import GatedCall
from gateway.edge.app import create_app
from gateway.edge.state import GATEWAY
from tests.procs import RedisServer, redis_server
from tests.unit.test_approvals_directory import TTL, approval

SIGNING_KEY = "k" * 40
BASE = "https://gw.example.com"


def config(smtp_port: int) -> str:
    return f"""
internal:
  secret: s3cret
upstream:
  url: http://adk.invalid:8000
  app_name: support_agent
auth:
  mode: api_key
  api_keys:
    - {{id: bob, key: k-bob}}
approvers:
  api_keys:
    - {{id: supervisor, key: k-supervisor}}
    - {{id: lead, key: k-lead}}
  groups:
    supervisors: {{users: [supervisor, lead, bob]}}
notifications:
  backoff: 100ms
  max_attempts: 3
  email:
    smtp: {{host: 127.0.0.1, port: {smtp_port}, starttls: false}}
    from: gateway@example.com
    link_base: {BASE}
    signing_key: {SIGNING_KEY}
    recipients:
      supervisor: sup@example.com
      "approver_key:lead": lead@example.com
      bob: bob@example.com
"""


class Inbox:
    """What the SMTP server received, by recipient (aiosmtpd's handler: it runs on the server's thread)."""

    def __init__(self) -> None:
        self.mails: list[tuple[list[str], EmailMessage]] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802 - aiosmtpd's hook name
        message = email.message_from_bytes(envelope.content, policy=email.policy.default)
        self.mails.append((list(envelope.rcpt_tos), message))  # type: ignore[arg-type]
        return "250 OK"

    def to(self, address: str) -> list[EmailMessage]:
        return [m for rcpt, m in self.mails if address in rcpt]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def smtp_server() -> Iterator[tuple[Inbox, int]]:
    """A real SMTP server on a free port of 127.0.0.1, and what it receives."""
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=_free_port())
    controller.start()
    try:
        yield inbox, controller.port
    finally:
        controller.stop()


@pytest.fixture
def smtp() -> Iterator[tuple[Inbox, int]]:
    with smtp_server() as server:
        yield server


@pytest.fixture
async def client(smtp: tuple[Inbox, int]) -> AsyncIterator[TestClient]:
    app = create_app(parse_config(config(smtp[1]), source="gateway.yaml", env={}))
    test_client = TestClient(TestServer(app))
    await test_client.start_server()
    for agent in app[GATEWAY].agents:
        agent.probe.cancel()  # no ADK: the page and the vote do not need one
    yield test_client
    await test_client.close()


@pytest.fixture
def decided(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool, str | None, list[dict[str, str]]]]:
    calls: list[tuple[str, bool, str | None, list[dict[str, str]]]] = []

    async def decide(record: dict[str, Any], approved: bool, reason: str | None, deciders: list[dict[str, str]]) -> str:
        calls.append((record["id"], approved, reason, deciders))
        return "decided"

    monkeypatch.setattr(client.app[GATEWAY].cluster.approvals, "decide", decide)  # type: ignore[index]
    return calls


async def waiting(
    client: TestClient, approval_id: str = "gw-1", requester: str = "bob", approvers: str | None = "supervisors",
) -> dict[str, Any]:
    """An approval for the supervisors (or, `approvers=None`, the chatting user's own held call),
    listed and told as the chat's owner does."""
    gateway = client.app[GATEWAY]  # type: ignore[index]
    now = time.time()
    record = {**approval(approval_id, now), "requester": requester, "approvers": approvers}
    await gateway.cluster.state.put_approval(record, ttl=TTL)
    call = GatedCall(
        approval_id, requester, "chat-1", "s-1", record["tool_call_id"], "issue_refund", record["args"],
        ToolPolicy(approval=True), now, now + 300, rule="large_refund", approvers=approvers, self_approval=False,
    )
    gateway.chats.notices.call_waiting("support_agent", call)
    return record


async def mails(inbox: Inbox, count: int) -> None:
    for _ in range(100):
        if len(inbox.mails) >= count:
            await asyncio.sleep(0.2)  # and no more arrive
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{len(inbox.mails)} mails arrived, not {count}")


def link_of(message: EmailMessage) -> str:
    text = message.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    found = re.search(re.escape(BASE) + r"(/approve/[A-Za-z0-9_.-]+)", text)
    assert found, text
    return found.group(1)


async def form_nonce(client: TestClient, path: str) -> str:
    page = await client.get(path)
    found = re.search(r'name="nonce" value="([^"]+)"', await page.text())
    assert page.status == 200 and found
    return found.group(1)


async def supervisors_link(client: TestClient, inbox: Inbox) -> tuple[str, str]:
    """A waiting approval mailed; the supervisor's link, and its form's nonce."""
    await waiting(client)
    await mails(inbox, 2)
    path = link_of(inbox.to("sup@example.com")[0])
    return path, await form_nonce(client, path)


async def test_a_waiting_approval_mails_each_approver_who_may_decide_it(client: TestClient, smtp: tuple[Inbox, int]) -> None:
    inbox, _ = smtp
    await waiting(client)
    await mails(inbox, 2)
    # Bob asked: four-eyes leaves him out, though he is in the group and mapped.
    assert sorted(rcpt[0] for rcpt, _ in inbox.mails) == ["lead@example.com", "sup@example.com"]
    message = inbox.to("sup@example.com")[0]
    assert message["Subject"] == "Approval needed: issue_refund (support_agent)"
    assert message["From"] == "gateway@example.com" and message["Auto-Submitted"] == "auto-generated"
    text = message.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    for shown in ("Tool: issue_refund", "Agent: support_agent", "Rule: large_refund", "Deadline: ", "Requested by: bob"):
        assert shown in text
    assert "DE89-SECRET" not in message.as_string()  # arguments only with include_args
    html = message.get_body(("html",)).get_content()  # type: ignore[union-attr]
    assert f'href="{BASE}{link_of(message)}"' in html
    # Each approver's link is their own.
    assert link_of(message) != link_of(inbox.to("lead@example.com")[0])
    assert sent(client, "sent") == 2 and sent(client, "failed") == 0


async def test_the_chatting_users_own_approval_mails_nobody(client: TestClient, smtp: tuple[Inbox, int]) -> None:
    """Bob is mapped and may answer his own call, in his chat: no link for it."""
    await waiting(client, "gw-own", approvers=None)
    await waiting(client, "gw-2")
    await mails(smtp[0], 2)
    assert sorted(rcpt[0] for rcpt, _ in smtp[0].mails) == ["lead@example.com", "sup@example.com"]


async def test_starttls_that_the_server_does_not_offer_sends_nothing_in_clear(smtp: tuple[Inbox, int]) -> None:
    inbox, port = smtp
    app = create_app(parse_config(config(port).replace("starttls: false", "starttls: true"), source="gateway.yaml", env={}))
    async with TestClient(TestServer(app)) as plain:
        for agent in app[GATEWAY].agents:
            agent.probe.cancel()
        await waiting(plain)
        await given_up(plain, 2)
        assert inbox.mails == []


async def given_up(client: TestClient, count: int) -> None:
    for _ in range(100):
        if sent(client, "failed") == count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{sent(client, 'failed')} mails given up, not {count}")


def sent(client: TestClient, result: str) -> float | None:
    return client.app[GATEWAY].metrics.registry.get_sample_value(  # type: ignore[index, no-any-return]
        "adk_gateway_approval_emails_total", {"result": result},
    )


async def test_an_smtp_server_that_is_down_costs_the_chat_nothing_and_is_tried_again(
    smtp: tuple[Inbox, int],
) -> None:
    inbox, port = smtp
    closed = _free_port()  # nobody listens there
    app = create_app(parse_config(config(closed), source="gateway.yaml", env={}))
    async with TestClient(TestServer(app)) as down:
        for agent in app[GATEWAY].agents:
            agent.probe.cancel()
        started = time.monotonic()
        await waiting(down)
        assert time.monotonic() - started < 0.1  # the notice only queued the mails
        # notifications.max_attempts (3) sessions per approver, a backoff apart, then given up.
        await given_up(down, 2)
        assert sent(down, "sent") == 0
        assert inbox.mails == []
        # A server that answers again takes the next approval's mails.
        # (as a reload applies `notifications` to the notices after it)
        app[GATEWAY].config = parse_config(config(port), source="gateway.yaml", env={})
        await waiting(down, "gw-2")
        await mails(inbox, 2)
        assert sent(down, "sent") == 2


async def test_opening_the_link_decides_nothing_and_posting_it_votes_once(
    client: TestClient, smtp: tuple[Inbox, int], decided: list[Any],
) -> None:
    inbox, _ = smtp
    await waiting(client)
    await mails(inbox, 2)
    path = link_of(inbox.to("sup@example.com")[0])
    page = await client.get(path)
    body = await page.text()
    assert page.status == 200 and "issue_refund" in body and "DE89-SECRET" in body
    assert page.headers["Referrer-Policy"] == "no-referrer" and "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
    assert decided == []
    assert (await client.app[GATEWAY].cluster.state.get_approval("gw-1"))["votes"] == []  # type: ignore[index]
    nonce = await form_nonce(client, path)
    answer = await client.post(path, data={"nonce": nonce, "decision": "approve", "reason": "ok by me"})
    assert answer.status == 200 and "You approved the call" in await answer.text()
    assert decided == [("gw-1", True, "ok by me", [{"user": "supervisor", "auth": "email"}])]
    again = await client.post(path, data={"nonce": nonce, "decision": "deny"})
    assert again.status == 410 and "used already" in await again.text()
    assert len(decided) == 1


async def test_an_altered_or_expired_link_or_a_foreign_form_decides_nothing(
    client: TestClient, smtp: tuple[Inbox, int], decided: list[Any],
) -> None:
    path, nonce = await supervisors_link(client, smtp[0])
    # Another approval's id, or another approver, under the same mac.
    payload, mac = path.removeprefix("/approve/").split(".")
    altered = f"/approve/{payload[:-2]}{'A' if payload[-2] != 'A' else 'B'}{payload[-1]}.{mac}"
    for bad in (altered, f"/approve/{payload}.{mac[:-1]}", "/approve/not-a-token", "/approve/" + "a" * 3000):
        assert (await client.get(bad)).status == 403, bad
        assert (await client.post(bad, data={"nonce": nonce, "decision": "approve"})).status == 403
    key = link_key(SIGNING_KEY)
    expired = LinkToken("gw-1", "approver_key:supervisor", int(time.time()) - 1, "n-expired")
    await client.app[GATEWAY].cluster.state.put_ticket(nonce_key("n-expired"), {"approval": "gw-1", "approver": "approver_key:supervisor"}, ttl=60)  # type: ignore[index]
    expired_path = f"/approve/{sign_link(key, expired)}"
    assert (await client.get(expired_path)).status == 410
    assert (await client.post(expired_path, data={"nonce": "n-expired", "decision": "approve"})).status == 410
    # The link's own form only: another nonce, another origin, a JSON body.
    assert (await client.post(path, data={"nonce": "guess", "decision": "approve"})).status == 403
    assert (await client.post(path, data={"nonce": nonce, "decision": "approve"}, headers={"Origin": "https://evil.example"})).status == 403
    assert (await client.post(path, json={"nonce": nonce, "decision": "approve"})).status == 415
    assert decided == []
    # None of that spent the link.
    answer = await client.post(path, data={"nonce": nonce, "decision": "deny"}, headers={"Origin": BASE})
    assert answer.status == 200 and decided == [("gw-1", False, None, [{"user": "supervisor", "auth": "email"}])]


async def test_a_decision_taken_elsewhere_makes_the_link_say_so(
    client: TestClient, smtp: tuple[Inbox, int], decided: list[Any],
) -> None:
    path, nonce = await supervisors_link(client, smtp[0])
    # The lead decides through the approvals API first.
    api = await client.post("/api/approvals/gw-1", json={"approved": False}, headers={"Authorization": "Bearer k-lead"})
    assert api.status == 200 and len(decided) == 1
    page = await client.get(path)
    assert page.status in (409, 410) and "already decided" in (await page.text())
    late = await client.post(path, data={"nonce": nonce, "decision": "approve"})
    assert late.status in (409, 410) and "already decided" in (await late.text())
    assert len(decided) == 1


async def test_the_access_log_names_the_route_never_the_link(
    client: TestClient, smtp: tuple[Inbox, int], capsys: pytest.CaptureFixture[str],
) -> None:
    path, _ = await supervisors_link(client, smtp[0])
    logged = capsys.readouterr()
    assert "/approve/{token}" in logged.out + logged.err
    assert path.removeprefix("/approve/")[:40] not in logged.out + logged.err


def test_a_recipient_who_names_nobody_refuses_the_file(smtp: tuple[Inbox, int]) -> None:
    text = config(smtp[1]).replace('"approver_key:lead": lead@example.com', '"approver_key:ghost": g@example.com')
    with pytest.raises(Exception, match="approver_key:ghost"):
        parse_config(text, source="gateway.yaml", env={})
    short = config(smtp[1]).replace(SIGNING_KEY, "short")
    with pytest.raises(Exception, match="signing_key"):
        parse_config(short, source="gateway.yaml", env={})
    injected = config(smtp[1]).replace("sup@example.com", '"sup@example.com\\nBcc: x@evil.example"')
    with pytest.raises(Exception, match="e-mail address"):
        parse_config(injected, source="gateway.yaml", env={})


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with redis_server(tmp_path_factory.mktemp("redis")) as server:
        yield server


async def test_on_two_replicas_a_link_mailed_by_one_votes_on_the_other_once(
    smtp: tuple[Inbox, int], redis: RedisServer, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The approval, the votes and the link's nonce are in Redis (sealed, taken with GETDEL): the
    replica that mailed the link need not be the one its form reaches, and a link votes once."""
    inbox, port = smtp
    shared = (
        f"sessions:\n  backend: redis\n  redis_url: {redis.url}\n  key_prefix: mail{secrets.token_hex(3)}\n"
        "  secret: test-sessions-secret-0123456789\n"
    )
    a_app, b_app = (create_app(parse_config(config(port) + shared, source="gateway.yaml", env={})) for _ in range(2))
    async with TestClient(TestServer(a_app)) as a, TestClient(TestServer(b_app)) as b:
        for app in (a_app, b_app):
            for agent in app[GATEWAY].agents:
                agent.probe.cancel()
        calls: list[str] = []

        async def decide(record: dict[str, Any], approved: bool, reason: str | None, deciders: list[dict[str, str]]) -> str:
            calls.append(record["id"])
            return "decided"

        monkeypatch.setattr(b_app[GATEWAY].cluster.approvals, "decide", decide)
        await waiting(a)
        await mails(inbox, 2)
        path = link_of(inbox.to("sup@example.com")[0])
        nonce = await form_nonce(b, path)
        answer = await b.post(path, data={"nonce": nonce, "decision": "approve"})
        assert answer.status == 200 and calls == ["gw-1"]
        again = await a.post(path, data={"nonce": nonce, "decision": "approve"})
        assert again.status == 410 and "used already" in await again.text()
