"""A run's chunk log: one upstream agent run streaming into one assistant message.

A run outlives the browser request that started it (DESIGN.md decision 4): the run's task writes
encoded chunks into the log, and any number of followers (the POST that started it, a resume
`GET /api/chat/{id}/stream`) read from it at their own pace. If the browser goes away the run
carries on; a reconnecting browser replays the response from its first chunk.

The log is split into responses (response.py): a response is what one browser request receives, from `start`
to `finish`. A run that waits for a person ends its response there; what comes next goes into a
new one. Followers hold the `Response` itself, so a response opened meanwhile never changes what
an attached request reads. Each response is bounded: past `limit` chunks the oldest half is
dropped, and a follower that falls that far behind is told so rather than handed a stream with a
hole in it.

Who reads a response is counted: each request that reads one holds a `Reader` from the moment it
is admitted until it stops, and says how to tell whether its browser is still there. A response
nobody reads any more (the AI SDK's `stop()` dropped the request) does not make its chat busy: a
new message ends its run instead (chat/service.py).

A resume reads the whole assistant message so far as one stream (a `Reader` with the message's
earlier chunks before the current response), because the AI SDK
rebuilds the message from nothing at a resumed stream's first `start` (`resumeStreamIsReplay`), so
a replay of the latest response alone would lose the responses before it (a tool output whose call
is in an earlier response fails the SDK's reducer). The responses are concatenated, with what the
browser itself added between two of them (chat/service.py says what); the `finish` of each but the last
becomes a `message-metadata` chunk with the same metadata, so the stream ends once, where the
message does, and every chunk keeps its position (a WebSocket `lastSequence` means the same chunk
in every replay). The chunks before the current response are kept while
they number at most `limit`; past that the message cannot be rebuilt and there is nothing to
resume.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import orjson

from ..core.protocol import encode_chunk
from .response import Feed, FollowerLagged, Reader, Response

# A response's names are re-exported: the log is read from this module.
__all__ = ["Feed", "FollowerLagged", "Reader", "Response", "Run"]


# How an encoded `finish` chunk starts ("type" is always a chunk's first key, as encode_chunk writes it).
_FINISH: Final = b'{"type":"finish"'


def _as_earlier(frames: Sequence[bytes]) -> tuple[bytes, ...]:
    """A closed response as a part of a longer replay: its `finish` (it ends a response, not the
    message) becomes `message-metadata` with that finish's metadata, which the AI SDK merges into
    the message just as it merges a finish's. Null metadata is a chunk the SDK ignores: one chunk
    for one, so positions do not move."""
    if not frames or not frames[-1].startswith(_FINISH):
        return tuple(frames)
    metadata = orjson.loads(frames[-1]).get("messageMetadata")
    return (*frames[:-1], encode_chunk({"type": "message-metadata", "messageMetadata": metadata}))


class Run:
    """The log of one run's responses; when a response opens and closes is the turn's (core/turn.py).

    `earlier` is the message so far when this run continues one that an earlier run began (a
    native confirmation's answer starts a new run on the same message): None if its beginning
    was lost already.
    """

    # Every chat keeps its last run (for resume): no per-instance dict.
    __slots__ = ("_added", "_earlier", "_limit", "current", "message_id")

    def __init__(self, message_id: str, *, limit: int = 10_000, earlier: Sequence[bytes] | None = ()) -> None:
        self.message_id = message_id
        self._limit = limit
        self.current = Response(limit)
        # The frames a replay shows before the current response; None: past the bound, lost.
        self._earlier: tuple[bytes, ...] | None = None
        self._keep(tuple(earlier) if earlier is not None else None)
        # What the browser added to the message before the current response (an answer, a
        # tool's output): the browser has it, so only a replay shows it.
        self._added: tuple[bytes, ...] = ()

    @property
    def streaming(self) -> bool:
        """A response is being written (whether anybody reads it is `current.read`)."""
        return not self.current.closed

    def publish(self, frames: list[bytes]) -> None:
        """Append encoded chunks to the current response and wake its followers."""
        if frames:
            self.current.append(frames)

    def end_response(self, now: float) -> None:
        """The current response is complete."""
        self.current.close(now)

    def next_response(self) -> Response:
        """Open the response that continues the run."""
        # A follower of the older response holds it itself; a replay needs its frames only.
        self._keep(self.message())
        self.current = Response(self._limit)
        self._added = ()
        return self.current

    def browser_added(self, frames: list[bytes]) -> None:
        """Chunks that say what the browser did before the current response, for replays only:
        call it before anything can read the response (the positions after it must not move)."""
        self._added += tuple(frames)

    def message(self) -> tuple[bytes, ...] | None:
        """The whole message up to the current response, which must be over, as a replay
        shows it before what continues it; None if part of it is lost."""
        response = self.current
        if self._earlier is None or not response.closed or not response.complete:
            return None
        return self._earlier + self._added + _as_earlier(response.frames)

    def _keep(self, earlier: tuple[bytes, ...] | None) -> None:
        self._earlier = earlier if earlier is not None and len(earlier) <= self._limit else None

    def unread(self) -> Response | None:
        """The response an answering request should read if it has not been read whole yet:
        still being written, or written while nobody was attached (e.g. after a deadline)."""
        response = self.current
        if not response.complete or (response.closed and (response.delivered or not response.frames)):
            return None
        return response

    def resumable(self, now: float, retention: float) -> Reader | None:
        """What a reconnecting browser should replay: the whole message, if its current response
        was not read whole yet or ended less than `retention` seconds ago (the client cannot tell
        us what reached it), and no part of the message was lost to the bound."""
        if self._earlier is None:
            return None
        response = self.unread()
        if response is None:
            response = self.current
            if not response.complete or response.closed_at is None or now - response.closed_at > retention:
                return None
        return response.reader(self._earlier + self._added)
