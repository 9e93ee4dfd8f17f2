"""The gateway's model of a live frame, held against ADK's own `LiveRequest` (test environment).

The daemon checks frames with gateway/core/live_frames.py, not ADK's class (it does not depend on
google-adk). The model may be stricter than ADK, never looser: a frame it lets through must be
one ADK reads, or ADK would silently stop reading the session. These tests fail if a new ADK
refuses a frame the gateway sends.
"""

from __future__ import annotations

import base64
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.core.live_frames import InvalidLiveFrame, check_live_frame

LiveRequest = pytest.importorskip("google.adk.agents.live_request_queue").LiveRequest


def adk_reads(frame: Any) -> bool:
    try:
        LiveRequest.model_validate_json(orjson.dumps(frame))
    except ValueError:
        return False
    return True


def gateway_sends(frame: Any) -> bool:
    try:
        check_live_frame(orjson.dumps(frame))
    except InvalidLiveFrame:
        return False
    return True


# What the gateway writes (gateway/core/chat_request.py, edge/ws.py audio, upstream/live.py), and near misses.
GOOD = [
    {"content": {"role": "user", "parts": [{"text": "hello there"}]}},
    {"content": {"role": "user", "parts": [{"text": "look"}, {"inlineData": {"mimeType": "image/png", "data": "aGVsbG8="}}]}},
    {"content": {"role": "user", "parts": [{"fileData": {"mimeType": "application/pdf", "fileUri": "https://example.com/a.pdf"}}]}},
    {"content": {"role": "user", "parts": [{"functionResponse": {"id": "adk-1", "name": "adk_request_confirmation", "response": {"confirmed": True}}}]}},
    {"blob": {"mimeType": "audio/pcm;rate=16000", "data": base64.b64encode(b"\0\1" * 800).decode()}},
    {"close": True},
]
BAD = [
    {"content": {"role": "user", "parts": [{"text": "x", "bogus": 1}]}},  # ADK stops reading on this one
    {"content": {"role": "user", "parts": [{"inlineData": {"mimeType": "image/png", "data": "!!!"}}]}},
    {"content": {"role": "user", "parts": [{"inlineData": {"data": "aGVsbG8="}, "text": "x"}]}},
    {"content": {"role": "model", "parts": [{"text": "x"}]}},
    {"content": {"role": "user", "parts": []}},
    {"blob": {"mimeType": "audio/pcm", "data": "a-_b"}},
    {"blob": {"mimeType": "audio/pcm", "data": "AAAA", "extra": 1}},
    {"close": "yes"},
    {"content": {"role": "user", "parts": [{"text": "x"}]}, "close": True},
    {"unknown": 1},
    {},
    [],
]


@pytest.mark.parametrize("frame", GOOD)
def test_every_frame_the_gateway_writes_passes_and_adk_reads_it(frame: dict[str, Any]) -> None:
    assert gateway_sends(frame)
    assert adk_reads(frame)


@pytest.mark.parametrize("frame", BAD)
def test_frames_outside_the_model_are_refused(frame: Any) -> None:
    assert not gateway_sends(frame)


def test_a_refusal_says_where() -> None:
    with pytest.raises(InvalidLiveFrame, match=r"content\.parts\.0\.bogus"):
        check_live_frame(orjson.dumps(BAD[0]))


_text = st.text(max_size=20)
_b64 = st.one_of(st.binary(max_size=12).map(lambda b: base64.b64encode(b).decode()), _text)
_int = st.integers(min_value=-(2**53), max_value=2**53)
_leaf = st.one_of(st.none(), st.booleans(), _int, _text, _b64)
_inline = st.fixed_dictionaries({"mimeType": st.one_of(_text, st.just("audio/pcm")), "data": _b64},
                                optional={"displayName": _text, "extra": _leaf})
_part = st.one_of(
    st.fixed_dictionaries({"text": st.one_of(_text, _int)}, optional={"thought": st.booleans()}),
    st.fixed_dictionaries({"inlineData": _inline}),
    st.fixed_dictionaries({"fileData": st.fixed_dictionaries({"mimeType": _text, "fileUri": _text})}),
    st.fixed_dictionaries({"functionResponse": st.fixed_dictionaries(
        {"name": _text, "response": st.dictionaries(_text, _leaf, max_size=2)}, optional={"id": _text})}),
    st.dictionaries(_text, _leaf, max_size=2),
)
_frame = st.one_of(
    st.fixed_dictionaries({"content": st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "model", ""]), "parts": st.lists(_part, max_size=3)})}),
    st.fixed_dictionaries({"blob": _inline}),
    st.fixed_dictionaries({"close": _leaf}),
    st.dictionaries(st.sampled_from(["content", "blob", "close", "partial", "x"]), _leaf, max_size=2),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_frame)
def test_whatever_the_gateway_would_send_adk_reads(frame: dict[str, Any]) -> None:
    if gateway_sends(frame):
        assert adk_reads(frame), frame


def _sends_inline_data(frame: dict[str, Any]) -> bool:
    # A frame the gateway sends may carry `content: null` beside `close` (ADK reads it as no content).
    content = frame.get("content")
    return gateway_sends(frame) and isinstance(content, dict) and any("inlineData" in p for p in content["parts"])


def test_the_generator_reaches_frames_the_gateway_sends() -> None:
    """Else the property above would hold vacuously."""
    from hypothesis import find

    found = find(_frame, _sends_inline_data)
    assert adk_reads(found)
