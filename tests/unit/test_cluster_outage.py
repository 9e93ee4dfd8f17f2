"""What a replica says while Redis is away, and after it came back empty (issue 13, defect 8).

- Retrying the inbox: backoff, and one log line when it is lost and one when it is back, not one
  per attempt.
- Readiness covers the restore window: after Redis lost its data, claims of chats it does not know
  are refused (503 "retry") for `owner_timeout`, and `/readyz` says so for that whole window.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import make_mocked_request

from gateway.edge.app import create_app, readyz
from gateway.cluster import redis_inbox as inbox_module
from gateway.ops.backoff import Backoff
from gateway.cluster.shared import SharedStateDown
from gateway.config.schema import parse_config
from gateway.edge.state import GATEWAY
from tests.support.shared_state import HEARTBEAT, redis_state
from tests.procs import RedisServer, redis_server
from tests.support.logs import RecordingLog



def test_backoff_doubles_up_to_its_cap_and_starts_over_after_a_success() -> None:
    backoff = Backoff(0.5, 5.0)
    assert [backoff.failed() for _ in range(7)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0]
    assert backoff.failing
    assert backoff.succeeded() == 7  # how many attempts had failed in a row
    assert not backoff.failing and backoff.succeeded() == 0
    assert backoff.failed() == 0.5
    for _ in range(5000):  # hours at the cap: no overflow
        assert backoff.failed() <= 5.0


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    with redis_server(tmp_path) as running:
        yield running


async def _until(predicate: Any, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def test_a_lost_inbox_is_logged_when_lost_and_when_back_and_retried_with_backoff(
    server: RedisServer, monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = RecordingLog()
    monkeypatch.setattr(inbox_module, "log", log)
    prefix = "inbox" + secrets.token_hex(3)
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    a, b = redis_state(server, "a", prefix), redis_state(server, "b", prefix)
    try:
        await a.start(inbox.put_nowait, lambda: [])
        await asyncio.to_thread(server.stop)
        # A second of outage: retrying every half heartbeat would be 20 attempts and 20 lines.
        await asyncio.sleep(1.0)
        assert len(log.named("inbox_reconnecting")) == 1
        await asyncio.to_thread(server.start)
        await _until(lambda: log.named("inbox_reconnected"))
        [lost], [back] = log.named("inbox_reconnecting"), log.named("inbox_reconnected")
        assert lost["reason"] and 2 <= back["failed_attempts"] <= 8, back
        # Back means back: a message sent now arrives.
        await b.start(lambda message: None, lambda: [])
        await b.send("a", {"op": "ping"})
        assert await asyncio.wait_for(inbox.get(), 5) == {"op": "ping"}
    finally:
        await a.close()
        await b.close()


# The gateway's owner_timeout, which is also the restore window after Redis came back empty: long
# enough that a loaded machine's thread handing Redis back does not outlast it before the test looks.
RESTORE_WINDOW = 2.0


@pytest.fixture
async def gateway_on(server: RedisServer) -> AsyncIterator[Any]:
    config = parse_config(
        "sessions:\n  backend: redis\n"
        f"  redis_url: {server.url}\n  key_prefix: ready{secrets.token_hex(3)}\n  secret: test-sessions-secret-0123456789\n"
        f"  heartbeat_interval: {HEARTBEAT}s\n  owner_timeout: {RESTORE_WINDOW}s\n",
        env={},
    )
    app = create_app(config)
    gateway = app[GATEWAY]
    gateway.agents.default.up = True  # readiness here is about the sessions store only
    await gateway.cluster.start()
    try:
        yield app
    finally:
        await gateway.cluster.close()


async def _readiness(app: Any) -> tuple[int, str]:
    answer = await readyz(make_mocked_request("GET", "/readyz", app=app))
    return answer.status, orjson.loads(answer.body)["status"]


async def test_readyz_is_503_for_as_long_as_claims_wait_for_the_restore(server: RedisServer, gateway_on: Any) -> None:
    app = gateway_on
    state = app[GATEWAY].cluster.state
    assert await _readiness(app) == (200, "ready")
    await asyncio.to_thread(server.stop)
    await _until(lambda: not state.available)
    assert await _readiness(app) == (503, "sessions_unavailable")
    await asyncio.to_thread(server.start)  # back, empty
    seen: list[tuple[int, str, str]] = []
    deadline = asyncio.get_running_loop().time() + 10
    while True:
        status, reason = await _readiness(app)
        try:
            await state.claim("bob", "chat-" + secrets.token_hex(4), agent="demo_agent", default_agent="demo_agent", ttl=60)
            outcome = "claimed"
        except SharedStateDown:
            outcome = "refused"
        seen.append((status, reason, outcome))
        if outcome == "claimed" and status == 200:
            break
        assert asyncio.get_running_loop().time() < deadline, seen
        await asyncio.sleep(0.02)
    # Ready means a new chat can be claimed; the restore window was seen, and said why.
    assert not [s for s in seen if s[0] == 200 and s[2] == "refused"], seen
    assert (503, "sessions_restoring", "refused") in seen, seen


async def test_the_chats_kept_states_are_written_back_after_redis_came_back_empty(server: RedisServer, gateway_on: Any) -> None:
    """The directory is written back after Redis lost its data, and so is each local chat's kept
    state: a replica that takes one of them over later still starts from its approvals."""
    from gateway.core.chat_events import NativeAnswered

    app = gateway_on
    gateway = app[GATEWAY]
    state = gateway.cluster.state
    chat = gateway.chats._registry.get("demo_agent", "alice", "chat-kept", now=0.0)  # noqa: SLF001 - a chat this replica runs
    chat.handle(NativeAnswered("adk-1", "call-1", timed_out=True))
    gateway.chats.states.changed(chat)
    await asyncio.sleep(0.1)
    assert await state.get_chat_state("alice", "chat-kept") == chat.machine.snapshot()
    await asyncio.to_thread(server.stop)
    await _until(lambda: not state.available)
    await asyncio.to_thread(server.start)  # back, empty
    kept = None
    deadline = asyncio.get_running_loop().time() + 10
    while kept is None and asyncio.get_running_loop().time() < deadline:
        try:
            kept = await state.get_chat_state("alice", "chat-kept")
        except SharedStateDown:
            pass
        await asyncio.sleep(0.05)
    assert kept == chat.machine.snapshot()
