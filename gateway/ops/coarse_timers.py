"""Long timers of many held streams on one event-loop timer: `CoarseTimers`.

A held stream keeps two long timers: its SSE keep-alive (`chat.keepalive_interval`, 15 s) and its
upstream idle timeout (`upstream.idle_timeout`, 300 s). On uvloop each `loop.call_at` is a
TimerHandle, a libuv timer and its context, ~540 bytes (bench.memprofile): a thousand idle
streams kept a megabyte of them. These timers need no precision, so a `CoarseTimers` files them
by the tick they fall due in (a dict entry each) and keeps one loop timer for the earliest tick.
A timer fires at most one tick late, never early; one due sooner than `short` from now goes to the
loop as before (a test's or a config's short timeout keeps its precision).
"""

from __future__ import annotations

import asyncio
import heapq
import math
from collections.abc import Callable

__all__ = ["CoarseTimer", "CoarseTimers"]


class CoarseTimer:
    """One filed timer; `cancel()` takes it out (as a TimerHandle's does)."""

    __slots__ = ("_callback", "_owner", "_tick")

    def __init__(self, owner: CoarseTimers, tick: int, callback: Callable[[], object]) -> None:
        self._owner = owner
        self._tick = tick
        self._callback: Callable[[], object] | None = callback

    def cancel(self) -> None:
        if self._callback is not None:
            self._callback = None
            self._owner._forget(self, self._tick)


class CoarseTimers:
    """Timers rounded up to the next multiple of `tick` seconds, all on one loop timer.

    `call_at(when, callback)` is the loop's (the loop's clock, a handle with `cancel()`), for
    callbacks that take no arguments and need no context of their own. Bound to the running loop
    at its first use (and to another if it is called from one)."""

    __slots__ = ("_due", "_handle", "_loop", "_short", "_tick", "_ticks")

    def __init__(self, tick: float = 1.0, short: float = 4.0) -> None:
        self._tick = tick
        self._short = short
        self._loop: asyncio.AbstractEventLoop | None = None
        # Timers by the tick they fall due in (insertion-ordered dicts: they fire in order filed).
        self._ticks: dict[int, dict[CoarseTimer, None]] = {}
        self._due: list[int] = []  # the ticks of `_ticks`, a heap (a tick emptied by cancels may linger)
        self._handle: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return sum(len(timers) for timers in self._ticks.values())

    def call_at(self, when: float, callback: Callable[[], object]) -> CoarseTimer | asyncio.TimerHandle:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            # Another loop (a test's next one): what was filed on the old one can never fire.
            self._loop = loop
            self._ticks.clear()
            self._due.clear()
            self._handle = None
        if when - loop.time() < self._short:
            return loop.call_at(when, callback)
        tick = math.ceil(when / self._tick)
        timers = self._ticks.get(tick)
        if timers is None:
            timers = self._ticks[tick] = {}
            heapq.heappush(self._due, tick)
            if self._due[0] == tick:
                self._arm(loop)
        timer = CoarseTimer(self, tick, callback)
        timers[timer] = None
        return timer

    def _forget(self, timer: CoarseTimer, tick: int) -> None:
        timers = self._ticks.get(tick)
        if timers is not None:
            timers.pop(timer, None)
            if not timers:
                del self._ticks[tick]

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = loop.call_at(self._due[0] * self._tick, self._fire) if self._due else None

    def _fire(self) -> None:
        loop = self._loop
        assert loop is not None
        self._handle = None
        now = loop.time()
        due = self._due
        while due and due[0] * self._tick <= now:
            timers = self._ticks.pop(heapq.heappop(due), None)
            for timer in timers or ():
                callback, timer._callback = timer._callback, None
                if callback is not None:
                    _run(loop, callback)
        while due and due[0] not in self._ticks:
            heapq.heappop(due)  # emptied by cancels
        self._arm(loop)


def _run(loop: asyncio.AbstractEventLoop, callback: Callable[[], object]) -> None:
    try:
        callback()
    except Exception as exc:  # one timer's failure must not skip the others of its tick
        loop.call_exception_handler({"message": "a coarse timer's callback failed", "exception": exc})
