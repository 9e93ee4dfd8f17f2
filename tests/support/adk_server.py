"""A fake ADK API server over HTTP, for the tests of the upstream client (`AdkClient`) itself: the
chat service's tests fake the client instead (adk.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.config.schema import UpstreamConfig
from gateway.ops.tracing import Tracing
from gateway.upstream.client import AdkClient

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# (method, path) -> a handler, a recorded (status, JSON body) answer, or a list of those used up one per call.
Routes = dict[tuple[str, str], Any]


@asynccontextmanager
async def adk_server(
    upstream: UpstreamConfig | None = None, *, app_name: str = "demo_agent", tracing: Tracing | None = None,
) -> AsyncIterator[tuple[Routes, AdkClient]]:
    """The server answering from the routes the test fills in (another path is a 404, as aiohttp's),
    and an AdkClient started on it: of `upstream` pointed at the server, or a plain one of
    `app_name`. Both are closed on leaving."""
    routes: Routes = {}

    async def handle(request: web.Request) -> web.StreamResponse:
        answer = routes.get((request.method, request.path))
        if answer is None:
            raise web.HTTPNotFound()
        if callable(answer):
            return await answer(request)
        status, body = answer.pop(0) if isinstance(answer, list) else answer
        return web.json_response(body, status=status)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    server = TestServer(app)
    await server.start_server()
    config = (upstream or UpstreamConfig(app_name=app_name)).model_copy(update={"url": str(server.make_url("/"))})
    client = AdkClient(config, tracing)
    await client.start()
    try:
        yield routes, client
    finally:
        await client.close()
        await server.close()


def sse_body(payload: bytes) -> Handler:
    """A `/run_sse` handler that reads the request and answers `payload` as the event stream."""
    async def answer(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await response.prepare(request)
        await response.write(payload)
        await response.write_eof()
        return response

    return answer
