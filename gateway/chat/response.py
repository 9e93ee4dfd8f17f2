"""One response of a run's chunk log, and the requests that read it (chunk_log.py has the whole story).

A `Response` holds the encoded chunks one browser request receives, from `start` to `finish`,
bounded by `limit`, and wakes its followers as chunks arrive; a follower that falls a whole half
behind is told so (`FollowerLagged`) rather than handed a stream with a hole in it. A `Reader` is
one request reading it (a `Feed`), counted until it is closed, with the message's earlier chunks
before it when it is a resume's.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Protocol

from .presence import Presence

__all__ = ["CallAt", "Feed", "FollowerLagged", "Reader", "Response"]


class _Handle(Protocol):
    def cancel(self) -> None: ...


class CallAt(Protocol):
    """Where a follower's keep-alive timer goes: the loop, or one timer for many (ops/coarse_timers.py)."""

    def call_at(self, when: float, callback: Callable[[], object], /) -> _Handle: ...


class Feed(Protocol):
    """What a transport follows: a `Reader` of a response here, or one relayed from another replica."""

    def watch(self, presence: Presence) -> None:
        """How to tell the request's browser is gone: the transport's word (chat/ports.py)."""
        ...

    def connected(self) -> bool:
        """Whether the request's browser is still there, as its `Presence` says."""
        ...

    def follow(self, start: int = 0, *, idle: float | None = None, timers: CallAt | None = None) -> AsyncIterator[list[bytes]]: ...

    def close(self) -> None:
        """The request reads no more (its browser went away, or it read to the end)."""
        ...


class FollowerLagged(Exception):
    """A follower fell behind the bounded log; the chunks it needed are gone."""


class Response:
    """The chunks of one browser response, in order."""

    __slots__ = ("_readers", "_sink", "_waiters", "closed", "closed_at", "delivered", "frames", "limit", "offset")

    def __init__(self, limit: int) -> None:
        # A tuple once closed (see `close`).
        self.frames: list[bytes] | tuple[bytes, ...] = []
        self.limit = limit
        self.offset = 0  # frames dropped from the front
        self.closed = False
        self.closed_at: float | None = None
        # Some follower read it to the end. A response nobody read whole (written while the
        # browser was away, e.g. after an approval timed out, or cut off by a dropped socket) is
        # handed to the next request that attaches or resumes.
        self.delivered = False
        self._waiters: list[asyncio.Future[object]] = []
        # A parked follower that can take frames synchronously (see `follow_direct`): one at most.
        self._sink: _Sink | None = None
        # The requests that read it (see `Reader`); None once it is closed, when nobody asks.
        # A list: one reader or two, where a set is 216 bytes empty (every held stream keeps one).
        self._readers: list[Reader] | None = []

    def append(self, frames: list[bytes]) -> None:
        held = self.frames
        assert isinstance(held, list), "a closed response takes no more frames"
        sink = self._sink
        caught_up = sink is not None and sink.position == self.offset + len(held)
        held.extend(frames)
        if len(held) > self.limit:
            drop = len(held) // 2
            del held[:drop]
            self.offset += drop
        if sink is not None:
            if caught_up and sink.write_now(frames):
                # Written by the publishing task itself: the follower stays parked, no task hop.
                sink.position = self.offset + len(self.frames)
                if sink.ticker is not None:
                    sink.ticker.touch()
            else:
                self._sink = None
                _resolve(sink.waiter, None)
        self._wake()

    def close(self, now: float) -> None:
        self.closed = True
        self.closed_at = now
        # A chat keeps its last response for resume, often for as long as the chat lives. As a
        # list, every full garbage collection visits each of its frames; a tuple of bytes is
        # untracked by CPython's collector at its first pass. With many idle chats a full
        # collection walked millions of frames (bench, tool turns of 303 events, a new chat
        # each: docs/performance.md).
        self.frames = tuple(self.frames)
        self._readers = None
        sink, self._sink = self._sink, None
        if sink is not None:
            _resolve(sink.waiter, None)
        self._wake()

    def reader(self, earlier: tuple[bytes, ...] = ()) -> Reader:
        """A reader of this response, counted from now until it is closed; `earlier`: the chunks a
        replay shows before it (the message's earlier responses)."""
        reader = Reader(self, earlier)
        if self._readers is not None:
            self._readers.append(reader)
        return reader

    @property
    def read(self) -> bool:
        """Some request still reads this response (and its browser is still there)."""
        return bool(self._readers) and any(reader.connected() for reader in self._readers)  # type: ignore[union-attr]

    @property
    def read_here(self) -> bool:
        """Some request of this replica's own still reads this response (not a relay)."""
        return bool(self._readers) and any(not r.remote and r.connected() for r in self._readers)  # type: ignore[union-attr]

    def _forget(self, reader: Reader) -> None:
        if self._readers is not None and reader in self._readers:
            self._readers.remove(reader)

    @property
    def complete(self) -> bool:
        """Every frame since `start` is still held, so the response can be replayed whole."""
        return self.offset == 0

    def follow(self, start: int = 0, *, idle: float | None = None, timers: CallAt | None = None) -> AsyncIterator[list[bytes]]:
        """Batches of frames from position `start` until the response is complete.

        With `idle`, an empty batch comes after that many seconds without frames, so the
        transport can send a keep-alive; `timers`: where that timer goes (default: the loop;
        ops/coarse_timers.py puts many on one).
        """
        return self._follow(start, idle, None, timers)

    def follow_direct(
        self, write_now: Callable[[list[bytes]], bool], start: int = 0, *, idle: float | None = None,
        timers: CallAt | None = None,
    ) -> AsyncIterator[list[bytes]]:
        """`follow`, except that while the follower is parked (it wrote everything so far), the
        publishing task calls `write_now(frames)` with new frames instead of waking it.

        `write_now` must not raise and must not block: it writes the frames and returns True, or
        returns False having written nothing (the transport has a backlog, say), and the frames
        then come out of the iterator as usual. Order is kept: frames are only handed to
        `write_now` when every frame before them was yielded and written. This saves the second
        task hop per publish (a future, a task step, the generator and the transport's
        coroutine): interleaved, ~11% of the gateway's added latency p50 per isolated event, on SSE
        and WebSocket alike, and nothing at saturation, where a follower is seldom parked
        (docs/performance.md, issue 14). Only one follower of a response writes directly; others
        follow as usual.
        """
        return self._follow(start, idle, write_now, timers)

    async def _follow(
        self, start: int, idle: float | None, write_now: Callable[[list[bytes]], bool] | None, timers: CallAt | None,
    ) -> AsyncIterator[list[bytes]]:
        position = start
        loop = asyncio.get_running_loop()
        # One timer per follower, re-armed only when it fires, not one per wait: a timer per
        # wait (call_later + cancel) costs about as much as the wake-up itself.
        ticker = None if idle is None else _Ticker(loop, idle, loop if timers is None else timers)
        sink: _Sink | None = None
        try:
            while True:
                if position < self.offset:
                    raise FollowerLagged(f"missed {self.offset - position} chunks")
                available = self.offset + len(self.frames)
                if position < available:
                    batch = self.frames[position - self.offset :]
                    position = available
                    yield batch if type(batch) is list else list(batch)
                    if ticker is not None:
                        ticker.touch()
                    continue
                if self.closed:
                    self.delivered = True
                    return
                waiter = loop.create_future()
                if write_now is not None and self._sink is None:
                    sink = self._sink = _Sink(position, write_now, waiter, ticker)
                else:
                    sink = None
                    self._waiters.append(waiter)
                if ticker is None:
                    try:
                        await waiter
                    finally:
                        if sink is not None:
                            position = self._unpark(sink)
                    continue
                ticker.park(waiter)
                try:
                    woke = await waiter
                finally:
                    ticker.waiter = None
                    if sink is not None:
                        position = self._unpark(sink)
                if woke is _IDLE:
                    if waiter in self._waiters:
                        self._waiters.remove(waiter)
                    yield []
                    ticker.touch()
        finally:
            if ticker is not None:
                ticker.cancel()

    def _unpark(self, sink: _Sink) -> int:
        """A direct follower woke: it takes frames through the iterator again, from its position."""
        if self._sink is sink:
            self._sink = None
        return sink.position

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


_IDLE = object()


class _Sink:
    """A parked direct follower: where it is, how to write to it, and how to wake it."""

    __slots__ = ("position", "ticker", "waiter", "write_now")

    def __init__(
        self, position: int, write_now: Callable[[list[bytes]], bool], waiter: asyncio.Future[object],
        ticker: _Ticker | None,
    ) -> None:
        self.position = position
        self.write_now = write_now
        self.waiter = waiter
        self.ticker = ticker


class _Ticker:
    """A follower's keep-alive clock: resolves the parked follower's waiter with _IDLE once
    `idle` seconds passed since its last batch. Its one timer is re-armed when it fires early."""

    __slots__ = ("handle", "idle", "last", "loop", "timers", "waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop, idle: float, timers: CallAt) -> None:
        self.loop = loop
        self.idle = idle
        self.timers = timers
        self.last = loop.time()
        self.waiter: asyncio.Future[object] | None = None
        self.handle: _Handle | None = None

    def touch(self) -> None:
        self.last = self.loop.time()

    def park(self, waiter: asyncio.Future[object]) -> None:
        self.waiter = waiter
        if self.handle is None:
            self.handle = self.timers.call_at(self.last + self.idle, self._fire)

    def _fire(self) -> None:
        self.handle = None
        if self.waiter is None:
            return  # not parked: the next park arms the timer again
        due = self.last + self.idle
        if self.loop.time() >= due - 0.001:
            _resolve(self.waiter, _IDLE)
        else:
            self.handle = self.timers.call_at(due, self._fire)

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None


def _resolve(waiter: asyncio.Future[object], value: object) -> None:
    if not waiter.done():
        waiter.set_result(value)


class _Here:
    """A reader nobody watches yet: its browser counts as there."""

    __slots__ = ()

    def connected(self) -> bool:
        return True


HERE: Presence = _Here()


class Reader:
    """One request reading a response: a `Feed` that counts as a reader until it is closed.

    It is taken when the request is admitted, before anything awaits, so a second request for the
    chat sees the response read even before the first one's transport starts to follow it. The
    transport then says how to tell that its browser is gone (`watch`): a dropped HTTP
    connection is seen when it drops, not at the next write, which may be a tool call away.

    A resume's reader shows `earlier` first: the message's earlier responses (and what the browser
    added between them), so positions count over the whole message.
    """

    __slots__ = ("_presence", "earlier", "remote", "response")

    def __init__(self, response: Response, earlier: tuple[bytes, ...] = ()) -> None:
        self.response = response
        self.earlier = earlier
        self._presence = HERE
        # A relay to another replica's browser (cluster/relay.py): that replica tells when its
        # browser is gone, which takes up to one relay poll.
        self.remote = False

    def watch(self, presence: Presence) -> None:
        self._presence = presence

    def connected(self) -> bool:
        return self._presence.connected()

    def follow(self, start: int = 0, *, idle: float | None = None, timers: CallAt | None = None) -> AsyncIterator[list[bytes]]:
        """Batches of frames from position `start` until the response is complete."""
        if not self.earlier:
            return self.response.follow(start, idle=idle, timers=timers)
        return self._after_earlier(start, self.response.follow(max(0, start - len(self.earlier)), idle=idle, timers=timers))

    def follow_direct(
        self, write_now: Callable[[list[bytes]], bool], start: int = 0, *, idle: float | None = None,
        timers: CallAt | None = None,
    ) -> AsyncIterator[list[bytes]]:
        if not self.earlier:
            return self.response.follow_direct(write_now, start, idle=idle, timers=timers)
        later = self.response.follow_direct(write_now, max(0, start - len(self.earlier)), idle=idle, timers=timers)
        return self._after_earlier(start, later)

    async def _after_earlier(self, start: int, later: AsyncIterator[list[bytes]]) -> AsyncIterator[list[bytes]]:
        if start < len(self.earlier):
            yield list(self.earlier[start:])
        async for batch in later:
            yield batch

    def close(self) -> None:
        self.response._forget(self)
