"""The approvers' two channels together (issue 41): Slack and mail are notifications of the one
approval record, and both vote through the approvals API's own vote (edge/approvals_api.py
`cast_vote`, after its rate, `spend_rate`): votes from the API, a Slack press and a mailed link add up
to one quorum, the first decision from any of them wins and a later one is told "already decided",
and a person's rate is one bucket whichever channel they vote through. A replica's stop gives the
webhooks, Slack and mail one bound, alongside.

The gateway is the real app with both sections set; Slack is test_slack.py's local stand-in and mail
test_email_approvals.py's real SMTP server (aiosmtpd); the chat that holds the call is test_slack.py's
`HeldChat` (it takes a decision once and reports it as the chat's gates do).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.approvals.email_links import nonce_key
from gateway.cluster.approval_desk import pending_record
from gateway.config.schema import parse_config
from gateway.core.approvals import GatedCall
from gateway.edge.app import create_app
from gateway.edge.state import GATEWAY
from tests.support.waiting import until
from tests.unit.test_email_approvals import BASE, SIGNING_KEY, Inbox, form_nonce, link_of, mails, smtp_server
from tests.unit.test_slack import ARGS, CONFIG, ENV, REFUND, Env, HeldChat, Slack, press, send, slack, waiting

__all__ = ["slack"]  # test_slack.py's stand-in, a fixture here too

EMAIL = """
  email:
    smtp: {{host: 127.0.0.1, port: {port}, starttls: false}}
    from: gateway@example.com
    link_base: {base}
    signing_key: {key}
    recipients: {{supervisor: sup@example.com, "approver_key:lead": lead@example.com}}
"""
# A person's burst is one vote: the second, through any channel, is over their rate.
TIGHT = "limits: {rate_per_user: 0.01, burst_per_user: 1}\n"


@dataclass
class Channels(Env):
    inbox: Inbox


async def channels(slack: Slack, monkeypatch: pytest.MonkeyPatch, *, extra: str = "") -> AsyncIterator[Channels]:
    with smtp_server() as (inbox, port):
        text = CONFIG + EMAIL.format(port=port, base=BASE, key=SIGNING_KEY) + extra
        app = create_app(parse_config(text, source="gateway.yaml", env={**ENV, "SLACK_STANDIN": slack.base}))
        client = TestClient(TestServer(app))
        await client.start_server()
        gateway = app[GATEWAY]
        for agent in gateway.agents:
            agent.probe.cancel()  # no ADK: nothing here reaches one
        call = GatedCall.open(user_id="alice", chat_id="chat-1", session_id="chat-1", tool_call_id="t1",
                              tool="issue_refund", args=ARGS, policy=REFUND, now=time.monotonic())
        call.rule, call.approvers, call.self_approval = "large_refund", "supervisors", False
        chat = HeldChat(gateway, call)
        monkeypatch.setattr(gateway.chats.desk_view, "decide_for_approvers", chat.decide_for_approvers)
        env = Channels(client, gateway, slack, chat, inbox)
        try:
            yield env
        finally:
            await client.close()


@pytest.fixture
async def env(slack: Slack, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Channels]:
    async for made in channels(slack, monkeypatch):
        yield made


@pytest.fixture
async def tight(slack: Slack, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Channels]:
    async for made in channels(slack, monkeypatch, extra=TIGHT):
        yield made


async def mailed(env: Channels, quorum: int = 1) -> tuple[str, str]:
    """A refund waits for the supervisors, posted to Slack and mailed to both: its id and the lead's link."""
    approval_id = await waiting(env, quorum)
    await mails(env.inbox, 2)
    return approval_id, link_of(env.inbox.to("lead@example.com")[0])


async def vote_by_link(env: Channels, path: str, decision: str = "approve") -> tuple[int, str]:
    nonce = await form_nonce(env.client, path)
    answer = await env.client.post(path, data={"nonce": nonce, "decision": decision}, headers={"Origin": BASE})
    return answer.status, await answer.text()


async def test_a_slack_press_and_a_mailed_link_make_one_quorum_and_a_late_api_vote_is_409(env: Channels) -> None:
    approval_id, lead = await mailed(env, quorum=2)
    assert await send(env, press(env, "U0SUPER", approval_id)) == 200
    await until(lambda: len(env.slack.responses) == 1, timeout=5)
    assert env.slack.responses[0]["text"] == "Your approval is counted (1 of 2 needed)."
    assert env.chat.decisions == []
    status, page = await vote_by_link(env, lead)
    assert status == 200 and "You approved the call" in page
    # One decision, by both: the link's voter as the mail authenticated them, the earlier vote by its principal's source.
    assert env.chat.decisions == [{"approved": True, "deciders": [
        {"user": "lead", "auth": "email"}, {"user": "supervisor", "auth": "approver_key"}]}]
    await until(lambda: len(env.slack.of("chat.update")) == 1, timeout=5)
    assert "*Approved* by lead (email)" in str(env.slack.of("chat.update")[0]["blocks"])
    late = await env.client.post(f"/api/approvals/{approval_id}", json={"approved": False}, headers={"Authorization": "Bearer k-supervisor"})
    assert late.status in (404, 409) and len(env.chat.decisions) == 1


async def test_the_first_decision_wins_whichever_channel_it_came_through(env: Channels) -> None:
    approval_id, lead = await mailed(env)
    status, page = await vote_by_link(env, lead, "deny")
    assert status == 200 and "You denied the call" in page
    assert await send(env, press(env, "U0SUPER", approval_id)) == 200
    await until(lambda: len(env.slack.responses) == 1, timeout=5)
    assert env.slack.responses[0]["text"].startswith("This approval was already decided")
    supervisor = link_of(env.inbox.to("sup@example.com")[0])
    opened = await env.client.get(supervisor)
    assert opened.status in (409, 410) and "already decided" in await opened.text()
    assert env.chat.decisions == [{"approved": False, "deciders": [{"user": "lead", "auth": "email"}]}]


async def test_a_persons_rate_is_one_bucket_across_the_api_slack_and_mail(tight: Channels) -> None:
    env = tight
    approval_id, _ = await mailed(env, quorum=2)
    counted = await env.client.post(f"/api/approvals/{approval_id}", json={"approved": True}, headers={"Authorization": "Bearer k-supervisor"})
    assert counted.status == 200 and (await counted.json())["state"] == "pending"
    # The same approver key's holder, pressing in Slack: their token is spent already.
    assert await send(env, press(env, "U0SUPER", approval_id)) == 200
    await until(lambda: len(env.slack.responses) == 1, timeout=5)
    assert env.slack.responses[0]["text"].startswith("Too many answers")
    # And from their mailed link: refused for the rate, the link is not spent.
    path = link_of(env.inbox.to("sup@example.com")[0])
    status, page = await vote_by_link(env, path)
    assert status == 429 and "nothing was decided" in page
    nonce = await form_nonce(env.client, path)
    assert await env.gateway.cluster.state.take_ticket(nonce_key(nonce)) is not None
    # A chatting user mapped in Slack votes from their chat bucket (by where their id comes from,
    # not by the channel): alice's refused API vote spent the token her press would have.
    refused = await env.client.post(f"/api/approvals/{approval_id}", json={"approved": True}, headers={"Authorization": "Bearer k-alice"})
    assert refused.status == 403
    assert await send(env, press(env, "U0ALICE", approval_id)) == 200
    await until(lambda: len(env.slack.responses) == 2, timeout=5)
    assert env.slack.responses[1]["text"].startswith("Too many answers")
    assert env.chat.decisions == []


async def test_a_stop_gives_webhooks_slack_and_mail_their_one_bound_alongside(monkeypatch: pytest.MonkeyPatch) -> None:
    """A receiver that never answers holds each of the three; the replica's stop still ends within
    the bound they share (2 s, edge/app.py), not one bound after the other, and counts what it dropped."""
    hung: list[str] = []

    async def never(request: web.Request) -> web.Response:
        hung.append(request.path)
        await asyncio.sleep(60)
        return web.Response()

    standin = web.Application()
    standin.add_routes([web.post("/{path:.*}", never)])
    with socket.socket() as smtp:  # listens, never greets: a session waits for its timeout
        smtp.bind(("127.0.0.1", 0))
        smtp.listen(8)
        async with TestServer(standin) as receiver:
            base = str(receiver.make_url("")).rstrip("/")
            hook = f"  webhooks:\n    - {{name: ops, url: '{base}/hook', secret: '{'w' * 24}'}}\n"
            text = CONFIG.replace("  backoff: 10ms\n", hook + "  backoff: 10ms\n") + EMAIL.format(
                port=smtp.getsockname()[1], base=BASE, key=SIGNING_KEY).replace("starttls: false", "starttls: false, timeout: 5s")
            app = create_app(parse_config(text, source="gateway.yaml", env={**ENV, "SLACK_STANDIN": base}))
            client = TestClient(TestServer(app))
            await client.start_server()
            gateway = app[GATEWAY]
            for agent in gateway.agents:
                agent.probe.cancel()
            call = GatedCall.open(user_id="alice", chat_id="chat-1", session_id="chat-1", tool_call_id="t1",
                                  tool="issue_refund", args=ARGS, policy=REFUND, now=time.monotonic())
            call.rule, call.approvers, call.self_approval = "large_refund", "supervisors", False
            await gateway.cluster.state.put_approval(pending_record(
                call, agent=gateway.config.default, app_name="support_agent", owner=gateway.cluster.state.replica_id,
                wall=time.time(), now=time.monotonic()), ttl=600)
            gateway.chats.notices.call_waiting(gateway.config.default, call)
            await until(lambda: sorted(hung) == ["/api/chat.postMessage", "/hook"], timeout=5)
            await asyncio.sleep(0.3)  # the mail's session is connected by now, waiting for a greeting
            assert gateway.email.pending == 1
            started = time.monotonic()
            await client.close()
            assert time.monotonic() - started < 3.0  # one after the other, 3 x 1.6 s
    metrics = gateway.metrics.registry
    assert metrics.get_sample_value("adk_gateway_approval_emails_total", {"result": "dropped"}) == 1
    for webhook in ("ops", "@slack"):
        assert metrics.get_sample_value(
            "adk_gateway_webhook_deliveries_total", {"webhook": webhook, "event": "waiting", "result": "dropped"}) == 1, webhook
