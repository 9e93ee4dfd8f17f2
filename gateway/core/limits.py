"""Admission control: request rates and concurrent streams, per user and in total (sans-IO).

Each check either admits or raises `Limited` carrying the HTTP status and the Retry-After the
client should honour: 429 for what one user exceeds, 503 for what the gateway as a whole cannot
take. The caller passes the time, so the token buckets are tested without sleeping.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..config.schema import LimitsConfig
from .refusals import Refusal

__all__ = ["Admission", "Limited", "StreamSlot"]


class Limited(Refusal):
    """A request over a limit; status and code depend on which (429 for a user's, 503 for the gateway's)."""

    def __init__(self, status: int, code: str, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.retry_after = None if retry_after is None else max(1, math.ceil(retry_after))


@dataclass
class _Bucket:
    tokens: float
    stamp: float


@dataclass
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
        rate, burst = self.config.rate_per_user, self.config.burst_per_user
        bucket = self._buckets.get(user_id)
        if bucket is None:
            bucket = self._buckets[user_id] = _Bucket(float(burst), now)
        bucket.tokens = min(float(burst), bucket.tokens + (now - bucket.stamp) * rate)
        bucket.stamp = now
        if bucket.tokens < 1.0:
            raise Limited(429, "rate_limited", "too many requests", (1.0 - bucket.tokens) / rate)
        bucket.tokens -= 1.0

    def open_stream(self, user_id: str) -> StreamSlot:
        if self.streams_total >= self.config.max_streams_total:
            raise Limited(503, "gateway_busy", "the gateway is at its stream limit; try again shortly", 2)
        held = self._streams.get(user_id, 0)
        if held >= self.config.max_streams_per_user:
            raise Limited(429, "too_many_streams", f"at most {self.config.max_streams_per_user} concurrent responses per user", 1)
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
