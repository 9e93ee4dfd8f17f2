"""Auth, isolation, limits, drain and reload, with real gateway processes in front of a real ADK server."""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from gateway.edge import event_loop
from tests.chatflow import new_chat, user
from tests.procs import GatewayProcess, Reply, adk_server, gateway_process, metric_value, request

pytestmark = pytest.mark.integration

KEYS = f"""
auth:
  mode: api_key
  api_keys:
    - id: alice
      key: key-alice
    - id: bob
      sha256: {hashlib.sha256(b"key-bob").hexdigest()}
  allowed_origins: [https://app.example]
"""


@pytest.fixture(scope="module")
def slow_adk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # 0.2 s between streamed chunks: long enough to act while a response streams.
    with adk_server(tmp_path_factory.mktemp("slow"), env={"DEMO_CHUNK_DELAY": "0.2"}) as base:
        yield base


@pytest.fixture(scope="module")
def keyed(slow_adk: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with gateway_process(tmp_path_factory.mktemp("keyed"), slow_adk, KEYS) as gw:
        yield gw


def chat_post(gw: GatewayProcess, chat: str, text: str, key: str | None, **headers: str) -> Reply:
    if key:
        headers["Authorization"] = f"Bearer {key}"
    body = {"id": chat, "messages": [user(text)], "trigger": "submit-message"}
    return request(gw.base, "POST", "/api/chat", body, headers=headers)


def test_credentials_are_required_and_chats_belong_to_their_user(keyed: GatewayProcess) -> None:
    chat = new_chat()
    for key in (None, "wrong"):
        refused = chat_post(keyed, chat, "hello there", key)
        assert refused.status == 401 and refused.json()["error"]["code"] == "unauthorized"
        assert "www-authenticate" in refused.headers
    assert chat_post(keyed, chat, "hello there", "key-alice").status == 200
    # Bob may not write to, nor read, Alice's chat: to him it does not exist.
    stolen = chat_post(keyed, chat, "hello there", "key-bob")
    assert stolen.status == 404 and stolen.json()["error"]["code"] == "chat_not_found"
    peek = request(keyed.base, "GET", f"/api/chat/{chat}/stream", headers={"x-api-key": "key-bob"})
    assert peek.status == 404
    assert request(keyed.base, "GET", f"/api/chat/{chat}/stream", headers={"x-api-key": "key-alice"}).status in (200, 204)
    assert "key-alice" not in keyed.log_text() and "key-bob" not in keyed.log_text()


async def test_websocket_auth_and_origins(keyed: GatewayProcess) -> None:
    url = keyed.base + "/api/chat/ws"
    async with aiohttp.ClientSession() as http_:
        with pytest.raises(aiohttp.WSServerHandshakeError) as no_key:
            await http_.ws_connect(url)
        assert no_key.value.status == 401
        # The key itself in the URL is refused (auth.allow_token_in_url is off): a page trades it
        # for a single-use ticket, in a header, and opens the socket with that.
        with pytest.raises(aiohttp.WSServerHandshakeError) as in_url:
            await http_.ws_connect(url + "?access_token=key-alice", origin="https://app.example")
        assert in_url.value.status == 401

        async def ticket() -> str:
            async with http_.post(keyed.base + "/api/chat/ws-ticket", headers={"Authorization": "Bearer key-alice"}) as answer:
                assert answer.status == 200
                return str((await answer.json())["ticket"])

        with pytest.raises(aiohttp.WSServerHandshakeError) as evil:
            await http_.ws_connect(url + f"?ticket={await ticket()}", origin="https://evil.example")
        assert evil.value.status == 403
        used = await ticket()
        async with http_.ws_connect(url + f"?ticket={used}", origin="https://app.example") as ws:
            await ws.send_str(json.dumps({"type": "send", "requestId": "r1", "id": new_chat(), "trigger": "submit-message",
                                          "messages": [user("hello there")], "headers": {}, "body": {}}))
            while (frame := json.loads(await asyncio.wait_for(ws.receive_str(), 20)))["type"] == "chunk":
                pass
            assert frame == {"type": "end", "requestId": "r1"}
    assert used not in keyed.log_text() and "key-alice" not in keyed.log_text()


def test_cors_from_the_allowlist_only(keyed: GatewayProcess) -> None:
    preflight = request(keyed.base, "OPTIONS", "/api/chat", headers={
        "Origin": "https://app.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type, authorization",
    })
    assert preflight.status == 204
    assert preflight.headers["access-control-allow-origin"] == "https://app.example"
    assert "POST" in preflight.headers["access-control-allow-methods"]
    denied = request(keyed.base, "OPTIONS", "/api/chat", headers={"Origin": "https://evil.example"})
    assert denied.status == 403
    reply = chat_post(keyed, new_chat(), "hello there", "key-alice", Origin="https://app.example")
    assert reply.status == 200 and reply.headers["access-control-allow-origin"] == "https://app.example"
    evil = chat_post(keyed, new_chat(), "hello there", "key-alice", Origin="https://evil.example")
    assert evil.status == 403 and evil.json()["error"]["code"] == "origin_not_allowed"
    # Errors carry CORS headers too, so an allowed page can read why it was refused.
    unauthorized = chat_post(keyed, new_chat(), "hello there", None, Origin="https://app.example")
    assert unauthorized.status == 401 and unauthorized.headers["access-control-allow-origin"] == "https://app.example"


def test_limits_answer_with_status_and_reason(slow_adk: str, tmp: Path) -> None:
    limits = """
limits:
  max_messages: 3
  max_streams_per_user: 1
  max_chats_per_user: 2
  rate_per_user: 1
  burst_per_user: 4
"""
    with gateway_process(tmp, slow_adk, limits) as gw:
        too_long = request(gw.base, "POST", "/api/chat", {"id": new_chat(), "messages": [user("a")] * 4})
        assert too_long.status == 413 and too_long.json()["error"]["code"] == "too_many_messages"
        # One response at a time per user: a second one while the first streams is refused.
        results: list[Reply] = []
        first = threading.Thread(target=lambda: results.append(chat_post(gw, "c-one", "hello there", None)))
        first.start()
        time.sleep(0.5)
        second = chat_post(gw, "c-two", "hello there", None)
        first.join()
        assert results[0].status == 200
        assert second.status == 429 and second.json()["error"]["code"] == "too_many_streams"
        assert int(second.headers["retry-after"]) >= 1
        # Quick requests (even bad ones) spend the bucket: the rate limit answers.
        statuses = [request(gw.base, "POST", "/api/chat", b"{}").status for _ in range(8)]
        assert 429 in statuses, statuses
        limited = request(gw.base, "POST", "/api/chat", b"{}")
        assert limited.status == 429 and limited.json()["error"]["code"] == "rate_limited"
        assert int(limited.headers["retry-after"]) >= 1
        time.sleep(2.2)
        # Two chats per user: a third is refused.
        assert chat_post(gw, "c-two", "hello there", None).status == 200
        time.sleep(1.1)
        third = chat_post(gw, "c-three", "hello there", None)
        assert third.status == 429 and third.json()["error"]["code"] == "too_many_chats"
        assert metric_value(gw.base, "adk_gateway_limited_total", {"reason": "too_many_streams"}) == 1
        assert metric_value(gw.base, "adk_gateway_limited_total", {"reason": "rate_limited"}) >= 1


def test_drain_refuses_new_work_ends_long_streams_and_exits_zero(slow_adk: str, tmp: Path) -> None:
    with gateway_process(tmp, slow_adk, drain_timeout="1s") as gw:
        host, port = gw.base.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        body = {"id": new_chat(), "messages": [user("tell me a very long story " * 10)], "trigger": "submit-message"}
        conn.request("POST", "/api/chat", body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        first = resp.read(20).decode()
        started = time.monotonic()
        gw.proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        assert request(gw.base, "GET", "/readyz").status == 503
        refused = chat_post(gw, new_chat(), "hello there", None)
        assert refused.status == 503 and refused.json()["error"]["code"] == "draining"
        # Longer than the drain time: it ends with a final error chunk and a proper end.
        rest = first + resp.read().decode()
        conn.close()
        assert "shutting down" in rest and rest.rstrip().endswith("data: [DONE]")
        assert gw.proc.wait(timeout=30) == 0
        assert time.monotonic() - started < 1 + 5


def test_drain_lets_a_short_stream_finish(slow_adk: str, tmp: Path) -> None:
    with gateway_process(tmp, slow_adk, drain_timeout="10s") as gw:
        results: list[Reply] = []
        worker = threading.Thread(target=lambda: results.append(chat_post(gw, new_chat(), "hello there", None)))
        worker.start()
        time.sleep(0.4)
        gw.proc.send_signal(signal.SIGTERM)
        worker.join(timeout=20)
        assert results and results[0].chunks[-1]["finishReason"] == "stop"
        assert gw.proc.wait(timeout=20) == 0
        # The start-up log names the event loop (uvloop where installed, unless $ADK_GATEWAY_LOOP says asyncio).
        starting = next(json.loads(line) for line in gw.log.read_text().splitlines() if '"gateway_starting"' in line)
        assert starting["event_loop"] == event_loop.choose("auto")


def test_reload_applies_good_files_and_keeps_the_old_on_bad(slow_adk: str, tmp: Path) -> None:
    base = "internal:\n  port: {port}\n  secret: reload-secret\n"
    from tests.procs import free_port

    internal_port = free_port()
    with gateway_process(tmp, slow_adk, base.format(port=internal_port)) as gw:
        path = gw.config_path
        original = path.read_text()
        # Bad file: refused, the old config stays, the failure is counted.
        path.write_text(original + "limits:\n  max_messages: lots\n")
        gw.proc.send_signal(signal.SIGHUP)
        _wait_metric(gw, "adk_gateway_config_reloads_total", {"result": "failure"}, 1)
        assert chat_post(gw, new_chat(), "hello there", None).status == 200
        # Good file: new requests follow it.
        path.write_text(original.replace("limits:\n", "limits:\n  max_messages: 1\n", 1))
        gw.proc.send_signal(signal.SIGHUP)
        _wait_metric(gw, "adk_gateway_config_reloads_total", {"result": "success"}, 1)
        two = request(gw.base, "POST", "/api/chat", {"id": new_chat(), "messages": [user("a"), user("b")]})
        assert two.status == 413
        assert metric_value(gw.base, "adk_gateway_config_last_reload_success_timestamp_seconds") > 0
        # The same over the internal listener, which answers with the problems.
        internal = f"http://127.0.0.1:{internal_port}"
        path.write_text(original + "bogus: 1\n")
        bad = request(internal, "POST", "/internal/v1/reload", headers={"Authorization": "Bearer reload-secret"})
        assert bad.status == 422 and any("bogus" in p for p in bad.json()["problems"])
        path.write_text(original)
        good = request(internal, "POST", "/internal/v1/reload", headers={"Authorization": "Bearer reload-secret"})
        assert good.status == 200 and good.json()["result"] == "success"
        assert request(internal, "POST", "/internal/v1/reload").status == 401
        assert request(gw.base, "POST", "/api/chat", {"id": new_chat(), "messages": [user("a"), user("b")]}).status == 200


def test_an_empty_or_truncated_file_never_opens_the_gateway(slow_adk: str, tmp: Path) -> None:
    """Issue 13's repro: a public listener with keys and a gated tool; the file is emptied, then cut short."""
    from tests.procs import free_port

    port, internal_port = free_port(), free_port()
    production = (
        f"listen:\n  host: 0.0.0.0\n  port: {port}\n"
        "auth:\n  mode: api_key\n  api_keys:\n    - id: web\n      key: key-web\n"
        f"internal:\n  port: {internal_port}\n  secret: reload-secret\n"
        "tools:\n  process_payment:\n    approval: true\n"
    )
    internal = f"http://127.0.0.1:{internal_port}"
    secret = {"Authorization": "Bearer reload-secret"}
    with gateway_process(tmp, slow_adk, production, port=port) as gw:
        path = gw.config_path
        written = path.read_text()
        assert chat_post(gw, new_chat(), "hello there", None).status == 401
        path.write_text("")
        gw.proc.send_signal(signal.SIGHUP)
        _wait_metric(gw, "adk_gateway_config_reloads_total", {"result": "failure"}, 1)
        assert chat_post(gw, new_chat(), "hello there", None).status == 401
        assert chat_post(gw, new_chat(), "hello there", "key-web").status == 200
        policy = request(internal, "GET", "/internal/v1/policy", headers=secret).json()
        assert policy["tools"]["process_payment"]["approval"] is True
        # Cut after the first section the test harness wrote (a loopback listen): the effective
        # config keeps the running 0.0.0.0 listener, so auth none is refused as start would.
        path.write_text(written[: written.index("logging:")])
        refused = request(internal, "POST", "/internal/v1/reload", headers=secret)
        assert refused.status == 422 and refused.json()["result"] == "failure"
        assert any("loopback listener, not 0.0.0.0" in p for p in refused.json()["problems"]), refused.json()
        assert chat_post(gw, new_chat(), "hello there", None).status == 401
        assert metric_value(gw.base, "adk_gateway_config_reloads_total", {"result": "failure"}) == 2
        assert any(line.get("event") == "config_reload_failed" and line.get("level") == "error" for line in gw.log_lines())


def test_on_disconnect_cancel_stops_the_agent_run(slow_adk: str, tmp: Path) -> None:
    with gateway_process(tmp, slow_adk, "chat:\n  on_disconnect: cancel\n") as gw:
        chat = new_chat()
        host, port = gw.base.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        body = {"id": chat, "messages": [user("tell me a long story please")], "trigger": "submit-message"}
        conn.request("POST", "/api/chat", body=json.dumps(body), headers={"Content-Type": "application/json"})
        conn.getresponse().fp.readline()
        conn.close()
        deadline = time.monotonic() + 10
        while not any(line.get("event") == "run_aborted" and line.get("chat_id") == chat for line in gw.log_lines()):
            assert time.monotonic() < deadline, "the run was not cancelled"
            time.sleep(0.1)


def _wait_metric(gw: GatewayProcess, name: str, labels: dict[str, str], value: float) -> None:
    deadline = time.monotonic() + 10
    while metric_value(gw.base, name, labels) < value:
        assert time.monotonic() < deadline, f"{name}{labels} never reached {value}"
        time.sleep(0.1)
