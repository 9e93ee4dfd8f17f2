"""The Redis connection pool's series (cluster/redis_pool.py waits; docs/metrics.md documents them):
how long commands waited for a free connection, and how many ran out of time. Part of the
gateway's registry (metrics.py); exported at 0 with the memory backend too, so a dashboard's query
works before the first wait.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from .metric_labels import REDIS_POOL_WAIT_BUCKETS

__all__ = ["RedisPoolMetrics"]


class RedisPoolMetrics:
    """A `PoolWatch` (cluster/redis_pool.py) that counts into the registry."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.wait = Histogram(
            "adk_gateway_redis_pool_wait_seconds",
            "Commands that found every Redis connection of the pool (sessions.redis_max_connections) in use, "
            "by how long they waited for one.",
            buckets=REDIS_POOL_WAIT_BUCKETS, registry=r,
        )
        self.timeouts = Counter(
            "adk_gateway_redis_pool_wait_timeouts_total",
            "Commands that waited the command timeout for a Redis connection and got none: answered 503 "
            "gateway_overloaded (Redis itself was up).",
            registry=r,
        )

    def waited(self, seconds: float) -> None:
        self.wait.observe(seconds)

    def timed_out(self) -> None:
        self.timeouts.inc()
