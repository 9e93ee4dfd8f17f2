"""Redis that fails over (issue 28, item 2), below the fault test: the Sentinel settings, how the
client is made from them, and a demoted node's READONLY behind one address (a managed endpoint).

The real failover, with sentinels promoting a replica under two gateways, is
tests/ops/test_sentinel_failover.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import SentinelConnectionPool, SentinelManagedSSLConnection
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.cluster.redis_client import RedisTarget, connect
from gateway.config.schema import ConfigError, parse_config
from gateway.edge.app import shared_state
from gateway.edge.reload import plan_reload
from tests.procs import free_port, redis_server

SECRET = "  secret: test-sessions-secret-0123456789\n"
SENTINELS = "  redis_sentinels: ['10.0.0.1:26379', 'sentinel-b:26379', '[fd00::3]:26380']\n"


def _sessions(body: str) -> str:
    return "sessions:\n  backend: redis\n" + body + SECRET


def _problems(body: str) -> list[str]:
    with pytest.raises(ConfigError) as refused:
        parse_config(_sessions(body), env={})
    return refused.value.problems


def test_sentinel_settings_parse_and_name_the_primary_by_its_service() -> None:
    config = parse_config(_sessions(
        SENTINELS + "  redis_sentinel_service: gateway\n  redis_url: 'rediss://app:${REDIS_PASSWORD}@/2'\n"
        "  redis_sentinel_password: ${SENTINEL_PASSWORD}\n  redis_sentinel_tls: true\n"
    ), env={"REDIS_PASSWORD": "data-pw-1", "SENTINEL_PASSWORD": "sentinel-pw-2"})
    sessions = config.sessions
    assert sessions.sentinel_addresses() == [("10.0.0.1", 26379), ("sentinel-b", 26379), ("fd00::3", 26380)]
    assert sessions.redis_sentinel_service == "gateway" and sessions.redis_sentinel_tls
    assert "data-pw-1" not in repr(sessions) and "sentinel-pw-2" not in repr(sessions)
    # No redis_url at all is fine with sentinels (no password, db 0).
    bare = parse_config(_sessions(SENTINELS + "  redis_sentinel_service: gateway\n"), env={})
    assert bare.sessions.redis_url is None


@pytest.mark.parametrize(("body", "expected"), [
    (SENTINELS, "sessions.redis_sentinels without sessions.redis_sentinel_service"),
    ("  redis_url: redis://cache:6379/0\n  redis_sentinel_service: gateway\n",
     "sessions.redis_sentinel_service without sessions.redis_sentinels"),
    ("  redis_sentinels: ['sentinel-a']\n  redis_sentinel_service: gateway\n",
     "sessions.redis_sentinels[0]: 'sentinel-a' is not host:port"),
    ("  redis_sentinels: ['a:26379', 'b:0']\n  redis_sentinel_service: gateway\n",
     "sessions.redis_sentinels[1]: 'b:0' is not host:port"),
    ("  redis_sentinels: []\n  redis_sentinel_service: ''\n", "sessions.redis_sentinel_service: String should have at least 1"),
    (SENTINELS + "  redis_sentinel_service: gateway\n  redis_url: 'redis://:hunter2hunter2@cache:6379/0'\n",
     "sessions.redis_url names a host and sessions.redis_sentinels are set"),
    (SENTINELS + "  redis_sentinel_service: gateway\n  redis_url: 'unix:///run/redis.sock'\n",
     "sessions.redis_url with sessions.redis_sentinels: the scheme is redis:// or rediss://"),
], ids=["no_service", "no_sentinels", "no_port", "port_0", "empty_service", "url_with_host", "unix_url"])
def test_sentinel_settings_that_contradict_or_fall_short_are_refused_clearly(body: str, expected: str) -> None:
    problems = _problems(body)
    assert any(expected in p for p in problems), problems
    assert "hunter2" not in " ".join(problems)  # a URL's password is never echoed


def test_a_reload_never_moves_the_store_to_other_sentinels() -> None:
    """`sessions` waits for a restart, the Sentinel keys with it: a reload does not quietly point
    a running replica at another primary."""
    text = _sessions(SENTINELS + "  redis_sentinel_service: gateway\n")
    running = parse_config(text, env={})
    plan = plan_reload(text.replace("gateway\n", "other\n"), source="gateway.yaml", running=running)
    assert plan.config is not None and "sessions" in plan.restart_required
    assert plan.config.sessions.redis_sentinel_service == "gateway"


def test_the_client_asks_the_sentinels_with_the_urls_credentials_and_the_same_timeouts() -> None:
    config = parse_config(_sessions(
        SENTINELS + "  redis_sentinel_service: gateway\n  redis_url: 'rediss://app:data-pw@/2'\n"
        "  redis_sentinel_username: watcher\n  redis_sentinel_password: sentinel-pw\n  redis_sentinel_tls: true\n"
    ), env={})
    state = shared_state(config)
    client = state._client  # type: ignore[attr-defined]
    pool = client.redis.connection_pool
    assert isinstance(pool, SentinelConnectionPool) and pool.service_name == "gateway" and pool.is_master
    assert pool.connection_class is SentinelManagedSSLConnection
    kwargs = pool.connection_kwargs
    assert (kwargs["db"], kwargs["username"], kwargs["password"]) == (2, "app", "data-pw")
    assert (kwargs["socket_connect_timeout"], kwargs["socket_timeout"], kwargs["retry"].get_retries()) == (2.0, 5.0, 1)
    sentinels = client.sentinel.sentinels
    assert len(sentinels) == 3
    first = sentinels[0].connection_pool.connection_kwargs
    assert (first["host"], first["port"], first["username"], first["password"]) == ("10.0.0.1", 26379, "watcher", "sentinel-pw")
    assert sentinels[0].connection_pool.connection_class.__name__ == "SSLConnection"
    asyncio.run(client.aclose())


async def _wait_replica(port: int) -> None:
    """Make the redis-server on `port` a replica (of a port nobody listens on): it answers writes READONLY."""
    dead = free_port()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"REPLICAOF 127.0.0.1 {dead}\r\n".encode())
    assert (await reader.readline()).startswith(b"+OK")
    writer.close()


async def _promote(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"REPLICAOF NO ONE\r\n")
    assert (await reader.readline()).startswith(b"+OK")
    writer.close()


def test_a_demoted_node_behind_one_address_is_left_not_written_to(tmp_path: Path) -> None:
    """A managed failover endpoint: the name moves to the new primary, but a pooled connection
    stays on the old one, which answers READONLY. The connection is dropped (so the next one
    resolves the name again) and the write fails as a lost connection, which the backend turns into
    SharedStateDown (503, retry): never a silent loss, never a connection stuck on the old node."""

    async def run(url: str, port: int) -> None:
        client = connect(
            RedisTarget(url=url), connect_timeout=2.0, command_timeout=5.0, retry=Retry(NoBackoff(), 1), max_connections=100,
        )
        try:
            await client.redis.set("k", "before")
            await _wait_replica(port)
            with pytest.raises(RedisConnectionError, match="READONLY"):
                await client.redis.set("k", "after")
            pool = client.redis.connection_pool
            assert not [c for c in pool._available_connections if c.is_connected]  # type: ignore[attr-defined]
            await _promote(port)  # the endpoint's new primary (here: the same node, promoted)
            await client.redis.set("k", "after")
            assert await client.redis.get("k") == b"after"
        finally:
            await client.aclose()

    with redis_server(tmp_path) as server:
        asyncio.run(run(server.url, server.port))
