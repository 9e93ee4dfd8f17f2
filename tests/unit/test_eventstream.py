"""The upstream event-stream decoder: bytes split anywhere still give whole events."""

import pytest

from gateway.eventstream import EventStreamDecoder, EventStreamError

STREAM = b'data: {"a": 1}\n\ndata: {"b": 2}\n\n: keep-alive\n\ndata:{"c":3}\n\n'


def feed_in_pieces(data: bytes, size: int) -> list[bytes]:
    decoder = EventStreamDecoder()
    out: list[bytes] = []
    for i in range(0, len(data), size):
        out.extend(decoder.feed(data[i : i + size]))
    return out


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_events_survive_any_split(size: int) -> None:
    assert feed_in_pieces(STREAM, size) == [b'{"a": 1}', b'{"b": 2}', b'{"c":3}']


@pytest.mark.parametrize("size", [1, 2, 5, 1000])
def test_crlf_and_lone_cr_line_ends(size: int) -> None:
    data = b'data: one\r\n\r\ndata: two\r\rdata: three\n\n'
    assert feed_in_pieces(data, size) == [b"one", b"two", b"three"]


def test_multiline_data_is_joined_with_newlines() -> None:
    assert EventStreamDecoder().feed(b"data: a\ndata: b\nid: 7\nevent: x\n\n") == [b"a\nb"]


def test_unterminated_event_is_not_dispatched() -> None:
    decoder = EventStreamDecoder()
    assert decoder.feed(b'data: {"partial": tr') == []
    assert decoder.feed(b"ue}\n") == []
    assert decoder.feed(b"\n") == [b'{"partial": true}']


def test_large_event_in_many_reads() -> None:
    big = b"x" * 300_000
    data = b"data: " + big + b"\n\n"
    assert feed_in_pieces(data, 4096) == [big]


def test_event_over_limit_is_refused() -> None:
    decoder = EventStreamDecoder(max_event_bytes=10)
    with pytest.raises(EventStreamError):
        decoder.feed(b"data: " + b"y" * 20 + b"\n")
    with pytest.raises(EventStreamError):
        EventStreamDecoder(max_event_bytes=10).feed(b"data: " + b"z" * 20)
