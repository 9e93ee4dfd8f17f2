"""The cluster's shared store in tests: a replica's view of a real redis-server with the tests' short
heartbeats and sealing secret (`redis_state`), and two replicas' views of one store, memory or Redis
(the `pair` fixture), on which the tests of each shared store run on both backends alike."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from gateway.cluster.memory import MemoryHub, MemoryState
from gateway.cluster.redis import RedisState
from gateway.cluster.sealing import Seal
from gateway.cluster.shared import SharedState
from tests.procs import RedisServer, redis_server

HEARTBEAT = 0.1
OWNER_TIMEOUT = 0.4
SEAL = Seal(["test-sessions-secret-0123456789"])


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with redis_server(tmp_path_factory.mktemp("redis")) as server:
        yield server


def redis_state(
    server: RedisServer, name: str, prefix: str, *, owner_timeout: float = OWNER_TIMEOUT, seal: Seal = SEAL, **pool: Any,
) -> RedisState:
    """Replica `name`'s view of `server`, its keys under `prefix` (`pool`: the connection pool's settings)."""
    return RedisState(
        name, server.url, prefix=prefix, heartbeat_interval=HEARTBEAT, owner_timeout=owner_timeout, seal=seal, **pool,
    )



@pytest.fixture(params=["memory", "redis"])
async def pair(request: pytest.FixtureRequest) -> AsyncIterator[tuple[SharedState, SharedState]]:
    if request.param == "memory":
        hub = MemoryHub()
        a: SharedState = MemoryState("a", hub)
        b: SharedState = MemoryState("b", hub)
    else:
        server = request.getfixturevalue("redis")
        prefix = "t" + secrets.token_hex(4)  # each test its own keys in the shared server
        a, b = redis_state(server, "a", prefix), redis_state(server, "b", prefix)
    for state in (a, b):
        await state.start(lambda message: None, lambda: [])
    try:
        yield a, b
    finally:
        for state in (a, b):
            await state.close()
