"""The aiohttp application: routes, middleware and the lifecycle of long-lived parts.

`create_app(config)` builds everything and hangs it off the Application (see state.py). The
`cleanup_ctx` starts the upstream client and the background duties (upstream health probe, idle
chat sweeper) and stops them in reverse order.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import structlog
from aiohttp import web

from .auth import Authenticator
from .chats import ChatService
from .cluster.memory import MemoryState
from .cluster.router import Cluster
from .cluster.shared import SharedState
from .config import GatewayConfig
from .errors import Handler, HttpError, error_middleware
from .limits import Admission
from .metrics import CONTENT_TYPE_LATEST, GatewayMetrics
from .registry import Registry
from .state import GATEWAY, Gateway
from .transports import sse, ws
from .upstream import AdkClient

__all__ = ["STATIC_DIR", "create_app"]

log = structlog.get_logger("adk_gateway.app")

STATIC_DIR = Path(__file__).parent / "static"

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
# How often gated calls past their deadline are timed out. Deadlines are minutes long in practice;
# a quarter second keeps tests with 1 s timeouts fast and costs nothing measurable.
_DEADLINE_TICK = 0.25


@web.middleware
async def request_context(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Bind ids for every log line of this request, then write one access line and count it."""
    incoming = request.headers.get("X-Request-Id", "")
    request_id = incoming if _REQUEST_ID.match(incoming) else secrets.token_hex(8)
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(request_id=request_id)
    started = time.perf_counter()
    status = 500
    try:
        response = await handler(request)
        status = response.status
        if not response.prepared:
            response.headers.setdefault("X-Request-Id", request_id)
            # Error answers too: a cross-origin page must be able to read why it was refused.
            response.headers.update(request.app[GATEWAY].auth.cors_headers(request))
        return response
    finally:
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else "unmatched"
        request.app[GATEWAY].metrics.http_requests.labels(route, request.method, str(status)).inc()
        log.info(
            "http_request", method=request.method, path=request.path, route=route, status=status,
            duration_ms=round((time.perf_counter() - started) * 1000, 1),
        )


async def demo_page(request: web.Request) -> web.StreamResponse:
    page = STATIC_DIR / "demo" / "index.html"
    if not page.is_file():
        raise HttpError(404, "demo_not_built", "the demo page is not built: run `make run` (it builds it)")
    return web.FileResponse(page, headers={"Cache-Control": "no-cache"})


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    if gateway.draining:
        return web.json_response({"status": "draining"}, status=503)
    if not gateway.upstream_up:
        return web.json_response({"status": "upstream_unreachable"}, status=503)
    if not gateway.cluster.available:
        return web.json_response({"status": "sessions_unavailable"}, status=503)
    if gateway.cluster.restoring:
        # Redis came back empty: new chats are refused until every owner has written its chats back.
        return web.json_response({"status": "sessions_restoring"}, status=503)
    return web.json_response({"status": "ready"})


async def metrics(request: web.Request) -> web.Response:
    body = request.app[GATEWAY].metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _probe_upstream(gateway: Gateway) -> None:
    while True:
        up = await gateway.upstream.ping()
        if up != gateway.upstream_up:
            log.info("upstream_health_changed", up=up)
        gateway.upstream_up = up
        gateway.metrics.upstream_up.set(1 if up else 0)
        await asyncio.sleep(gateway.config.upstream.health_interval)


async def _enforce_deadlines(gateway: Gateway) -> None:
    while True:
        await asyncio.sleep(_DEADLINE_TICK)
        expired = gateway.chats.gates.expire_due()
        if expired:
            log.info("gates_timed_out", count=expired)


async def _sweep_idle_chats(gateway: Gateway) -> None:
    while True:
        ttl = gateway.config.chat.idle_chat_ttl  # read each time: a reload may change it
        await asyncio.sleep(min(ttl, 60.0))
        now = gateway.clock()
        forgotten = await gateway.cluster.forget_idle(now - ttl)
        gateway.admission.forget_idle_buckets(now)
        if forgotten:
            log.info("idle_chats_forgotten", count=forgotten)


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    gateway = app[GATEWAY]
    gateway.metrics.watch_gc()
    await gateway.upstream.start()
    await gateway.cluster.start()
    log.info("replica_started", replica=gateway.cluster.replica_id, sessions_backend=gateway.config.sessions.backend)
    duties = [
        asyncio.create_task(_probe_upstream(gateway), name="upstream-probe"),
        asyncio.create_task(_sweep_idle_chats(gateway), name="idle-chat-sweeper"),
        asyncio.create_task(_enforce_deadlines(gateway), name="deadline-sweeper"),
    ]
    yield
    for task in duties:
        task.cancel()
    await asyncio.gather(*duties, return_exceptions=True)
    await gateway.chats.close()
    await gateway.cluster.close()
    await gateway.upstream.close()
    gateway.metrics.unwatch_gc()


def shared_state(config: GatewayConfig) -> SharedState:
    """The configured backend for what replicas share, as this replica's view of it."""
    replica_id = f"{socket.gethostname()}-{secrets.token_hex(3)}"
    sessions = config.sessions
    if sessions.backend == "memory":
        return MemoryState(replica_id)
    from .cluster.redis import RedisState

    assert sessions.redis_url is not None  # the config requires it with backend redis
    return RedisState(
        replica_id, sessions.redis_url.get_secret_value(), prefix=sessions.key_prefix,
        heartbeat_interval=sessions.heartbeat_interval, owner_timeout=sessions.owner_timeout,
    )


def create_app(config: GatewayConfig) -> web.Application:
    metrics_ = GatewayMetrics()
    metrics_.know_tools(config.tools)
    registry = Registry(config.limits.max_chats_per_user)
    upstream = AdkClient(config.upstream)
    chats = ChatService(upstream=upstream, registry=registry, metrics=metrics_, config=config)
    gateway = Gateway(
        config=config, metrics=metrics_, registry=registry, auth=Authenticator(config.auth),
        upstream=upstream, chats=chats, cluster=Cluster(shared_state(config), chats, metrics_),
        admission=Admission(config.limits),
    )
    metrics_.sessions_up.set_function(lambda: 1.0 if gateway.cluster.available else 0.0)
    app = web.Application(
        middlewares=[request_context, error_middleware], client_max_size=config.chat.max_body_bytes
    )
    app[GATEWAY] = gateway
    app.cleanup_ctx.append(_lifecycle)
    app.add_routes(sse.routes())
    app.add_routes(ws.routes())
    # Browser-side helpers the gateway ships, such as the ai 6 WebSocket transport module.
    app.router.add_static("/static/", STATIC_DIR, show_index=False, follow_symlinks=False)
    if config.demo.page:
        app.add_routes([web.get("/", demo_page)])
    app.add_routes([web.get("/healthz", healthz), web.get("/readyz", readyz)])
    if config.metrics.enabled:
        app.add_routes([web.get(config.metrics.path, metrics)])
    return app

