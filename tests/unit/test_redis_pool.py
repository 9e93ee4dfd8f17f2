"""The Redis connection pool under load (cluster/redis_pool.py), on a real redis-server.

- More concurrent commands than the pool holds all complete: they wait for a free connection
  (redis-py's own pool raises MaxConnectionsError at once, which the backend took for Redis down).
- A pool exhausted for longer than the wait is an overload (SharedStateBusy, 503
  `gateway_overloaded`), not Redis down: the backend stays available and its heartbeat goes on.
- The pool is read off a real client made by `connect`: if an upgrade of redis-py changes the
  class or the methods the waiting relies on, these fail.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Iterator

import pytest
import redis
from prometheus_client import CollectorRegistry
from redis.asyncio.connection import ConnectionPool
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import SentinelConnectionPool
from redis.backoff import NoBackoff
from redis.exceptions import MaxConnectionsError

from gateway.cluster.redis import RedisState
from gateway.cluster.redis_calls import RedisCalls
from gateway.cluster.redis_client import CONTROL_CONNECTIONS, RedisClient, RedisTarget, connect
from gateway.cluster.redis_pool import DEFAULT_MAX_CONNECTIONS, WaitingPool, WaitingSentinelPool
from gateway.cluster.shared import SharedStateBusy, SharedStateDown
from gateway.config.schema import parse_config
from gateway.ops.redis_pool_metrics import RedisPoolMetrics
from tests.procs import RedisServer, redis_server
from tests.support.shared_state import OWNER_TIMEOUT, redis_state


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with redis_server(tmp_path_factory.mktemp("redis-pool")) as running:
        yield running


@pytest.fixture
async def started(server: RedisServer) -> AsyncIterator[tuple[RedisState, RedisPoolMetrics]]:
    metrics = RedisPoolMetrics(CollectorRegistry())
    state = redis_state(server, "a", "pool" + secrets.token_hex(3), max_connections=8, pool_watch=metrics)
    await state.start(lambda message: None, lambda: [])
    try:
        yield state, metrics
    finally:
        await state.close()


def _count(metrics: RedisPoolMetrics, sample: str) -> float:
    for family in metrics.wait.collect() + metrics.timeouts.collect():
        for s in family.samples:
            if s.name == sample:
                return s.value
    raise AssertionError(sample)


# ---- what the code relies on in redis-py -------------------------------------------------------


def test_connect_gives_the_waiting_pool_of_the_configured_size() -> None:
    client = connect(
        RedisTarget(url="redis://127.0.0.1:1/0"), connect_timeout=2.0, command_timeout=5.0, retry=Retry(NoBackoff(), 1),
        max_connections=321,
    )
    pool, control = client.redis.connection_pool, client.control.connection_pool
    assert type(pool) is WaitingPool and type(control) is WaitingPool
    assert (pool.max_connections, pool.wait_timeout) == (321, 5.0)
    assert control.max_connections == CONTROL_CONNECTIONS
    for used in (pool, control):
        assert used.connection_kwargs["protocol"] == 2
        assert not used.maint_notifications_enabled()
    # The waiting is built on these of redis-py's pool: an upgrade that renames or drops them, or
    # that makes the pool wait by itself, must be looked at again (pyproject.toml pins the major).
    assert redis.__version__.split(".")[0] == "8"
    assert issubclass(WaitingPool, ConnectionPool)
    for name in ("can_get_connection", "get_available_connection", "release"):
        assert callable(getattr(ConnectionPool, name)), name


def test_connect_through_sentinels_gives_the_waiting_sentinel_pool() -> None:
    client = connect(
        RedisTarget(url="redis://:pw@/0", sentinels=(("127.0.0.1", 1),), service="mymaster"),
        connect_timeout=2.0, command_timeout=5.0, retry=Retry(NoBackoff(), 1), max_connections=77,
    )
    pool = client.redis.connection_pool
    assert type(pool) is WaitingSentinelPool and issubclass(WaitingSentinelPool, SentinelConnectionPool)
    assert (pool.max_connections, pool.wait_timeout) == (77, 5.0)
    assert client.control.connection_pool.max_connections == CONTROL_CONNECTIONS


async def test_redis_py_own_pool_still_fails_at_once_when_exhausted() -> None:
    """The behaviour the waiting pool exists for: if redis-py's pool starts waiting by itself, its
    default (100) and this module's wait no longer say what happens."""
    pool = ConnectionPool(max_connections=1)
    pool.get_available_connection()
    with pytest.raises(MaxConnectionsError):
        pool.get_available_connection()
    assert ConnectionPool().max_connections == 100


def test_the_configured_pool_size_has_a_default_and_a_floor() -> None:
    assert parse_config("{}", env={}).sessions.redis_max_connections == DEFAULT_MAX_CONNECTIONS == 500
    with pytest.raises(Exception, match="redis_max_connections"):
        parse_config("sessions:\n  redis_max_connections: 2\n", env={})


# ---- on a real redis-server --------------------------------------------------------------------


async def test_more_concurrent_blocking_reads_than_the_default_pool_all_complete(server: RedisServer) -> None:
    """150 relay reads at once, each holding its connection while Redis blocks it: more than
    redis-py's default pool of 100, which failed the rest with MaxConnectionsError (Redis down)."""
    state = redis_state(server, "a", "burst" + secrets.token_hex(3))
    await state.start(lambda message: None, lambda: [])
    try:
        reads = await asyncio.gather(*(state.relay_read(f"k{i}", "", timeout=0.3) for i in range(150)))
        assert reads == [("", [])] * 150
        assert state.available
    finally:
        await state.close()


async def test_commands_beyond_the_pool_wait_for_a_free_connection(started: tuple[RedisState, RedisPoolMetrics]) -> None:
    state, metrics = started
    reads = await asyncio.gather(*(state.relay_read(f"k{i}", "", timeout=0.1) for i in range(40)))
    assert reads == [("", [])] * 40
    assert state.available
    # 40 reads on 8 connections: 32 of them waited, none ran out of time.
    assert _count(metrics, "adk_gateway_redis_pool_wait_seconds_count") >= 32
    assert _count(metrics, "adk_gateway_redis_pool_wait_timeouts_total") == 0


async def test_a_pool_exhausted_past_the_wait_is_an_overload_not_redis_down(
    started: tuple[RedisState, RedisPoolMetrics], server: RedisServer,
) -> None:
    state, metrics = started
    pool = state._client.redis.connection_pool  # type: ignore[attr-defined]
    pool.wait_timeout = 0.3
    held = [await pool.get_connection() for _ in range(pool.max_connections)]
    try:
        with pytest.raises(SharedStateBusy) as refused:
            await state.get_call("some-call")
        error = refused.value.http()
        assert (error.status, error.code) == (503, "gateway_overloaded")
        assert "overloaded" in str(refused.value) and "unreachable" not in str(refused.value)
        assert isinstance(refused.value, SharedStateDown)  # every caller still fails closed
        assert _count(metrics, "adk_gateway_redis_pool_wait_timeouts_total") == 1
        # Redis is fine: the backend stays available, and the heartbeat (on its own connections)
        # keeps this replica alive for the others through more than an owner_timeout.
        other = redis_state(server, "b", state._prefix)  # type: ignore[attr-defined]
        await other.start(lambda message: None, lambda: [])
        try:
            await asyncio.sleep(2 * OWNER_TIMEOUT)
            assert state.available
            assert await other.alive("a")
        finally:
            await other.close()
    finally:
        for connection in held:
            await pool.release(connection)
    assert await state.get_call("some-call") is None  # served again once connections came free


# ---- a slow check: Redis down, or this replica behind a burst ------------------------------------


def _calls() -> tuple[RedisCalls, RedisClient, list[BaseException]]:
    client = connect(
        RedisTarget(url="redis://127.0.0.1:1/0"), connect_timeout=2.0, command_timeout=5.0, retry=Retry(NoBackoff(), 1),
        max_connections=8,
    )
    downs: list[BaseException] = []
    return RedisCalls(client, available=lambda: True, went_down=downs.append), client, downs


async def test_a_slow_check_while_redis_answers_other_calls_is_an_overload(server: RedisServer) -> None:
    """A replica whose event loop is behind a burst of requests sees its limit check take longer
    than the check's timeout while other commands come back: not Redis down (which turned every
    request of the burst into 503 `sessions_unavailable` until the next heartbeat)."""
    calls, client, downs = _calls()
    client.redis.connection_pool.connection_kwargs.update(port=server.port)
    try:
        slow = asyncio.ensure_future(calls.within(asyncio.sleep(1), 0.2))
        await asyncio.sleep(0.1)
        assert await calls(client.redis.ping()) is True  # another command came back during the wait
        with pytest.raises(SharedStateBusy):
            await slow
        assert downs == []
    finally:
        await client.aclose()


async def test_a_slow_check_while_nothing_comes_back_is_redis_down(server: RedisServer) -> None:
    calls, client, downs = _calls()
    client.redis.connection_pool.connection_kwargs.update(port=server.port)
    try:
        assert await calls(client.redis.ping()) is True  # before the wait: not during it
        with pytest.raises(SharedStateDown) as refused:
            await calls.within(asyncio.sleep(1), 0.2)
        assert not isinstance(refused.value, SharedStateBusy) and len(downs) == 1
    finally:
        await client.aclose()


def test_an_overload_is_told_as_one_where_a_refusal_names_the_store() -> None:
    """The plugin's refused call and the approvals API say overloaded, not Redis unreachable."""
    from gateway.cluster.remote_gate import store_refused
    from gateway.edge.approvals_api import store_down

    busy, down = SharedStateBusy("overloaded; retry"), SharedStateDown("unreachable")
    assert store_refused(busy)[1] == "gateway_overloaded" and store_refused(down)[1] == "sessions_unavailable"
    assert "overloaded" in store_refused(busy)[0].as_json()["response"]["error"]
    assert (store_down(busy).code, store_down(busy).status) == ("gateway_overloaded", 503)
    assert store_down(down).code == "sessions_unavailable"
