"""Per-user limits in Redis (`sessions.backend: redis`): the token buckets and stream slots every
replica counts against, so that N replicas admit a user's configured rate, not N times it.

Two keys per user under `sessions.key_prefix` (docs/scaling.md has the table):
- `{p}:rate:{user}`: a hash {tokens, stamp}: the user's token bucket as of `stamp` (ms on Redis's
  clock). It expires when it would be full again: then it says nothing a missing bucket does not.
- `{p}:streams:{user}`: a hash, field a stream slot's id (the holding replica's id and a number),
  value when the slot's lease ends (ms on Redis's clock). The holder renews its slots' leases at
  every heartbeat (`sessions.heartbeat_interval`) for `sessions.owner_timeout`, the span after
  which a silent replica is dead for the chat directory too; a slot whose lease ended is removed by
  the next opening for that user, so a replica that dies, or loses a release on a Redis error, holds
  the user's slot for one lease at most. The key expires a lease after its last write.

Each decision is one Lua script, which runs core/limits.py's pure rule (`take_token`, `take_slot`)
on Redis's clock (`TIME` inside the script): one round trip per admitted request, and replicas on
hosts whose clocks disagree still share one bucket. The scripts take an explicit clock only from the
tests (the shared table in tests/unit/test_shared_limits.py runs both rules on the same cases).
Raises what redis-py raises; RedisState turns it into SharedStateDown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

import redis.asyncio as aioredis

__all__ = ["RedisLimits"]

# Now in ms: Redis's clock, or the tests' (ARGV given).
_NOW: Final = """
local function clock(given)
  if given ~= '' then return tonumber(given) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
end
"""

# core/limits.py take_token. KEYS: the bucket. ARGV: rate (per second), burst, now (ms, or '').
# Returns -1 when admitted, else the seconds until a token is back (as a string: Lua numbers
# reach redis-py as integers).
_TAKE_TOKEN: Final = _NOW + """
local now = clock(ARGV[3])
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local kept = redis.call('HMGET', KEYS[1], 'tokens', 'stamp')
local tokens = burst
if kept[1] then
  tokens = math.min(burst, tonumber(kept[1]) + math.max(0, now - tonumber(kept[2])) / 1000 * rate)
end
local wait = -1
if tokens < 1 then
  wait = (1 - tokens) / rate
else
  tokens = tokens - 1
end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens), 'stamp', string.format('%.17g', now))
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) / rate * 1000) + 1)
return string.format('%.17g', wait)
"""

# core/limits.py take_slot. KEYS: the user's slots. ARGV: slot id, cap, lease (ms), now (ms, or '').
# Returns 1 (taken; also when this slot is held already: a retried call whose reply was lost) or 0.
_OPEN_SLOT: Final = _NOW + """
local now = clock(ARGV[4])
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  redis.call('HSET', KEYS[1], ARGV[1], string.format('%.17g', now + tonumber(ARGV[3])))
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
local held = redis.call('HGETALL', KEYS[1])
local live = 0
for i = 1, #held, 2 do
  if tonumber(held[i + 1]) <= now then
    redis.call('HDEL', KEYS[1], held[i])
  else
    live = live + 1
  end
end
if live >= tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], string.format('%.17g', now + tonumber(ARGV[3])))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""

# The leases of a replica's slots, extended. KEYS: users' slot hashes. ARGV: lease (ms), now (ms,
# or ''), then for each key its number of slots and their ids. A slot no longer there is not
# written back: it was released (a release and a renewal may cross), or its lease ended.
_RENEW: Final = _NOW + """
local now = clock(ARGV[2])
local untl = string.format('%.17g', now + tonumber(ARGV[1]))
local at = 3
local renewed = 0
for k = 1, #KEYS do
  local n = tonumber(ARGV[at])
  at = at + 1
  for j = 1, n do
    if redis.call('HEXISTS', KEYS[k], ARGV[at]) == 1 then
      redis.call('HSET', KEYS[k], ARGV[at], untl)
      renewed = renewed + 1
    end
    at = at + 1
  end
  if redis.call('EXISTS', KEYS[k]) == 1 then redis.call('PEXPIRE', KEYS[k], ARGV[1]) end
end
return renewed
"""


def _ms(seconds: float | None) -> str:
    return "" if seconds is None else repr(seconds * 1000)


class RedisLimits:
    """The shared limits of one RedisState (its client and key prefix). Nothing here is sealed: a
    bucket or a slot authorizes nothing, and who can write Redis can take the gateway down anyway
    (docs/security.md)."""

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self._redis = client
        self._prefix = prefix
        self._take = client.register_script(_TAKE_TOKEN)
        self._open = client.register_script(_OPEN_SLOT)
        self._renew = client.register_script(_RENEW)

    def _bucket(self, user_id: str) -> str:
        return f"{self._prefix}:rate:{user_id}"

    def _slots(self, user_id: str) -> str:
        return f"{self._prefix}:streams:{user_id}"

    async def take_token(self, user_id: str, rate: float, burst: int, now: float | None) -> float | None:
        wait = float(await self._take(keys=[self._bucket(user_id)], args=[repr(float(rate)), burst, _ms(now)]))
        return None if wait < 0 else wait

    async def open_slot(self, user_id: str, slot_id: str, cap: int, lease: float, now: float | None) -> bool:
        args = [slot_id, cap, max(1, round(lease * 1000)), _ms(now)]
        return bool(await self._open(keys=[self._slots(user_id)], args=args))

    async def close_slot(self, user_id: str, slot_id: str) -> None:
        await self._redis.hdel(self._slots(user_id), slot_id)

    async def renew(self, slots: Mapping[str, Sequence[str]], lease: float, now: float | None) -> int:
        if not slots:
            return 0
        keys: list[str] = []
        args: list[str | int] = [max(1, round(lease * 1000)), _ms(now)]
        for user_id, ids in slots.items():
            keys.append(self._slots(user_id))
            args.append(len(ids))
            args.extend(ids)
        return int(await self._renew(keys=keys, args=args))
