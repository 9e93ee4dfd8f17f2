"""How the gateway reaches Redis (`sessions.backend: redis`): one address, or Redis Sentinel.

`RedisTarget` is what the configuration names (docs/scaling.md "Redis that fails over"):
- `redis_url` alone: one address, a Redis or a managed failover endpoint (one DNS name that moves
  to the new primary). A node answering READONLY was demoted: the connection is dropped and the
  command tried once more on a new one, which resolves the name again (so it reaches the new
  primary once the DNS moved; until then it fails, and the gateway answers 503).
- `redis_sentinels` and `redis_sentinel_service`: the sentinels are asked for the primary's address
  at each new connection (redis-py's SentinelConnectionPool); `redis_url`, then without a host,
  gives the rest (rediss://, user, password, db). After a promotion, connections to the old primary
  fail (it died, or it answers READONLY and the sentinels disconnect its clients when they demote
  it) and the next one goes to the new primary.

Either way a command's failure is not retried more than once and never hidden: it raises, and
RedisState turns it into SharedStateDown (503 with Retry-After, or the caller's own retry).

Two pools, both waiting for a free connection rather than failing (redis_pool.py): the commands'
(`sessions.redis_max_connections`), and the control pool of the heartbeat and the inbox
subscription, which hold or need a connection whatever the load: a replica whose heartbeat queued
behind a burst of commands would look dead to the others, and its chats would be taken over.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.connection import Connection, SSLConnection, parse_url
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError
from redis.maint_notifications import MaintNotificationsConfig

from .redis_pool import PoolWatch, WaitingPool, WaitingSentinelPool

__all__ = ["CONTROL_CONNECTIONS", "RedisClient", "RedisTarget", "connect"]

# The control pool: the inbox's subscription holds one connection for good, the heartbeat uses one.
CONTROL_CONNECTIONS = 2


@dataclass(frozen=True)
class RedisTarget:
    """Where Redis is. `url` is a secret (it may carry the password); with `sentinels` it has no host."""

    url: str = ""
    sentinels: tuple[tuple[str, int], ...] = ()
    service: str = ""
    sentinel_username: str | None = None
    sentinel_password: str | None = None
    sentinel_tls: bool = False

    @property
    def via_sentinel(self) -> bool:
        return bool(self.sentinels)

    def describe(self) -> str:
        """For logs: never the URL (the password), only how the address is found."""
        if self.via_sentinel:
            return f"sentinel service {self.service} via {len(self.sentinels)} sentinels"
        return "redis_url"


@dataclass
class RedisClient:
    """The client the backend's parts share, the control client (heartbeat, inbox subscription), and
    the sentinels' own clients (closed with them)."""

    redis: aioredis.Redis
    control: aioredis.Redis
    sentinel: Sentinel | None = None

    @property
    def exhausted(self) -> bool:
        """Whether every connection of the commands' pool is in use (a command now waits)."""
        pool = self.redis.connection_pool
        return isinstance(pool, (WaitingPool, WaitingSentinelPool)) and pool.exhausted

    def answered_within(self, seconds: float) -> bool:
        """Whether a command of the commands' pool came back in the last `seconds`."""
        pool = self.redis.connection_pool
        released = pool.released_at if isinstance(pool, (WaitingPool, WaitingSentinelPool)) else 0.0
        return time.monotonic() - released < seconds

    async def aclose(self) -> None:
        try:
            await self.redis.aclose()
            await self.control.aclose()
        finally:
            if self.sentinel is not None:
                await self.sentinel.aclose()


def connect(
    target: RedisTarget, *, connect_timeout: float, command_timeout: float, retry: Retry, max_connections: int,
    watch: PoolWatch | None = None,
) -> RedisClient:
    """The clients for `target` (no I/O until their first command), with the timeouts and retry
    policy given: the commands' on a pool of `max_connections` (a command waits up to
    `command_timeout` for a free one, each wait told to `watch`), and the control client."""
    common: dict[str, Any] = {
        "socket_connect_timeout": connect_timeout, "socket_timeout": command_timeout, "retry": retry,
        "health_check_interval": 0, "wait_timeout": command_timeout,
        # Said, not left to redis-py's defaults, which 8.0 changed: the parts read replies in RESP2's
        # shapes (XREAD's list of [stream, entries]; 8.x speaks RESP3 unless told, and converts
        # back only while no protocol is named); and no CLIENT MAINT_NOTIFICATIONS at each new
        # connection (a Redis Enterprise feature: elsewhere a failed round trip per connection,
        # which a burst opening hundreds of them pays at once).
        "protocol": 2, "maint_notifications_config": MaintNotificationsConfig(enabled=False),
    }
    if not target.via_sentinel:
        return RedisClient(
            _direct(target.url, {**common, "max_connections": max_connections, "watch": watch}),
            _direct(target.url, {**common, "max_connections": CONTROL_CONNECTIONS}),
        )
    data = _data_node_options(target.url)
    sentinel_options: dict[str, Any] = {
        # SENTINEL MASTERS answers at once: a sentinel slower than a connect timeout is skipped for the next.
        "socket_connect_timeout": connect_timeout, "socket_timeout": connect_timeout,
        "username": target.sentinel_username, "password": target.sentinel_password,
        # Sentinels have no CLIENT MAINT_NOTIFICATIONS either: each new connection to one logged its refusal.
        "maint_notifications_config": MaintNotificationsConfig(enabled=False),
    }
    if target.sentinel_tls:
        sentinel_options["ssl"] = True
    sentinel = Sentinel(list(target.sentinels), sentinel_kwargs=sentinel_options)
    # SentinelManagedConnection turns READONLY into a ConnectionError after disconnecting, so the
    # one retry asks the sentinels again and lands on the new primary when they have promoted one.
    options = {**common, **data, "connection_pool_class": WaitingSentinelPool}
    return RedisClient(
        sentinel.master_for(target.service, **options, max_connections=max_connections, watch=watch),
        sentinel.master_for(target.service, **options, max_connections=CONTROL_CONNECTIONS),
        sentinel,
    )


def _direct(url: str, options: dict[str, Any]) -> aioredis.Redis:
    pool = WaitingPool.from_url(url, **options)
    # A demoted node must not keep a pooled connection answering READONLY forever.
    if pool.connection_class is Connection:
        pool.connection_class = _FollowsPromotion
    elif pool.connection_class is SSLConnection:
        pool.connection_class = _FollowsPromotionTLS
    return aioredis.Redis.from_pool(pool)


def _data_node_options(url: str) -> dict[str, Any]:
    """What a hostless redis_url says about the data nodes: credentials, db, TLS and its options."""
    if not url:
        return {}
    options: dict[str, Any] = dict(parse_url(url))
    for address in ("host", "port", "path"):
        options.pop(address, None)
    if options.pop("connection_class", Connection) is SSLConnection:
        options["ssl"] = True  # SentinelConnectionPool picks its TLS connection class from this
    return options


class _FollowsPromotion(Connection):
    """A connection that treats READONLY as the sign of a failover behind one address (a managed
    endpoint): disconnect, so the retry connects again and resolves the name again."""

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().read_response(*args, **kwargs)
        except ReadOnlyError:
            await self.disconnect()
            raise RedisConnectionError("the Redis node was demoted to a replica (READONLY)") from None


class _FollowsPromotionTLS(_FollowsPromotion, SSLConnection):
    pass
