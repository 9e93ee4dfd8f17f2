"""decode_event reads every ADK event as `orjson.loads` does, minus the keys the gateway never reads,
and the converter makes the same chunks of it, byte for byte, as of the dict orjson made."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.adk_events import AdkEvent, decode_event
from gateway.core.converter import Converter
from gateway.core.protocol import encode_chunk

from tests.support.recordings import ROOT, SSE_FOLDERS, fixture_names, lines

READ = frozenset(AdkEvent.__struct_fields__)


def _old(raw: bytes) -> Any:
    """What the old path made of `raw`, restricted to the keys the gateway reads."""
    value = orjson.loads(raw)
    return {k: v for k, v in value.items() if k in READ} if type(value) is dict else value


def _same(raw: bytes) -> None:
    try:
        expected = _old(raw)
    except orjson.JSONDecodeError:
        with pytest.raises(orjson.JSONDecodeError):
            decode_event(raw)
        return
    got = decode_event(raw)
    if type(got) is AdkEvent:
        got = got.as_dict()
    if type(expected) is dict:
        got = {k: v for k, v in got.items() if k in READ}  # the old path's escapees may keep more
    # Key by key, as the browser would get them (1 and 1.0, True and 1 differ there; an integer
    # beyond 64 bits is msgspec's exact int, written as orjson's float: core/adk_events.py).
    assert type(got) is type(expected)
    if type(got) is dict:
        assert sorted(got) == sorted(expected)
        for key in got:
            assert _written(got[key]) == _written(expected[key])
    else:
        assert repr(got) == repr(expected)


def _written(value: Any) -> bytes | str:
    try:
        return encode_chunk({"v": value})
    except TypeError:  # nested deeper than orjson writes
        return repr(value)


def _recorded() -> list[bytes]:
    lines = []
    for path in sorted(Path(ROOT).glob("adk*/*.jsonl")):
        lines += [line.encode() for line in path.read_text().splitlines() if line.strip()]
    return lines


def test_every_recorded_event_decodes_as_before() -> None:
    lines = _recorded()
    assert len(lines) > 100
    for raw in lines:
        _same(raw)


def test_unread_keys_are_dropped_and_read_ones_kept() -> None:
    event = decode_event(b'{"id":"x","timestamp":1.5,"actions":{"stateDelta":{}},"partial":true,"content":{"parts":[]}}')
    assert event.as_dict() == {"partial": True, "content": {"parts": []}}
    # Read as a dict by the rare readers.
    assert "partial" in event and "error" not in event and "id" not in event
    assert event.get("partial") is True and event.get("error") is None and event.get("error", 1) == 1
    assert event["content"] == {"parts": []}
    with pytest.raises(KeyError):
        event["error"]


@pytest.mark.parametrize("raw", [
    b"[]", b"1", b'"x"', b"null", b"", b"   ", b"{", b'{"content":NaN}', b'{"content":1e400}', b'{"content":-1e400}',
    b'\xef\xbb\xbf{}', b'{"content":"\xff"}', b'{"content":"\\ud800"}', b'{"content":"\\udc00x"}', b'{"content":"a\nb"}',
    b'{"content":"a"}x', b'{"error":"x","error":"y"}', b'{"content":{"a":1,"a":2}}', b'{"partial":null}',
    b'{"content":123456789012345678901234567890}', b'{"content":-9223372036854775809}', b'{"content":-9223372036854775808}',
    b'{"content":18446744073709551615}', b'{"content":18446744073709551616}', b'{"usageMetadata":{"totalTokenCount":1e2}}',
    b'{"content":[1,2.25,-0.0,1.5e-7,12345678901234567890.5,"s",null,true,false]}', b'{"content":"\\u0000\\"\\\\"}',
    b'{"content":' + b"[" * 1100 + b"]" * 1100 + b"}", b'{"content":' + b"[" * 500 + b"]" * 500 + b"}",
    b'{"error":"boom","error_details":"x"}', b'{"id":"1234567890123456789012"}', b'{"content":{"x":"\\u00e9\xc3\xa9"}}',
])
def test_odd_events_decode_as_before(raw: bytes) -> None:
    _same(raw)


_json = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
_keys = st.sampled_from(sorted(READ) + ["id", "actions", "timestamp", "x"]) | st.text(max_size=6)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_keys, _json, max_size=6))
def test_random_events_decode_as_before(event: dict[str, Any]) -> None:
    try:
        raw = orjson.dumps(event)
    except TypeError:  # an integer orjson cannot write: write it as Python's json would
        import json

        raw = json.dumps(event).encode()
    _same(raw)


def _chunks(events: list[Any], version: int) -> list[bytes]:
    converter = Converter("m1", version)  # type: ignore[arg-type]
    out = [encode_chunk(c) for c in converter.start()]
    for event in events:
        out += [encode_chunk(c) for c in converter.feed(event)]
    out += [encode_chunk(c) for c in converter.finish()]
    return out


@pytest.mark.parametrize(("folder", "name"), [(f, n) for f in SSE_FOLDERS for n in fixture_names(f)])
@pytest.mark.parametrize("version", [6, 7])
def test_the_converter_writes_the_same_bytes_from_structs_as_from_dicts(folder: str, name: str, version: int) -> None:
    raws = [line.encode() for line in lines(name, folder) if line.strip()]
    as_dicts = []
    for raw in raws:
        try:
            as_dicts.append(orjson.loads(raw))
        except orjson.JSONDecodeError:
            return  # ADK 1.22's unescaped run error: the upstream client's own case (test_upstream_versions)
    structs = [decode_event(raw) for raw in raws]
    assert all(type(e) is AdkEvent for e in structs)
    assert _chunks(structs, version) == _chunks(as_dicts, version)


@pytest.mark.parametrize("raw", [
    b'{"content":{"parts":[{"functionCall":{"id":"c1","name":"t","args":{"n":1000000000000000000000}}}]}}',
    b'{"content":{"parts":[{"functionResponse":{"id":"c1","name":"t","response":{"n":[-9223372036854775809,18446744073709551615,1]}}}]}}',
    b'{"content":{"parts":[{"text":"x"}]},"usageMetadata":{"promptTokenCount":1,"candidatesTokenCount":2,"totalTokenCount":3}}',
    b'{"content":{"parts":[{"text":"x"}]},"error":"e","author":"a"}',
    b'{"error":"boom","error_details":"x"}',
    b'{"errorCode":"E1","errorMessage":"m","partial":false}',
    b'{"interrupted":true}',
    b'{"outputTranscription":{"text":"hi"},"partial":true}',
    b'{"inputTranscription":{"text":"hi"},"partial":false}',
    b'{"finishReason":"MAX_TOKENS","content":{"parts":[{"text":"x"}]}}',
    b'{"partial":0,"content":{"parts":[{"text":"x","thought":true}]}}',
])
@pytest.mark.parametrize("version", [6, 7])
def test_odd_events_make_the_same_bytes(raw: bytes, version: int) -> None:
    # Integers beyond 64 bits: msgspec keeps them exact, encode_chunk writes them as orjson's floats.
    assert _chunks([decode_event(raw)], version) == _chunks([orjson.loads(raw)], version)


def test_an_integer_beyond_a_double_is_written_as_null() -> None:
    # orjson refused such an event as not JSON; msgspec reads it, and the browser gets null.
    assert encode_chunk({"type": "x", "output": {"n": 10**400, "m": 10**21}}) == b'{"type":"x","output":{"n":null,"m":1e+21}}'


@pytest.mark.parametrize(("raw", "reason"), [
    (b"{", "not JSON"), (b'{"content":NaN}', "not JSON"), (b'{"content":1e400}', "not JSON"), (b"\xef\xbb\xbf{}", "not JSON"),
    (b"[]", "not an object"), (b"1", "not an object"), (b"null", "not an object"), (b'"x"', "not an object"),
])
def test_the_upstream_client_refuses_what_it_refused(raw: bytes, reason: str) -> None:
    from gateway.upstream.client import UpstreamError, _parsed

    events = _parsed([b'{"partial":true}', raw, b"{}"])
    assert next(events) == AdkEvent(partial=True)
    with pytest.raises(UpstreamError, match=reason) as refused:
        next(events)
    assert refused.value.kind == "protocol"


def test_a_refused_event_that_orjson_reads_is_its_dict() -> None:
    from gateway.upstream.client import _parsed

    # Nesting msgspec refuses (Python's recursion limit) and orjson reads (up to 1,024 levels).
    raw = b'{"content":' + b"[" * 1010 + b"]" * 1010 + b',"id":"x"}'
    orjson.loads(raw)
    (event,) = list(_parsed([raw]))
    assert type(event) is dict and event["id"] == "x"  # the old path's dict, every key kept


def test_a_writes_chunks_are_encoded_as_each_alone() -> None:
    # encode_chunks (the actor's, one comprehension a write) writes encode_chunk's bytes, its
    # fallbacks included: a long int anywhere in the batch, and what orjson refuses.
    from gateway.core.protocol import encode_chunks

    batches = [
        [{"type": "text-delta", "id": "t1", "delta": "é😀\x00"}, {"type": "finish-step"}],
        [{"type": "tool-output-available", "toolCallId": "c", "output": {"f": 1e16, "n": 2**70}}, {"type": "start-step"}],
        [{"type": "x", "output": {"n": 10**400}}],
        [],
    ]
    for chunks in batches:
        assert encode_chunks(chunks) == [encode_chunk(c) for c in chunks]
    with pytest.raises(TypeError):
        encode_chunks([{"type": "x", "output": {1, 2}}])
