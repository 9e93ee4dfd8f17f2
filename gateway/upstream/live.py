"""A chat's live session with ADK (`/run_live`): one socket kept across turns, and its turns.

In live mode the agent keeps one bidirectional session per chat. The gateway opens it on the
chat's first turn and keeps it across turns until the browser socket closes (once the turn under
way has ended: chat/agent_runs.py) or the chat goes idle. `LiveLink` is the I/O shell of the
session's turns: it keeps the socket, the reader task that takes every event off it, the turn's
inbox and the event `settle` waits on; every decision (where a turn ends, whose an event is,
whether a turn may start, what becomes of a turn left before its end, a closed socket mid-turn)
is the sans-IO machine's, core/live_turns.py `LiveTurns`, which it asks and then obeys.

A turn the gateway leaves before its end (the browser stopped it, a new message came while nobody
read it) goes on in ADK's live session: its remainder is dropped up to that turn's end, and the
next turn's request goes out only then (`settle`), so that what the next turn reads is the answer
to its own request. Events that arrive with no turn in progress are dropped and counted.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import structlog

from ..core.live_turns import LiveTurns, Verdict
from .client import LiveConnection, UpstreamError, parse_live_event

__all__ = ["LiveLink"]

log = structlog.get_logger("adk_gateway.upstream.live")

# Compared on every event of a turn: a module global, not an Enum member looked up on its class.
_TURN_ENDED = Verdict.TURN_ENDED

# What a turn's queue receives when the socket is gone.
_CLOSED: dict[str, Any] = {}


class LiveLink:
    def __init__(self, connection: LiveConnection, on_closed: Callable[[], None] = lambda: None) -> None:
        self.connection = connection
        self._on_closed = on_closed
        self._turns = LiveTurns()
        self._inbox: _Inbox | None = None  # the turn's, while its reader is there
        # Set unless a turn left before its end is still under way in ADK.
        self._cut_ended = asyncio.Event()
        self._cut_ended.set()
        self._reader = asyncio.create_task(self._read(), name="live-reader")

    @property
    def alive(self) -> bool:
        return not self._reader.done()

    @property
    def in_turn(self) -> bool:
        return self._turns.in_turn

    @property
    def dropped(self) -> int:
        return self._turns.dropped

    async def _read(self) -> None:
        turns = self._turns
        try:
            async for data in self.connection.messages():
                if turns.in_turn:
                    # Parsed by the turn as it takes them: a socket read can bring hundreds of
                    # events, and as many parsed events alive at once kept the garbage collector
                    # busy (~9 us per event at saturation).
                    self._inbox.put(data)  # type: ignore[union-attr]
                elif (event := parse_live_event(data)) is not None:
                    self._carry_out(turns.event(event))
        except UpstreamError as exc:
            log.warning("live_read_failed", reason=str(exc))
        finally:
            self._carry_out(turns.closed())
            self._on_closed()

    def _carry_out(self, verdict: Verdict) -> None:
        """What the machine's verdict on an event nobody reads, a cut or a close asks of the shell."""
        if verdict is Verdict.DROP:
            log.debug("live_event_dropped", reason="no turn in progress")
        elif verdict is Verdict.CUT_ENDED:
            self._cut_ended.set()
        elif verdict is Verdict.CUT:
            self._cut_ended.clear()
        elif verdict is Verdict.CLOSE_TURN:
            self._inbox.put(_CLOSED)  # type: ignore[union-attr]

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
        turns = self._turns
        verdict = turns.begin()
        if verdict is Verdict.CLOSED:
            raise UpstreamError("reset", f"the live session is {self.connection.close_reason}")
        if verdict is not Verdict.START:
            raise UpstreamError("protocol", verdict.value)
        inbox = self._inbox = _Inbox()
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
                if turns.event(event) is _TURN_ENDED:
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
            verdict = turns.left(sent)
            self._inbox = None
            self._carry_out(verdict)
            if verdict is Verdict.CUT:
                self._drop_cut(inbox.events)

    def _drop_cut(self, arrived: list[Any]) -> None:
        """What a turn left before its end had not taken yet: its remainder, up to its end."""
        turns = self._turns
        try:
            for data in arrived:
                if not turns.cut:
                    return
                if data is not _CLOSED and (event := parse_live_event(data)) is not None:
                    self._carry_out(turns.event(event))
        except UpstreamError:
            self._reader.cancel()  # the session is not to be trusted any more, as above

    async def send(self, request: dict[str, Any]) -> None:
        await self.connection.send(request)

    async def close(self) -> None:
        await self.connection.close()
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)
        # A reader cancelled before its first step told the machine nothing.
        self._carry_out(self._turns.closed())


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
