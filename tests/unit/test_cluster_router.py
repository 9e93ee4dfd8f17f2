"""The router's side of a dead owner (gateway/cluster/router.py), on the memory backend with a 10 ms
heartbeat: each case takes milliseconds.

Replica "b" runs the router; "a" owns the chat and dies the moment it receives the forwarded
request (kill -9 of a replica with approvals pending, issue 25). An answer to an approval, the
whole request, is taken over and done here: what it answers is in ADK's session (confirm mode)
and ADK's session says whether it is still pending, so nothing runs twice. A new message is not:
the dead owner may have sent it to ADK already.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.chat.service import Attachment, ChatService
from gateway.cluster.liveness import OwnerLost
from gateway.cluster.memory import MemoryHub, MemoryState
from gateway.cluster.messages import Forwarded, Refused, Reply, Submit
from gateway.cluster.router import Cluster
from gateway.config.schema import parse_config
from gateway.core.chat_request import ChatRequest, parse_chat_body
from gateway.core.refusals import HttpError
from gateway.ops.metrics import GatewayMetrics
from tests.support.service import chat_service

CONFIG = """
sessions:
  heartbeat_interval: 10ms
  forward_timeout: 2s
"""
BOUND = 2.0
AGENT = "default"


@dataclass
class Pair:
    hub: MemoryHub
    owner: MemoryState
    cluster: Cluster
    agent: str
    # What ChatService.submit was asked here, and what the dead owner received before it died.
    submitted: list[ChatRequest] = field(default_factory=list)
    received: list[dict[str, Any]] = field(default_factory=list)
    # Set: the owner drains instead of dying, and lets go of the chat after that many requests.
    draining: int | None = None


@pytest.fixture
async def pair() -> AsyncIterator[Pair]:
    config = parse_config(CONFIG, env={})
    metrics = GatewayMetrics()
    chats = chat_service(config, metrics=metrics)
    hub = MemoryHub()
    owner, here = MemoryState("a", hub), MemoryState("b", hub)
    cluster = Cluster(here, chats, metrics)
    p = Pair(hub, owner, cluster, config.default)

    async def submit(agent: str, user_id: str, request: ChatRequest, claims: dict[str, Any] | None = None) -> Attachment:
        p.submitted.append(request)
        return Attachment(None, None)  # type: ignore[arg-type]  # what the router returns is all that is looked at

    chats.submit = submit  # type: ignore[method-assign]

    def dies_on_receipt(raw: dict[str, Any]) -> None:
        p.received.append(raw)
        if p.draining is not None:
            # Draining: new work is refused (forwarding.py), until the owner lets go of the chat.
            hub.inboxes["b"](Reply(raw["id"], Refused(503, "draining", "shutting down", {"Retry-After": "5"})).to_json())
            if len(p.received) == p.draining:
                del hub.chats[raw["body"]["id"]]  # what the drain's hand-over does
            return
        hub.inboxes.pop("a", None)  # kill -9: no reply, no heartbeat from now on

    await owner.start(dies_on_receipt, lambda: [])
    await cluster.start()
    try:
        yield p
    finally:
        await cluster.close()


def _request(chat: str, *, answer: bool) -> ChatRequest:
    messages: list[dict[str, Any]] = [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "pay 50 to Hanako"}]}]
    if answer:
        messages.append({"id": "m1", "role": "assistant", "parts": [{
            "type": "tool-process_payment", "toolCallId": "fc-1", "state": "approval-responded",
            "input": {"amount": 50, "recipient": "Hanako"}, "approval": {"id": "adk-1", "approved": True},
        }]})
    return parse_chat_body({"id": chat, "messages": messages}, version_header=None, default_version=6)


async def _owned_by_a(p: Pair, chat: str) -> None:
    claim = await p.owner.claim("alice", chat, agent=p.agent, default_agent=p.agent, ttl=60)
    assert claim.local


async def test_an_answer_forwarded_to_an_owner_that_dies_is_taken_over_and_done_here(pair: Pair) -> None:
    await _owned_by_a(pair, "c1")
    request = _request("c1", answer=True)
    async with asyncio.timeout(BOUND):
        await pair.cluster.submit(pair.agent, "alice", request)
    assert len(pair.received) == 1  # asked of the owner first, which died with it
    assert pair.submitted == [request]
    assert pair.hub.chats["c1"].owner == "b"


async def test_a_new_message_forwarded_to_an_owner_that_dies_is_503_not_sent_twice(pair: Pair) -> None:
    await _owned_by_a(pair, "c2")
    with pytest.raises(OwnerLost) as refused:
        async with asyncio.timeout(BOUND):
            await pair.cluster.submit(pair.agent, "alice", _request("c2", answer=False))
    assert (refused.value.status, refused.value.code) == (503, "replica_unavailable")
    assert pair.submitted == []


async def test_an_answer_refused_by_a_draining_owner_is_done_here_once_the_owner_lets_go(pair: Pair) -> None:
    """A rolling restart: the owner refuses new work while it drains, and lets go of the chats it
    runs nothing for; the answer waits for that (asking again) instead of failing with a 503."""
    pair.draining = 2
    await _owned_by_a(pair, "c5")
    request = _request("c5", answer=True)
    async with asyncio.timeout(BOUND):
        await pair.cluster.submit(pair.agent, "alice", request)
    assert len(pair.received) == 2
    assert pair.submitted == [request]
    assert pair.hub.chats["c5"].owner == "b"


async def test_a_new_message_refused_by_a_draining_owner_is_503_draining(pair: Pair) -> None:
    pair.draining = 100
    await _owned_by_a(pair, "c6")
    with pytest.raises(HttpError) as refused:
        async with asyncio.timeout(BOUND):
            await pair.cluster.submit(pair.agent, "alice", _request("c6", answer=False))
    assert (refused.value.status, refused.value.code) == (503, "draining")
    assert len(pair.received) == 1 and pair.submitted == []


async def test_a_resume_forwarded_to_an_owner_that_dies_is_taken_over_here(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page reloaded at the kill: nothing was running (confirm mode's approval ended its run),
    so the resume is this replica's: it asks ADK's session for a waiting message (here none: 204)
    rather than answering a 503 to retry."""
    asked: list[str] = []

    async def nothing_waits(agent: str, user_id: str, chat_id: str, version: object = None) -> None:
        asked.append(chat_id)

    monkeypatch.setattr(pair.cluster.chats, "resume_waiting", nothing_waits)
    await _owned_by_a(pair, "c3")
    async with asyncio.timeout(BOUND):
        assert await pair.cluster.resume(pair.agent, "alice", "c3") is None
    assert asked == ["c3"]
    assert len(pair.received) == 1
    assert pair.hub.chats["c3"].owner == "b"


async def test_a_resume_of_a_run_that_died_with_its_owner_is_410_run_lost(pair: Pair) -> None:
    await _owned_by_a(pair, "c4")
    await pair.owner.mark_run("alice", "c4", "msg-1")
    with pytest.raises(OwnerLost) as lost:
        async with asyncio.timeout(BOUND):
            await pair.cluster.resume(pair.agent, "alice", "c4")
    assert (lost.value.status, lost.value.code) == (410, "run_lost")


# ---- a draining owner hands its idle chats over -----------------------------------------------


@pytest.fixture
async def draining() -> AsyncIterator[tuple[Cluster, MemoryHub, ChatService]]:
    """Replica "a" alone on the hub, the owner of the chats the test makes."""
    config = parse_config(CONFIG, env={})
    metrics = GatewayMetrics()
    chats = chat_service(config, metrics=metrics)
    hub = MemoryHub()
    cluster = Cluster(MemoryState("a", hub), chats, metrics)
    await cluster.start()
    try:
        yield cluster, hub, chats
    finally:
        await cluster.close()


async def _local_chat(cluster: Cluster, chats: ChatService, chat_id: str, *, running: bool) -> None:
    agent = chats.config.default
    await cluster.state.claim("alice", chat_id, agent=agent, default_agent=agent, ttl=60)
    chat = chats._registry.get(agent, "alice", chat_id, now=0.0)
    if running:
        chat.machine.turn = SimpleNamespace(reported=False)  # type: ignore[assignment]  # all `running` reads


async def test_a_chat_a_request_just_reached_is_handed_over_only_once_that_request_had_time_to_start_its_run(
    draining: Any,
) -> None:
    """A request admitted just before the drain may still be asking ADK whether its answer is
    pending (it runs nothing yet): handing the chat over now would let the same answer, sent
    again to another replica, reach ADK twice."""
    cluster, hub, chats = draining
    await _local_chat(cluster, chats, "fresh", running=False)
    chats._registry.find_session("alice", "fresh").last_active = time.monotonic()  # type: ignore[union-attr]
    cluster.draining = True
    await asyncio.sleep(0.2)
    assert hub.chats["fresh"].owner == "a"
    async with asyncio.timeout(BOUND + 1):
        while "fresh" in hub.chats:
            await asyncio.sleep(0.01)


async def test_a_draining_owner_hands_over_the_chats_it_runs_nothing_for(draining: Any) -> None:
    """SIGTERM: a chat waiting on an ADK confirmation (confirm mode) holds nothing here, so the
    replica that gets its answer during the drain takes it (instead of a 503 `draining` from
    here until this replica has stopped); a chat whose run goes on stays until it ends."""
    cluster, hub, chats = draining
    await _local_chat(cluster, chats, "idle", running=False)
    await _local_chat(cluster, chats, "busy", running=True)
    cluster.draining = True
    async with asyncio.timeout(BOUND):
        while "idle" in hub.chats:
            await asyncio.sleep(0.01)
    assert hub.chats["busy"].owner == "a"

    # The run ends during the drain: its chat is handed over too, instead of marked idle.
    chats.run_changed(chats._registry.find_session("alice", "busy"), "")  # type: ignore[arg-type]
    async with asyncio.timeout(BOUND):
        while "busy" in hub.chats:
            await asyncio.sleep(0.01)


async def test_an_owner_that_is_not_draining_keeps_its_idle_chats(draining: Any) -> None:
    cluster, hub, chats = draining
    await _local_chat(cluster, chats, "idle", running=False)
    chats.run_changed(chats._registry.find_session("alice", "idle"), "")  # type: ignore[arg-type]
    await asyncio.sleep(0.05)
    assert hub.chats["idle"].owner == "a"


async def test_an_answer_that_reaches_its_owner_after_the_chat_was_taken_over_is_refused_there() -> None:
    """A busy owner (its event loop behind a burst) can miss its heartbeat: the asker takes the
    chat over and answers the approval itself. When the forwarded answer reaches the old owner
    afterwards, it must not send it to ADK as well: ADK runs the tool once per answer it gets
    (a payment made twice under a burst of 300 approvals)."""
    config = parse_config(CONFIG, env={})
    metrics = GatewayMetrics()
    chats = chat_service(config, metrics=metrics)
    submitted: list[ChatRequest] = []

    async def submit(agent: str, user_id: str, request: ChatRequest, claims: dict[str, Any] | None = None) -> Attachment:
        submitted.append(request)
        return Attachment(None, None)  # type: ignore[arg-type]

    chats.submit = submit  # type: ignore[method-assign]
    hub = MemoryHub()
    old, new = MemoryState("a", hub), MemoryState("b", hub)
    replies: list[dict[str, Any]] = []
    await new.start(replies.append, lambda: [])
    cluster = Cluster(old, chats, metrics)
    await cluster.start()
    try:
        assert (await new.claim("alice", "c9", agent=config.default, default_agent=config.default, ttl=60)).local
        request = _request("c9", answer=True)
        await cluster._forwarded.serve(Forwarded("b", "r1", Submit("alice", config.default, request.as_body())))  # type: ignore[attr-defined]
        assert submitted == []
        await asyncio.sleep(0)  # the reply is delivered as over a network: later
        [reply] = replies
        assert reply["error"]["code"] == "chat_moved", reply
    finally:
        await cluster.close()
        await new.close()
