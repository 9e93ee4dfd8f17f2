"""A chat's live session with ADK (`/run_live`): one socket kept across turns, and its turns.

In live mode the agent keeps one bidirectional session per chat. The gateway opens it on the
chat's first turn and keeps it across turns until the browser socket closes (once the turn under
way has ended: chat/agent_runs.py) or the chat goes idle. A reader
task takes every event off the socket and hands it to the turn in progress, which ends at ADK's
`turnComplete`. Events that arrive with no turn in progress (the model speaking up by itself)
are dropped and counted: the AI SDK has no request to carry them.

A turn the gateway leaves before its end (the browser stopped it, a new message came while nobody
read it) goes on in ADK's live session: the model finishes its answer there. Its remainder is not
the next turn's: it is dropped up to that turn's end, and the next turn's request goes out only
then (`settle`), so that what the next turn reads is the answer to its own request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import structlog

from .client import LiveConnection, UpstreamError, parse_live_event

__all__ = ["LiveLink"]

log = structlog.get_logger("adk_gateway.upstream.live")

# What a turn's queue receives when the socket is gone.
_CLOSED: dict[str, Any] = {}


class LiveLink:
    def __init__(self, connection: LiveConnection, on_closed: Callable[[], None] = lambda: None) -> None:
        self.connection = connection
        self._on_closed = on_closed
        self._turn: _Inbox | None = None
        # A turn left before its end: where its end is looked for, and set when it came.
        self._cut: _TurnEnd | None = None
        self._cut_ended = asyncio.Event()
        self._cut_ended.set()
        self._reader = asyncio.create_task(self._read(), name="live-reader")
        self.dropped = 0

    @property
    def alive(self) -> bool:
        return not self._reader.done()

    @property
    def in_turn(self) -> bool:
        return self._turn is not None

    async def _read(self) -> None:
        try:
            async for data in self.connection.messages():
                if self._turn is not None:
                    # Parsed by the turn as it takes them: a socket read can bring hundreds of
                    # events, and as many parsed events alive at once kept the garbage collector
                    # busy (~9 us per event at saturation).
                    self._turn.put(data)
                elif self._cut is not None:
                    self._drop_cut(data)
                elif parse_live_event(data) is not None:
                    self.dropped += 1
                    log.debug("live_event_dropped", reason="no turn in progress")
        except UpstreamError as exc:
            log.warning("live_read_failed", reason=str(exc))
        finally:
            if self._turn is not None:
                self._turn.put(_CLOSED)
            self._cut = None  # a closed socket ends the cut turn too
            self._cut_ended.set()
            self._on_closed()

    def _drop_cut(self, data: Any) -> None:
        """An event of the turn that was left before its end: dropped; its end ends the cut."""
        event = parse_live_event(data)
        if event is None or self._cut is None:
            return
        self.dropped += 1
        if self._cut.ends_with(event):
            self._cut = None
            self._cut_ended.set()

    async def settle(self, timeout: float) -> bool:
        """Wait up to `timeout` for the end of a turn that was left before its end (at once if
        none was); whether it ended. Until then the next turn's request must not go out."""
        if self._cut_ended.is_set():
            return True  # without a step of the loop: the turn starts as it did before
        try:
            await asyncio.wait_for(self._cut_ended.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def turn(self, request: dict[str, Any] | None) -> AsyncIterator[dict[str, Any]]:
        """Send `request` (if any) and yield this turn's events, `turnComplete` included."""
        async for batch in self.turn_batches(request):
            for event in batch:
                yield event

    async def turn_batches(self, request: dict[str, Any] | None) -> AsyncIterator[Iterator[dict[str, Any]]]:
        """`turn`, in batches: the events that arrived while the turn slept, parsed as the batch is
        iterated (iterate it before asking for the next one)."""
        if self._turn is not None:
            raise UpstreamError("protocol", "a live turn is already in progress for this chat")
        if not self.alive:
            raise UpstreamError("reset", f"the live session is {self.connection.close_reason}")
        if self._cut is not None:
            raise UpstreamError("protocol", "the live session's previous turn has not ended (settle first)")
        inbox = _Inbox()
        self._turn = inbox
        end = _TurnEnd()
        ended = sent = False

        def events(arrived: list[Any]) -> Iterator[dict[str, Any]]:
            nonlocal ended
            for data in arrived:
                if data is _CLOSED:
                    raise UpstreamError("reset", f"the live session was {self.connection.close_reason} mid-turn")
                try:
                    event = parse_live_event(data)
                except UpstreamError:
                    self._reader.cancel()  # the session is not to be trusted any more, as before
                    raise
                if event is None:
                    continue
                yield event
                if end.ends_with(event):
                    # What arrived after the turn's end is not this turn's (dropped, as before).
                    ended = True
                    return

        try:
            if request is not None:
                await self.connection.send(request)
            sent = True
            while not ended:
                yield events(await inbox.take())
        finally:
            self._turn = None
            if sent and not ended and self.alive:
                # Left before its end: ADK's model goes on with this turn; its rest is dropped.
                self._cut = end
                self._cut_ended.clear()
                try:
                    for data in inbox.events:
                        if data is not _CLOSED and self._cut is not None:
                            self._drop_cut(data)
                except UpstreamError:
                    self._reader.cancel()  # the session is not to be trusted any more, as above

    async def send(self, request: dict[str, Any]) -> None:
        await self.connection.send(request)

    async def close(self) -> None:
        await self.connection.close()
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)


class _Inbox:
    """A turn's events (JSON text) from the reader task: a list handed over whole, one wake-up
    per batch."""

    __slots__ = ("events", "waiter")

    def __init__(self) -> None:
        self.events: list[Any] = []
        self.waiter: asyncio.Future[None] | None = None

    def put(self, event: Any) -> None:
        self.events.append(event)
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def take(self) -> list[Any]:
        while not self.events:
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        events, self.events = self.events, []
        return events


class _TurnEnd:
    """Where a live turn ends: at ADK's `turnComplete`, unless the model has not spoken since the
    last tool results. Some Live models (Gemini 2.x, per ADK) complete a turn right after a tool
    call and then answer the tool's result in another turn: that turn is not over yet."""

    __slots__ = ("answered",)

    def __init__(self) -> None:
        self.answered = True

    def ends_with(self, event: dict[str, Any]) -> bool:
        self.answered = _after_tools(event, self.answered)
        return bool(event.get("turnComplete")) and self.answered


def _after_tools(event: dict[str, Any], answered: bool) -> bool:
    """Whether the model has spoken since the last tool results, after this event."""
    content = event.get("content")
    parts = content.get("parts") if isinstance(content, dict) else None
    if not parts:
        return answered
    for part in parts:
        if "functionResponse" in part:
            return False
    if content.get("role") == "model":
        return True
    return answered
