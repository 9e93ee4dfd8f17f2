"""After a Redis outage longer than `owner_timeout` (a Sentinel failover takes `down-after-milliseconds`
and more), every heartbeat has expired, the live replicas' too: the first replica back must not
take a live replica's chat over, or think it dead, before the others had time to beat again
(issue 28, item 2). A missing heartbeat means dead only once Redis has served beats for
`owner_timeout` without a gap.

The gap is made as the failover makes it, on a real redis-server: the beats stop (the key that
records the last one is moved back in time) and the heartbeats of a live replica are gone.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from gateway.cluster.redis import RedisState
from gateway.cluster.shared import SharedStateDown
from tests.support.shared_state import HEARTBEAT, redis_state
from tests.procs import RedisServer, redis_server

OWNER_TIMEOUT = 0.6
DEMO = {"agent": "demo", "default_agent": "demo"}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    with redis_server(tmp_path) as running:
        yield running


@pytest.fixture
async def pair(server: RedisServer) -> AsyncIterator[tuple[RedisState, RedisState, aioredis.Redis, str]]:
    prefix = f"gap{secrets.token_hex(3)}"
    states = [
        redis_state(server, name, prefix, owner_timeout=OWNER_TIMEOUT)
        for name in ("a", "b")
    ]
    for state in states:
        await state.start(lambda message: None, lambda: [])
    raw = aioredis.Redis.from_url(server.url)
    try:
        yield states[0], states[1], raw, prefix
    finally:
        for state in states:
            await state.close()
        await raw.aclose()


async def _outage(raw: aioredis.Redis, prefix: str, seconds: float) -> None:
    """What an outage of `seconds` leaves behind: the last beat that long ago, every heartbeat expired."""
    (now_s, now_us) = await raw.time()
    now_ms = now_s * 1000 + now_us // 1000
    await raw.hset(f"{prefix}:beats", "last", str(now_ms - int(seconds * 1000)))
    await raw.delete(f"{prefix}:replica:a", f"{prefix}:replica:b")


async def test_a_live_owner_keeps_its_chat_through_an_outage_longer_than_owner_timeout(pair) -> None:  # type: ignore[no-untyped-def]
    a, b, raw, prefix = pair
    chat = "chat-" + secrets.token_hex(4)
    await a.claim("alice", chat, **DEMO, ttl=60)
    await a.mark_run("alice", chat, "msg-1")
    # Both replicas stop beating while Redis is away (a failover), then B's beat comes first.
    a._closed = True  # A's loop pauses: it beats again only when we say  # noqa: SLF001
    await asyncio.sleep(2 * HEARTBEAT)
    await _outage(raw, prefix, 5.0)
    await b._beat()  # noqa: SLF001
    # A is not known dead yet: its heartbeat is missing only because of the outage.
    assert await b.alive("a")
    assert await b.owner("alice", chat) == "a"
    with pytest.raises(SharedStateDown, match="retry"):
        await b.claim("alice", chat, **DEMO, ttl=60)
    # A beats again: its chat is still its own, its run still running.
    a._closed = False  # noqa: SLF001
    await a._beat()  # noqa: SLF001
    claim = await b.claim("alice", chat, **DEMO, ttl=60)
    assert (claim.owner, claim.local) == ("a", False)


async def test_a_replica_that_died_in_the_outage_is_dead_once_redis_served_beats_for_owner_timeout(pair) -> None:  # type: ignore[no-untyped-def]
    a, b, raw, prefix = pair
    chat = "chat-" + secrets.token_hex(4)
    await a.claim("alice", chat, **DEMO, ttl=60)
    await a.mark_run("alice", chat, "msg-1")
    a._closed = True  # A died with the primary  # noqa: SLF001
    await asyncio.sleep(2 * HEARTBEAT)
    await _outage(raw, prefix, 5.0)
    await b._beat()  # noqa: SLF001
    assert await b.alive("a")
    await asyncio.sleep(OWNER_TIMEOUT + 2 * HEARTBEAT)  # B's own beats go on meanwhile
    assert not await b.alive("a")
    taken = await b.claim("alice", chat, **DEMO, ttl=60)
    assert (taken.owner, taken.local, taken.orphaned_run) == ("b", True, "msg-1")
    a._closed = False  # so that the fixture closes its connections  # noqa: SLF001


async def test_beats_without_a_gap_change_nothing(pair) -> None:  # type: ignore[no-untyped-def]
    """A replica that dies while Redis serves is dead after owner_timeout, as before."""
    a, b, _, _ = pair
    chat = "chat-" + secrets.token_hex(4)
    await a.claim("alice", chat, **DEMO, ttl=60)
    await asyncio.sleep(OWNER_TIMEOUT + 2 * HEARTBEAT)  # serving for owner_timeout
    await a.close()
    assert not await b.alive("a")
    taken = await b.claim("alice", chat, **DEMO, ttl=60)
    assert (taken.owner, taken.local) == ("b", True)
