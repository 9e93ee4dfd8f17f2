"""The idle timeout of an upstream stream, which a run waiting for a person does not spend.

`IdleReader` reads an ADK `/run_sse` body and fails with TimeoutError once the stream has been
silent for `upstream.idle_timeout`; `WaitSignal` is how the run's owner tells it that the silence
is a person deciding (an approval), not idleness. `upstream/client.py` reads every run through one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

import aiohttp

__all__ = ["IdleReader", "WaitSignal"]


class WaitSignal:
    """Tells the idle timer of a run's upstream stream whether the run waits for a person.

    While a person decides, ADK's run stays open and sends nothing (the plugin holds the tool call
    until the verdict), and that silence is not idleness. The run's owner calls `set()` whenever
    the answer may have changed; only changes reach the stream's reader, which then counts silence
    from its last read or from the end of the last wait, whichever is later. A flag polled by the
    timer could not do that: a wait that began and ended between two firings went unseen, and a
    wait's end was only seen at the next firing, so ADK's next event could find the budget spent.
    """

    __slots__ = ("_listener", "waiting")

    def __init__(self) -> None:
        self.waiting = False
        self._listener: Callable[[bool], None] | None = None

    def set(self, waiting: bool) -> None:
        if waiting is not self.waiting:
            self.waiting = waiting
            if self._listener is not None:
                self._listener(waiting)


class _Handle(Protocol):
    def cancel(self) -> None: ...


class _CallAt(Protocol):
    def call_at(self, when: float, callback: Callable[[], object], /) -> _Handle: ...


class _Timers(_CallAt, Protocol):
    """What `IdleReader` needs of the event loop (tests pass a clock they move by hand)."""

    def time(self) -> float: ...


class IdleReader:
    """Reads a stream, failing with TimeoutError after `idle` seconds without data.

    The time the run waits for a person (see WaitSignal) is not silence: silence counts from the
    last read or from the end of the last wait, whichever is later.

    One timer per stream, re-armed only when it fires: a timer per read (asyncio.timeout) costs a
    heap insertion and removal for every event on the hot path. Reads and the end of a wait only
    move `_last`; the timer, when it fires early, re-arms for the deadline `_last` gives, and while
    the run waits it fires once per `idle` with nothing to do. `close()` must be called when the
    stream is left, so the timer never fires into whatever the task does next.
    """

    __slots__ = ("_content", "_expired", "_idle", "_last", "_loop", "_task", "_timer", "_timers", "_wait")

    def __init__(
        self, content: aiohttp.StreamReader, idle: float, wait: WaitSignal | None = None, loop: _Timers | None = None,
        timers: _CallAt | None = None,
    ) -> None:
        self._content = content
        self._idle = idle
        self._wait = wait
        self._loop: _Timers = loop or asyncio.get_running_loop()
        # Where the timer goes: the loop, or one timer for many streams (ops/coarse_timers.py).
        self._timers: _CallAt = self._loop if timers is None else timers
        self._task = asyncio.current_task()
        self._last = self._loop.time()
        self._timer: _Handle | None = self._timers.call_at(self._last + idle, self._check)
        self._expired = False
        if wait is not None:
            wait._listener = self._wait_changed

    async def read(self) -> bytes:
        try:
            data = await self._content.readany()
        except asyncio.CancelledError:
            if self._expired and self._task is not None:
                self._task.uncancel()
                raise TimeoutError from None
            raise
        self._last = self._loop.time()
        return data

    def _wait_changed(self, waiting: bool) -> None:
        if not waiting:
            self._last = self._loop.time()

    def _check(self) -> None:
        now = self._loop.time()
        if self._wait is not None and self._wait.waiting:
            due = now + self._idle
        else:
            due = self._last + self._idle
            if now >= due:
                self._timer = None
                if self._task is not None:
                    self._expired = True
                    self._task.cancel()
                return
        self._timer = self._timers.call_at(due, self._check)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._wait is not None and self._wait._listener == self._wait_changed:
            self._wait._listener = None
