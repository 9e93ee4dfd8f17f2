"""What every browser request passes before it reaches a chat, whatever its transport.

Identity (auth, or a WebSocket ticket), the page's origin, the agent the route names (404 if none such, 403 if the caller
may not use it), the drain state and the user's request rate (with a stream slot, for a request that
streams: `admit_stream`), in that order, each refused with its
own status and JSON reason and counted in `adk_gateway_limited_total`; the body of a request that
has one (`read_body`: within `chat.body_timeout`, uncompressed, under the body size limit); and the
CORS preflight that comes before a cross-origin page's requests.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Final

import structlog
from aiohttp import web

from ..access.auth import Identity
from ..core.refusals import HttpError
from ..core.limits import Limited
from .limiter import Slot
from .state import GATEWAY
from ..access.tickets import QUERY_PARAMETER

__all__ = ["Caller", "admit", "admit_stream", "count_refusal", "identify", "preflight", "read_body", "route_agent"]

# What a request refused while draining is told to wait, in seconds: long enough for a balancer
# polling `/readyz` (503 `draining` from the first moment) to stop routing here, so the retry lands
# on another instance; short enough that a person retrying by hand hardly notices.
_DRAINING_RETRY_AFTER: Final = "5"
# How long a browser may cache a preflight's answer, in seconds: it saves an OPTIONS round trip
# before every cross-origin POST, and a reload that takes an origin off the allowlist reaches
# pages that cached an answer within ten minutes (browsers cap it anyway: Chromium at 2 hours).
_PREFLIGHT_MAX_AGE: Final = "600"


@dataclass(frozen=True, slots=True)
class Caller:
    """An admitted request: the user it acts for, on the agent its route names."""

    user_id: str
    agent: str
    identity: Identity


def count_refusal(request: web.Request, reason: str) -> None:
    request.app[GATEWAY].metrics.limited.labels(reason).inc()


def route_agent(request: web.Request) -> str:
    """The agent a route names: `/agents/{agent}/api/chat...`, or the default agent's `/api/chat...`."""
    return request.match_info.get("agent") or request.app[GATEWAY].config.default


def _socket_handshake(request: web.Request) -> bool:
    """A WebSocket handshake, as aiohttp's `WebSocketResponse.prepare` takes one: a GET whose
    `Connection` lists `upgrade` and whose `Upgrade` is `websocket`."""
    connection = {token.strip() for token in request.headers.get("Connection", "").lower().split(",")}
    return (
        request.method == "GET"
        and "upgrade" in connection
        and request.headers.get("Upgrade", "").strip().lower() == "websocket"
    )


async def _redeem_ticket(request: web.Request, value: str, *, socket: bool) -> Identity:
    """The identity a `?ticket=` stands for: only on a real handshake of a socket route. Anywhere
    else it is refused, not read (nor spent): a ticket that bought a ticket, each with a new
    lifetime, would be a credential that never expires where the credential (an API key) has no `exp`."""
    gateway = request.app[GATEWAY]
    if not (socket and _socket_handshake(request)):
        gateway.metrics.ws_tickets.labels("refused").inc()
        raise HttpError(
            401, "unauthorized",
            "?ticket= is a credential only on a WebSocket handshake of .../api/chat/ws (a ticket never buys a "
            "ticket): send the credential in the Authorization header here",
            {"WWW-Authenticate": 'Bearer realm="adk-gateway"'},
        )
    try:
        identity = await gateway.tickets.redeem(
            value, agent=route_agent(request), origin=request.headers.get("Origin"), fingerprint=gateway.auth.fingerprint
        )
    except HttpError:
        gateway.metrics.ws_tickets.labels("refused").inc()
        raise
    gateway.metrics.ws_tickets.labels("redeemed").inc()
    return identity


async def identify(request: web.Request, *, socket: bool = False) -> Identity:
    """Who calls, from a page that may call: the first two checks, for routes of no one agent.
    The handshake of a `socket` route may carry a ticket (access/tickets.py) instead of a credential."""
    gateway = request.app[GATEWAY]
    try:
        ticket = request.query.get(QUERY_PARAMETER)
        if ticket is not None:
            identity = await _redeem_ticket(request, ticket, socket=socket)
        else:
            identity = await gateway.auth.identify(request)
        gateway.auth.check_origin(request, identity)
    except HttpError as exc:
        count_refusal(request, exc.code if exc.status == 403 else "unauthorized")
        raise
    structlog.contextvars.bind_contextvars(user_id=identity.user_id)
    return identity


async def admit(request: web.Request, *, new_work: bool = True, socket: bool = False) -> Caller:
    """The caller, once they may proceed; `new_work` requests are refused while draining. Only a
    `socket` route's handshake may be admitted by a ticket."""
    gateway = request.app[GATEWAY]
    caller = await _before_limits(request, new_work=new_work, socket=socket)
    try:
        await gateway.admission.check_rate(caller.user_id, gateway.clock())
    except Limited as exc:
        count_refusal(request, exc.code)
        raise
    return caller


async def admit_stream(request: web.Request) -> tuple[Caller, Slot]:
    """`admit` for a request that streams its answer (new work): the caller and a stream slot,
    taken with the rate's token in one step (one round trip when the replicas share the limits).
    The caller releases the slot."""
    gateway = request.app[GATEWAY]
    caller = await _before_limits(request, new_work=True, socket=False)
    try:
        slot = await gateway.admission.admit_stream(caller.user_id, gateway.clock())
    except Limited as exc:
        count_refusal(request, exc.code)
        raise
    return caller, slot


async def _before_limits(request: web.Request, *, new_work: bool, socket: bool) -> Caller:
    gateway = request.app[GATEWAY]
    identity = await identify(request, socket=socket)
    user_id = identity.user_id
    agent = route_agent(request)
    config = gateway.config.agents.get(agent)
    if config is None:
        count_refusal(request, "agent_not_found")
        raise HttpError(404, "agent_not_found", "no such agent")
    if not gateway.auth.may_use(identity, config.access):
        count_refusal(request, "agent_not_allowed")
        raise HttpError(403, "agent_not_allowed", "this credential may not use this agent")
    structlog.contextvars.bind_contextvars(agent=agent)
    if new_work and gateway.draining:
        count_refusal(request, "draining")
        raise HttpError(503, "draining", "the gateway is shutting down; retry on another instance", {"Retry-After": _DRAINING_RETRY_AFTER})
    return Caller(user_id, agent, identity)


async def read_body(request: web.Request) -> bytes:
    """The request's body, read within `chat.body_timeout` (408 `body_timeout`): a caller that
    sends its body slowly holds a connection no longer than that. 413 over the size limit, 415 for
    a compressed body, 400 for one that does not decode."""
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        # Browsers never compress request bodies; aiohttp's decoders can wait forever on a
        # truncated deflate stream and answer unsupported ones in plain text.
        raise HttpError(415, "unsupported_encoding", "compressed request bodies are not accepted")
    try:
        async with asyncio.timeout(request.app[GATEWAY].config.chat.body_timeout):
            return await request.read()
    except TimeoutError:
        count_refusal(request, "body_timeout")
        raise HttpError(408, "body_timeout", "the request body did not arrive in time") from None
    except web.HTTPRequestEntityTooLarge:
        count_refusal(request, "body_too_large")
        raise
    except ConnectionError:
        raise
    except Exception as exc:
        # A body that does not decode (e.g. Content-Encoding: gzip over bytes that are not gzip).
        raise HttpError(400, "invalid_body", f"the request body could not be read: {type(exc).__name__}") from None


async def preflight(request: web.Request) -> web.Response:
    """CORS preflight for cross-origin pages on the allowlist."""
    gateway = request.app[GATEWAY]
    headers = gateway.auth.cors_headers(request)
    if not headers:
        count_refusal(request, "origin_not_allowed")
        raise HttpError(403, "origin_not_allowed", "this page's origin may not use the gateway")
    headers.update({
        "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
        "Access-Control-Allow-Headers": request.headers.get("Access-Control-Request-Headers", "content-type, authorization"),
        "Access-Control-Max-Age": _PREFLIGHT_MAX_AGE,
    })
    return web.Response(status=204, headers=headers)
