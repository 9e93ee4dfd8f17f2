"""One call into Redis for RedisState, and what its failure means: Redis down, or this replica
overloaded (cluster/redis.py owns the backend; its parts raise what redis-py raises).

- Redis down: any error of redis-py or of the socket, or a limit check that got no answer while
  no other command came back either (Redis hangs). SharedStateDown (503 `sessions_unavailable`), and the backend
  counts as down until its heartbeat gets through (`went_down`).
- This replica overloaded: every pooled connection stayed in use for the command timeout
  (redis_pool.py), or a limit check took too long while other commands came back meanwhile (the
  wait was this replica's event loop, behind a burst of requests: taking that for Redis down made
  every request of the burst a 503 until the next heartbeat). SharedStateBusy (503
  `gateway_overloaded`); the backend stays available, and `shared_state_down` is not logged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import structlog
from redis.exceptions import RedisError

from .redis_client import RedisClient
from .redis_pool import PoolExhausted
from .shared import SharedStateBusy, SharedStateDown

__all__ = ["RedisCalls", "reason"]

log = structlog.get_logger("adk_gateway.cluster.redis_calls")

_UNREACHABLE = "the shared session store (Redis) is unreachable"


class RedisCalls:
    """Runs a part's call; `available`: whether the backend is up; `went_down`: told of the error
    that shows it is not (the backend marks itself down and asks its heartbeat)."""

    def __init__(self, client: RedisClient, *, available: Callable[[], bool], went_down: Callable[[BaseException], None]) -> None:
        self._client = client
        self._available = available
        self._went_down = went_down

    async def __call__(self, op: Coroutine[Any, Any, Any]) -> Any:
        try:
            if not self._available():
                raise SharedStateDown(_UNREACHABLE)
            return await op
        except PoolExhausted:
            raise self._busy() from None
        except (RedisError, OSError) as exc:
            self._went_down(exc)
            raise SharedStateDown(_UNREACHABLE) from None
        finally:
            op.close()  # not awaited when the store is down: no "never awaited" warning

    async def within(self, op: Coroutine[Any, Any, Any], timeout: float) -> Any:
        """The call, given `timeout` seconds; past them, an overload or Redis down (as above)."""
        try:
            async with asyncio.timeout(timeout):
                return await self(op)
        except TimeoutError:
            if self._client.exhausted:
                raise self._busy() from None
            if self._client.answered_within(timeout):
                raise SharedStateBusy("the gateway is overloaded (a check on its session store took too long); retry") from None
            self._went_down(TimeoutError())
            raise SharedStateDown(_UNREACHABLE) from None

    def _busy(self) -> SharedStateBusy:
        log.warning("redis_pool_exhausted", max_connections=self._client.redis.connection_pool.max_connections)
        return SharedStateBusy("the gateway is overloaded (no connection to its session store came free in time); retry")


def reason(exc: BaseException) -> str:
    # Not str(exc) alone: redis-py's messages can include the URL, and with it the password.
    return type(exc).__name__
