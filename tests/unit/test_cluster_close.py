"""Every way a replica leaves the cluster ends within a bound (issue 13, defect 2).

A cancellation can be lost below the cluster: on Python 3.11, `asyncio.wait_for` (which redis-py
uses to send every command) returns the result of a call that completed as the cancellation
arrived, and the cancellation is gone. A task of the cluster's that lost one must still stop, and
`close()` must not wait without a bound for a task that does not; nor for a Redis that does not
answer, or is not there.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.cluster import redis as redis_module
from gateway.ops import stopping as stopping_module
from gateway.cluster.memory import MemoryHub, MemoryState
from gateway.cluster.redis import RedisState
from gateway.cluster.router import Cluster
from gateway.cluster.shared import SharedState
from gateway.config.schema import parse_config
from gateway.ops.metrics import GatewayMetrics
from gateway.chat.registry import Chat
from tests.support.logs import RecordingLog
from tests.support.shared_state import redis_state
from tests.support.service import chat_service
from tests.procs import RedisServer, redis_server

# What close() may take at most in these tests: its own bounds are about a second per step.
CLOSE_BOUND = 4.0


class StuckMarks(MemoryState):
    """A store whose run-mark write blocks until cancelled, then loses the cancellation the way
    wait_for does: `swallow` times (None: every time, and it never returns)."""

    def __init__(self, replica_id: str, hub: MemoryHub, swallow: int | None) -> None:
        super().__init__(replica_id, hub)
        self.swallow = swallow
        self.writing = asyncio.Event()

    async def mark_run(self, user_id: str, chat_id: str, message_id: str) -> None:
        self.writing.set()
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if self.swallow is None:
                    continue
                if self.swallow > 0:
                    self.swallow -= 1
                    return
                raise


def cluster_on(state: SharedState, config_text: str = "") -> Cluster:
    config = parse_config(config_text, env={})
    metrics = GatewayMetrics()
    chats = chat_service(config, metrics=metrics)
    return Cluster(state, chats, metrics)


async def _close_within(close: Any, bound: float) -> None:
    async with asyncio.timeout(bound):
        await close()


async def test_a_cancellation_lost_inside_a_store_call_does_not_hang_close() -> None:
    hub = MemoryHub()
    state = StuckMarks("a", hub, swallow=1)
    cluster = cluster_on(state)
    await cluster.start()
    cluster.chats.run_changed(Chat("alice", "c1", "s1", 0.0), "msg-1")
    await state.writing.wait()
    # The mark-writer loses close()'s cancellation, as it did inside a Redis call in the issue.
    await _close_within(cluster.close, CLOSE_BOUND)
    assert "a" not in hub.inboxes  # the store was left: other replicas see this one gone


async def test_close_gives_up_on_a_task_that_never_stops_and_still_leaves_the_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = RecordingLog()
    monkeypatch.setattr(stopping_module, "log", log)
    hub = MemoryHub()
    state = StuckMarks("a", hub, swallow=None)
    cluster = cluster_on(state)
    await cluster.start()
    cluster.chats.run_changed(Chat("alice", "c1", "s1", 0.0), "msg-1")
    await state.writing.wait()
    writer = next(t for t in asyncio.all_tasks() if t.get_coro().__qualname__ == "Cluster._write_marks")
    closing = asyncio.create_task(cluster.close())
    try:
        done, _ = await asyncio.wait([closing], timeout=CLOSE_BOUND)
        assert closing in done, "close() waits for a task that does not stop"
        assert "a" not in hub.inboxes
        [stuck] = log.named("stop_overran")
        assert stuck["what"] == "cluster tasks" and stuck["stuck"] == [writer.get_name()], stuck
        assert "write_marks" in writer.get_name()
    finally:
        # Left behind, as it would be at exit; ended here so the test's loop can close.
        state.swallow = 0
        writer.cancel()
        await asyncio.wait([closing], timeout=CLOSE_BOUND)


class StuckCalls(MemoryState):
    """A store whose call-record read blocks until cancelled, then loses that cancellation once."""

    def __init__(self, replica_id: str, hub: MemoryHub) -> None:
        super().__init__(replica_id, hub)
        self.reading = asyncio.Event()

    async def get_call(self, call_id: str) -> dict[str, str] | None:
        if self.reading.is_set():
            return None
        self.reading.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass  # as wait_for does when the reply arrives with the cancellation
        return None


async def test_a_plugin_request_waiting_on_another_replica_ends_when_cancelled_even_if_a_store_call_lost_it() -> None:
    hub = MemoryHub()
    owner = MemoryState("a", hub)

    def owner_inbox(message: dict[str, Any]) -> None:
        # The owner opened the call and shows it to a person: the asker now waits for the verdict.
        hub.inboxes["b"]({"reply": message["id"], "call": "gw-1"})

    await owner.start(owner_inbox, lambda: [])
    await owner.claim("alice", "c1", agent="demo_agent", default_agent="demo_agent", ttl=60)
    state = StuckCalls("b", hub)
    cluster = cluster_on(state, "sessions:\n  heartbeat_interval: 50ms\n")
    await cluster.start()
    gate = asyncio.create_task(
        cluster.gate(app_name="demo_agent", user_id="alice", session_id="c1", tool_call_id="t1", tool="process_payment", args={})
    )
    try:
        await state.reading.wait()
        gate.cancel()
        # Without the check, the wait goes on (the owner is alive) until the tool's deadline.
        done, _ = await asyncio.wait([gate], timeout=2)
        assert gate in done and gate.cancelled()
    finally:
        gate.cancel()
        await _close_within(cluster.close, CLOSE_BOUND)


# ---- RedisState: a Redis that is gone, or does not answer -----------------------------------


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    with redis_server(tmp_path) as running:  # stopped with SIGKILL, paused (SIGSTOP) or not
        yield running


async def _started(state: RedisState) -> RedisState:
    await state.start(lambda message: None, lambda: [])
    assert state.available
    return state


async def test_closing_while_a_run_mark_is_written_to_redis_never_hangs(server: RedisServer) -> None:
    """The issue's hang, with the real client: redis-py loses the cancellation when it lands in
    some of the event-loop steps of a command (here, steps 1 to 3 of EVALSHA), so try every step."""
    for steps in range(12):
        # A prefix per step: the chat is new to each replica, not one to take over from the last
        # (a take-over waits out a gap in the heartbeats, which a loaded machine can open).
        state = redis_state(server, f"a{steps}", "marks" + secrets.token_hex(3))
        cluster = cluster_on(state)
        await cluster.start()
        await state.claim("alice", "c1", agent="demo_agent", default_agent="demo_agent", ttl=60)
        cluster.chats.run_changed(Chat("alice", "c1", "s1", 0.0), "msg-1")
        for _ in range(steps):
            await asyncio.sleep(0)
        closing = asyncio.create_task(cluster.close())
        done, _ = await asyncio.wait([closing], timeout=CLOSE_BOUND)
        assert closing in done, f"close() hung when cancelling the mark writer after {steps} loop steps"


async def test_a_clean_close_deletes_the_heartbeat_at_once(server: RedisServer) -> None:
    prefix = "close" + secrets.token_hex(3)
    a, b = await _started(redis_state(server, "a", prefix)), await _started(redis_state(server, "b", prefix))
    try:
        assert await b.alive("a")
        await _close_within(a.close, CLOSE_BOUND)
        assert not await b.alive("a")  # not owner_timeout later: the others may take over now
    finally:
        await a.close()
        await b.close()


async def test_close_with_redis_stopped_returns_within_a_bound(server: RedisServer) -> None:
    state = await _started(redis_state(server, "a", "close" + secrets.token_hex(3)))
    await asyncio.to_thread(server.stop)
    await _close_within(state.close, CLOSE_BOUND)
    assert all(task.done() for task in state._tasks)


async def test_close_with_redis_not_answering_returns_within_a_bound(
    server: RedisServer, monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = RecordingLog()
    monkeypatch.setattr(redis_module, "log", log)
    state = await _started(redis_state(server, "a", "close" + secrets.token_hex(3)))
    assert server.proc is not None
    # Paused, not stopped: connections are accepted, commands are never answered.
    os.kill(server.proc.pid, signal.SIGSTOP)
    await _close_within(state.close, CLOSE_BOUND)
    assert all(task.done() for task in state._tasks)
    # It says that the heartbeat could not be deleted (the others take over after owner_timeout).
    assert log.named("heartbeat_not_deleted")
    pool = state._redis.connection_pool
    assert not any(conn.is_connected for conn in (*pool._available_connections, *pool._in_use_connections))
