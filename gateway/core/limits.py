"""Admission control: request rates and concurrent streams, per user and in total (sans-IO).

Each check either admits or raises `Limited` carrying the HTTP status and the Retry-After the
client should honour: 429 for what one user exceeds, 503 for what the gateway as a whole cannot
take. The caller passes the time, so the token buckets are tested without sleeping.

`take_token` and `take_slot` are the two decisions, pure: `Admission` applies them to this process's
counts, and with `sessions.backend: redis` the replicas apply them to counts kept in Redis, where
redis_limits.py runs them as Lua scripts that mirror these functions line for line
(tests/unit/test_shared_limits.py runs one table of cases against both). `LeasedLimits` keeps such
counts as Redis keeps them, for the memory backend of the shared state.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..config.schema import LimitsConfig
from .refusals import Refusal

__all__ = ["Admission", "LeasedLimits", "Limited", "StreamSlot", "take_slot", "take_token", "too_many_streams"]


class Limited(Refusal):
    """A request over a limit; status and code depend on which (429 for a user's, 503 for the gateway's)."""

    def __init__(self, status: int, code: str, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.retry_after = None if retry_after is None else max(1, math.ceil(retry_after))


def take_token(tokens: float | None, stamp: float, now: float, rate: float, burst: int) -> tuple[float, float | None]:
    """One request against a bucket that held `tokens` at `stamp` (None: no bucket, which is a full
    one). Returns the tokens left, stamped `now`, and None when the request is admitted, else the
    seconds until a token is back. A clock that went backwards (a Redis failed over to a host whose
    clock is behind) refills nothing rather than taking tokens away."""
    if tokens is None:
        tokens = float(burst)
    else:
        tokens = min(float(burst), tokens + max(0.0, now - stamp) * rate)
    if tokens < 1.0:
        return tokens, (1.0 - tokens) / rate
    return tokens - 1.0, None


def take_slot(held: Mapping[str, float], now: float, cap: int) -> tuple[list[str], bool]:
    """One more stream for a user who holds `held` (slot id -> when its lease ends): the slots whose
    lease ended (to forget: their holder stopped renewing them, it died or lost the release), and
    whether a new slot fits under `cap` once they are gone."""
    expired = [slot for slot, until in held.items() if until <= now]
    return expired, len(held) - len(expired) < cap


@dataclass
class _Bucket:
    tokens: float
    stamp: float


def too_many_streams(config: LimitsConfig) -> Limited:
    return Limited(429, "too_many_streams", f"at most {config.max_streams_per_user} concurrent responses per user", 1)


@dataclass(slots=True)
class StreamSlot:
    """A held stream; `release()` gives it back (idempotent)."""

    admission: Admission
    user_id: str
    released: bool = field(default=False)

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.admission._release(self.user_id)


class Admission:
    def __init__(self, config: LimitsConfig) -> None:
        self.config = config
        self._buckets: dict[str, _Bucket] = {}
        self._streams: dict[str, int] = {}
        self.streams_total = 0

    def check_rate(self, user_id: str, now: float) -> None:
        """Take one token from the user's bucket."""
        bucket = self._buckets.get(user_id)
        tokens, wait = take_token(
            None if bucket is None else bucket.tokens, 0.0 if bucket is None else bucket.stamp, now,
            self.config.rate_per_user, self.config.burst_per_user,
        )
        self._buckets[user_id] = _Bucket(tokens, now)
        if wait is not None:
            raise Limited(429, "rate_limited", "too many requests", wait)

    def open_stream(self, user_id: str, *, per_user: bool = True) -> StreamSlot:
        """A stream slot, under the total cap, and under the user's unless `per_user` is false (the
        replicas check that one together, in Redis: the slot is still counted here, for a fallback)."""
        if self.streams_total >= self.config.max_streams_total:
            raise Limited(503, "gateway_busy", "the gateway is at its stream limit; try again shortly", 2)
        held = self._streams.get(user_id, 0)
        if per_user and held >= self.config.max_streams_per_user:
            raise too_many_streams(self.config)
        self._streams[user_id] = held + 1
        self.streams_total += 1
        return StreamSlot(self, user_id)

    def _release(self, user_id: str) -> None:
        held = self._streams.get(user_id, 0) - 1
        if held > 0:
            self._streams[user_id] = held
        else:
            self._streams.pop(user_id, None)
        self.streams_total -= 1

    def forget_idle_buckets(self, now: float) -> None:
        """Drop buckets that have refilled completely: they hold no information any more."""
        full_after = self.config.burst_per_user / self.config.rate_per_user
        stale = [u for u, b in self._buckets.items() if now - b.stamp > full_after]
        for user in stale:
            del self._buckets[user]


@dataclass
class LeasedLimits:
    """Per-user token buckets and leased stream slots, kept as the replicas' shared store keeps them
    (cluster/redis_limits.py's scripts run the same rules in Redis): the memory backend's, which the
    shared table of cases holds to the scripts (tests/unit/test_shared_limits.py)."""

    # user -> (tokens, stamp); user -> {slot id: lease end}.
    buckets: dict[str, tuple[float, float]] = field(default_factory=dict)
    slots: dict[str, dict[str, float]] = field(default_factory=dict)

    def take_token(self, user_id: str, rate: float, burst: int, now: float) -> float | None:
        """None when a token was taken, else the seconds until one is there."""
        kept = self.buckets.get(user_id)
        tokens, wait = take_token(None if kept is None else kept[0], 0.0 if kept is None else kept[1], now, rate, burst)
        self.buckets[user_id] = (tokens, now)
        return wait

    def open_slot(self, user_id: str, slot_id: str, cap: int, lease: float, now: float) -> bool:
        held = self.slots.setdefault(user_id, {})
        if slot_id not in held:
            expired, fits = take_slot(held, now, cap)
            for slot in expired:
                del held[slot]
            if not fits:
                return False
        held[slot_id] = now + lease
        return True

    def close_slot(self, user_id: str, slot_id: str) -> None:
        held = self.slots.get(user_id)
        if held is not None:
            held.pop(slot_id, None)
            if not held:
                del self.slots[user_id]

    def renew(self, slots: Mapping[str, Sequence[str]], lease: float, now: float) -> int:
        """Extend the leases of the slots still held (a renewal never brings a released one back)."""
        renewed = 0
        for user_id, ids in slots.items():
            held = self.slots.get(user_id, {})
            for slot_id in ids:
                if slot_id in held:
                    held[slot_id] = now + lease
                    renewed += 1
        return renewed
