"""A new chat against the stock ADK API server with and without `--auto_create_session`.

Between the gateway and ADK a proxy notes every request. With the flag (and the gateway's
`upstream.auto_create_session`) a new chat's first turn is one `POST /run_sse`, no `POST .../sessions`;
the session ADK made carries the chat's id and user id, and holds the turn. Without the flag the
gateway's setting costs one 404 once: it then creates the session first, every chat works.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gateway.demo import adk_venv
from tests.chatflow import new_chat, post, types, user
from tests.integration.test_adk_versions import VERSIONS
from tests.procs import AdkServer, gateway_process, metric_value, request

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

SESSIONS = "/apps/demo_agent/users/anonymous/sessions"


class CountingProxy:
    """A pass-through to ADK that notes each request's method and path (not the health probe's)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.seen: list[str] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.forward)
        return app

    async def forward(self, req: web.Request) -> web.StreamResponse:
        if req.path != "/list-apps":
            self.seen.append(f"{req.method} {req.path}")
        body = await req.read()
        headers = {k: v for k, v in req.headers.items() if k.lower() in ("content-type", "accept")}
        async with aiohttp.ClientSession() as session:
            async with session.request(req.method, self.target + req.path_qs, data=body, headers=headers) as up:
                resp = web.StreamResponse(status=up.status, headers={"Content-Type": up.headers.get("Content-Type", "application/json")})
                await resp.prepare(req)
                async for chunk in up.content.iter_any():
                    await resp.write(chunk)
                await resp.write_eof()
                return resp


async def chat_turn(gw: Any, chat: str, text: str = "hello there") -> list[str]:
    reply = await asyncio.to_thread(post, gw, chat, [user(text)])
    assert reply.status == 200, reply.body[:300]
    return types(reply)


@pytest.mark.parametrize("flag", [True, False], ids=["auto-create", "stock"])
async def test_a_new_chat_and_the_session_create(aiohttp_server: Any, tmp_path: Path, flag: bool) -> None:
    server = AdkServer(tmp_path, auto_create_session=flag)
    await asyncio.to_thread(server.start)
    try:
        proxy = CountingProxy(server.base)
        front = await aiohttp_server(proxy.app())
        with gateway_process(tmp_path, f"http://127.0.0.1:{front.port}", auto_create_session=True) as gw:
            first, second = new_chat(), new_chat()
            assert "text-delta" in await chat_turn(gw, first)
            assert "text-delta" in await chat_turn(gw, second)
            assert "text-delta" in await chat_turn(gw, first, "weather in Tokyo")
            creates = [r for r in proxy.seen if r.startswith("POST /apps/") and r.endswith("/sessions")]
            runs = [r for r in proxy.seen if r == "POST /run_sse"]
            missing = await asyncio.to_thread(metric_value, gw.base, "adk_gateway_upstream_errors_total", {"kind": "session_missing"})
            if flag:
                assert creates == [] and len(runs) == 3, proxy.seen
                assert missing == 0
            else:
                # The first chat's run answered 404 once; from then on sessions are created first.
                assert len(creates) == 2 and len(runs) == 4, proxy.seen
                assert missing == 1
                assert "upstream_does_not_create_sessions" in gw.log_text()
            # ADK's session is the chat's: its id, its user, both turns in it.
            for chat in (first, second):
                got = await asyncio.to_thread(request, server.base, "GET", f"{SESSIONS}/{chat}")
                assert got.status == 200 and got.json()["id"] == chat and got.json()["userId"] == "anonymous"
            texts = [p.get("text") for e in (await asyncio.to_thread(request, server.base, "GET", f"{SESSIONS}/{first}")).json()["events"]
                     if e.get("author") == "user" for p in e["content"]["parts"]]
            assert texts == ["hello there", "weather in Tokyo"]
    finally:
        await asyncio.to_thread(server.stop)


# An older ADK's venv is built by `make compat` (ADK_VERSIONS), never by `make test`: there the
# stock 2.13 server without the flag covers the same path (the test above, "stock").
@pytest.mark.parametrize("version", VERSIONS)
async def test_an_adk_without_the_flag_with_the_setting_on(tmp_path: Path, version: str) -> None:
    # An older server run without the flag (1.22.1 has none): the setting left on by mistake
    # costs one 404, once.
    try:
        adk = adk_venv.ensure(version) / "bin" / "adk"
    except adk_venv.VenvError as exc:
        pytest.fail(str(exc))
    server = AdkServer(tmp_path, adk=adk)
    await asyncio.to_thread(server.start)
    try:
        with gateway_process(tmp_path, server.base, auto_create_session=True) as gw:
            for chat in (new_chat(), new_chat()):
                assert "text-delta" in await chat_turn(gw, chat)
            missing = await asyncio.to_thread(metric_value, gw.base, "adk_gateway_upstream_errors_total", {"kind": "session_missing"})
            assert missing == 1
    finally:
        await asyncio.to_thread(server.stop)
