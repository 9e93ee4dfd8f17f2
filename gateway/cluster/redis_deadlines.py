"""The one deadline queue in Redis (`sessions.backend: redis`): the set every replica watches.

Three keys under `sessions.key_prefix` (docs/scaling.md has the table):
- `{p}:deadlines`: a sorted set, member the deadline's key (chat id/approval id for an ADK
  confirmation's, chat id/held for a chat's held calls': deadlines.py `Deadline.key`), score its due
  time (seconds since the epoch), or, while a replica holds a claim on it, when the claim's
  lease ends;
- `{p}:deadline`: a hash, field the same key, value the deadline (deadlines.py) as JSON, sealed
  (sealing.py): another replica acts on it, so what does not open is dropped unread;
- `{p}:deadline_claims`: a hash, field the same key, value the token of the claim that holds it
  (its lease's end, as the claimer wrote it), while one does.

A deadline is kept until it is dropped (answered) or its claim settles it: at most the tool's
`timeout` after its call was asked, plus a lease per replica that died holding it, unless
nobody can claim it (every replica down), when the first replica back claims it. Claiming runs as
one Lua script that leases what it returns (pushes its due time to the lease's end and writes the
claim's token), so of replicas racing for the same due deadline exactly one gets it, and nobody
else until that lease ends. Settling runs as one script too, which changes the deadline only while
the token is still the claimer's: an add or a drop meanwhile clears it, a later claim replaces it.
Every Redis error becomes SharedStateDown (the caller's owner, RedisState, turns it so).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Final

import redis.asyncio as aioredis
import structlog

from ..core.deadlines import Deadline, MalformedDeadline
from .sealing import Seal, Tampered

__all__ = ["RedisDeadlines"]

log = structlog.get_logger("adk_gateway.cluster.redis_deadlines")

# ARGV: now (seconds), at most how many, the lease's end (also the claim's token).
# KEYS: the sorted set, the records, the claims. Returns key, record, key, record...
# A key without a record (written by another party) is removed.
_CLAIM: Final = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local out = {}
for _, key in ipairs(due) do
  local record = redis.call('HGET', KEYS[2], key)
  if record then
    redis.call('ZADD', KEYS[1], ARGV[3], key)
    redis.call('HSET', KEYS[3], key, ARGV[3])
    out[#out + 1] = key
    out[#out + 1] = record
  else
    redis.call('ZREM', KEYS[1], key)
    redis.call('HDEL', KEYS[3], key)
  end
end
return out
"""

# ARGV: the key, the claim's token, when to try again ('': drop it), the sealed record to keep.
# KEYS: as _CLAIM's. Returns 1 if the claim still held the deadline (and settled it), else 0.
_SETTLE: Final = """
if redis.call('HGET', KEYS[3], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[3], ARGV[1])
if ARGV[3] == '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
else
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[4])
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
end
return 1
"""


class RedisDeadlines:
    """The deadline set of one RedisState (its client, key prefix and seal). Raises what redis-py
    raises; RedisState turns it into SharedStateDown."""

    def __init__(self, client: aioredis.Redis, prefix: str, seal: Seal) -> None:
        self._redis = client
        self._set = f"{prefix}:deadlines"
        self._records = f"{prefix}:deadline"
        self._claims = f"{prefix}:deadline_claims"
        self._seal = seal
        self._claim = client.register_script(_CLAIM)
        self._settle = client.register_script(_SETTLE)

    def _context(self, key: str) -> str:
        # The seal covers the key, so a sealed deadline cannot be moved to another confirmation.
        return f"{self._records}:{key}"

    def _sealed(self, deadline: Deadline) -> bytes:
        return self._seal.seal(deadline.to_json().encode(), self._context(deadline.key))

    async def add(self, deadline: Deadline) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(self._records, deadline.key, self._sealed(deadline))
            pipe.zadd(self._set, {deadline.key: deadline.due})
            pipe.hdel(self._claims, deadline.key)
            await pipe.execute()

    async def drop(self, key: str) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.zrem(self._set, key)
            pipe.hdel(self._records, key)
            pipe.hdel(self._claims, key)
            await pipe.execute()

    async def claim(self, now: float, limit: int, until: float) -> list[Deadline]:
        if until <= now:
            raise ValueError("a lease ends after it starts")
        keys = [self._set, self._records, self._claims]
        raw: list[Any] = await self._claim(keys=keys, args=[repr(now), limit, repr(until)])
        out = []
        for index in range(0, len(raw) - 1, 2):
            key = raw[index].decode() if isinstance(raw[index], bytes) else str(raw[index])
            try:
                deadline = Deadline.from_json(self._seal.open(raw[index + 1], self._context(key)))
            except (Tampered, MalformedDeadline):
                deadline = None
            if deadline is None or deadline.key != key:
                # Not one this gateway wrote: gone for good, not claimed again after every lease.
                log.warning("deadline_record_tampered")
                await self._settle_key(key, until, None, b"")
                continue
            out.append(replace(deadline, leased_until=until))
        return out

    async def settle(self, claimed: Deadline, again: float | None) -> bool:
        if claimed.leased_until is None:
            raise ValueError("only a claimed deadline is settled")
        record = b"" if again is None else self._sealed(replace(claimed, due=again))
        return await self._settle_key(claimed.key, claimed.leased_until, again, record)

    async def _settle_key(self, key: str, until: float, again: float | None, record: bytes) -> bool:
        # The token compares as the string the claim wrote: repr of the same float.
        args = [key, repr(until), "" if again is None else repr(again), record]
        return bool(await self._settle(keys=[self._set, self._records, self._claims], args=args))

    async def next_due(self) -> float | None:
        first = await self._redis.zrange(self._set, 0, 0, withscores=True)
        return float(first[0][1]) if first else None
