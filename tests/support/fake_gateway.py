"""The gateway's internal listener as the ADK plugin sees it (`/internal/v1/policy` and
`/internal/v1/tool-calls`), faked for the plugin's own tests and for the recorders' real ADK servers
(tests/support/recorder.py), and the tool context ADK gives the plugin. The real pairing runs in
tests/integration."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

from aiohttp import web

RUN = {"verdict": "run"}


class FakeGateway:
    """Answers the plugin's policy fetch with `tools`, and each decision request with `verdict` and
    `status`, after `behaviour` ("hang": held open, a person who never answers; "drop": the
    connection cut). Behind a balancer instead (`fates` set): each decision request meets the next
    fate ("handback" by a draining replica, "drop", "refuse", "busy", or a verdict), the last one
    repeating. Only the secrets in `secrets` are let in (two while a rotation overlaps); `refused`
    counts the others. Records each decision request (`asked`), its headers and its client port
    (a new connection has a new one). `decide`, when set, answers each decision request instead:
    its body in, the verdict out, when it chooses to answer (a recorder's scripted person).
    The policy is `tools` for every app, or `tools_of(app_name)`; `apps` records each fetch's app."""

    def __init__(self) -> None:
        self.verdict: Any = RUN
        self.status = 200
        self.behaviour = ""
        self.fates: list[Any] = []
        self.asked: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.ports: list[int] = []
        self.secrets = {"s3cret"}
        self.refused = 0
        self.tools: dict[str, Any] = {
            "pay": {"approval": True, "runs_in": "server", "gated": True, "non_blocking": True},
        }
        self.tools_of: Callable[[str | None], dict[str, Any]] | None = None
        self.apps: list[str | None] = []
        self.refresh = 30
        self.decide: Callable[[dict[str, Any]], Awaitable[Any]] | None = None

    def authorized(self, request: web.Request) -> bool:
        if request.headers.get("Authorization", "").removeprefix("Bearer ") in self.secrets:
            return True
        self.refused += 1
        return False

    def app(self) -> web.Application:
        async def policy(request: web.Request) -> web.Response:
            if not self.authorized(request):
                return web.json_response({}, status=401)
            app = request.query.get("app_name")
            self.apps.append(app)
            tools = self.tools if self.tools_of is None else self.tools_of(app)
            return web.json_response({"tools": tools, "refresh": self.refresh})

        async def tool_calls(request: web.Request) -> web.StreamResponse:
            if not self.authorized(request):
                return web.json_response({}, status=401)
            self.asked.append(await request.json())
            self.headers.append(dict(request.headers))
            peer = request.transport.get_extra_info("peername") if request.transport else None
            self.ports.append(peer[1] if peer else 0)
            if self.decide is not None:
                return web.json_response(await self.decide(self.asked[-1]))
            if self.fates:
                return await _meet(self.fates.pop(0) if len(self.fates) > 1 else self.fates[0], request)
            if self.behaviour == "hang":
                await asyncio.sleep(30)
            if self.behaviour == "drop":
                await _drop(request)
            return web.json_response(self.verdict, status=self.status)

        app = web.Application()
        app.add_routes([web.get("/internal/v1/policy", policy), web.post("/internal/v1/tool-calls", tool_calls)])
        return app


async def _drop(request: web.Request) -> None:
    assert request.transport is not None
    request.transport.close()
    await asyncio.sleep(1)


async def _meet(fate: Any, request: web.Request) -> web.StreamResponse:
    if fate == "handback":
        return web.json_response(
            {"error": {"code": "retry_elsewhere", "message": "shutting down"}}, status=503, headers={"Retry-After": "0"},
        )
    if fate == "busy":  # a balancer with no replica up
        return web.Response(status=502, text="bad gateway")
    if fate == "refuse":
        return web.json_response({"error": {"code": "unauthorized", "message": "no"}}, status=401)
    if fate == "drop":
        await _drop(request)
    return web.json_response(fate)


def context() -> Any:
    """ADK's tool context of call-1 in chat-1 of `app`, for user u1, before any confirmation."""
    return SimpleNamespace(
        session=SimpleNamespace(app_name="app", id="chat-1"), user_id="u1", invocation_id="inv",
        function_call_id="call-1", tool_confirmation=None,
    )
