"""The AG-UI transport: `POST /ag-ui` (the default agent's) and `POST /agents/{name}/ag-ui`.

A `RunAgentInput` in (core/agui_input.py rewrites it as the chat request it amounts to), an SSE
stream of AG-UI 1.0 events out: the chat's own response, the chunks the AI SDK routes stream,
said in AG-UI's words by core/agui_stream.py. The thread id is the chat id; admission, ownership,
limits, replicas, approvals and durability are the chat routes' (edge/admit.py, the cluster
router, chat/service.py), so the handler only admits, parses, follows and translates.

What the engine refuses after the input was read (an interrupt that is not pending, another
chat's, one its approvers decide, a chat busy with another response) is the run's `RUN_ERROR`
with the refusal's code, as AG-UI has it; what cannot be read at all is a 400 with a JSON body,
and what is no fault of the run (limits, the shared store settling or out of reach) the chat
routes' HTTP answer (429, 503 with Retry-After), for the client to try again.
"""

from __future__ import annotations

import time
from typing import Final

import orjson
import structlog
from aiohttp import web

from ..chat.attachment import Attachment
from ..chat.response import Feed, FollowerLagged
from ..core.agui_input import AguiInput, parse_run_input
from ..core.agui_stream import AguiEvent, AguiStream
from ..core.chat_request import InvalidRequest
from ..core.limits import Limited
from ..core.refusals import HttpError, refusal
from .admit import Caller, admit_stream, count_refusal, preflight, read_body, route_agent
from .aiohttp_raw import forget_body
from .sse import stream_ended
from .state import GATEWAY

__all__ = ["routes"]

log = structlog.get_logger("adk_gateway.edge.agui")

_TRANSPORT: Final = "ag-ui"
_PROTOCOL: Final = "ag_ui"
_KEEPALIVE: Final = b": keep-alive\n\n"
_HEADERS: Final = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "Connection": "keep-alive",
    "x-accel-buffering": "no",
}


class _Browser:
    """Whether the request's browser is still there (chat/presence.py), read on the transport
    aiohttp drops when the connection is lost: a tool call may be minutes away from a write."""

    __slots__ = ("request",)

    def __init__(self, request: web.Request) -> None:
        self.request = request

    def connected(self) -> bool:
        transport = self.request.transport
        return transport is not None and not transport.is_closing()


def _frames(events: list[AguiEvent]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(event) + b"\n\n" for event in events)


async def post_run(request: web.Request) -> web.StreamResponse:
    caller, slot = await admit_stream(request)
    try:
        run = await _read(request)
        gateway = request.app[GATEWAY]
        agent = gateway.config.agents[caller.agent]
        stream = AguiStream(run.thread_id, run.run_id, now=time.time(),
                            timeout_of=lambda tool: agent.tool_policy(tool).timeout)
        unknown = sorted(set(run.tools) - set(agent.browser_tools))
        if unknown:
            offered = ", ".join(agent.browser_tools) or "none"
            return await _refused(request, stream, (
                f"this agent has no browser tool named {', '.join(unknown)}; the tools it hands to the browser: {offered}"
            ), "unknown_tools")
        try:
            attachment = await gateway.cluster.submit(caller.agent, caller.user_id, run.request, claims=dict(caller.identity.claims))
        except Exception as exc:
            answer = refusal(exc)
            if answer is None:
                raise
            if isinstance(exc, Limited):
                count_refusal(request, exc.code)
            if isinstance(exc, Limited) or answer.status >= 500:
                # Not this run's fault (limits, a store settling or out of reach): the HTTP answer,
                # with its Retry-After, as the chat routes give it, for the client to try again.
                raise answer from None
            return await _refused(request, stream, answer.message, answer.code)
        finally:
            forget_body(request)
        return await _stream(request, attachment, caller, run.thread_id, stream, run.denied_before)
    finally:
        slot.release()


async def _read(request: web.Request) -> AguiInput:
    raw = await read_body(request)
    try:
        run = parse_run_input(raw)
    except InvalidRequest as exc:
        raise HttpError(400, "invalid_request", str(exc)) from None
    structlog.contextvars.bind_contextvars(chat_id=run.thread_id, protocol="ag-ui")
    request.app[GATEWAY].tracing.annotate(agent=route_agent(request), chat_id=run.thread_id)
    return run


async def _open(request: web.Request) -> web.StreamResponse:
    gateway = request.app[GATEWAY]
    request_id = structlog.contextvars.get_contextvars().get("request_id", "")
    response = web.StreamResponse(headers={**_HEADERS, **gateway.auth.cors_headers(request), "X-Request-Id": request_id})
    await response.prepare(request)
    return response


async def _refused(request: web.Request, stream: AguiStream, message: str, code: str) -> web.StreamResponse:
    log.info("agui_run_refused", code=code)
    gateway, agent = request.app[GATEWAY], route_agent(request)
    gateway.metrics.browser_runs.labels(agent, _PROTOCOL, "refused").inc()
    response = await _open(request)
    await response.write_eof(_frames(stream.error(message, code)))
    return response


async def _stream(
    request: web.Request, attachment: Attachment, caller: Caller, chat_id: str, stream: AguiStream, denied: list[str],
) -> web.StreamResponse:
    feed: Feed = attachment.response
    # A chat whose response nobody reads takes the person's next run (chat/service.py).
    feed.watch(_Browser(request))
    gateway = request.app[GATEWAY]
    try:
        response = await _open(request)
    except BaseException:
        feed.close()
        raise
    gauge = gateway.metrics.active_streams.labels(_TRANSPORT)
    gauge.inc()
    completed = False
    try:
        await response.write(_frames(stream.start() + stream.denied_before(denied)))
        async for batch in feed.follow(idle=gateway.config.chat.keepalive_interval, timers=gateway.timers):
            if not batch:
                await response.write(_KEEPALIVE)
                continue
            events: list[AguiEvent] = []
            for frame in batch:
                events += stream.feed(orjson.loads(frame))
            if events:
                await response.write(_frames(events))
        await response.write_eof(_frames(stream.end()))
        completed = True
    except FollowerLagged as exc:
        log.warning("follower_lagged", reason=str(exc))
        await response.write_eof(_frames(stream.error(
            "This response fell too far behind and cannot continue; send the run again.", "lagged")))
        completed = True
    except ConnectionError:
        log.info("client_disconnected")
    except Exception:
        log.exception("stream_failed")
        try:
            await response.write_eof(_frames(stream.error("The gateway failed while streaming this run.", "gateway_error")))
        except ConnectionError:
            pass
    finally:
        gauge.dec()
        outcome = stream.outcome or "disconnected"
        gateway.metrics.browser_runs.labels(caller.agent, _PROTOCOL, outcome).inc()
        await stream_ended(request, caller, chat_id, feed, completed=completed)
    return response


def routes() -> list[web.RouteDef]:
    out = []
    for base in ("", "/agents/{agent}"):
        out += [web.post(base + "/ag-ui", post_run), web.options(base + "/ag-ui", preflight)]
    return out
