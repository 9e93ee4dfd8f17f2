"""The Slack approvals channel (issue 41): the `notifications.slack` section, the messages, Slack's
request signature, and the whole round trip in process.

The gateway is the real app (create_app, the memory backend, aiohttp's test client); Slack is a local
stand-in for its Web API (`chat.postMessage`, `chat.update`: recorded, answered `{"ok": true, "ts": …}`
as Slack answers) and for a press's `response_url`. Presses are form-encoded `payload=` JSON of a
`block_actions` interaction, signed as Slack signs them (v0 HMAC-SHA256 of `v0:<timestamp>:<body>`).
The approval is listed as the chat's replica lists it (approval_desk.pending_record) and its notices
come through the chat service's `Notices`, as the chat reports them; the one stand-in on the gateway's
side is the chat that holds the call (the approvals room's port, `decide_for_approvers`): it takes a
decision once and reports it as the chat's gates do (those are tested in test_approver_calls.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.approvals.notice import ApprovalNotice, Approver
from gateway.approvals.slack import SlackChannel, message_key
from gateway.approvals.slack_blocks import ACTION_APPROVE, ACTION_DENY, Facts, ended_message, waiting_message
from gateway.cluster.approval_desk import pending_record
from gateway.cluster.shared import SharedState
from gateway.config.schema import ConfigError, ToolPolicy, parse_config
from gateway.core.approvals import GatedCall, Outcome
from gateway.edge.app import create_app
from gateway.edge.slack import signature_valid
from gateway.edge.state import GATEWAY, Gateway
from gateway.ops.logs import secret_values
from gateway.ops.metrics import GatewayMetrics
from tests.support.shared_state import pair, redis  # noqa: F401 - fixtures
from tests.support.waiting import until

SIGNING = "8f742231b10e8888abcd99yyyzzz85a5"
TOKEN = "xoxb-test-token-0001"
CONFIG = """
internal:
  secret: s3cret-s3cret-s3cret
upstream:
  url: http://adk.invalid:8000
  app_name: support_agent
auth:
  mode: api_key
  api_keys:
    - {id: alice, key: k-alice}
approvers:
  api_keys:
    - {id: supervisor, key: k-supervisor}
    - {id: lead, key: k-lead}
  groups:
    supervisors: {users: [supervisor, lead, alice]}
notifications:
  backoff: 10ms
  backoff_max: 50ms
  slack:
    bot_token: ${SLACK_BOT_TOKEN}
    signing_secret: ${SLACK_SIGNING_SECRET}
    channel: C0APPROVALS
    api_base: ${SLACK_STANDIN}/api
    response_url_prefix: ${SLACK_STANDIN}/actions/
    users: {U0SUPER: supervisor, U0LEAD: "approver_key:lead", U0ALICE: alice}
"""
REFUND = ToolPolicy.model_validate({"approval": True, "timeout": 300, "hint": "The card is credited.", "rules": [
    {"name": "large_refund", "when": "args.amount > 100", "decide": "ask", "approvers": "supervisors", "self_approval": False},
]})
ARGS = {"order_id": "1234", "amount": 250, "iban": "DE89-SECRET"}


# ---- Slack's signature ---------------------------------------------------------------------------


def test_the_signature_is_slacks_own_documented_example() -> None:
    """api.slack.com/authentication/verifying-requests-from-slack: its secret, timestamp, body and signature."""
    body = (b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V"
            b"&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text="
            b"&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN"
            b"&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c")
    signature = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"
    assert signature_valid(SIGNING.encode(), "1531420618", body, signature, now=1531420618 + 10)
    assert not signature_valid(SIGNING.encode(), "1531420618", body + b"x", signature, now=1531420618 + 10)
    assert not signature_valid(b"another-secret-0000000000", "1531420618", body, signature, now=1531420618 + 10)
    # Five minutes off, either way, is a replay.
    assert not signature_valid(SIGNING.encode(), "1531420618", body, signature, now=1531420618 + 301)
    assert not signature_valid(SIGNING.encode(), "1531420618", body, signature, now=1531420618 - 301)
    assert not signature_valid(SIGNING.encode(), "-1531420618", body, signature, now=1531420618)


# ---- the section ---------------------------------------------------------------------------------


ENV = {"SLACK_BOT_TOKEN": TOKEN, "SLACK_SIGNING_SECRET": SIGNING, "SLACK_STANDIN": "http://127.0.0.1:1"}


def test_the_section_loads_with_its_secrets_from_the_environment_and_never_shows_them() -> None:
    slack = parse_config(CONFIG, source="gateway.yaml", env=ENV).notifications.slack
    assert slack is not None and slack.bot_token.get_secret_value() == TOKEN
    assert TOKEN not in repr(slack) and SIGNING not in repr(slack) and SIGNING not in str(slack.model_dump())
    # Both among the secrets every log line is masked of.
    assert {TOKEN, SIGNING} <= set(secret_values(parse_config(CONFIG, source="gateway.yaml", env=ENV)))
    assert slack.api_base == "http://127.0.0.1:1/api" and not slack.include_args
    assert [str(slack.approver(parse_config(CONFIG, env=ENV).approvers, u)) for u in ("U0SUPER", "U0LEAD", "U0ALICE")] == [
        "approver_key:supervisor", "approver_key:lead", "api_key:alice"]


@pytest.mark.parametrize(("edit", "problem"), [
    (("U0ALICE: alice", "U0ALICE: jwt:alice"), "notifications.slack.users.U0ALICE: jwt:alice names an identity provider's user"),
    (("U0ALICE: alice", "U0ALICE: approver_key:nobody"), "notifications.slack.users.U0ALICE: approver_key:nobody: approvers.api_keys has no id nobody"),
    (("U0ALICE: alice", "alice: alice"), "'alice' is not a Slack user id"),
    (("channel: C0APPROVALS", "channel: C0APPROVALS\n    agents: [billing]"), "notifications.slack.agents: billing not among the agents"),
    (("${SLACK_SIGNING_SECRET}", "short"), "signing_secret is Slack's app signing secret"),
    (("${SLACK_STANDIN}/api", "ftp://slack.com/api"), "api_base and response_url_prefix is http(s)"),
])
def test_a_section_that_cannot_work_is_refused_naming_the_key(edit: tuple[str, str], problem: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(CONFIG.replace(*edit), source="gateway.yaml", env=ENV)
    assert problem in str(refused.value)


# ---- the messages --------------------------------------------------------------------------------


def notice(kind: str = "waiting", **changes: Any) -> ApprovalNotice:
    fields: dict[str, Any] = {"args": ARGS, "rule": "large_refund", "args_digest": "hmac-sha256:abc",
                              "asks": ("supervisors",), **changes}
    return ApprovalNotice(kind, "gw-1", "support", "support_agent", "issue_refund", "t1", "chat-1",  # type: ignore[arg-type]
                          "alice", at=1_800_000_000.0, **fields)


FACTS = Facts("supervisors", 2, 1_800_000_300.0, "The card is credited.")


def texts(message: dict[str, Any]) -> str:
    return json.dumps(message["blocks"])


def test_a_waiting_message_shows_the_call_and_buttons_valued_with_the_approval_id_but_not_the_arguments() -> None:
    message = waiting_message(notice(), FACTS, requester="alice", include_args=False)
    [actions] = [b for b in message["blocks"] if b["type"] == "actions"]
    assert [(e["action_id"], e["value"], e["style"]) for e in actions["elements"]] == [
        (ACTION_APPROVE, "gw-1", "primary"), (ACTION_DENY, "gw-1", "danger")]
    shown = texts(message)
    for fact in ("issue_refund", "support", "alice", "large_refund", "2 of supervisors", "<!date^1800000300^",
                 "hmac-sha256:abc", "The card is credited."):
        assert fact in shown, fact
    assert "DE89-SECRET" not in shown and "DE89-SECRET" not in message["text"]
    with_args = texts(waiting_message(notice(), FACTS, requester=None, include_args=True))
    assert "DE89-SECRET" in with_args and "alice" not in with_args and "_not shown_" in with_args


def test_markup_in_what_the_model_or_a_user_wrote_is_shown_as_text() -> None:
    shown = texts(waiting_message(notice(args={"note": "<!channel> & <@U0SUPER>"}), FACTS, requester="<!here>", include_args=True))
    assert "<!channel>" not in shown and "<!here>" not in shown and "&lt;!channel&gt; &amp; &lt;@U0SUPER&gt;" in shown


def test_an_ended_message_says_how_and_by_whom_without_buttons() -> None:
    decided = notice("decided", source="approver", outcome="denied", reason="not today",
                     approvers=(Approver("supervisor", "slack"),))
    message = ended_message(decided, FACTS, requester="alice", include_args=False, who=lambda a: f"<@{a.user}>")
    assert not [b for b in message["blocks"] if b["type"] == "actions"]
    assert "*Denied* by <@supervisor>\\n>not today" in texts(message)
    expired = ended_message(notice("expired", source="timeout", outcome="timeout"), FACTS, requester="alice",
                            include_args=False, who=str)
    assert "Expired: nobody decided before the deadline*" in texts(expired)


# ---- the round trip ------------------------------------------------------------------------------


@dataclass
class Slack:
    """The stand-in: every Web API call and every response_url post, in order; `fail` answers first."""

    calls: list[tuple[str, dict[str, Any], str]] = field(default_factory=list)
    responses: list[dict[str, Any]] = field(default_factory=list)
    fail: list[int] = field(default_factory=list)
    base: str = ""

    def of(self, method: str) -> list[dict[str, Any]]:
        return [body for name, body, _ in self.calls if name == method]


@pytest.fixture
async def slack() -> AsyncIterator[Slack]:
    standin = Slack()

    async def api(request: web.Request) -> web.Response:
        if standin.fail:
            return web.Response(status=standin.fail.pop(0), headers={"Retry-After": "0"})
        body = await request.json()
        standin.calls.append((request.match_info["method"], body, request.headers.get("Authorization", "")))
        return web.json_response({"ok": True, "channel": body["channel"], "ts": body.get("ts", "1800000000.000100")})

    async def response_url(request: web.Request) -> web.Response:
        standin.responses.append(await request.json())
        return web.Response(status=200)

    app = web.Application()
    app.add_routes([web.post("/api/{method}", api), web.post("/actions/{path:.*}", response_url)])
    server = TestServer(app)
    await server.start_server()
    standin.base = str(server.make_url("")).rstrip("/")
    yield standin
    await server.close()


@dataclass
class HeldChat:
    """The chat that holds the call (the approvals room's port): decides it once, reports it as its gates do."""

    gateway: Gateway
    call: GatedCall
    decisions: list[dict[str, Any]] = field(default_factory=list)

    def decide_for_approvers(self, *, approved: bool, reason: str | None, deciders: list[dict[str, str]], **_: Any) -> str:
        self.decisions.append({"approved": approved, "deciders": deciders})
        if self.call.outcome is not None:
            return "already"
        self.call.outcome = Outcome.APPROVED if approved else Outcome.DENIED
        self.call.decided_by, self.call.deciders, self.call.reason = "approver", deciders, reason
        self.gateway.chats.notices.call_released(self.gateway.config.default, self.call, waited=1.0)
        return "decided"


@dataclass
class Env:
    client: TestClient
    gateway: Gateway
    slack: Slack
    chat: HeldChat


async def waiting(env: Env, quorum: int = 1) -> str:
    """A refund waits for the supervisors: listed as its chat's replica lists it, then reported."""
    call, gateway = env.chat.call, env.gateway
    call.quorum = quorum
    record = pending_record(call, agent=gateway.config.default, app_name="support_agent",
                            owner=gateway.cluster.state.replica_id, wall=time.time(), now=time.monotonic())
    await gateway.cluster.state.put_approval(record, ttl=600)
    gateway.chats.notices.call_waiting(gateway.config.default, call)
    await until(lambda: len(env.slack.of("chat.postMessage")) == 1, timeout=5)
    for _ in range(500):  # where the message is, kept in the shared store for whichever replica updates it
        if await gateway.cluster.state.get_call(message_key(call.id)) is not None:
            return call.id
        await asyncio.sleep(0.01)
    raise AssertionError("the message's place was not kept")


@pytest.fixture
async def env(slack: Slack, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Env]:
    config = parse_config(CONFIG, source="gateway.yaml", env={**ENV, "SLACK_STANDIN": slack.base})
    app = create_app(config)
    client = TestClient(TestServer(app))
    await client.start_server()
    gateway = app[GATEWAY]
    for agent in gateway.agents:
        agent.probe.cancel()  # no ADK: nothing here reaches one
    # The chat service's clock: the gateway's monotonic one.
    call = GatedCall.open(user_id="alice", chat_id="chat-1", session_id="chat-1", tool_call_id="t1", tool="issue_refund",
                          args=ARGS, policy=REFUND, now=time.monotonic())
    call.rule, call.approvers, call.self_approval = "large_refund", "supervisors", False
    chat = HeldChat(gateway, call)
    monkeypatch.setattr(gateway.chats.desk_view, "decide_for_approvers", chat.decide_for_approvers)
    yield Env(client, gateway, slack, chat)
    await client.close()


def press(env: Env, slack_user: str, approval_id: str, action: str = ACTION_APPROVE) -> bytes:
    """A button press as Slack posts it (api.slack.com/reference/interaction-payloads/block-actions-payload)."""
    payload = {
        "type": "block_actions", "team": {"id": "T0TEAM", "domain": "example"},
        "user": {"id": slack_user, "username": "someone", "name": "someone", "team_id": "T0TEAM"},
        "api_app_id": "A0APP", "token": "deprecated-verification-token", "trigger_id": "1.2.3",
        "container": {"type": "message", "message_ts": "1800000000.000100", "channel_id": "C0APPROVALS", "is_ephemeral": False},
        "channel": {"id": "C0APPROVALS", "name": "approvals"},
        "response_url": f"{env.slack.base}/actions/T0TEAM/123/secret-part",
        "actions": [{"type": "button", "action_id": action, "block_id": "adk_gateway.answer", "value": approval_id,
                     "text": {"type": "plain_text", "text": "Approve"}, "action_ts": "1800000001.000200"}],
    }
    return urlencode({"payload": json.dumps(payload)}).encode()


async def send(env: Env, body: bytes, *, secret: str = SIGNING, at: float | None = None) -> int:
    stamp = str(int(time.time() if at is None else at))
    signature = "v0=" + hmac.new(secret.encode(), f"v0:{stamp}:".encode() + body, hashlib.sha256).hexdigest()
    answer = await env.client.post("/api/slack/interactions", data=body, headers={
        "Content-Type": "application/x-www-form-urlencoded", "X-Slack-Request-Timestamp": stamp, "X-Slack-Signature": signature})
    return answer.status


async def votes(env: Env, approval_id: str) -> list[dict[str, Any]]:
    record = await env.gateway.cluster.state.get_approval(approval_id)
    assert record is not None
    return record["votes"]  # type: ignore[no-any-return]


async def test_a_press_of_approve_decides_and_the_message_says_so_without_buttons(env: Env) -> None:
    approval_id = await waiting(env)
    [posted] = env.slack.of("chat.postMessage")
    assert env.slack.calls[0][2] == f"Bearer {TOKEN}" and posted["channel"] == "C0APPROVALS"
    [actions] = [b for b in posted["blocks"] if b["type"] == "actions"]
    assert {e["value"] for e in actions["elements"]} == {approval_id}
    assert "DE89-SECRET" not in json.dumps(posted)  # include_args is off: the digest only
    started = time.monotonic()
    assert await send(env, press(env, "U0SUPER", approval_id)) == 200
    assert time.monotonic() - started < 3  # Slack's bound
    await until(lambda: len(env.slack.of("chat.update")) == 1, timeout=5)
    assert env.chat.decisions == [{"approved": True, "deciders": [{"user": "supervisor", "auth": "slack"}]}]
    [updated] = env.slack.of("chat.update")
    assert (updated["channel"], updated["ts"]) == ("C0APPROVALS", "1800000000.000100")
    assert not [b for b in updated["blocks"] if b["type"] == "actions"]
    assert "*Approved* by <@U0SUPER>" in json.dumps(updated["blocks"])
    await until(lambda: len(env.slack.responses) == 1, timeout=5)
    assert env.slack.responses == [{"response_type": "ephemeral", "replace_original": False, "text": "You approved this call."}]


async def test_a_bad_signature_or_a_stale_timestamp_is_401_and_decides_nothing(env: Env) -> None:
    approval_id = await waiting(env)
    body = press(env, "U0SUPER", approval_id)
    assert await send(env, body, secret="not-the-signing-secret-000") == 401
    assert await send(env, body, at=time.time() - 301) == 401
    assert await send(env, body, at=time.time() + 301) == 401
    unsigned = await env.client.post("/api/slack/interactions", data=body)
    assert unsigned.status == 401 and (await unsigned.json())["error"]["code"] == "invalid_signature"
    await asyncio.sleep(0.1)
    assert await votes(env, approval_id) == [] and env.chat.decisions == [] and env.slack.responses == []


async def test_a_slack_user_who_is_not_mapped_is_told_so_and_decides_nothing(env: Env) -> None:
    approval_id = await waiting(env)
    assert await send(env, press(env, "U0STRANGER", approval_id)) == 200
    await until(lambda: len(env.slack.responses) == 1, timeout=5)
    assert "not an approver" in env.slack.responses[0]["text"] and env.slack.responses[0]["response_type"] == "ephemeral"
    assert await votes(env, approval_id) == [] and env.chat.decisions == []


async def test_the_requester_mapped_in_slack_is_held_to_four_eyes(env: Env) -> None:
    approval_id = await waiting(env)
    assert await send(env, press(env, "U0ALICE", approval_id)) == 200
    await until(lambda: len(env.slack.responses) == 1, timeout=5)
    assert env.slack.responses[0]["text"].startswith("You asked for this call yourself")
    assert await votes(env, approval_id) == [] and env.chat.decisions == []


async def test_decided_through_the_api_the_message_is_updated_and_a_late_press_is_already_decided(env: Env) -> None:
    approval_id = await waiting(env)
    answer = await env.client.post(f"/api/approvals/{approval_id}", json={"approved": False, "reason": "not today"},
                                   headers={"Authorization": "Bearer k-lead"})
    assert answer.status == 200, await answer.text()
    await until(lambda: len(env.slack.of("chat.update")) == 1, timeout=5)
    shown = json.dumps(env.slack.of("chat.update")[0]["blocks"])
    assert "*Denied* by lead (approver_key)" in shown and "not today" in shown
    assert await send(env, press(env, "U0SUPER", approval_id)) == 200
    await until(lambda: len(env.slack.responses) == 1, timeout=5)
    assert env.slack.responses[0]["text"].startswith("This approval was already decided")
    assert len(env.chat.decisions) == 1 and len(env.slack.of("chat.update")) == 1


async def test_a_quorum_of_two_takes_one_slack_vote_and_one_api_vote(env: Env) -> None:
    approval_id = await waiting(env, quorum=2)
    assert "2 of supervisors" in json.dumps(env.slack.of("chat.postMessage")[0]["blocks"])
    assert await send(env, press(env, "U0SUPER", approval_id)) == 200
    await until(lambda: len(env.slack.responses) == 1, timeout=5)
    assert env.slack.responses[0]["text"] == "Your approval is counted (1 of 2 needed)."
    assert env.chat.decisions == [] and env.slack.of("chat.update") == []
    # The same person again through Slack counts once.
    assert await send(env, press(env, "U0SUPER", approval_id)) == 200
    await until(lambda: len(env.slack.responses) == 2, timeout=5)
    assert env.slack.responses[1]["text"] == "You already answered this approval."
    answer = await env.client.post(f"/api/approvals/{approval_id}", json={"approved": True}, headers={"Authorization": "Bearer k-lead"})
    assert answer.status == 200 and (await answer.json())["state"] == "decided"
    assert env.chat.decisions == [{"approved": True, "deciders": [
        {"user": "lead", "auth": "approver_key"}, {"user": "supervisor", "auth": "approver_key"}]}]
    await until(lambda: len(env.slack.of("chat.update")) == 1, timeout=5)


async def test_what_the_chatting_user_answers_is_never_posted_nor_updated(env: Env) -> None:
    call, state = env.chat.call, env.gateway.cluster.state
    # Even with the id listed and a message kept for it: the notices alone say whose the call is.
    await state.put_approval(pending_record(call, agent=env.gateway.config.default, app_name="support_agent",
                                            owner=state.replica_id, wall=time.time(), now=time.monotonic()), ttl=600)
    await state.put_call(message_key(call.id), {"channel": "C0APPROVALS", "ts": "1.2", "group": "supervisors",
                                                "quorum": "1", "deadline": "1800000300.0"}, ttl=600)
    call.approvers = None
    env.gateway.chats.notices.call_waiting(env.gateway.config.default, call)
    call.outcome = Outcome.APPROVED
    env.gateway.chats.notices.call_released(env.gateway.config.default, call, waited=1.0)
    await asyncio.sleep(0.2)
    assert env.slack.calls == []


async def test_an_approval_told_waiting_again_is_not_posted_twice(env: Env) -> None:
    """A replica that takes the chat over (or ADK's run that asks again) reports it waiting anew."""
    await waiting(env)
    env.gateway.chats.notices.call_waiting(env.gateway.config.default, env.chat.call)
    await asyncio.sleep(0.2)
    assert len(env.slack.of("chat.postMessage")) == 1


async def test_slack_throttling_is_retried_after_its_retry_after_and_counted(env: Env) -> None:
    env.slack.fail[:] = [429, 503]
    await waiting(env)
    metrics = env.gateway.metrics.registry
    assert metrics.get_sample_value("adk_gateway_webhook_attempts_total", {"webhook": "@slack", "outcome": "429"}) == 1
    assert metrics.get_sample_value("adk_gateway_webhook_attempts_total", {"webhook": "@slack", "outcome": "5xx"}) == 1
    assert metrics.get_sample_value(
        "adk_gateway_webhook_deliveries_total", {"webhook": "@slack", "event": "waiting", "result": "delivered"}) == 1
    assert metrics.get_sample_value(
        "adk_gateway_webhook_deliveries_total", {"webhook": "@slack", "event": "expired", "result": "failed"}) == 0


async def test_the_replica_that_reports_the_decision_updates_the_message_another_posted(
    slack: Slack, pair: tuple[SharedState, SharedState],
) -> None:
    """Where the message is lives in the shared store (sealed in Redis): replica b, which took the chat
    over, updates what replica a posted; on both backends (tests/support/shared_state.py)."""
    config = parse_config(CONFIG, source="gateway.yaml", env={**ENV, "SLACK_STANDIN": slack.base})
    a, b = pair
    record = {"id": "gw-1", "state": "pending", "agent": config.default, "tool": "issue_refund", "requester": "alice",
              "approvers": "supervisors", "quorum": 1, "deadline": time.time() + 300, "created": time.time(), "votes": [],
              "owner": "a"}
    await a.put_approval(record, ttl=600)
    metrics = GatewayMetrics()
    channels = [SlackChannel(lambda: config, state, metrics) for state in (a, b)]
    for channel in channels:
        channel.start()
    try:
        channels[0].notify(notice())
        await until(lambda: len(slack.of("chat.postMessage")) == 1, timeout=5)
        for _ in range(500):
            if await b.get_call(message_key("gw-1")) is not None:
                break
            await asyncio.sleep(0.01)
        channels[1].notify(notice("decided", source="approver", outcome="approved", approvers=(Approver("supervisor", "slack"),)))
        await until(lambda: len(slack.of("chat.update")) == 1, timeout=5)
        assert slack.of("chat.update")[0]["ts"] == "1800000000.000100"
        assert "*Approved* by <@U0SUPER>" in json.dumps(slack.of("chat.update")[0]["blocks"])
    finally:
        for channel in channels:
            await channel.stop(1.0)
