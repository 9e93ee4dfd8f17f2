"""A `/run_sse` run the gateway cut off, and the wait before the next run on its ADK session.

The gateway cuts a run's stream when the browser stops it (WebSocket `abort`, `chat.on_disconnect:
cancel`), when a new message comes while nobody reads the response, when the upstream falls silent
past `upstream.idle_timeout`, or when a stop must end a stuck run. ADK (2.11 and later) then cancels
the invocation and, after the cut, writes its abort seal (an event with `errorCode:
INVOCATION_ABORTED`) into the session. ADK's database session stores (SQLite, Postgres) refuse an
append from a run whose copy of the session is older than storage (`StaleSessionError`, optimistic
concurrency): a run started on the session before that seal is written loads the session, the seal
lands, and the new run's first append (its user message) fails. In-memory sessions do not check.

So the chat's next run waits (`settle_cut`) until ADK has finished writing the cut one, as its
session shows it: its history ends on an abort seal and is unchanged one poll later, or nothing
changed for `QUIET` (an ADK before 2.11 writes nothing after a cut), at most `BOUND`. Each poll is
a read of the session (ADK's GET answers its whole history): this is the stop path, not the
per-event one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["BOUND", "POLL", "QUIET", "SessionWrites", "settle_cut"]

# How often the session is read while a cut run may still be writing.
POLL: Final = 0.05
# No write for this long: the cut run has finished (an ADK that writes no seal stops at the cut).
QUIET: Final = 0.3
# The longest a next run waits: a cut run's seal comes within milliseconds of the cut, unless the
# invocation is stuck (a tool that ignores cancellation); then the next run goes ahead.
BOUND: Final = 3.0

_ABORTED: Final = "INVOCATION_ABORTED"


@dataclass(frozen=True)
class SessionWrites:
    """What a read of an ADK session says of its writes: how many events, when it was last
    updated, and whether its last event is ADK's abort seal of a cancelled invocation."""

    events: int
    updated: Any
    sealed: bool

    @classmethod
    def of(cls, session: Any) -> SessionWrites:
        """From the session JSON ADK's GET answers (either key case)."""
        if not isinstance(session, dict):
            return cls(0, None, False)
        events = session.get("events")
        events = events if isinstance(events, list) else []
        last = events[-1] if events and isinstance(events[-1], dict) else {}
        sealed = (last.get("errorCode") or last.get("error_code")) == _ABORTED
        updated = session.get("lastUpdateTime", session.get("last_update_time"))
        return cls(len(events), updated, sealed)


async def settle_cut(
    read: Callable[[], Awaitable[Any]], *, clock: Callable[[], float],
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> bool:
    """Wait until the session `read` returns (None: it does not exist) shows the cut run finished:
    ended on an abort seal and unchanged across one poll, or unchanged for `QUIET`; at most `BOUND`.
    Whether it settled (False: the bound passed). What `read` raises is the caller's."""
    start = clock()
    seen: SessionWrites | None = None
    since = start
    while True:
        session = await read()
        if session is None:
            return True
        writes = SessionWrites.of(session)
        now = clock()
        if writes != seen:
            seen, since = writes, now
        elif writes.sealed or now - since >= QUIET:
            return True
        if now - start >= BOUND:
            return False
        await sleep(POLL)
