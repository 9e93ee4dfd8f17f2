"""The AI SDK UI message stream as the browser sees it: versions, finish reasons and SSE framing.

This module owns what differs between client versions. An ai 6 client treats any chunk type it does
not know as fatal, so everything ai 7 added is only ever sent to a client that said it speaks v7
(request header `x-ai-sdk-version: 7`, or `"aiSdkVersion": 7` in the request body).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, Literal

import orjson

__all__ = [
    "DONE_FRAME",
    "SSE_HEADERS",
    "V7_ONLY_CHUNK_TYPES",
    "ClientVersion",
    "client_version",
    "encode_chunk",
    "encode_chunks",
    "sse_frame",
    "sse_frames",
    "finish_reason_for",
]

ClientVersion = Literal[6, 7]

# Chunk types and finish reasons that ai 7 accepts and ai 6 rejects (DESIGN.md section 2).
V7_ONLY_CHUNK_TYPES: Final = frozenset(
    {"tool-approval-response", "custom", "reasoning-file", "steering-message", "reset-step"}
)
_V7_ONLY_FINISH_REASONS: Final = frozenset({"interrupted"})

SSE_HEADERS: Final = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "Connection": "keep-alive",
    "x-vercel-ai-ui-message-stream": "v1",
    # Stops nginx and similar proxies from buffering the stream into one late burst.
    "x-accel-buffering": "no",
}

DONE_FRAME: Final = b"data: [DONE]\n\n"

VERSION_HEADER: Final = "x-ai-sdk-version"


def client_version(header: str | None, body_field: Any, default: ClientVersion) -> ClientVersion:
    """The AI SDK major version a request declares, or the configured default.

    Anything that is not clearly 7 is treated as 6: sending ai 6's subset to an ai 7 client is
    harmless, while the reverse breaks the client.
    """
    for value in (header, body_field):
        if value is None:
            continue
        text = str(value).strip().lower().removeprefix("v")
        if text.split(".")[0] == "7":
            return 7
        if text.split(".")[0] == "6":
            return 6
    return default


def finish_reason_for(reason: str, version: ClientVersion) -> str:
    """A finish reason the client's version accepts."""
    if version == 6 and reason in _V7_ONLY_FINISH_REASONS:
        return "other"
    return reason


def encode_chunk(chunk: dict[str, Any]) -> bytes:
    """A chunk's JSON, encoded once and shared by every transport that frames it.

    Copied to an exact-size object: orjson's result keeps its whole output buffer (4 KiB), and
    runs keep their chunks for resume, so without the copy a 60-byte chunk held 4 KiB of memory.
    """
    # `encoded.join((b"", b""))` is b"" + encoded + b"" in one exact-size allocation: the
    # cheapest copy measured (~10 ns, where bytes(memoryview(...)) costs ~250 ns).
    try:
        return orjson.dumps(chunk).join(_EMPTY_PAIR)
    except TypeError as exc:
        if "Integer" not in str(exc):
            raise  # nested too deep, or not JSON at all: as before
        # An integer beyond 64 bits (ADK events are decoded with msgspec, which keeps it exact,
        # core/adk_events.py): written as the float orjson made of it when it parsed events.
        return orjson.dumps(_long_ints_as_floats(chunk)).join(_EMPTY_PAIR)


def encode_chunks(chunks: Sequence[dict[str, Any]]) -> list[bytes]:
    """`[encode_chunk(c) for c in chunks]`, the same bytes, with the per-chunk Python call left
    out of the common case: one read's chunks are encoded by one comprehension (docs/performance.md,
    issue 29: ~340 instructions a chunk)."""
    try:
        return [_dumps(chunk).join(_EMPTY_PAIR) for chunk in chunks]
    except TypeError:
        return [encode_chunk(chunk) for chunk in chunks]  # a long int, or an error as encode_chunk raises it


_INT_RANGE: Final = range(-(2**63), 2**64)


def _long_ints_as_floats(value: Any) -> Any:
    if type(value) is dict:
        return {key: _long_ints_as_floats(item) for key, item in value.items()}
    if type(value) is list:
        return [_long_ints_as_floats(item) for item in value]
    if type(value) is int and value not in _INT_RANGE:
        try:
            return float(value)
        except OverflowError:
            # Beyond a double: orjson refused such an event as not JSON; null is what it writes
            # for a float it cannot write (inf), the nearest to "no value" the browser can get.
            return None
    return value


_EMPTY_PAIR: Final = (b"", b"")
_dumps: Final = orjson.dumps  # a global read, not an attribute lookup, per chunk of encode_chunks
_SSE_AROUND: Final = (b"data: ", b"\n\n")


def sse_frame(encoded_chunk: bytes) -> bytes:
    return encoded_chunk.join(_SSE_AROUND)  # b"data: " + chunk + b"\n\n", one allocation


def sse_frames(encoded_chunks: list[bytes]) -> bytes:
    """`b"".join(map(sse_frame, encoded_chunks))` in one join, for a non-empty batch."""
    return b"data: " + b"\n\ndata: ".join(encoded_chunks) + b"\n\n"
