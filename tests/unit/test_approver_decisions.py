"""What the cluster does with an ADK confirmation its approvers decide (`/run_sse`), between the
approvals API's directory, the deadline queue and the chat: a deadline's answer takes it out of the
listing at once; a decision whose chat is busy stays the approval's and is applied when the chat
frees, never replaced by `on_timeout`; and such confirmations count against the caps on waiting
calls (per chat, per user) as held calls do.

A real chat service on the scripted ADK (tests/support/adk.py) whose session holds a history, a real
cluster router on the memory backend (10 ms heartbeats), and the approval put in the directory as the
chat's replica puts it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

import gateway.cluster.approval_desk as approval_desk
from gateway.chat.service import ChatService
from gateway.cluster.memory import MemoryHub, MemoryState
from gateway.cluster.router import Cluster
from gateway.cluster.shared import SharedStateDown
from gateway.config.schema import parse_config
from gateway.core.approvals import REFUSAL_KEY, Verdict
from gateway.core.approver_confirmations import marked
from gateway.core.deadlines import Deadline
from gateway.ops.metrics import GatewayMetrics
from tests.unit.test_agents import body
from tests.support.adk import ScriptedAdk
from tests.support.chat import call_event
from tests.support.service import chat_service

CONFIG = """
internal:
  secret: test-secret
upstream:
  app_name: pay_app
sessions:
  heartbeat_interval: 10ms
  owner_timeout: 50ms
limits:
  max_pending_approvals_per_chat: 2
  max_pending_approvals_per_user: 2
approvers:
  api_keys:
    - {id: supervisor, key: k-supervisor}
  groups:
    supervisors: {users: [supervisor]}
tools:
  pay:
    approval: true
    timeout: 30s
    approvers: supervisors
    self_approval: false
"""
USER, CHAT, APPROVAL, CALL = "u", "chat-1", "adk-9", "c-1"
MARK = {"adk_gateway": {"approvers": {"approvers": "supervisors", "self_approval": False, "quorum": 1, "rule": None}}}
UNTIL = 5.0


def asked(approval_id: str = APPROVAL, call: str = CALL, at: float | None = None) -> list[dict[str, Any]]:
    """ADK's events of a `pay` call whose confirmation its approvers answer, asked at `at` (wall clock)."""
    stamp = {"timestamp": at} if at is not None else {}
    return [
        {"author": "a", "content": {"role": "model", "parts": [{"functionCall": {"id": call, "name": "pay", "args": {"amount": 9}}}]}},
        {"author": "a", "longRunningToolIds": [approval_id], **stamp, "content": {"role": "user", "parts": [{"functionCall": {
            "id": approval_id, "name": "adk_request_confirmation",
            "args": {"originalFunctionCall": {"id": call, "name": "pay", "args": {"amount": 9}},
                     "toolConfirmation": {"hint": "", "confirmed": False, "payload": MARK}},
        }}]}},
    ]


@dataclass
class Env:
    adk: ScriptedAdk
    chats: ChatService
    state: MemoryState
    cluster: Cluster
    metrics: GatewayMetrics


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    config = parse_config(CONFIG, env={})
    adk = ScriptedAdk(history=[])
    metrics = GatewayMetrics()
    metrics.know_agents(config)
    chats = chat_service(config, adk=adk, metrics=metrics)
    state = MemoryState("a", MemoryHub())
    cluster = Cluster(state, chats, metrics)
    await cluster.start()
    yield Env(adk, chats, state, cluster, metrics)
    for _ in range(4):
        adk.reads.put_nowait(None)
    await cluster.close()
    await chats.close()


async def listed(env: Env, *, due: float) -> dict[str, Any]:
    """The confirmation listed for its approvers, as the replica that ran the chat lists it, with its
    chat claimed in the shared directory (the deadline's answer goes where the chat runs)."""
    config = env.chats.config
    await env.state.claim(USER, CHAT, agent=config.default, default_agent=config.default, ttl=60)
    record = {
        "id": APPROVAL, "state": "pending", "agent": config.default, "app_name": "pay_app", "tool": "pay",
        "tool_call_id": CALL, "chat_id": CHAT, "requester": USER, "args": {"amount": 9}, "rule": None, "hint": None,
        "approvers": "supervisors", "self_approval": False, "quorum": 1, "votes": [], "created": due - 30,
        "deadline": due, "owner": "", "session": CHAT, "engine": approval_desk.CONFIRM_ENGINE,
    }
    await env.state.put_approval(record, ttl=max(due - time.time(), 0) + 60)
    return record


async def until(check: Any, what: str) -> None:
    deadline = time.monotonic() + UNTIL
    while not await check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


async def test_a_confirmation_answered_at_its_deadline_leaves_the_approvers_listing_at_once(env: Env) -> None:
    """Failed on merge-i38: ADK got the timeout's answer, but the approval stayed listed (and open
    to votes) until its record expired, a minute past the deadline."""
    now = time.time()
    env.adk.history = asked(at=now - 60)
    await listed(env, due=now - 30)
    await env.state.add_deadline(Deadline(env.chats.config.default, USER, CHAT, APPROVAL, CALL, "pay", now - 30))
    env.adk.reads.put_nowait(None)  # the timeout's run
    await until(lambda: _true(env.adk.answers()), "the deadline was answered")
    assert env.adk.answers() == [{"confirmed": False}]  # on_timeout: deny
    await until(lambda: _none(env.state.get_approval(APPROVAL)), "the approval left the directory")
    assert await env.state.list_approvals() == []


async def test_a_decision_whose_chat_is_busy_is_kept_and_applied_when_the_chat_frees(
    env: Env, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Failed on merge-i38: the approvers got 503 `chat_busy`, and the deadline later answered ADK
    with `on_timeout`: their decision was lost."""
    monkeypatch.setattr(approval_desk, "_BUSY_TRIES", 2)
    monkeypatch.setattr(approval_desk, "_BUSY_WAIT", 0.01)
    now = time.time()
    env.adk.history = asked(at=now - 1)
    record = await listed(env, due=now + 0.3)
    await env.state.add_deadline(Deadline(env.chats.config.default, USER, CHAT, APPROVAL, CALL, "pay", now + 0.3))
    # The requester chats on: a run streams (it never ends by itself here).
    await env.cluster.submit(env.chats.config.default, USER, body(CHAT))
    tally = await env.state.vote_approval(APPROVAL, "approver_key:supervisor", True, 1)
    assert tally.state == "decided_approved"
    deciders = [{"user": "supervisor", "auth": "approver_key"}]
    result = await env.cluster.approvals.decide(record, True, None, deciders)
    assert result == "queued"
    kept = await env.state.get_approval(APPROVAL)
    assert kept is not None and (kept["state"], kept["outcome"]) == ("decided", "approved")
    assert await env.state.list_approvals() == [], "decided: not listed for a vote any more"
    await asyncio.sleep(0.5)  # the approval's own deadline passes while the chat is busy
    assert env.adk.answers() == [], "nothing reaches ADK while its chat runs something else"
    env.adk.reads.put_nowait(None)  # the chat frees
    env.adk.reads.put_nowait(None)  # the decision's run
    await until(lambda: _true(env.adk.answers()), "the decision reached ADK")
    await until(lambda: _none(env.state.get_approval(APPROVAL)), "the approval left the directory")
    # The approvers' approval, not the deadline's `on_timeout` (a rejection); once.
    assert env.adk.answers() == [{"confirmed": True}]


async def test_a_decision_made_while_the_store_settles_is_applied_not_gone(
    env: Env, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Failed in `make chaos` (both replicas killed, the approval's second vote cast just after they
    were back): the chat's claim answered "settling, retry" (503: for `owner_timeout` after every
    replica was down no chat is taken over), and the desk took that for a chat that is gone: the
    approver read 410 `approval_gone` for an approval the store had just decided."""
    monkeypatch.setattr(approval_desk, "_BUSY_WAIT", 0.01)
    now = time.time()
    env.adk.history = asked(at=now - 1)
    record = await listed(env, due=now + 30)
    claim = env.state.claim
    settling = [SharedStateDown("the replicas are restoring the shared session store; retry in a moment")] * 2

    async def claim_after_settling(*args: Any, **kwargs: Any) -> Any:
        if settling:
            raise settling.pop()
        return await claim(*args, **kwargs)

    monkeypatch.setattr(env.state, "claim", claim_after_settling)
    tally = await env.state.vote_approval(APPROVAL, "approver_key:supervisor", True, 1)
    assert tally.state == "decided_approved"
    env.adk.reads.put_nowait(None)  # the decision's run
    result = await env.cluster.approvals.decide(record, True, None, [{"user": "supervisor", "auth": "approver_key"}])
    assert result == "decided" and settling == []
    await until(lambda: _true(env.adk.answers()), "the decision reached ADK")
    assert env.adk.answers() == [{"confirmed": True}]


async def _true(value: Any) -> bool:
    return bool(value)


async def _none(awaitable: Any) -> bool:
    return await awaitable is None


# ---- the caps on waiting calls -----------------------------------------------------------------


async def _ask(env: Env, call: str) -> tuple[Verdict, str]:
    """The plugin's ask about a `pay` call (plugin 0.3: it marks ADK's confirmation for approvers)."""
    return await env.cluster.gate(app_name="pay_app", user_id=USER, session_id=CHAT, tool_call_id=call, tool="pay",
                                  args={"amount": 9}, confirm=True, approvers=True)


def _refused(verdict: Verdict, reason: str, words: str) -> bool:
    response = verdict.response or {}
    return not verdict.run and not verdict.confirm and response.get(REFUSAL_KEY) == reason and words in response["error"]


async def test_confirmations_for_approvers_count_against_the_chats_cap(env: Env) -> None:
    """Failed on merge-i38: a chat could have any number of confirmations waiting for approvers."""
    default = env.chats.config.default
    attachment = await env.cluster.submit(default, USER, body(CHAT))
    env.adk.reads.put_nowait([*asked("adk-1", "c-1"), *asked("adk-2", "c-2")])
    env.adk.reads.put_nowait(None)  # the run ends with two confirmations for the approvers
    await until(lambda: _true(env.chats.desk_view.native_waiting(default, USER, CHAT, "adk-2")), "both wait")
    attachment.response.close()
    # The requester chats on (ADK's session keeps both), and the next run's call would be a third.
    again = {"id": "u2", "role": "user", "parts": [{"type": "text", "text": "and pay 9 more"}]}
    await env.cluster.submit(default, USER, body(CHAT, again))
    env.adk.reads.put_nowait([call_event("pay")])
    await asyncio.sleep(0.02)
    chat = env.chats.local_chats()[0]
    assert sorted(c.approval_id for c in chat.ledger.pending_native()) == ["adk-1", "adk-2"]
    verdict, result = await _ask(env, "c-3")
    assert result == "too_many_pending"
    assert _refused(verdict, "too_many_pending", "max_pending_approvals_per_chat"), verdict


async def test_confirmations_for_approvers_count_against_the_users_cap(env: Env) -> None:
    """Failed on merge-i38: the plugin was told to ask ADK's confirmation whatever its user had listed."""
    default = env.chats.config.default
    for n in (1, 2):  # listed in other chats of the same user (on any replica: the store counts)
        await env.state.put_approval({
            "id": f"adk-{n}", "agent": default, "tool": "pay", "requester": USER, "approvers": "supervisors",
            "created": time.time(), "engine": approval_desk.CONFIRM_ENGINE,
        }, ttl=60)
    await env.cluster.submit(default, USER, body(CHAT))
    env.adk.reads.put_nowait([call_event("pay")])
    await asyncio.sleep(0.02)
    verdict, result = await _ask(env, "c-3")
    assert result == "too_many_pending_user"
    assert _refused(verdict, "too_many_pending_user", "max_pending_approvals_per_user"), verdict
    assert env.metrics.registry.get_sample_value("adk_gateway_approvals_over_user_cap_total", {"agent": default}) == 1
    assert len(await env.state.list_approvals()) == 2, "nothing more listed"
    # Below the cap the same ask is ADK's confirmation, marked for the approvers.
    await env.state.drop_approval("adk-1")
    verdict, result = await _ask(env, "c-4")
    assert verdict.confirm and marked(verdict.payload) and result == "confirm", verdict
