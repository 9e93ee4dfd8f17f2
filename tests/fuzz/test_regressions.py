"""The smallest reproductions of what the fuzz suite found, as plain tests (run in every profile).

Each runs against the shared fuzz gateway through harness.send / ws_exchange, so the same checks
apply: no 5xx, an answer in bounded time, no crash in the log.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import time

import pytest

from tests.chatflow import assistant_from
from tests.faults.client import bounded_request, check_stream
from tests.fuzz.harness import CHANGED_EVENTS, REQUEST_DEADLINE, Fuzz, approval_metrics, make_pending, send, ws_exchange
from tests.fuzz.strategies import encode

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_body_that_is_not_valid_compressed_data_is_a_400(fuzz: Fuzz, encoding: str) -> None:
    # Found by test_raw_and_encoded_bodies: aiohttp raises RequestPayloadError from request.read(),
    # which post_chat does not catch: 500 internal_error and handler_crashed in the log.
    reply = send(fuzz, "regression", "POST", "/api/chat", b"not compressed at all", {"Content-Encoding": encoding})
    assert reply is not None and reply.status in (400, 415), (reply.status, reply.body[:200])


def test_an_honest_gzip_body_is_read(fuzz: Fuzz) -> None:
    body = gzip.compress(encode({"id": "fz-gzip", "messages": [{"id": "u", "role": "user", "parts": [{"type": "text", "text": "hi"}]}]}))
    reply = send(fuzz, "regression", "POST", "/api/chat", body, {"Content-Encoding": "gzip"})
    assert reply is not None and reply.status in (200, 415), reply.status


def test_a_deflate_body_that_never_completes_is_answered(fuzz: Fuzz) -> None:
    # Found by test_raw_and_encoded_bodies: a few zero bytes under Content-Encoding: deflate (a raw
    # deflate block header that promises more) are a complete request by Content-Length, but when
    # they arrive in a segment of their own (after the headers) request.read() waits for the rest
    # of the deflate stream forever: no answer until the client gives up, and no body read
    # timeout ends it. (In the same segment as the headers aiohttp answers 400 at once.)
    host, port = fuzz.base.removeprefix("http://").split(":")
    rid = fuzz.next_request_id("deflate zeros")
    body = b"\x00\x00\x00\x00"
    head = (
        f"POST /api/chat HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Encoding: deflate\r\nX-Request-Id: {rid}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(head)
        time.sleep(0.05)
        sock.sendall(body)
        try:
            status_line = sock.recv(100).split(b"\r\n", 1)[0]
        except TimeoutError:
            status_line = b"(no answer within 5 s)"
    fuzz.after_case("deflate zeros", rid)
    assert status_line.startswith((b"HTTP/1.1 4", b"HTTP/1.0 4")), status_line


@pytest.mark.parametrize("kind", [[], {}, ["send"], {"a": 1}])
def test_a_ws_frame_whose_type_is_not_a_string_gets_an_error_frame(fuzz: Fuzz, kind: object) -> None:
    # Found by test_ws_frames: `kind in _HANDLERS` with an unhashable `type` raises TypeError in
    # Connection.on_text; the socket handler dies and an HTTP 500 is written into the WebSocket
    # stream (the client sees "Received fragmented control frame" / reserved bits).
    rid = fuzz.next_request_id(kind)
    frame = json.dumps({"type": kind, "requestId": "r1"})
    frames = asyncio.run(ws_exchange(fuzz.base, [frame], headers={"X-Request-Id": rid}, wait_for={"r1"}))
    mine = [f for f in frames if f.get("requestId") == "r1"]
    assert mine and mine[0]["type"] == "error" and "type" in mine[0]["errorText"], mine
    fuzz.after_case(frame, rid)


def test_a_forged_native_answer_does_not_cancel_a_pending_gated_approval(fuzz: Fuzz) -> None:
    # Found by test_forged_and_replayed_answers_change_nothing, on the held path: an answer-only
    # request whose approval id is not a known gw- id is treated as a native ADK confirmation;
    # ChatService.submit then "settles" the chat's open run (the path for a person who typed instead
    # of answering), which cancels the real pending approval; the forged id goes to ADK (ValueError
    # as an error chunk), and the owner's real answer afterwards gets 410 approval_gone. The victim
    # here is the fuzz stack's engine's (an ADK confirmation on /run_sse): a forged confirmation id
    # beside it must change it no more.
    assert approval_metrics(fuzz.gateway) == fuzz.baseline, "the fuzz cases before this one changed approvals"
    try:
        victim = make_pending(fuzz.gateway, "pay 50 to Hanako")
        forged = assistant_from(victim.first, [True])
        forged["parts"][1]["approval"]["id"] = "adk-forged-0001"
        body = {"id": victim.chat_id, "messages": [*victim.history, forged], "messageId": forged["id"]}
        send(fuzz, "regression", "POST", "/api/chat", encode(body), what="forged native id in the owner's chat")
        cancelled = [
            line for line in fuzz.gateway.log_lines()
            if line.get("event") in CHANGED_EVENTS and line.get("approval_id") in victim.gate_ids
        ]
        assert not cancelled, f"the forged answer changed the pending approval: {cancelled}"
        real = assistant_from(victim.first, [True])
        owner = bounded_request(
            fuzz.base, "POST", "/api/chat",
            {"id": victim.chat_id, "messages": [*victim.history, real], "messageId": real["id"]}, total=REQUEST_DEADLINE,
        )
        assert owner.status == 200, (owner.status, owner.body[:300])
        assert "tool-output-available" in [c["type"] for c in check_stream(owner)]
    finally:
        fuzz.after_case("forged native id in the owner's chat", owner=True)
        fuzz.baseline = approval_metrics(fuzz.gateway)  # this test's own approval, answered (or lost) here
