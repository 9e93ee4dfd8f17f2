"""Confirmation deadlines in Redis (`sessions.backend: redis`): the set every replica watches.

Two keys under `sessions.key_prefix` (docs/scaling.md has the table):
- `{p}:deadlines`: a sorted set, member the deadline's key (chat id/approval id), score its due
  time (seconds since the epoch);
- `{p}:deadline`: a hash, field the same key, value the deadline (deadlines.py) as JSON, sealed
  (sealing.py): another replica acts on it, so what does not open is dropped unread.

A deadline is kept until it is claimed or dropped: at most the tool's `timeout` after its
confirmation was asked, unless nobody can claim it (every replica down), when the first replica
back claims it. Claiming runs as one Lua script, so of replicas racing for the same due deadline
exactly one gets it. Every Redis error becomes SharedStateDown (the caller's owner, RedisState,
turns it so).
"""

from __future__ import annotations

from typing import Any, Final

import redis.asyncio as aioredis
import structlog

from ..core.deadlines import Deadline, MalformedDeadline
from .sealing import Seal, Tampered

__all__ = ["RedisDeadlines"]

log = structlog.get_logger("adk_gateway.cluster.redis_deadlines")

# ARGV: now (seconds), at most how many.  KEYS: the sorted set, the hash. Returns key, record, key, record...
_CLAIM: Final = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local out = {}
for _, key in ipairs(due) do
  redis.call('ZREM', KEYS[1], key)
  local record = redis.call('HGET', KEYS[2], key)
  redis.call('HDEL', KEYS[2], key)
  if record then
    out[#out + 1] = key
    out[#out + 1] = record
  end
end
return out
"""


class RedisDeadlines:
    """The deadline set of one RedisState (its client, key prefix and seal). Raises what redis-py
    raises; RedisState turns it into SharedStateDown."""

    def __init__(self, client: aioredis.Redis, prefix: str, seal: Seal) -> None:
        self._redis = client
        self._set = f"{prefix}:deadlines"
        self._records = f"{prefix}:deadline"
        self._seal = seal
        self._claim = client.register_script(_CLAIM)

    def _context(self, key: str) -> str:
        # The seal covers the key, so a sealed deadline cannot be moved to another confirmation.
        return f"{self._records}:{key}"

    async def add(self, deadline: Deadline) -> None:
        sealed = self._seal.seal(deadline.to_json().encode(), self._context(deadline.key))
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(self._records, deadline.key, sealed)
            pipe.zadd(self._set, {deadline.key: deadline.due})
            await pipe.execute()

    async def drop(self, key: str) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.zrem(self._set, key)
            pipe.hdel(self._records, key)
            await pipe.execute()

    async def claim(self, now: float, limit: int) -> list[Deadline]:
        raw: list[Any] = await self._claim(keys=[self._set, self._records], args=[repr(now), limit])
        out = []
        for index in range(0, len(raw) - 1, 2):
            key = raw[index].decode() if isinstance(raw[index], bytes) else str(raw[index])
            try:
                deadline = Deadline.from_json(self._seal.open(raw[index + 1], self._context(key)))
            except (Tampered, MalformedDeadline):
                log.warning("deadline_record_tampered")
                continue
            if deadline.key == key:
                out.append(deadline)
        return out

    async def next_due(self) -> float | None:
        first = await self._redis.zrange(self._set, 0, 0, withscores=True)
        return float(first[0][1]) if first else None
