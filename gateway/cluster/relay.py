"""Relays: a response run on this replica, streamed to a browser connected to another one.

The owner pumps the response's encoded chunks from its run log into a relay in the shared state
(`Relays.open`), one entry per batch, then the relay's end. The replica holding the browser follows
the relay (`RelayFeed`) as a transport follows a local response, until the response ends, the
owner dies or the shared state is lost; each of the last two ends the browser's response with an
`error` chunk, unless the response had already ended.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator

import structlog

from ..chats import Attachment
from ..metrics import GatewayMetrics
from ..protocol import encode_chunk
from ..runs import FollowerLagged
from .liveness import Liveness
from .shared import RelayEntry, SharedState, SharedStateDown
from .tasks import Tasks

__all__ = ["RelayFeed", "Relays"]

log = structlog.get_logger("adk_gateway.cluster")

_CONTACT_LOST = "The gateway lost contact with the replica running this response; reload the chat to resume it."
_OWNER_STOPPED = "The gateway replica running this response stopped; send your message again."
# How a chunk that ends a response starts, as encode_chunk writes it ("type" is always a chunk's first key).
_TERMINAL = (b'{"type":"finish"', b'{"type":"error"', b'{"type":"abort"')


class Relays:
    """This replica's relays: the pumps of responses run here, and feeds of responses run elsewhere."""

    def __init__(self, state: SharedState, tasks: Tasks, liveness: Liveness, metrics: GatewayMetrics) -> None:
        self._state = state
        self._tasks = tasks
        self._liveness = liveness
        self.metrics = metrics
        self._pumps: set[asyncio.Task[None]] = set()

    def open(self, attachment: Attachment | None) -> str | None:
        """Start relaying the response `attachment` reads; the relay's key (None: nothing to relay)."""
        if attachment is None:
            return None
        key = secrets.token_urlsafe(12)
        pump = self._tasks.spawn(self._pump(key, attachment))
        self._pumps.add(pump)
        pump.add_done_callback(self._pumps.discard)
        return key

    @property
    def active(self) -> int:
        """Responses run here that another replica streams to its browser: the drain waits for them
        as for its own streams."""
        return len(self._pumps)

    async def end(self, timeout: float) -> None:
        """Let the relays of responses that just ended write their ends (the drain, once runs are
        cancelled), so a relayed browser gets its terminal chunks and the relay's end, not a cut."""
        if self._pumps:
            await asyncio.wait(set(self._pumps), timeout=timeout)

    def feed(self, owner: str, key: str) -> RelayFeed:
        """The response `owner` relays under `key`, to follow here."""
        return RelayFeed(self._state, self._liveness, self.metrics, owner, key)

    async def _pump(self, key: str, attachment: Attachment) -> None:
        seq = 0
        try:
            try:
                async for batch in attachment.response.follow(0):
                    await self._state.relay_append(key, RelayEntry(seq, batch))
                    seq += len(batch)
                end = "done"
            except FollowerLagged:
                end = "lagged"
            await self._state.relay_append(key, RelayEntry(seq, end=end))
        except SharedStateDown:
            log.warning("relay_cut", reason="the shared session store is unreachable")
        finally:
            attachment.response.close()


class RelayFeed:
    """A response running on another replica, read from its relay: what a transport follows."""

    def __init__(self, state: SharedState, liveness: Liveness, metrics: GatewayMetrics, owner: str, key: str) -> None:
        self._state = state
        self._liveness = liveness
        self.metrics = metrics
        self._owner = owner
        self._key = key

    def close(self) -> None:
        pass

    async def follow(self, start: int = 0, *, idle: float | None = None) -> AsyncIterator[list[bytes]]:
        """Batches of frames from position `start` to the end of the response (as Response.follow)."""
        step = self._liveness.interval
        if idle is not None:
            step = min(step, idle)
        position, after, quiet = 0, "", 0.0
        # Whether the last frame handed out ended the response (finish, error, abort): a relay that
        # breaks after that has nothing left to say, and a second terminal chunk would reach the
        # browser after its finish.
        ended = False
        while True:
            try:
                after, entries = await self._state.relay_read(self._key, after, timeout=step)
                if not entries:
                    quiet += step
                    if idle is not None and quiet >= idle:
                        quiet = 0.0
                        yield []
                    if await self._liveness.dead(self._owner):
                        if not ended:
                            self.metrics.owner_lost.labels("stream").inc()
                            yield [_error_frame(_OWNER_STOPPED)]
                        return
                    continue
            except SharedStateDown:
                if not ended:
                    yield [_error_frame(_CONTACT_LOST)]
                return
            quiet = 0.0
            batch: list[bytes] = []
            for entry in entries:
                if entry.seq != position:
                    # The relay lost entries (Redis restarted under it): do not hand out a stream with a hole.
                    yield batch + [_error_frame(_CONTACT_LOST)]
                    return
                for frame in entry.frames:
                    if position >= start:
                        batch.append(frame)
                    position += 1
                if entry.end == "lagged":
                    if batch:
                        yield batch
                    raise FollowerLagged("the relay fell behind the response")
                if entry.end is not None:
                    if batch:
                        yield batch
                    return
            if batch:
                ended = batch[-1].startswith(_TERMINAL)
                yield batch


def _error_frame(text: str) -> bytes:
    return encode_chunk({"type": "error", "errorText": text})
