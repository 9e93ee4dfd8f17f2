"""A run: one upstream agent run streaming into one assistant message, and its chunk log.

A run outlives the browser request that started it (DESIGN.md decision 4): the run's task writes
encoded chunks into the log, and any number of followers (the POST that started it, a resume
`GET /api/chat/{id}/stream`) read from it at their own pace. If the browser goes away the run
carries on; a reconnecting browser replays the response from its first chunk.

The log is split into responses: a response is what one browser request receives, from `start`
to `finish`. A run that waits for a person ends its response there; the answer opens the next.
The log is bounded: past `limit` chunks the oldest half is dropped, and a follower that falls
that far behind is told so instead of being handed a stream with a hole in it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from enum import Enum

__all__ = ["FollowerLagged", "Run", "RunState"]


class RunState(Enum):
    STREAMING = "streaming"
    WAITING = "waiting"  # for a person: an approval or a browser tool
    DONE = "done"


class FollowerLagged(Exception):
    """A follower fell behind the bounded log; the chunks it needed are gone."""


class _Response:
    __slots__ = ("closed", "frames", "offset")

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.offset = 0  # frames dropped from the front
        self.closed = False


class Run:
    def __init__(self, message_id: str, *, limit: int = 10_000) -> None:
        self.message_id = message_id
        self.state = RunState.STREAMING
        self._limit = limit
        self._responses: list[_Response] = [_Response()]
        self._waiters: list[asyncio.Future[None]] = []
        self.finished_at: float | None = None

    @property
    def response_index(self) -> int:
        return len(self._responses) - 1

    @property
    def streaming(self) -> bool:
        """A response is being written: a second request for the chat must wait its turn."""
        return self.state is RunState.STREAMING

    def publish(self, frames: list[bytes]) -> None:
        """Append encoded chunks to the current response and wake its followers."""
        if not frames:
            return
        response = self._responses[-1]
        response.frames.extend(frames)
        if len(response.frames) > self._limit:
            drop = len(response.frames) // 2
            del response.frames[:drop]
            response.offset += drop
        self._wake()

    def end_response(self, *, waiting: bool) -> None:
        """The current response is complete; `waiting` says the run now waits for a person."""
        self._responses[-1].closed = True
        self.state = RunState.WAITING if waiting else RunState.DONE
        self._wake()

    def next_response(self) -> int:
        """Open the response that continues a waiting run; returns its index."""
        # Only the latest response can be followed or resumed, so older ones are released.
        self._responses = [_Response()]
        self.state = RunState.STREAMING
        return 0

    def resumable(self) -> int | None:
        """The index of a response still being written, for a resume, or None."""
        response = self._responses[-1]
        if response.closed or response.offset:
            return None
        return self.response_index

    async def follow(self, index: int, start: int = 0) -> AsyncIterator[list[bytes]]:
        """Batches of frames of response `index` from position `start` until it is complete."""
        response = self._responses[index]
        position = start
        while True:
            if position < response.offset:
                raise FollowerLagged(f"missed {response.offset - position} chunks")
            available = response.offset + len(response.frames)
            if position < available:
                batch = response.frames[position - response.offset :]
                position = available
                yield batch
                continue
            if response.closed:
                return
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
