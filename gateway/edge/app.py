"""The aiohttp application: routes, middleware and the lifecycle of long-lived parts.

`create_app(config)` builds everything and hangs it off the Application (see edge/state.py). The
`cleanup_ctx` starts the agents' upstream clients and health probes and the background duty (the idle
chat sweeper) and stops them in reverse order. A gated call's deadline is in the one deadline
queue (cluster/deadline_timer.py), not a sweep.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import socket
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import MappingProxyType

import structlog
from aiohttp import web
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS_TYPE

from ..upstream.agents import Agents
from ..access.auth import Authenticator
from ..chat.service import ChatService
from ..cluster.memory import MemoryState
from ..cluster.router import Cluster
from ..cluster.shared import SharedState
from ..config.schema import GatewayConfig
from .errors import Handler, error_answer
from ..core.refusals import HttpError
from ..access.jwks import provider_keys
from ..core.limits import Admission, Limited
from .limiter import Limiter
from ..approvals.audit_trail import AuditTrail
from ..ops.coarse_timers import CoarseTimers
from ..ops.logs import user_id_as_logged
from ..ops.metrics import GatewayMetrics
from ..ops.tracing import Tracing, TracingUnavailable
from ..upstream.client import AdkClient
from ..config.schema import ConfigError
from ..chat.registry import Registry
from .state import GATEWAY, Gateway
from ..ops.stopping import within
from ..approvals.webhooks import Webhooks
from ..approvals.slack import SlackChannel
from ..approvals.email import EmailNotices
from ..access.tickets import Tickets
from . import agui, approvals_api, decision_page, grants_api, slack, sse, ws
from .admit import count_refusal, identify, preflight

__all__ = ["STATIC_DIR", "create_app"]

log = structlog.get_logger("adk_gateway.edge.app")

STATIC_DIR = Path(__file__).parents[1] / "static"

# How long a stop waits for the audit records not yet in the shared store (they are in the log).
_AUDIT_FLUSH = 2.0
# How long a stop gives webhook calls under way (and deliveries between attempts, one last one):
# a share of the stop's grace (edge/server.py STOP_GRACE), so a receiver that hangs cannot hold the exit.
_WEBHOOKS_STOP = 2.0

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")

# Answered without a span: probes and scrapes, every few seconds, would bury the turns.
_UNTRACED = frozenset({"/healthz", "/readyz"})


@web.middleware
async def request_context(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Bind ids for every log line of this request, then write one access line and count it."""
    incoming = request.headers.get("X-Request-Id", "")
    request_id = incoming if _REQUEST_ID.match(incoming) else secrets.token_hex(8)
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(request_id=request_id)
    started = time.perf_counter()
    status = 500
    gateway = request.app[GATEWAY]
    span = None
    if gateway.tracing.enabled:
        span = _server_span(request, gateway)
    try:
        # error_middleware's work, done here: one coroutine frame less on every held stream.
        try:
            response = await handler(request)
        except Exception as exc:
            answer = error_answer(request, exc)
            if answer is None:
                raise
            response = answer
        status = response.status
        if not response.prepared:
            response.headers.setdefault("X-Request-Id", request_id)
            # Error answers too: a cross-origin page must be able to read why it was refused.
            response.headers.update(request.app[GATEWAY].auth.cors_headers(request))
        return response
    finally:
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else "unmatched"
        # A streamed answer is written by the handler: its duration runs to the stream's end.
        duration = time.perf_counter() - started
        exemplar = gateway.tracing.server_exemplar(span) if span is not None else None
        request.app[GATEWAY].metrics.count_request(route, request.method, str(status), duration, exemplar)
        gateway.tracing.end_server(span, status)
        # A mailed decision link's path is a credential: its route is logged instead.
        path = route if route == decision_page.ROUTE else request.path
        log.info(
            "http_request", method=request.method, path=path, route=route, status=status,
            duration_ms=round(duration * 1000, 1),
        )


def _server_span(request: web.Request, gateway: Gateway) -> object:
    """The request's SERVER span, or None for probes, scrapes and the WebSocket upgrade (a socket
    lives for hours: each `send` on it gets its span instead, edge/ws_frames.py)."""
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else "unmatched"
    if request.path in _UNTRACED or request.path == gateway.config.metrics.path or route.endswith("/ws"):
        return None
    return gateway.tracing.server_span(
        request.headers, request.method, route, route if route == decision_page.ROUTE else request.path, agent=request.match_info.get("agent"),
    )


# The demo's pages load only their own files (web/src has no inline script, style or handler) and
# talk only to this origin; nothing may frame them: the inbox decides approvals with an approver's
# key, so a framing page could trick a click, and an injected script would act with the key.
_PAGE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
_PAGE_HEADERS = MappingProxyType({
    "Cache-Control": "no-cache", "Content-Security-Policy": _PAGE_POLICY,
    # frame-ancestors' older spelling, for browsers without CSP 2.
    "X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff",
})


def _demo_file(name: str) -> web.FileResponse:
    page = STATIC_DIR / "demo" / name
    if not page.is_file():
        raise HttpError(404, "demo_not_built", "the demo page is not built: run `make run` (it builds it)")
    return web.FileResponse(page, headers=_PAGE_HEADERS)


async def demo_page(request: web.Request) -> web.StreamResponse:
    return _demo_file("index.html")


async def agui_page(request: web.Request) -> web.StreamResponse:
    """The demo chat over AG-UI (POST /agents/{name}/ag-ui), beside the AI SDK one at `/`."""
    return _demo_file("agui.html")


async def inbox_page(request: web.Request) -> web.StreamResponse:
    """The demo's approvals inbox: a page only; what it lists and decides goes through /api/approvals."""
    return _demo_file("inbox.html")


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Ready when the default agent's upstream, and the shared session store, answer. Every agent's
    upstream is reported under `agents`; another agent's outage leaves the replica ready (the
    balancer cannot route around one agent) and shows as `adk_gateway_upstream_up{agent}` 0."""
    gateway = request.app[GATEWAY]
    agents = {agent.name: "up" if agent.up else "unreachable" for agent in gateway.agents}
    status = readiness(gateway)
    body: dict[str, object] = {"status": status, "agents": agents}
    if gateway.jwks is not None:
        # Detail, not readiness: the keys held keep working while the provider is down.
        body["jwks"] = gateway.jwks.cache.status
    return web.json_response(body, status=200 if status == "ready" else 503)


def readiness(gateway: Gateway) -> str:
    """What /readyz says (and `adk_gateway_ready` counts): "ready", or why not."""
    if gateway.draining:
        return "draining"
    if not gateway.agents.default.up:
        return "upstream_unreachable"
    if not gateway.cluster.available:
        return "sessions_unavailable"
    if gateway.cluster.restoring:
        # Redis came back empty: new chats are refused until every owner has written its chats back.
        return "sessions_restoring"
    return "ready"


async def list_agents(request: web.Request) -> web.Response:
    """The agents the caller may use, and their routes: what a page needs to offer a choice."""
    gateway = request.app[GATEWAY]
    identity = await identify(request)
    try:
        await gateway.admission.check_rate(identity.user_id, gateway.clock())
    except Limited as exc:
        count_refusal(request, exc.code)
        raise
    config = gateway.config
    agents = [
        {"name": name, "default": name == config.default, "mode": agent.upstream.mode,
         "api": f"/agents/{name}/api/chat", "ws": f"/agents/{name}/api/chat/ws", "ag_ui": f"/agents/{name}/ag-ui",
         "browser_tools": agent.browser_tools}
        for name, agent in config.agents.items() if gateway.auth.may_use(identity, agent.access)
    ]
    return web.json_response({"default": config.default, "agents": agents})


async def metrics(request: web.Request) -> web.Response:
    # OpenMetrics (which carries the exemplars) when the scraper asks for it; else the text format.
    openmetrics = "application/openmetrics-text" in request.headers.get("Accept", "")
    body = request.app[GATEWAY].metrics.render(openmetrics)
    return web.Response(body=body, headers={"Content-Type": OPENMETRICS_TYPE if openmetrics else CONTENT_TYPE_LATEST})


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
    await gateway.agents.start()
    if gateway.jwks is not None:
        gateway.jwks.open()
    await gateway.cluster.start()
    gateway.admission.start()
    gateway.audit.start()
    gateway.webhooks.start()
    gateway.slack.start()
    gateway.email.start()
    log.info(
        "replica_started", replica=gateway.cluster.replica_id, sessions_backend=gateway.config.sessions.backend,
        agents=[agent.name for agent in gateway.agents],
    )
    duties = [
        asyncio.create_task(_sweep_idle_chats(gateway), name="idle-chat-sweeper"),
    ]
    yield
    for task in duties:
        task.cancel()
    await asyncio.gather(*duties, return_exceptions=True)
    await gateway.chats.close()
    # After the chats (their last approvals are recorded), before the store is left.
    await gateway.audit.stop(_AUDIT_FLUSH)
    # After the chats: the notices of the approvals their close cancels are queued by then.
    # The Slack channel's calls and the approval mails in the same share, alongside (before the
    # store is left: the Slack channel keeps where its messages are, a mail's link its nonce).
    await asyncio.gather(
        within(gateway.webhooks.stop(_WEBHOOKS_STOP), _WEBHOOKS_STOP + 1.0, what="webhooks"),
        within(gateway.slack.stop(_WEBHOOKS_STOP), _WEBHOOKS_STOP + 1.0, what="slack"),
        within(gateway.email.stop(_WEBHOOKS_STOP), _WEBHOOKS_STOP + 1.0, what="approval mails"),
    )
    # Before the store is left: the last streams' shared slots are given back.
    await gateway.admission.close()
    await gateway.cluster.close()
    await gateway.agents.close()
    # After everything that ends spans: the last turns' and approvals' spans go out.
    await gateway.tracing.stop()
    if gateway.jwks is not None:
        await gateway.jwks.close()
    if gateway.background:
        await within(asyncio.gather(*gateway.background, return_exceptions=True), 2.0, what="background clean-ups")
    gateway.metrics.unwatch_gc()


def shared_state(config: GatewayConfig, metrics: GatewayMetrics | None = None) -> SharedState:
    """The configured backend for what replicas share, as this replica's view of it (its Redis
    connection pool's waits counted in `metrics`)."""
    replica_id = f"{socket.gethostname()}-{secrets.token_hex(3)}"
    sessions = config.sessions
    if sessions.backend == "memory":
        return MemoryState(replica_id)
    from ..cluster.redis import RedisState
    from ..cluster.redis_client import RedisTarget
    from ..cluster.sealing import Seal

    # The config requires a redis_url or the sentinels with backend redis.
    password = sessions.redis_sentinel_password
    target = RedisTarget(
        url=sessions.redis_url.get_secret_value() if sessions.redis_url is not None else "",
        sentinels=tuple(sessions.sentinel_addresses()), service=sessions.redis_sentinel_service or "",
        sentinel_username=sessions.redis_sentinel_username,
        sentinel_password=password.get_secret_value() if password is not None else None,
        sentinel_tls=sessions.redis_sentinel_tls,
    )
    return RedisState(
        replica_id, target, prefix=sessions.key_prefix,
        heartbeat_interval=sessions.heartbeat_interval, owner_timeout=sessions.owner_timeout,
        seal=Seal(config.seal_secrets()),  # the config refuses backend redis without one
        max_connections=sessions.redis_max_connections, pool_watch=metrics.redis_pool if metrics is not None else None,
    )


def _users_as_logged(config: GatewayConfig) -> Callable[[str], str | None]:
    key = config.logging.user_id_key
    return user_id_as_logged(config.logging.user_id, key.get_secret_value() if key is not None else None)


def create_app(config: GatewayConfig) -> web.Application:
    metrics_ = GatewayMetrics()
    metrics_.know_agents(config)
    metrics_.webhooks.know(config.notifications)
    shared = shared_state(config, metrics_)
    try:
        tracing = Tracing.from_config(config.telemetry, replica=shared.replica_id, users=_users_as_logged(config))
    except TracingUnavailable as exc:
        raise ConfigError([str(exc)]) from None
    if tracing.enabled:
        # The latency histograms carry the sampled trace's id (docs/metrics.md#exemplars).
        metrics_.attach_exemplars(tracing)
    registry = Registry(config.limits.max_chats_per_user)
    timers = CoarseTimers()
    agents = Agents(
        config, on_health=metrics_.upstream_health, client=lambda agent: AdkClient(agent.upstream, tracing, timers),
    )
    chats = ChatService(agents=agents, registry=registry, metrics=metrics_, config=config, tracing=tracing)
    jwks = provider_keys(config.auth, metrics_.jwks_fetched)
    # The config through the gateway, so a reload's notifications apply to the notices after it.
    webhooks = Webhooks(lambda: gateway.config.notifications, metrics_)
    email = EmailNotices(lambda: gateway.config.notifications, shared, shared, decision_page.link_deciders(lambda: gateway), metrics_.webhooks)
    gateway = Gateway(
        config=config, metrics=metrics_, registry=registry, auth=Authenticator(config.auth, jwks),
        agents=agents, chats=chats, cluster=Cluster(shared, chats, metrics_),
        admission=Limiter(Admission(config.limits), shared, metrics_, config.sessions), tickets=Tickets(shared), webhooks=webhooks, jwks=jwks, tracing=tracing,
        slack=SlackChannel(lambda: gateway.config, shared, metrics_), email=email,
        timers=timers,
        # The config read through the gateway at each use, so a reload's `audit:` applies.
        audit=AuditTrail(
            shared, metrics_, lambda: gateway.config.audit, logging=config.logging, timeout=config.sessions.forward_timeout,
        ),
    )
    # Every approval decided (whoever decided it) becomes an audit record; every notice goes to the
    # webhooks that want it, and to the approvers' channels (Slack, mail), which read their config at each.
    for sink in (gateway.audit.record, gateway.webhooks.notify, gateway.slack.notify, gateway.email.notify):
        chats.notices.add_sink(sink)
    metrics_.sessions_up.set_function(lambda: 1.0 if gateway.cluster.available else 0.0)
    metrics_.ready.set_function(lambda: 1.0 if readiness(gateway) == "ready" else 0.0)
    app = web.Application(
        middlewares=[request_context], client_max_size=config.chat.max_body_bytes
    )
    app[GATEWAY] = gateway
    app.cleanup_ctx.append(_lifecycle)
    for face in (sse, ws, agui, approvals_api, grants_api, slack, decision_page):
        app.add_routes(face.routes())
    # Browser-side helpers the gateway ships, such as the ai 6 WebSocket transport module.
    app.router.add_static("/static/", STATIC_DIR, show_index=False, follow_symlinks=False)
    if config.demo.page:
        app.add_routes([web.get("/", demo_page), web.get("/agui", agui_page), web.get("/inbox", inbox_page)])
    app.add_routes([web.get("/healthz", healthz), web.get("/readyz", readyz)])
    # An app on an allowed origin may read the list cross-origin, with its credential in a header.
    app.add_routes([web.get("/api/agents", list_agents), web.options("/api/agents", preflight)])
    if config.metrics.enabled and config.metrics.listener == "public":
        app.add_routes([web.get(config.metrics.path, metrics)])
    return app

