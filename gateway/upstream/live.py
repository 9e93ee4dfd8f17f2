"""A chat's live session with ADK (`/run_live`): one socket kept across turns, and its turns.

In live mode the agent keeps one bidirectional session per chat. The gateway opens it on the
chat's first turn and keeps it across turns until the browser socket closes (once the turn under
way has ended: chat/agent_runs.py) or the chat goes idle. A reader
task takes every event off the socket and hands it to the turn in progress, which ends at ADK's
`turnComplete`. Events that arrive with no turn in progress (the model speaking up by itself)
are dropped and counted: the AI SDK has no request to carry them.
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
                elif parse_live_event(data) is not None:
                    self.dropped += 1
                    log.debug("live_event_dropped", reason="no turn in progress")
        except UpstreamError as exc:
            log.warning("live_read_failed", reason=str(exc))
        finally:
            if self._turn is not None:
                self._turn.put(_CLOSED)
            self._on_closed()

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
        inbox = _Inbox()
        self._turn = inbox
        # Some Live models (Gemini 2.x, per ADK) complete a turn right after a tool call and then
        # answer the tool's result in another turn: a turn that ends with tool results and no word
        # from the model since is not over yet.
        answered_since_tools = True
        ended = False

        def events(arrived: list[Any]) -> Iterator[dict[str, Any]]:
            nonlocal answered_since_tools, ended
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
                answered_since_tools = _after_tools(event, answered_since_tools)
                if event.get("turnComplete") and answered_since_tools:
                    # What arrived after the turn's end is not this turn's (dropped, as before).
                    ended = True
                    return

        try:
            if request is not None:
                await self.connection.send(request)
            while not ended:
                yield events(await inbox.take())
        finally:
            self._turn = None

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
