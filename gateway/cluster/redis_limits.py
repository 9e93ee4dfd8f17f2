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
on Redis's clock (`TIME` inside the script): one round trip per admitted request (a streamed request takes its
token and its slot in the same script), and replicas on
hosts whose clocks disagree still share one bucket. The scripts take an explicit clock only from the
tests (the shared table in tests/unit/test_shared_limits.py runs both rules on the same cases).
Raises what redis-py raises; RedisState turns it into SharedStateDown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

import redis.asyncio as aioredis

__all__ = ["RedisLimits"]

# What every script starts with: the clock, and the two rules as functions. `clock`: now in ms,
# Redis's unless the tests give one. `take`: core/limits.py take_token on the bucket at `key`;
# -1 when admitted, else the seconds until a token is back. `open_slot`: take_slot on the slots at
# `key`, 1 when taken (also when this slot is held already: a retried call whose reply was lost).
_RULES: Final = """
local function clock(given)
  if given ~= '' then return tonumber(given) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
end
local function take(key, rate, burst, now)
  local kept = redis.call('HMGET', key, 'tokens', 'stamp')
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
  redis.call('HSET', key, 'tokens', string.format('%.17g', tokens), 'stamp', string.format('%.17g', now))
  -- Full again after this long: then the bucket says nothing a missing one would not.
  redis.call('PEXPIRE', key, math.ceil((burst - tokens) / rate * 1000) + 1)
  return wait
end
local function open_slot(key, slot, cap, lease_ms, now)
  if redis.call('HEXISTS', key, slot) == 1 then
    redis.call('HSET', key, slot, string.format('%.17g', now + lease_ms))
    redis.call('PEXPIRE', key, lease_ms)
    return 1
  end
  local held = redis.call('HGETALL', key)
  local live = 0
  for i = 1, #held, 2 do
    if tonumber(held[i + 1]) <= now then
      redis.call('HDEL', key, held[i])
    else
      live = live + 1
    end
  end
  if live >= cap then return 0 end
  redis.call('HSET', key, slot, string.format('%.17g', now + lease_ms))
  redis.call('PEXPIRE', key, lease_ms)
  return 1
end
"""

# KEYS: the bucket. ARGV: rate (per second), burst, now (ms, or ''). Returns take's answer as a
# string (Lua numbers reach redis-py as integers).
_TAKE_TOKEN: Final = _RULES + """
return string.format('%.17g', take(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), clock(ARGV[3])))
"""

# KEYS: the user's slots. ARGV: slot id, cap, lease (ms), now (ms, or ''). Returns open_slot's answer.
_OPEN_SLOT: Final = _RULES + """
return open_slot(KEYS[1], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), clock(ARGV[4]))
"""

# A token, then a slot if the token was there: what a streamed request needs, in one round trip
# (a request refused for its rate takes no slot; one refused for the cap has spent its token, as
# with one replica). KEYS: the bucket, the slots. ARGV: rate, burst, slot id, cap, lease (ms), now
# (ms, or ''). Returns {take's answer as a string, open_slot's answer (0 when not tried)}.
_TAKE_BOTH: Final = _RULES + """
local now = clock(ARGV[6])
local wait = take(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), now)
if wait >= 0 then return {string.format('%.17g', wait), 0} end
return {'-1', open_slot(KEYS[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), now)}
"""

# The leases of a replica's slots, extended. KEYS: users' slot hashes. ARGV: lease (ms), now (ms,
# or ''), then for each key its number of slots and their ids. A slot no longer there is not
# written back: it was released (a release and a renewal may cross), or its lease ended.
_RENEW: Final = _RULES + """
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
        self._both = client.register_script(_TAKE_BOTH)
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

    async def take_token_and_slot(
        self, user_id: str, slot_id: str, rate: float, burst: int, cap: int, lease: float, now: float | None,
    ) -> tuple[float | None, bool]:
        args = [repr(float(rate)), burst, slot_id, cap, max(1, round(lease * 1000)), _ms(now)]
        raw_wait, taken = await self._both(keys=[self._bucket(user_id), self._slots(user_id)], args=args)
        wait = float(raw_wait)
        return (None, bool(taken)) if wait < 0 else (wait, False)

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
