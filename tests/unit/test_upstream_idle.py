"""The upstream idle timer: silence ends a stream, a person's wait does not, and neither does the
moment right after it. Time is a clock the tests move by hand (no sleeps racing the timer)."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable

from gateway.upstream.idle_reader import IdleReader, WaitSignal

IDLE = 1.0


class Timer:
    def __init__(self, callback: Callable[[], object]) -> None:
        self.callback: Callable[[], object] | None = callback

    def cancel(self) -> None:
        self.callback = None


class Timers:
    """The event loop's time and timers, with a clock that moves only when `advance` says so."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Timer]] = []
        self._seq = itertools.count()
        self.fired = 0

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], object], /) -> Timer:
        timer = Timer(callback)
        heapq.heappush(self._heap, (when, next(self._seq), timer))
        return timer

    def advance(self, to: float) -> None:
        """Fire every timer due by `to`, in order, each at its own time."""
        while self._heap and self._heap[0][0] <= to:
            when, _, timer = heapq.heappop(self._heap)
            if timer.callback is not None:
                self.now = max(self.now, when)
                self.fired += 1
                timer.callback()
        self.now = to

    @property
    def armed(self) -> int:
        return sum(1 for _, _, t in self._heap if t.callback is not None)


class Stream:
    """An upstream body the test feeds, read by an `IdleReader` in its own task."""

    def __init__(self, timers: Timers, wait: WaitSignal | None) -> None:
        self._chunks: asyncio.Queue[bytes] = asyncio.Queue()
        self.received: list[bytes] = []
        self.task = asyncio.create_task(self._read(timers, wait))

    async def readany(self) -> bytes:
        return await self._chunks.get()

    async def _read(self, timers: Timers, wait: WaitSignal | None) -> None:
        reader = IdleReader(self, IDLE, wait, timers)  # type: ignore[arg-type]
        try:
            while data := await reader.read():
                self.received.append(data)
        finally:
            reader.close()

    async def send(self, data: bytes) -> None:
        self._chunks.put_nowait(data)
        await _settle()

    async def end(self) -> list[bytes]:
        self._chunks.put_nowait(b"")
        await self.task
        return self.received


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def started(wait: WaitSignal | None = None) -> tuple[Timers, Stream]:
    timers = Timers()
    stream = Stream(timers, wait)
    await _settle()
    return timers, stream


async def assert_timed_out(stream: Stream) -> None:
    await _settle()
    assert stream.task.done()
    assert isinstance(stream.task.exception(), TimeoutError)


async def test_silence_longer_than_the_idle_timeout_ends_the_stream() -> None:
    timers, stream = await started()
    await stream.send(b"a")
    timers.advance(0.75)
    await stream.send(b"b")  # the silence restarts with each read
    timers.advance(1.5)
    assert not stream.task.done()
    timers.advance(1.75)
    await assert_timed_out(stream)
    assert stream.received == [b"a", b"b"]


async def test_a_wait_longer_than_the_idle_timeout_leaves_a_full_budget_after_it() -> None:
    wait = WaitSignal()
    timers, stream = await started(wait)
    timers.advance(0.1)
    wait.set(True)  # the plugin announced a gated call; ADK says nothing until the verdict
    timers.advance(30.0)
    wait.set(False)  # the person decided
    timers.advance(30.0 + IDLE - 0.01)  # ADK's next event may come (almost) a whole budget later
    await stream.send(b"next event")
    assert await stream.end() == [b"next event"]


async def test_a_short_wait_ending_near_the_deadline_leaves_a_full_budget_after_it() -> None:
    # The timer never fires during this wait: it must still restart the silence at its end.
    wait = WaitSignal()
    timers, stream = await started(wait)
    timers.advance(0.05)
    wait.set(True)
    timers.advance(0.95)
    wait.set(False)
    timers.advance(0.95 + IDLE - 0.01)
    await stream.send(b"next event")
    assert await stream.end() == [b"next event"]


async def test_silence_after_a_wait_counts_from_its_end() -> None:
    wait = WaitSignal()
    timers, stream = await started(wait)
    wait.set(True)
    timers.advance(10.0)
    wait.set(False)
    timers.advance(10.0 + IDLE - 0.01)
    assert not stream.task.done()
    timers.advance(10.0 + IDLE)
    await assert_timed_out(stream)


async def test_a_wait_costs_one_timer_firing_per_idle_period_and_close_disarms_it() -> None:
    wait = WaitSignal()
    timers, stream = await started(wait)
    wait.set(True)
    timers.advance(10.0 * IDLE)
    assert timers.fired == 10 and timers.armed == 1
    assert await stream.end() == []
    assert timers.armed == 0
    wait.set(False)  # the run's signal outlives the stream; nothing is listening any more


async def test_a_busy_stream_arms_no_timer_per_read() -> None:
    timers, stream = await started()
    for i in range(100):
        timers.advance(i * 0.01)
        await stream.send(b"x")
    assert timers.fired == 0 and timers.armed == 1
    assert len(await stream.end()) == 100
