"""Per-user limits shared by two gateway replicas on one real redis-server (issue 28, item 3).

Replicas A and B (`sessions.backend: redis`) in front of a fake ADK server (tests/faults/upstream.py,
whose `fault:hang` run holds a stream open), with one user limited to 20 requests per second (a small
burst) and 2 concurrent streams. A round-robin client alternates between them: together they admit
about 20 per second, not 40, and a third stream (SSE or WebSocket) is refused on either. With Redis
stopped, A falls back to its own limits (`limits.shared_fallback: local`) and B refuses (`refuse`: 503 with
Retry-After); both share again once Redis is back. `PYTEST_ARGS='-k shared_limit'` runs these alone.
"""

from __future__ import annotations

import http.client
import json
import os
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass

import pytest

from tests.chatflow import new_chat, user
from tests.faults.upstream import FaultUpstream, directive
from tests.ops.stack import wait_until
from tests.procs import GatewayProcess, RedisServer, gateway_process, metric_value, redis_server, request

pytestmark = pytest.mark.integration

RATE = 20
BURST = 5
STREAMS = 2


@dataclass
class Pair:
    a: GatewayProcess
    b: GatewayProcess
    redis: RedisServer


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    tmp = tmp_path_factory.mktemp("shared-limits")
    secret = "sessions-" + os.urandom(16).hex()
    with ExitStack() as stack:
        redis = stack.enter_context(redis_server(tmp))
        upstream = stack.enter_context(FaultUpstream().running())

        def config(fallback: str) -> str:
            return (
                f"sessions:\n  backend: redis\n  redis_url: {redis.url}\n  key_prefix: gw-limits\n  secret: {secret}\n"
                "  heartbeat_interval: 200ms\n  owner_timeout: 800ms\n"
                f"limits:\n  rate_per_user: {RATE}\n  burst_per_user: {BURST}\n  max_streams_per_user: {STREAMS}\n"
                f"  shared_fallback: {fallback}\n"
                # A browser that went away is noticed at the next write: a keep-alive soon.
                "chat:\n  keepalive_interval: 500ms\n"
            )

        a = stack.enter_context(gateway_process(tmp, upstream, config("local")))
        b = stack.enter_context(gateway_process(tmp, upstream, config("refuse")))
        for gw in (a, b):
            wait_until(lambda gw=gw: request(gw.base, "GET", "/readyz").status == 200, f"{gw.base} ready")
        yield Pair(a, b, redis)


def _connection(gw: GatewayProcess) -> http.client.HTTPConnection:
    return http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)


def _get(conn: http.client.HTTPConnection, path: str = "/api/agents") -> tuple[int, dict[str, str], bytes]:
    conn.request("GET", path)
    reply = conn.getresponse()
    return reply.status, {k.lower(): v for k, v in reply.getheaders()}, reply.read()


def _round_robin(pair: Pair, seconds: float) -> tuple[int, int, float]:
    """Requests alternating between A and B as fast as one client goes for `seconds`: (admitted,
    refused, elapsed)."""
    conns = [_connection(pair.a), _connection(pair.b)]
    admitted = refused = 0
    started = time.monotonic()
    try:
        index = 0
        while time.monotonic() - started < seconds:
            status, headers, body = _get(conns[index % 2])
            index += 1
            if status == 200:
                admitted += 1
            else:
                assert status == 429 and json.loads(body)["error"]["code"] == "rate_limited", body
                assert int(headers["retry-after"]) >= 1
                refused += 1
        return admitted, refused, time.monotonic() - started
    finally:
        for conn in conns:
            conn.close()


def test_shared_limit_rate_across_two_replicas(pair: Pair) -> None:
    time.sleep(BURST / RATE + 0.2)  # a full bucket to start from
    admitted, refused, elapsed = _round_robin(pair, 3.0)
    expected = RATE * elapsed
    # Each replica alone would admit its own RATE per second: about twice `expected` together.
    print(f"shared_limit rate: {admitted} admitted, {refused} refused in {elapsed:.2f}s (limit {RATE}/s, burst {BURST})")
    assert 0.7 * expected <= admitted <= 1.3 * expected + BURST, (admitted, refused, elapsed)
    assert refused > admitted  # the client went much faster than the limit
    for gw in (pair.a, pair.b):
        assert metric_value(gw.base, "adk_gateway_shared_limit_checks_total", {"check": "rate", "result": "admitted"}) > 0
        assert metric_value(gw.base, "adk_gateway_shared_limit_checks_total", {"check": "rate", "result": "local"}) == 0


def _open_stream(gw: GatewayProcess) -> tuple[http.client.HTTPConnection, int, bytes]:
    """A chat turn whose run hangs upstream: the response stays open (status 200) while the
    connection is held; a refusal comes whole."""
    conn = _connection(gw)
    body = json.dumps({"id": new_chat(), "messages": [user(directive("hang", 30))], "trigger": "submit-message"})
    conn.request("POST", "/api/chat", body=body, headers={"Content-Type": "application/json"})
    reply = conn.getresponse()
    if reply.status == 200:
        return conn, 200, reply.read1(16)
    data = reply.read()
    conn.close()
    return conn, reply.status, data


def test_shared_limit_stream_cap_across_two_replicas(pair: Pair) -> None:
    time.sleep(BURST / RATE + 0.2)
    held = []
    try:
        for gw in (pair.a, pair.b):
            conn, status, data = _open_stream(gw)
            assert status == 200, data
            held.append(conn)
        for gw in (pair.a, pair.b):
            _, status, data = _open_stream(gw)
            assert status == 429 and json.loads(data)["error"]["code"] == "too_many_streams", data
        # The browser on A goes away: its slot is given back, and a stream fits again (on B).
        held.pop(0).close()

        def reopened() -> bool:
            conn, status, _ = _open_stream(pair.b)
            if status == 200:
                held.append(conn)
                return True
            return False

        wait_until(reopened, "a slot given back", timeout=10, every=0.2)
    finally:
        for conn in held:
            conn.close()


def test_shared_limit_fallback_when_redis_stops_and_recovery(pair: Pair) -> None:
    time.sleep(1.0)  # the streams of the test before are gone
    pair.redis.stop()
    try:
        wait_until(lambda: request(pair.b.base, "GET", "/readyz").status == 503, "B sees Redis gone")
        # A: its own bucket (never unlimited): the burst, then 429.
        conn = _connection(pair.a)
        statuses = [_get(conn)[0] for _ in range(3 * BURST)]
        conn.close()
        assert statuses.count(200) >= 1 and statuses.count(429) >= 1 and set(statuses) <= {200, 429}, statuses
        assert statuses.count(200) <= BURST + 2, statuses
        assert metric_value(pair.a.base, "adk_gateway_shared_limit_checks_total", {"check": "rate", "result": "local"}) >= len(statuses)
        # B: refuses, with a Retry-After, as configured.
        status, headers, body = _get(_connection(pair.b))
        assert status == 503 and json.loads(body)["error"]["code"] == "limits_unavailable" and headers["retry-after"] == "1", body
        assert metric_value(pair.b.base, "adk_gateway_shared_limit_checks_total", {"check": "rate", "result": "refused"}) >= 1
    finally:
        pair.redis.start()
    for gw in (pair.a, pair.b):
        wait_until(lambda gw=gw: request(gw.base, "GET", "/readyz").status == 200, f"{gw.base} ready again")
    time.sleep(BURST / RATE + 0.2)
    before = metric_value(pair.b.base, "adk_gateway_shared_limit_checks_total", {"check": "rate", "result": "admitted"})
    assert request(pair.b.base, "GET", "/api/agents").status == 200
    assert metric_value(pair.b.base, "adk_gateway_shared_limit_checks_total", {"check": "rate", "result": "admitted"}) == before + 1
    for gw, event in ((pair.a, "shared_limits_unavailable"), (pair.b, "shared_limits_unavailable"), (pair.b, "shared_limits_restored")):
        assert sum(1 for line in gw.log_lines() if line.get("event") == event) == 1, (gw.base, event)


def test_shared_limit_stream_cap_counts_websocket_requests_too(pair: Pair) -> None:
    """A stream held over SSE on A and one over a WebSocket on B: a `send` on either socket is
    refused with an `error` frame, the cap being the user's across transports and replicas."""
    import asyncio

    import aiohttp

    def send_frame(request_id: str) -> dict[str, object]:
        return {"type": "send", "requestId": request_id, "id": new_chat(), "messages": [user(directive("hang", 30))],
                "trigger": "submit-message"}

    async def scenario() -> list[dict[str, object]]:
        async with aiohttp.ClientSession() as session:
            ws_a = await session.ws_connect(pair.a.base.replace("http", "ws") + "/api/chat/ws")
            ws_b = await session.ws_connect(pair.b.base.replace("http", "ws") + "/api/chat/ws")
            try:
                await ws_b.send_json(send_frame("held"))
                first = await ws_b.receive_json(timeout=10)
                assert first["type"] == "chunk", first  # its response streams, and holds a slot
                answers = []
                for ws in (ws_a, ws_b):
                    # The user's tokens back (the handshakes and sends took some): the cap is tested here, not the rate.
                    await asyncio.sleep(BURST / RATE)
                    await ws.send_json(send_frame("third"))
                    while True:
                        frame = await ws.receive_json(timeout=10)
                        if frame.get("requestId") == "third":
                            answers.append(frame)
                            break
                return answers
            finally:
                await ws_a.close()
                await ws_b.close()

    time.sleep(1.5)  # the streams of the tests before are gone, the bucket full
    conn, status, data = _open_stream(pair.a)
    assert status == 200, data
    try:
        answers = asyncio.run(scenario())
    finally:
        conn.close()
    for frame in answers:
        assert frame["type"] == "error" and "at most 2 concurrent responses" in str(frame["errorText"]), frame
