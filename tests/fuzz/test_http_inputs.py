"""Bad HTTP input: POST bodies (random, near-valid, raw bytes), headers, methods, query strings, resume GETs.

Every case: no 5xx, a 200 is a well-formed stream ending in [DONE], no crash in the gateway's log,
no victim approval touched (harness.send); every 50 cases a good turn still works.
"""

from __future__ import annotations

from urllib.parse import quote

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from tests.fuzz.harness import Fuzz, budget, gating, known_bug, send
from tests.fuzz.strategies import (
    POOL, apply_content_encoding, content_encodings, encode, header_sets, header_text, near_valid_bodies,
    query_strings, raw_bodies, resume_targets, wild_values,
)

pytestmark = pytest.mark.integration


@budget(40, 1500)
@given(value=wild_values)
def test_random_json_bodies(fuzz: Fuzz, value: object) -> None:
    body = encode(value)
    assume(not gating(body))
    send(fuzz, "random_json", "POST", "/api/chat", body)


@budget(80, 2500)
@given(body=near_valid_bodies(), version=st.one_of(st.none(), st.sampled_from(["6", "7"]), header_text))
def test_near_valid_bodies(fuzz: Fuzz, body: object, version: str | None) -> None:
    raw = encode(body)
    assume(not gating(raw))
    headers = {} if version is None else {"x-ai-sdk-version": version}
    send(fuzz, "near_valid", "POST", "/api/chat", raw, headers)


@budget(30, 1000)
@given(raw=raw_bodies(), encoding=content_encodings)
def test_raw_and_encoded_bodies(fuzz: Fuzz, raw: bytes, encoding: str | None) -> None:
    assume(not gating(raw) and not known_bug("encoding", encoding))
    data, headers = apply_content_encoding(raw, encoding)
    send(fuzz, "raw_bytes", "POST", "/api/chat", data, headers, what=(encoding, raw[:300]))


@budget(30, 800)
@given(
    headers=header_sets(), query=query_strings, body=near_valid_bodies(),
    method=st.sampled_from(["POST", "POST", "POST", "POST", "GET", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]),
)
def test_headers_methods_and_query_strings(fuzz: Fuzz, headers: dict[str, str], query: str, body: object, method: str) -> None:
    raw = encode(body)
    assume(not gating(raw))
    send(fuzz, "headers", method, "/api/chat" + query, raw if method not in ("GET", "HEAD") else None, headers)


@budget(30, 800)
@given(target=resume_targets, query=query_strings, headers=header_sets(), pick=st.integers(min_value=0, max_value=100))
def test_resume_gets(fuzz: Fuzz, target: str, query: str, headers: dict[str, str], pick: int) -> None:
    if target == "$victim":
        chat = fuzz.victims[pick % len(fuzz.victims)].chat_id
    elif target == "$spent":
        chat = fuzz.spent[pick % len(fuzz.spent)].chat_id
    elif target == "$pool":
        chat = POOL[pick % len(POOL)]
    else:
        chat = target
    path = f"/api/chat/{chat}/stream"
    if any(not 0x21 <= ord(c) <= 0x7E for c in chat):  # http.client refuses control characters
        path = f"/api/chat/{quote(chat, safe='%')}/stream"
    send(fuzz, "resume", "GET", path + query, None, headers)
