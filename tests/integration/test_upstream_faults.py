"""The gateway in front of an upstream that fails in every way tests/faults/upstream.py knows.

For each fault the browser gets one clear `error` chunk and a proper end (`finish`, `[DONE]`; over
WebSocket `end`), or a 502 JSON answer when the failure comes before the stream starts (session API
errors, connection refused); never a hang (every request has a total deadline); the same chat
works for the next message; and `adk_gateway_upstream_errors_total{kind}` counts the failure.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.config.schema import ChatConfig
from tests.chatflow import assistant_from, new_chat, post, types, user
from tests.faults.client import TimedReply, bounded_request, check_stream, config_section, model_has, upstream_with
from tests.faults.stack import demo_stack
from tests.faults.upstream import RUN_ERROR_TEXT, FaultUpstream, directive
from tests.procs import GatewayProcess, free_port, gateway_process, metric_value

pytestmark = pytest.mark.integration

IDLE_TIMEOUT = 1.0  # upstream.idle_timeout
KEEPALIVE = 0.25  # chat.keepalive_interval, once the gateway has it
HAS_KEEPALIVE = model_has(ChatConfig, "keepalive_interval")
KEEPALIVE_LINE = re.compile(rb"(^|\n):[ ]?keep-alive\b")
# Deadline for one request: several times the idle timeout, far below "hung".
DEADLINE = 15.0


@dataclass
class Faulty:
    upstream: FaultUpstream
    gateway: GatewayProcess

    def errors(self, kind: str) -> float:
        return metric_value(self.gateway.base, "adk_gateway_upstream_errors_total", {"kind": kind})


def fault_config() -> str:
    return config_section("chat", ChatConfig, keepalive_interval=f"{int(KEEPALIVE * 1000)}ms")


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Faulty]:
    upstream = FaultUpstream()
    tmp = tmp_path_factory.mktemp("faults")
    with upstream.running() as url, gateway_process(
        tmp, upstream_with(url, idle_timeout=f"{IDLE_TIMEOUT}s", connect_timeout="1s"), fault_config()
    ) as gw:
        yield Faulty(upstream, gw)
        crashes = [line for line in gw.log_lines() if line.get("level") in ("error", "critical")]
        assert not crashes, crashes[:3]
        assert "Traceback" not in gw.log_text()


def chat_post(gw: GatewayProcess, chat_id: str, messages: list[dict[str, Any]], **extra: Any) -> TimedReply:
    body = {"id": chat_id, "messages": messages, "trigger": "submit-message", **extra}
    return bounded_request(gw.base, "POST", "/api/chat", body, total=DEADLINE)


def assert_normal_turn(gw: GatewayProcess, chat_id: str, history: list[dict[str, Any]]) -> None:
    """The chat still works: a plain message streams the upstream's normal answer to the end."""
    reply = chat_post(gw, chat_id, [*history, user("hello again")])
    chunks = check_stream(reply)
    assert chunks[-1] == {**chunks[-1], "type": "finish", "finishReason": "stop"}, chunks[-1]
    assert not [c for c in chunks if c["type"] == "error"]
    assert "".join(c.get("delta", "") for c in chunks if c["type"] == "text-delta").startswith("You said")


# ---- faults during the stream: an error chunk, then a proper end -------------------------------

STREAM_FAULTS = [
    # (behaviour, its argument, the upstream error kind the gateway must count, text the error names)
    pytest.param("reset", 2, "reset", "closed the connection", id="reset-mid-stream"),
    pytest.param("refuse", None, "reset", "closed the connection", id="refuse-connection"),
    pytest.param("garbage", None, "protocol", "not JSON", id="garbage-data-line"),
    pytest.param("http", 500, "http", "HTTP 500", id="http-500"),
    pytest.param("http", 503, "http", "HTTP 503", id="http-503"),
    pytest.param("error_event", None, "run_error", RUN_ERROR_TEXT, id="error-event"),
    pytest.param("hang", 10, "timeout", "idle timeout", id="hang-after-one-event"),
    pytest.param("slow_first_event", 10, "timeout", "idle timeout", id="slow-first-event"),
    pytest.param("slow_headers", 10, "timeout", "", id="slow-headers"),
    pytest.param("missing_session_always", None, "session_missing", "does not know this session", id="session-lost-for-good"),
]


@pytest.mark.parametrize(("fault", "arg", "kind", "needle"), STREAM_FAULTS)
def test_stream_fault_gives_one_error_chunk_a_proper_end_and_the_chat_recovers(
    faulty: Faulty, fault: str, arg: int | None, kind: str, needle: str
) -> None:
    gw = faulty.gateway
    before = faulty.errors(kind)
    chat, message = new_chat(), user(directive(fault, arg))
    reply = chat_post(gw, chat, [message])
    chunks = check_stream(reply)
    errors = [c for c in chunks if c["type"] == "error"]
    assert len(errors) == 1, chunks
    assert needle in errors[0]["errorText"], errors[0]
    assert "Traceback" not in errors[0]["errorText"]
    assert chunks[-1]["type"] == "finish" and chunks[-1]["finishReason"] == "error", chunks[-1]
    if kind == "timeout":
        # Ended by the idle timeout (1 s), not by the upstream giving up (10 s).
        assert reply.elapsed < IDLE_TIMEOUT + 4, reply.elapsed
    assert faulty.errors(kind) >= before + 1, f"adk_gateway_upstream_errors_total{{kind={kind!r}}} did not count it"
    assert_normal_turn(gw, chat, [message])


def test_reset_after_text_closes_the_open_text_block_before_the_error(faulty: Faulty) -> None:
    chat, message = new_chat(), user(directive("reset", 3))
    chunks = check_stream(chat_post(faulty.gateway, chat, [message]))
    kinds = [c["type"] for c in chunks]
    assert kinds[:3] == ["start", "start-step", "text-start"]
    assert kinds.index("text-end") < kinds.index("error") < kinds.index("finish")


def test_hang_sends_keepalives_before_the_idle_timeout_error(faulty: Faulty) -> None:
    before = faulty.errors("timeout")
    chat, message = new_chat(), user(directive("hang", 10))
    reply = chat_post(faulty.gateway, chat, [message])
    check_stream(reply)
    error_at = reply.first_at(b'"type":"error"')
    assert error_at is not None and IDLE_TIMEOUT * 0.9 <= error_at < IDLE_TIMEOUT + 4, error_at
    assert faulty.errors("timeout") >= before + 1
    if not HAS_KEEPALIVE:
        pytest.skip("gateway.config.ChatConfig has no keepalive_interval yet: keep-alive comments not checked")
    assert KEEPALIVE_LINE.search(reply.body), f"no ': keep-alive' comment line in {reply.body[:800]!r}"
    keepalive_at = next(
        (at for at, piece in reply.pieces if KEEPALIVE_LINE.search(piece)), None
    )
    assert keepalive_at is not None and keepalive_at < error_at, (keepalive_at, error_at)


def test_slow_but_within_the_idle_timeout_is_not_an_error(faulty: Faulty) -> None:
    before = {k: faulty.errors(k) for k in ("timeout", "http", "reset")}
    chat = new_chat()
    for fault in ("slow_headers", "slow_first_event"):
        reply = chat_post(faulty.gateway, chat, [user(directive(fault, IDLE_TIMEOUT / 2))])
        chunks = check_stream(reply)
        assert chunks[-1]["finishReason"] == "stop" and not [c for c in chunks if c["type"] == "error"]
    assert {k: faulty.errors(k) for k in before} == before


def test_session_lost_once_is_recreated_and_the_run_retried(faulty: Faulty) -> None:
    before = faulty.errors("session_missing")
    runs_before = len(faulty.upstream.run_bodies)
    chat = new_chat()
    reply = chat_post(faulty.gateway, chat, [user(directive("missing_session"))])
    chunks = check_stream(reply)
    assert chunks[-1]["finishReason"] == "stop" and not [c for c in chunks if c["type"] == "error"]
    assert len(faulty.upstream.run_bodies) == runs_before + 2
    assert faulty.errors("session_missing") == before + 1


def test_failed_response_can_be_resumed_and_ends(faulty: Faulty) -> None:
    chat = new_chat()
    check_stream(chat_post(faulty.gateway, chat, [user(directive("garbage"))]))
    resumed = bounded_request(faulty.gateway.base, "GET", f"/api/chat/{chat}/stream", total=DEADLINE)
    if resumed.status == 204:
        return  # nothing to replay is a valid answer too
    chunks = check_stream(resumed)
    assert [c["type"] for c in chunks].count("error") == 1


# ---- faults before the stream: 502 JSON ------------------------------------------------------


@pytest.mark.parametrize(
    ("queue", "kind"),
    [
        # A new chat's session is created (one POST; 409 means it exists), never looked up first.
        pytest.param({"session_create": [500]}, "http", id="session-create-500"),
        pytest.param({"session_create": [503]}, "http", id="session-create-503"),
        pytest.param({"session_create": ["refuse"]}, "reset", id="session-create-refused"),
    ],
)
def test_session_api_failure_is_502_json_and_the_chat_recovers(faulty: Faulty, queue: dict[str, list[Any]], kind: str) -> None:
    before = faulty.errors(kind)
    faulty.upstream.clear()
    faulty.upstream.queue(**queue)
    chat, message = new_chat(), user("hello there")
    reply = chat_post(faulty.gateway, chat, [message])
    assert reply.status == 502, (reply.status, reply.body[:300])
    assert reply.headers["content-type"].startswith("application/json")
    error = reply.json()["error"]
    assert error["code"] == "upstream_unavailable" and error["message"], error
    assert "Traceback" not in error["message"]
    assert faulty.errors(kind) >= before + 1
    faulty.upstream.clear()
    assert_normal_turn(faulty.gateway, chat, [])


async def test_connection_refused_is_502_then_the_chat_works_once_the_upstream_is_back(
    aiohttp_server: Any, tmp_path: Path
) -> None:
    # In-process upstream (pytest-aiohttp) on a port chosen now, started only after the first try.
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with gateway_process(tmp_path, upstream_with(url, idle_timeout="1s", connect_timeout="1s"), fault_config()) as gw:
        chat, message = new_chat(), user("hello there")
        refused = await asyncio.to_thread(chat_post, gw, chat, [message])
        assert refused.status == 502 and refused.json()["error"]["code"] == "upstream_unavailable", refused.body
        assert await asyncio.to_thread(
            metric_value, gw.base, "adk_gateway_upstream_errors_total", {"kind": "connect"}
        ) >= 1
        upstream = FaultUpstream()
        await aiohttp_server(upstream.app(), port=port)
        await asyncio.to_thread(assert_normal_turn, gw, chat, [])
        # And a fault from the in-process upstream reaches the browser the same way.
        reply = await asyncio.to_thread(chat_post, gw, chat, [user(directive("reset", 1))])
        assert [c["type"] for c in check_stream(reply)].count("error") == 1
        assert upstream.injected["reset"] == 1


# ---- the same over WebSocket -----------------------------------------------------------------


def send_frame(request_id: str, chat_id: str, text: str) -> str:
    return json.dumps({
        "type": "send", "requestId": request_id, "id": chat_id, "trigger": "submit-message",
        "messages": [user(text)], "headers": {}, "body": {},
    })


async def frames_until_terminal(ws: aiohttp.ClientWebSocketResponse, request_id: str) -> list[dict[str, Any]]:
    frames = []
    while True:
        msg = await asyncio.wait_for(ws.receive(), DEADLINE)
        assert msg.type is aiohttp.WSMsgType.TEXT, (msg.type, msg.data)
        frame = json.loads(msg.data)
        if frame.get("requestId") != request_id:
            continue
        frames.append(frame)
        if frame["type"] not in ("chunk", "start"):
            return frames


def ws_chunks(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    chunk_frames = [f for f in frames if f["type"] == "chunk"]
    assert [f["sequence"] for f in chunk_frames] == list(range(len(chunk_frames)))
    return [f["chunk"] for f in chunk_frames]


@pytest.mark.parametrize(
    ("fault", "arg", "kind"),
    [
        pytest.param("reset", 2, "reset", id="reset"),
        pytest.param("garbage", None, "protocol", id="garbage"),
        pytest.param("hang", 10, "timeout", id="hang"),
        pytest.param("http", 503, "http", id="http-503"),
    ],
)
async def test_ws_stream_fault_is_an_error_chunk_then_end(faulty: Faulty, fault: str, arg: int | None, kind: str) -> None:
    gw = faulty.gateway
    before = await asyncio.to_thread(faulty.errors, kind)
    chat = new_chat()
    async with aiohttp.ClientSession() as http, http.ws_connect(gw.base + "/api/chat/ws") as ws:
        await ws.send_str(send_frame("r1", chat, directive(fault, arg)))
        frames = await frames_until_terminal(ws, "r1")
        assert frames[-1] == {"type": "end", "requestId": "r1"}, frames[-3:]
        chunks = ws_chunks(frames)
        assert chunks[0]["type"] == "start" and chunks[-1] == {**chunks[-1], "type": "finish", "finishReason": "error"}
        assert [c["type"] for c in chunks].count("error") == 1, chunks
        # The socket and the chat both still work.
        await ws.send_str(send_frame("r2", chat, "hello again"))
        frames = await frames_until_terminal(ws, "r2")
        assert frames[-1]["type"] == "end"
        assert ws_chunks(frames)[-1]["finishReason"] == "stop"
    assert await asyncio.to_thread(faulty.errors, kind) >= before + 1


async def test_ws_failure_before_the_stream_is_an_error_frame(faulty: Faulty) -> None:
    before = await asyncio.to_thread(faulty.errors, "http")
    chat = new_chat()
    faulty.upstream.clear()
    faulty.upstream.queue(session_create=[500])
    async with aiohttp.ClientSession() as http, http.ws_connect(faulty.gateway.base + "/api/chat/ws") as ws:
        await ws.send_str(send_frame("r1", chat, "hello there"))
        frames = await frames_until_terminal(ws, "r1")
        assert len(frames) == 1 and frames[0]["type"] == "error", frames
        assert "unavailable" in frames[0]["errorText"] or "HTTP 500" in frames[0]["errorText"], frames[0]
        await ws.send_str(send_frame("r2", chat, "hello again"))
        frames = await frames_until_terminal(ws, "r2")
        assert frames[-1]["type"] == "end" and ws_chunks(frames)[-1]["finishReason"] == "stop"
    assert await asyncio.to_thread(faulty.errors, "http") >= before + 1


# ---- the idle timeout must not end a run that waits for a person ----------------------------


def test_pending_approval_outlives_the_upstream_idle_timeout(tmp_path: Path) -> None:
    """A gated call on `/run_sse` ends ADK's run with its confirmation: the person's wait is no
    silence of any run, so the upstream idle timeout (meant for a stalled agent) must not cancel an
    approval that is within its own timeout, nor the run its answer starts (a new one, with a whole
    idle period of its own). The idle reader's timer logic is tested without real time in
    tests/unit/test_upstream_idle.py; this checks the wiring."""
    # ADK has a whole idle period after the decision for its next event, plenty on a loaded
    # machine; the person's wait only has to be longer than one, and its length decides nothing.
    idle = 2.0
    with demo_stack(tmp_path, payment_timeout="60s", upstream={"idle_timeout": f"{idle}s"}) as stack:
        gw = stack.gateway
        chat, first_message = new_chat(), user("pay 50 to Hanako")
        first = post(gw, chat, [first_message])
        assert types(first)[-3:] == ["tool-approval-request", "finish-step", "finish"], types(first)
        assert first.chunks[-3]["approvalId"].startswith("adk-")  # ADK's confirmation: its run has ended
        time.sleep(idle * 1.5)  # the person takes a moment; no run is open meanwhile
        answer = assistant_from(first, [True])
        second = bounded_request(
            gw.base, "POST", "/api/chat",
            {"id": chat, "messages": [first_message, answer], "trigger": "submit-message", "messageId": answer["id"]},
            total=DEADLINE,
        )
        assert second.status == 200, (second.status, second.body[:300])
        chunks = check_stream(second)
        assert "tool-output-available" in [c["type"] for c in chunks], [c.get("errorText", c["type"]) for c in chunks]
        assert metric_value(gw.base, "adk_gateway_approval_wait_seconds_count", {"outcome": "cancelled"}) == 0
        assert metric_value(gw.base, "adk_gateway_upstream_errors_total", {"kind": "timeout"}) == 0
