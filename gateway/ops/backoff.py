"""Backoff: the delays between attempts at something that keeps failing.

Used by the Redis backend's inbox loop (redis.py), which retries its subscription while Redis is
down without hammering it, and starts over once an attempt succeeds; and by the approval webhooks
and the Slack channel (approvals/webhooks.py, approvals/slack.py), with a receiver's `Retry-After`;
and by the approval mails (approvals/email.py).
"""

from __future__ import annotations

from email.utils import parsedate_to_datetime

__all__ = ["Backoff", "retry_after"]


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


def retry_after(value: str | None, now: float) -> float | None:
    """Retry-After's seconds, from a number of seconds or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        return max(parsedate_to_datetime(value).timestamp() - now, 0.0)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
