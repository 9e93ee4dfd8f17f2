"""The Redis connection pool's limit (`sessions.redis_max_connections`): a command that finds every
connection taken waits for one to come free, up to the command timeout, instead of failing.

redis-py's asyncio `ConnectionPool` (every release to 8.x) raises `MaxConnectionsError` at once when
its `max_connections` (default 100) are all in use; a burst of requests then failed as though Redis
were down. Its `BlockingConnectionPool` waits, but gives up with a plain `ConnectionError`, which
cannot be told from a Redis that does not answer, and the Sentinel pool has no waiting variant. So
the waiting is this module's, over either pool (`WaitingPool`, `WaitingSentinelPool`):
- a command waits at most `wait_timeout` (the command timeout) for a free connection; each wait is
  reported to a `PoolWatch` (the metrics: how long, and how many ran out of time);
- past it, `PoolExhausted`: the gateway is busier than its pool, Redis is fine. RedisState answers
  it as an overload (503 `gateway_overloaded`), never as Redis being down;
- a connection that fails to connect still raises what redis-py raises: that is Redis being down.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Protocol

from redis.asyncio.connection import AbstractConnection, ConnectionPool
from redis.asyncio.sentinel import SentinelConnectionPool
from redis.exceptions import MaxConnectionsError, RedisError

__all__ = ["DEFAULT_MAX_CONNECTIONS", "PoolExhausted", "PoolWatch", "WaitingPool", "WaitingSentinelPool"]

# sessions.redis_max_connections' default (gateway/config/sections.py says why), for callers that do not say.
DEFAULT_MAX_CONNECTIONS = 500


class PoolExhausted(RedisError):
    """No connection of the pool came free within the wait: the gateway is overloaded, Redis is not down."""


class PoolWatch(Protocol):
    """Told of every wait for a connection (the metrics)."""

    def waited(self, seconds: float) -> None: ...

    def timed_out(self) -> None: ...


class _Unwatched:
    def waited(self, seconds: float) -> None:
        pass

    def timed_out(self) -> None:
        pass


class _Waits:
    """Mixed in before a redis-py pool class: `get_connection` waits for a free connection."""

    max_connections: int

    def __init__(self, *args: Any, wait_timeout: float, watch: PoolWatch | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.wait_timeout = wait_timeout
        self._watch: PoolWatch = watch or _Unwatched()
        # Notified at every release: one waiter looks again.
        self._freed = asyncio.Condition()
        # When (time.monotonic) a connection last came back whole from a command: Redis answered
        # then, which tells a slow check on a busy replica from a Redis that hangs.
        self.released_at = 0.0

    if TYPE_CHECKING:
        def can_get_connection(self) -> bool: ...  # the pool class's

    @property
    def exhausted(self) -> bool:
        """Every connection in use (a command now would wait)."""
        return not self.can_get_connection()

    async def get_connection(self, *args: Any, **kwargs: Any) -> AbstractConnection:
        deadline: float | None = None
        started = time.monotonic()
        while True:
            if self.can_get_connection():
                try:
                    connection: AbstractConnection = await super().get_connection()  # type: ignore[misc]
                except MaxConnectionsError:
                    pass  # taken between the check and the pool's own lock: wait again
                else:
                    if deadline is not None:
                        self._watch.waited(time.monotonic() - started)
                    return connection
            if deadline is None:
                deadline = started + self.wait_timeout
            await self._wait_until(deadline)

    async def _wait_until(self, deadline: float) -> None:
        try:
            async with asyncio.timeout(max(deadline - time.monotonic(), 0)):
                async with self._freed:
                    await self._freed.wait_for(self.can_get_connection)
        except TimeoutError:
            self._watch.timed_out()
            raise PoolExhausted(
                f"all {self.max_connections} Redis connections stayed in use for {self.wait_timeout:g}s"
            ) from None

    async def release(self, connection: AbstractConnection) -> None:
        await super().release(connection)  # type: ignore[misc]
        if connection.is_connected:  # not one dropped by a failure or a cancelled command
            self.released_at = time.monotonic()
        async with self._freed:
            self._freed.notify()


class WaitingPool(_Waits, ConnectionPool):
    """A pool on one address that waits for a free connection."""


class WaitingSentinelPool(_Waits, SentinelConnectionPool):
    """A pool on the primary the sentinels name that waits for a free connection."""
