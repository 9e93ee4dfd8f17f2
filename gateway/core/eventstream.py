"""A sans-IO decoder for the text/event-stream bytes that ADK's `/run_sse` answers with.

Bytes go in as they arrive from the socket, complete `data` payloads come out. Reads split lines
and events anywhere, so the decoder keeps the unterminated tail between calls. It follows the
WHATWG event-stream rules that matter for ADK: LF, CRLF and lone CR line ends, multi-line `data`
fields joined by LF, comment lines, one optional space after the colon, and an event dispatched
only at a blank line (an unterminated event at end of stream is dropped, as the spec says).
"""

from __future__ import annotations

__all__ = ["EventStreamDecoder", "EventStreamError"]


class EventStreamError(Exception):
    """The upstream sent an event larger than the configured limit."""


class EventStreamDecoder:
    def __init__(self, max_event_bytes: int = 16 * 1024 * 1024) -> None:
        self._max = max_event_bytes
        self._tail = b""
        self._data: list[bytes] = []
        self._size = 0

    def feed(self, chunk: bytes) -> list[bytes]:
        """The payloads of every event completed by `chunk`, in order."""
        buf = self._tail + chunk if self._tail else chunk
        if self._data or b"\r" in buf or len(buf) > self._max:
            return self._feed_lines(buf)
        # Fast path for ADK's framing: every event one `data: <json>` line, then a blank line.
        # The complete events of the read are split once (on LF, the fast single-byte search);
        # if any of them is anything else (comments, other fields, multi-line data, `data:`
        # without its space), the whole read goes through the line parser, nothing consumed yet.
        size = len(buf)
        if buf.find(b"\n") == size - 2 and buf.startswith(b"data: ") and buf.endswith(b"\n\n"):
            self._tail = b""
            return [buf[6:-2]]  # one whole event (ADK writes each on its own: an idle stream's read)
        end = size if buf.endswith(b"\n\n") else buf.rfind(b"\n\n") + 2
        if end < 2:
            if b"\n" in buf:
                return self._feed_lines(buf)
            self._tail = buf  # the start of an event, no line complete yet
            return []
        lines = (buf if end == size else buf[:end]).split(b"\n")
        last = len(lines) - 1  # lines: event, "", event, "", ..., event, "", "" (after the last LF)
        if any(lines[1:last:2]):
            return self._feed_lines(buf)
        events: list[bytes] = []
        for line in lines[0:last:2]:
            if not line.startswith(b"data: "):
                return self._feed_lines(buf)
            events.append(line[6:])
        rest = buf[end:]
        if b"\n" in rest:
            # Complete lines of an event still open: the line parser keeps them in `_data`.
            self._tail = b""
            events += self._feed_lines(rest)
        else:
            self._tail = rest
        return events

    def _feed_lines(self, buf: bytes) -> list[bytes]:
        """The general parser: `buf` (the tail already prepended), line by line."""
        held_cr = b""
        if b"\r" in buf:
            # A CR at the very end may be the first half of a CRLF split across two reads.
            if buf.endswith(b"\r"):
                buf, held_cr = buf[:-1], b"\r"
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buf.split(b"\n")
        self._tail = lines.pop() + held_cr
        if len(self._tail) > self._max:
            raise EventStreamError(f"upstream event exceeds {self._max} bytes")

        events: list[bytes] = []
        for line in lines:
            if not line:
                if self._data:
                    events.append(self._data[0] if len(self._data) == 1 else b"\n".join(self._data))
                    self._data = []
                    self._size = 0
            elif line.startswith(b"data:"):
                value = line[5:]
                if value.startswith(b" "):
                    value = value[1:]
                self._size += len(value)
                if self._size > self._max:
                    raise EventStreamError(f"upstream event exceeds {self._max} bytes")
                self._data.append(value)
            # Comments (":...") and the event/id/retry fields carry nothing ADK uses.
        return events
