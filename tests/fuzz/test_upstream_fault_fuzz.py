"""Random sequences of upstream faults (tests/faults/upstream.py) over SSE and WebSocket.

A gateway in front of the fault upstream: each step is one chat turn (on a chat used before, or a
new one) that meets one behaviour. Whatever happened before, each turn ends properly (one error
chunk at most, finish, [DONE] / end; a 502 or an error frame for failures before the stream), in
bounded time, and every chat touched works again once the upstream behaves.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.config.schema import ChatConfig
from tests.chatflow import new_chat, user
from tests.faults.client import bounded_request, check_stream, config_section, upstream_with
from tests.faults.upstream import FaultUpstream, directive
from tests.fuzz.harness import budget, is_crash, limits_config
from tests.fuzz.tally import TALLY
from tests.procs import GatewayProcess, gateway_process

pytestmark = pytest.mark.integration

IDLE = 0.5
DEADLINE = 10.0

# (behaviour, argument, an error chunk must come, the failure comes before the stream)
RUN_STEPS = st.one_of(
    st.tuples(st.just("reset"), st.integers(min_value=0, max_value=9)),
    st.tuples(st.sampled_from(["refuse", "garbage", "error_event", "missing_session_always"]), st.none()),
    st.tuples(st.sampled_from(["normal", "missing_session"]), st.none()),
    st.tuples(st.just("http"), st.sampled_from([400, 404, 429, 500, 502, 503])),
    st.tuples(st.just("hang"), st.just(5)),
    st.tuples(st.sampled_from(["slow_first_event", "slow_headers"]), st.sampled_from([0.1, 2])),
)
# A new chat's session is created (one POST, 409 when it exists), never looked up first.
SESSION_STEPS = st.tuples(st.just("session_create"), st.sampled_from([500, 503, "refuse"]))
STEPS = st.lists(
    st.tuples(st.one_of(RUN_STEPS, RUN_STEPS, RUN_STEPS, SESSION_STEPS), st.sampled_from(["sse", "ws"]), st.booleans()),
    min_size=1, max_size=4,
)


def errs(step: tuple[str, Any]) -> bool:
    name, arg = step
    if name in ("normal", "missing_session"):
        return False
    if name.startswith("slow"):
        return arg >= IDLE
    return True


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FaultUpstream, GatewayProcess]]:
    upstream = FaultUpstream()
    config = config_section("chat", ChatConfig, keepalive_interval="200ms") + limits_config()
    with upstream.running() as url, gateway_process(
        tmp_path_factory.mktemp("faultfuzz"), upstream_with(url, idle_timeout=f"{IDLE}s", connect_timeout="1s"), config,
    ) as gw:
        yield upstream, gw
        crashes = [line for line in gw.log_lines() if is_crash(line)]
        assert not crashes, crashes[:3]


async def ws_turn(base: str, chat: str, text: str) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.ws_connect(base + "/api/chat/ws") as ws:
        await ws.send_str(json.dumps({
            "type": "send", "requestId": "r", "id": chat, "trigger": "submit-message",
            "messages": [user(text)], "headers": {}, "body": {},
        }))
        frames = []
        while True:
            frame = json.loads(await asyncio.wait_for(ws.receive_str(), DEADLINE))
            frames.append(frame)
            if frame["type"] in ("end", "error"):
                return frames


def turn(gw: GatewayProcess, chat: str, text: str, transport: str) -> tuple[str, list[dict[str, Any]]]:
    """('stream', chunks) or ('refused', [error]) for one turn, both checked for shape."""
    if transport == "sse":
        reply = bounded_request(gw.base, "POST", "/api/chat", {"id": chat, "messages": [user(text)]}, total=DEADLINE)
        if reply.status != 200:
            assert reply.status == 502 and reply.json()["error"]["code"] == "upstream_unavailable", reply.body[:300]
            return "refused", [reply.json()]
        return "stream", check_stream(reply)
    frames = asyncio.run(ws_turn(gw.base, chat, text))
    if frames[-1]["type"] == "error":
        assert len(frames) == 1, frames
        return "refused", frames
    chunks = [f["chunk"] for f in frames if f["type"] == "chunk"]
    assert [f["sequence"] for f in frames if f["type"] == "chunk"] == list(range(len(chunks)))
    assert chunks[0]["type"] == "start" and chunks[-1]["type"] == "finish", chunks
    assert sum(c["type"] == "error" for c in chunks) <= 1
    return "stream", chunks


@budget(10, 300)
@given(steps=STEPS)
def test_any_sequence_of_upstream_faults_ends_every_turn_and_the_chats_recover(
    faulty: tuple[FaultUpstream, GatewayProcess], steps: list[Any]
) -> None:
    upstream, gw = faulty
    TALLY.cases["upstream_faults"] += 1
    chats: list[str] = []
    for step, transport, reuse in steps:
        name, arg = step
        fresh = not (reuse and chats)
        chat = new_chat() if fresh else chats[-1]
        if fresh:
            chats.append(chat)
        upstream.clear()
        started = time.monotonic()
        if name.startswith("session_"):
            if not fresh:
                continue  # the chat's session is known already: the gateway will not create it
            upstream.queue(**{name: [arg, arg]})
            kind, got = turn(gw, chat, "hello there", transport)
            assert kind == "refused", (step, got)
        else:
            kind, got = turn(gw, chat, directive(name, arg), transport)
            assert kind == "stream", (step, got)
            errors = [c for c in got if c["type"] == "error"]
            assert len(errors) == (1 if errs(step) else 0), (step, got)
            assert got[-1]["finishReason"] == ("error" if errs(step) else "stop"), (step, got[-1])
        assert time.monotonic() - started < DEADLINE
        upstream.clear()
    for chat in chats:
        kind, got = turn(gw, chat, "hello again", "sse")
        assert kind == "stream" and got[-1]["finishReason"] == "stop", got
    TALLY.faults.clear()
    TALLY.faults.update(upstream.injected)
