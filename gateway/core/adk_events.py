"""ADK's `/run_sse` event JSON decoded into `AdkEvent`: only the top-level fields the gateway reads.

A streamed ADK event carries more than the gateway uses (its id, invocation id, timestamp, the
actions' empty deltas, node info, ...): about half of a tool-heavy event's bytes. It is decoded
into a typed `msgspec` struct that names only the fields the gateway reads (core/converter.py,
chat/agent_runs.py): the parser skips the others without building Python objects for them, and the
converter reads the struct's attributes. Measured (docs/performance.md, "Issue 29"): decoding into
the struct costs ~5,000 instructions an event less than `orjson.loads` into a dict, on the long
text and on the tool-heavy stream alike; turning the struct back into a dict would cost most of that
again (msgspec.to_builtins copies every container of the content; a dict built field by field
in Python costs as much), so the struct is what travels. Absent fields are `msgspec.UNSET`, which
is falsy, like the None a dict's `get` gave.

What msgspec refuses takes the old path (`orjson.loads` of the whole event, a dict), so odd input
is refused as it was: what is not JSON, what is not an object (the caller tells those apart),
floats out of range, nesting too deep. One difference stays, on purpose: an integer beyond 64
bits is read as the exact int, where orjson read a float. Finding one in the raw bytes first cost
more than the decoding saved (~8,000 instructions an event), so core/protocol.encode_chunk writes
such an int as the float orjson made of it, and the browser's bytes are the same; an integer of
309 digits or more (orjson refused the whole event as not JSON) is written as null.

A dict (a live event, or what orjson read) becomes the same struct with `as_event`, so the
converter has one path.

It also owns the sentences ADK's error fields become, the same for every browser protocol
(core/converter.py makes them the AI SDK's `error` chunks, which the AG-UI route says as RUN_ERROR).
"""

from __future__ import annotations

from typing import Any, Final

import msgspec
import orjson

__all__ = ["REFUSED", "AdkEvent", "UNSET", "as_event", "decode_event", "decode_struct", "error_code_text", "run_failed_text"]

UNSET: Final = msgspec.UNSET


class AdkEvent(msgspec.Struct):
    """The top-level fields of an ADK event that the gateway reads; absent ones are UNSET."""

    error: Any = UNSET
    content: Any = UNSET
    author: Any = UNSET
    partial: Any = UNSET
    finishReason: Any = UNSET  # noqa: N815 - ADK's camelCase JSON names
    usageMetadata: Any = UNSET  # noqa: N815
    modelVersion: Any = UNSET  # noqa: N815
    interrupted: Any = UNSET
    outputTranscription: Any = UNSET  # noqa: N815
    inputTranscription: Any = UNSET  # noqa: N815
    errorCode: Any = UNSET  # noqa: N815
    errorMessage: Any = UNSET  # noqa: N815

    # The rare readers (live mode's and error fields, a drained run, tests) read it as a dict.
    def get(self, key: str, default: Any = None) -> Any:
        value = getattr(self, key, UNSET)
        return default if value is UNSET else value

    def __getitem__(self, key: str) -> Any:
        value = getattr(self, key, UNSET)
        if value is UNSET:
            raise KeyError(key)
        return value

    def __contains__(self, key: str) -> bool:
        return getattr(self, key, UNSET) is not UNSET

    def as_dict(self) -> dict[str, Any]:
        """The event as `orjson.loads` read it, minus the keys the gateway never reads."""
        return {key: value for key in self.__struct_fields__ if (value := getattr(self, key)) is not UNSET}


# The hot loop (upstream/client.py) calls these two itself, a Python call less per event.
decode_struct: Final = msgspec.json.Decoder(AdkEvent).decode
# What `decode_struct` raises for what it refuses: not JSON, not an object, a float out of range,
# nesting too deep; orjson then says what it is.
REFUSED: Final = (msgspec.MsgspecError, ValueError, RecursionError)


def decode_event(raw: bytes) -> Any:
    """An `AdkEvent`, or, for what msgspec refuses, `orjson.loads(raw)`'s value (any JSON value;
    raises `orjson.JSONDecodeError` for what is not JSON)."""
    try:
        return decode_struct(raw)
    except REFUSED:
        return orjson.loads(raw)


def as_event(event: dict[str, Any]) -> AdkEvent:
    """A dict's event (a live one, or what orjson read) as the struct: its values, not copies."""
    return msgspec.convert(event, AdkEvent)


def run_failed_text(error: Any) -> str:
    """What a person is told of a run `/run_sse` reports as failed (`{"error": ...}`)."""
    return str(error or "the agent run failed")


def error_code_text(code: Any, message: Any) -> str:
    """What a person is told of an event carrying ADK's `errorCode` and/or `errorMessage`."""
    return f"{code}: {message}" if code and message else str(message or code)
