"""Relays: a response run on this replica, streamed to a browser connected to another one.

The owner pumps the response's encoded chunks from its run log into a relay in the shared state
(`Relays.open`), one entry per batch, then the relay's end. The replica holding the browser follows
the relay (`RelayFeed`) as a transport follows a local response, until the response ends, the
owner dies or the shared state is lost; each of the last two ends the browser's response as an
error ends a local one (what was open closed, one `error`, then `finish`), unless it had already ended.

A relay counts as a reader of the owner's response (chat/chunk_log.py `Reader`) while its browser reads it:
the replica holding the browser looks at it each time the relay wakes it (at least every
`sessions.heartbeat_interval`), and once the browser is gone tells the owner (`Unfollow`), which
stops the relay. A new message in that chat is then taken instead of refused as busy (chat/service.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Callable

import orjson
import structlog

from ..chat.service import Attachment
from ..ops.metrics import GatewayMetrics
from ..core.protocol import encode_chunk
from ..chat.chunk_log import FollowerLagged, Reader
from ..chat.presence import Presence
from ..chat.response import HERE, CallAt
from .liveness import Liveness
from .messages import Forwarded, Unfollow
from .shared import RelayEntry, SharedState, SharedStateBusy, SharedStateDown
from .tasks import Tasks

__all__ = ["RelayFeed", "Relays"]

log = structlog.get_logger("adk_gateway.cluster.relay")

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
        # The pumps of the responses relayed from here, by relay key.
        self._pumps: dict[str, asyncio.Task[None]] = {}

    def open(self, attachment: Attachment | None) -> str | None:
        """Start relaying the response `attachment` reads; the relay's key (None: nothing to relay)."""
        if attachment is None:
            return None
        if isinstance(attachment.response, Reader):
            attachment.response.remote = True
        key = secrets.token_urlsafe(12)
        pump = self._tasks.spawn(self._pump(key, attachment))
        self._pumps[key] = pump
        pump.add_done_callback(lambda _t: self._pumps.pop(key, None))
        return key

    def unfollow(self, key: str) -> None:
        """The browser that read relay `key` is gone: stop relaying it (its reader goes with it)."""
        pump = self._pumps.get(key)
        if pump is not None:
            pump.cancel()

    @property
    def active(self) -> int:
        """Responses run here that another replica streams to its browser: the drain waits for them
        as for its own streams."""
        return len(self._pumps)

    async def end(self, timeout: float) -> None:
        """Let the relays of responses that just ended write their ends (the drain, once runs are
        cancelled), so a relayed browser gets its terminal chunks and the relay's end, not a cut."""
        if self._pumps:
            await asyncio.wait(set(self._pumps.values()), timeout=timeout)

    def feed(self, owner: str, key: str, user_id: str) -> RelayFeed:
        """The response `owner` relays under `key` for `user_id`'s browser, to follow here."""
        return RelayFeed(
            self._state, self._liveness, self.metrics, owner, key,
            abandoned=lambda: self._tasks.spawn(self._unfollow(owner, key, user_id)),
        )

    async def _unfollow(self, owner: str, key: str, user_id: str) -> None:
        notice = Forwarded(self._state.replica_id, secrets.token_hex(8), Unfollow(user_id, key))
        with contextlib.suppress(SharedStateDown):
            await self._state.send(owner, notice.to_json())

    async def _pump(self, key: str, attachment: Attachment) -> None:
        seq = 0
        try:
            try:
                async for batch in attachment.response.follow(0):
                    await self._append(key, RelayEntry(seq, batch))
                    seq += len(batch)
                end = "done"
            except FollowerLagged:
                end = "lagged"
            await self._append(key, RelayEntry(seq, end=end))
        except SharedStateDown:
            log.warning("relay_cut", reason="the shared session store is unreachable")
        finally:
            attachment.response.close()

    async def _append(self, key: str, entry: RelayEntry) -> None:
        while True:
            try:
                return await self._state.relay_append(key, entry)
            except SharedStateBusy:
                # Redis is up and the browser still reads: an entry skipped would be a hole
                # that ends its response. Each try already waited a command timeout.
                log.info("relay_append_waits", reason="the gateway is overloaded")


class RelayFeed:
    """A response running on another replica, read from its relay: what a transport follows."""

    def __init__(
        self, state: SharedState, liveness: Liveness, metrics: GatewayMetrics, owner: str, key: str,
        abandoned: Callable[[], object] | None = None,
    ) -> None:
        self._state = state
        self._liveness = liveness
        self.metrics = metrics
        self._owner = owner
        self._key = key
        # Whether the browser is still there (the transport says how to tell, as for a Reader: `watch`).
        self._presence: Presence = HERE
        # Told when the browser stops reading before the relay ended: the owner must hear of it.
        self._abandoned = abandoned
        self._over = False

    def watch(self, presence: Presence) -> None:
        self._presence = presence

    def connected(self) -> bool:
        return self._presence.connected()

    def close(self) -> None:
        """The request reads no more: if the relay has not ended, tell the owner (once)."""
        if not self._over:
            self._over = True
            if self._abandoned is not None:
                self._abandoned()

    async def follow(self, start: int = 0, *, idle: float | None = None, timers: CallAt | None = None) -> AsyncIterator[list[bytes]]:
        """Batches of frames from position `start` to the end of the response (as Response.follow;
        `timers` unused: the relay polls its owner)."""
        step = self._liveness.interval
        if idle is not None:
            step = min(step, idle)
        position, after, quiet = 0, "", 0.0
        # Whether the last frame handed out ended the response (finish, error, abort): a relay that
        # breaks after that has nothing left to say, and a second terminal chunk would reach the
        # browser after its finish.
        ended = False
        # What the frames so far left open, for a cut to close before its error (the browser's
        # resumed view opened them too, so frames before `start` count).
        opened = _Opened()
        while True:
            try:
                after, entries = await self._state.relay_read(self._key, after, timeout=step)
                if not self.connected():
                    # Seen at each wake, chunks or not: a browser that left while the run is quiet
                    # (a tool call) must not keep the owner's response read until the next write.
                    raise ConnectionResetError("the browser stopped reading")
                if not entries:
                    quiet += step
                    if idle is not None and quiet >= idle:
                        quiet = 0.0
                        yield []
                    if await self._liveness.dead(self._owner):
                        if not ended:
                            self.metrics.owner_lost.labels("stream").inc()
                            yield opened.cut(_OWNER_STOPPED)
                        self._over = True
                        return
                    continue
            except SharedStateBusy:
                # This replica had no free connection in time: Redis and the owner are fine, and
                # nothing of the relay is lost by reading again.
                continue
            except SharedStateDown:
                if not ended:
                    yield opened.cut(_CONTACT_LOST)
                self._over = True
                return
            quiet = 0.0
            batch, position, stop = _unpack(entries, position, start, opened)
            if stop == "hole":
                # The relay lost entries (Redis restarted under it): do not hand out a stream with a hole.
                yield batch + opened.cut(_CONTACT_LOST)
                self._over = True
                return
            if stop is not None:
                if batch:
                    yield batch
                self._over = True
                if stop == "lagged":
                    raise FollowerLagged("the relay fell behind the response")
                return
            if batch:
                ended = batch[-1].startswith(_TERMINAL)
                yield batch


def _unpack(
    entries: list[RelayEntry], position: int, start: int, opened: _Opened,
) -> tuple[list[bytes], int, str | None]:
    """The frames of `entries` from `start` on, the position after them, and why to stop there:
    None (read on), "hole" (an entry missing), "lagged" or "end" (the response's end)."""
    batch: list[bytes] = []
    for entry in entries:
        if entry.seq != position:
            return batch, position, "hole"
        for frame in entry.frames:
            if frame.startswith(_OPENS_OR_CLOSES):
                opened.see(frame)
            if position >= start:
                batch.append(frame)
            position += 1
        if entry.end is not None:
            return batch, position, "lagged" if entry.end == "lagged" else "end"
    return batch, position, None


# The frames that open or close a block or a step, as encode_chunk writes them.
_OPENS_OR_CLOSES = (
    b'{"type":"text-start"', b'{"type":"text-end"', b'{"type":"reasoning-start"', b'{"type":"reasoning-end"',
    b'{"type":"start-step"', b'{"type":"finish-step"',
)


class _Opened:
    """The text and reasoning blocks and the step a relayed response has open: a relay cut short
    ends the browser's response as the owner's own error would (message_writer.py): what is open
    closed, one `error`, then `finish`, so the AI SDK reads a finished, failed message."""

    def __init__(self) -> None:
        self._blocks: dict[str, str] = {}  # id -> "text" or "reasoning", in opening order
        self._step = False

    def see(self, frame: bytes) -> None:
        chunk = orjson.loads(frame)
        kind = chunk["type"]
        if kind in ("text-start", "reasoning-start"):
            self._blocks[chunk["id"]] = kind.partition("-")[0]
        elif kind in ("text-end", "reasoning-end"):
            self._blocks.pop(chunk["id"], None)
        else:
            self._step = kind == "start-step"

    def cut(self, text: str) -> list[bytes]:
        out = [encode_chunk({"type": f"{kind}-end", "id": block}) for block, kind in self._blocks.items()]
        if self._step:
            out.append(encode_chunk({"type": "finish-step"}))
        out.append(encode_chunk({"type": "error", "errorText": text}))
        out.append(encode_chunk({"type": "finish", "finishReason": "error"}))
        return out
