"""Backoff: the delays between attempts at something that keeps failing.

Used by the Redis backend's inbox loop (redis.py), which retries its subscription while Redis is
down without hammering it, and starts over once an attempt succeeds.
"""

from __future__ import annotations

__all__ = ["Backoff"]


class Backoff:
    """Delays between attempts at something that keeps failing: `first`, then twice the last,
    up to `cap`; from `first` again after a success."""

    def __init__(self, first: float, cap: float) -> None:
        self._first = first
        self._cap = cap
        self._delay = first
        self._failures = 0

    @property
    def failing(self) -> bool:
        """Whether the last attempt failed."""
        return self._failures > 0

    def failed(self) -> float:
        """Count a failed attempt; the delay before the next one."""
        self._failures += 1
        delay = self._delay
        self._delay = min(self._delay * 2, self._cap)
        return delay

    def succeeded(self) -> int:
        """Start over; how many attempts had failed in a row."""
        failures, self._failures, self._delay = self._failures, 0, self._first
        return failures
