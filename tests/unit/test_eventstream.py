"""The upstream event-stream decoder: bytes split anywhere still give whole events."""

import pytest

from gateway.core.eventstream import EventStreamDecoder, EventStreamError

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


def _reference(data: bytes) -> list[bytes]:
    """The line parser alone, whole stream at once: what the fast path must agree with."""
    return EventStreamDecoder()._feed_lines(data)


@pytest.mark.parametrize("seed", range(40))
def test_fast_path_agrees_with_the_line_parser_on_any_mix_and_split(seed: int) -> None:
    import random

    rng = random.Random(seed)
    pieces = [
        b'data: {"a": 1}\n\n', b'data: {"b": "x y"}\n\n', b"data:{\"c\":3}\n\n", b": keep-alive\n\n",
        b"data: one\ndata: two\n\n", b"data: cr\r\n\r\n", b"id: 5\ndata: with-id\n\n", b"\n", b"data: \n\n",
        b"data:  two-spaces\n\n", b"event: x\n\n",
    ]
    data = b"".join(rng.choice(pieces) for _ in range(30)) + b"data: unterminated"
    expected = _reference(data)
    for _ in range(5):
        decoder = EventStreamDecoder()
        got: list[bytes] = []
        i = 0
        while i < len(data):
            step = rng.randint(1, 60)
            got += decoder.feed(data[i : i + step])
            i += step
        assert got == expected
