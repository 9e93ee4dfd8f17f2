"""The WebSocket transport: `/api/chat/ws`, speaking the frames of ai 7's `WebSocketChatTransport`.

One socket carries many requests, each correlated by `requestId`:
in: `send` (a chat turn, same body as the SSE POST), `resume {id, lastSequence?}`, `abort`, and
`audio` (realtime audio for a live-mode agent, see docs/websocket.md);
out: `start` (a resume found something), `chunk {sequence}` (0, 1, 2... per request, no gaps), `end`,
`error {errorText}`, `no-active`.

Requests attach to the same runs as SSE requests do (chat/service.py), so a run that waits for a person
ends the request with `end`, the answering `send` re-attaches, and `resume` replays the whole
message from the run's log (a `Reader` (chat/response.py) of the whole message), numbered over it. A malformed frame gets an `error` frame naming the problem and the socket stays up;
frames over the size limit close it with 1009. Closing the socket stops the requests' followers
(runs go on, unless aborted) and tells each chat it used (`ChatService.socket_closed`): a live chat's
session closes then, or when the turn under way ends (docs/websocket.md).

What each incoming frame does is ws_frames.py's; this module owns the socket: its requests in
flight, the frames it sends, its life from handshake to close.

`POST /api/chat/ws-ticket` issues the single-use ticket a page without a cookie opens the socket
with (`?ticket=`, access/tickets.py): browsers cannot set headers on a handshake.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

import orjson
import structlog
from aiohttp import WSCloseCode, WSMsgType, web

from ..chat.attachment import Attachment
from ..core.limits import Limited
from ..core.protocol import client_version
from ..chat.response import Feed, FollowerLagged, Reader
from .state import GATEWAY, Gateway
from .admit import Caller, admit, preflight
from .aiohttp_raw import send_text_frames, write_text_frames_now
from .ws_frames import HANDLERS as _HANDLERS
from .ws_frames import FrameError, refused

__all__ = ["routes"]

log = structlog.get_logger("adk_gateway.edge.ws")

_TRANSPORT: Final = "ws"
_PROTOCOL: Final = "ai_sdk"
_MAX_REQUEST_ID = 128


class _Request:
    """One request of a socket as its feed's `Presence` (chat/presence.py): there until the socket
    closes or the request is aborted."""

    __slots__ = ("aborted", "request_id", "ws")

    def __init__(self, ws: web.WebSocketResponse, request_id: str, aborted: set[str]) -> None:
        self.ws, self.request_id, self.aborted = ws, request_id, aborted

    def connected(self) -> bool:
        return not (self.ws.closed or self.request_id in self.aborted)


class Connection:
    """One browser socket: its requests in flight and the frames it sends."""

    def __init__(self, ws: web.WebSocketResponse, gateway: Gateway, caller: Caller) -> None:
        self.ws = ws
        self.gateway = gateway
        self.user_id = caller.user_id
        # The agent this socket's route names: every chat it touches is that agent's.
        self.agent = caller.agent
        self._identity = caller.identity
        # What the tool rules may read of who is chatting (their JWT claims; none otherwise).
        self.claims = dict(caller.identity.claims)
        self.requests: dict[str, asyncio.Task[None]] = {}
        # The chat each `send` request drives, for `abort`; and every chat seen, for closing.
        self.request_chats: dict[str, str] = {}
        # Requests the browser aborted whose task has not ended yet: nothing more is sent for them.
        self.aborted: set[str] = set()
        self.chats: set[str] = set()
        self.default_version = gateway.config.chat.default_protocol
        self._frames_out = gateway.metrics.ws_frames

    # ---- frames out ------------------------------------------------------------------------

    async def send(self, frame: dict[str, Any]) -> None:
        self._frames_out.labels("out", frame["type"]).inc()
        await self.ws.send_frame(orjson.dumps(frame), WSMsgType.TEXT)

    async def error(self, request_id: str, text: str) -> None:
        await self.send({"type": "error", "requestId": request_id, "errorText": text})

    # ---- frames in -------------------------------------------------------------------------

    async def on_text(self, text: str) -> None:
        try:
            frame = orjson.loads(text)
        except orjson.JSONDecodeError:
            self.gateway.metrics.ws_frames.labels("in", "invalid").inc()
            await self.error("", "frame is not valid JSON")
            return
        kind = frame.get("type") if isinstance(frame, dict) else None
        if not isinstance(kind, str):
            kind = None  # a list or an object would not even be a valid dict key below
        request_id = frame.get("requestId") if isinstance(frame, dict) else None
        self.gateway.metrics.ws_frames.labels("in", kind if kind in _HANDLERS else "invalid").inc()
        if not isinstance(request_id, str) or not 0 < len(request_id) <= _MAX_REQUEST_ID:
            await self.error(request_id if isinstance(request_id, str) else "", "requestId: a string of 1-128 characters is required")
            return
        handler = _HANDLERS.get(kind)  # type: ignore[arg-type]
        if handler is None:
            await self.error(request_id, f"type: unknown frame type {kind!r} (expected send, resume, abort or audio)")
            return
        try:
            if kind != "abort":
                self._check_agent()
            if kind in ("send", "audio"):
                await self._admit_new_work()
            elif kind == "resume":
                # A resume is a request (an SSE resume is admitted with its rate), but not new
                # work: a draining replica still replays.
                await self._check_rate()
            await handler(self, request_id, frame)
        except FrameError as exc:
            await self.error(request_id, str(exc))

    def _check_agent(self) -> None:
        """At every request, not the handshake alone: a reload may have removed the socket's agent
        or narrowed who may use it."""
        gateway = self.gateway
        config = gateway.config.agents.get(self.agent)
        if config is None:
            gateway.metrics.limited.labels("agent_not_found").inc()
            raise FrameError(f"the agent {self.agent} is not served here any more")
        if not gateway.auth.may_use(self._identity, config.access):
            gateway.metrics.limited.labels("agent_not_allowed").inc()
            raise FrameError("this credential may not use this agent")

    async def _admit_new_work(self) -> None:
        gateway = self.gateway
        if gateway.draining:
            gateway.metrics.limited.labels("draining").inc()
            raise FrameError("the gateway is shutting down; reconnect to try another instance")
        await self._check_rate()

    async def _check_rate(self) -> None:
        """Spend one of the user's request tokens, the bucket HTTP requests spend too."""
        gateway = self.gateway
        try:
            await gateway.admission.check_rate(self.user_id, gateway.clock())
        except Limited as exc:
            raise refused(self, exc) from None

    async def start_request(self, request_id: str, work: Any) -> None:
        if request_id in self.requests:
            work.close()
            raise FrameError("requestId: a request with this id is already in flight")
        if len(self.requests) >= self.gateway.config.websocket.max_requests:
            work.close()
            raise FrameError("too many requests in flight on this socket")
        try:
            slot = await self.gateway.admission.open_stream(self.user_id)
        except Limited as exc:
            work.close()
            raise refused(self, exc) from None
        task = asyncio.create_task(self._guard(request_id, work))
        task.add_done_callback(lambda _t: slot.release())
        self.requests[request_id] = task
        task.add_done_callback(lambda _t: self._forget(request_id))

    def _forget(self, request_id: str) -> None:
        self.requests.pop(request_id, None)
        self.request_chats.pop(request_id, None)
        self.aborted.discard(request_id)

    async def _guard(self, request_id: str, work: Any) -> None:
        try:
            await work
        except FrameError as exc:
            await self._try(self.error(request_id, str(exc)))
        except (ConnectionError, asyncio.CancelledError):
            raise
        except Exception:
            log.exception("ws_request_crashed", ws_request_id=request_id)
            await self._try(self.error(request_id, "the gateway failed to handle this request"))

    @staticmethod
    async def _try(send: Any) -> None:
        try:
            await send
        except ConnectionError:
            pass

    def stop(self) -> None:
        """Stop following: the requests end, their runs go on."""
        for task in list(self.requests.values()):
            task.cancel()

    async def close(self) -> None:
        self.stop()
        await asyncio.gather(*self.requests.values(), return_exceptions=True)

    # ---- requests --------------------------------------------------------------------------

    def watch(self, request_id: str, feed: Feed) -> None:
        """Tell the chat how to see that this request no longer reads `feed`: the socket closed or
        the request was aborted (a chat whose response nobody reads takes the next message, chat/service.py).
        Set as soon as the request has its feed, so a request that never gets to follow it counts
        as gone with its socket."""
        feed.watch(_Request(self.ws, request_id, self.aborted))

    async def pump(self, request_id: str, attachment: Attachment, *, first_sequence: int = 0) -> None:
        """Send a response's chunks as `chunk` frames from `first_sequence`, then `end`."""
        gauge = self.gateway.metrics.active_streams.labels(_TRANSPORT)
        gauge.inc()
        chunk_frames = self._frames_out.labels("out", "chunk")
        prefix = b'{"type":"chunk","requestId":' + orjson.dumps(request_id) + b',"sequence":'
        sequence = first_sequence
        ws = self.ws
        aborted = self.aborted

        def payloads(batch: list[bytes]) -> list[bytes]:
            # Bytes straight into text frames: send_str would decode them only to encode again.
            return [b'%b%d,"chunk":%b}' % (prefix, sequence + i, encoded) for i, encoded in enumerate(batch)]

        def write_now(batch: list[bytes]) -> bool:
            """The publishing task writes the frames itself while this request waits (see
            `Response.follow_direct`); False, nothing sent, when the socket has a backlog or the
            request was aborted (the run's task may publish its last chunks before this request's
            task has seen its cancellation)."""
            nonlocal sequence
            if request_id in aborted or not write_text_frames_now(ws, payloads(batch)):
                return False
            sequence += len(batch)
            chunk_frames.inc(len(batch))
            return True

        feed = attachment.response
        self.watch(request_id, feed)
        batches = feed.follow_direct(write_now, first_sequence) if isinstance(feed, Reader) else feed.follow(first_sequence)
        outcome = "disconnected"
        try:
            async for batch in batches:
                frames = payloads(batch)
                sequence += len(batch)
                if len(frames) == 1 or not await send_text_frames(ws, frames):
                    for payload in frames:
                        await self.ws.send_frame(payload, WSMsgType.TEXT)
                chunk_frames.inc(len(batch))
            await self.send({"type": "end", "requestId": request_id})
            outcome = "completed"
        except FollowerLagged as exc:
            log.warning("follower_lagged", reason=str(exc))
            outcome = "failed"
            await self.error(request_id, "This response fell too far behind and cannot continue; reload the chat.")
        finally:
            feed.close()
            gauge.dec()
            self.gateway.metrics.browser_runs.labels(self.agent, _PROTOCOL, outcome).inc()


async def chat_socket(request: web.Request) -> web.WebSocketResponse:
    gateway = request.app[GATEWAY]
    caller = await admit(request, socket=True)
    settings = gateway.config.websocket
    ws = web.WebSocketResponse(
        heartbeat=settings.heartbeat, max_msg_size=settings.max_frame_bytes, compress=settings.compress,
        # The browser's close is answered below, once its chats were told (see there).
        autoclose=False,
    )
    await ws.prepare(request)
    conn = Connection(ws, gateway, caller)
    # Browsers cannot set headers on the handshake, and the stock transports send no version:
    # an app may say `?aiSdkVersion=7` in the URL (or per frame, in headers/body).
    conn.default_version = client_version(request.query.get("aiSdkVersion"), None, gateway.config.chat.default_protocol)
    gateway.metrics.ws_connections.inc()
    gateway.sockets.add(ws)
    log.info("ws_connected")
    try:
        while not ws.closed:
            idle = None if conn.requests else settings.idle_timeout
            try:
                # Not receive(timeout=...): heartbeat pongs restart that timer, so it never fires.
                msg = await asyncio.wait_for(ws.receive(), idle)
            except TimeoutError:
                await ws.close(code=WSCloseCode.GOING_AWAY, message=b"idle timeout")
                break
            if msg.type is WSMsgType.TEXT:
                await conn.on_text(msg.data)
            elif msg.type is WSMsgType.BINARY:
                gateway.metrics.ws_frames.labels("in", "invalid").inc()
                await conn.error("", "binary frames are not supported: send JSON text frames")
            elif msg.type is WSMsgType.ERROR:
                log.info("ws_error", reason=str(ws.exception()))
                break
            else:  # CLOSE, CLOSING, CLOSED
                break
    finally:
        try:
            conn.stop()
            for chat_id in conn.chats:
                await gateway.cluster.socket_closed(caller.agent, caller.user_id, chat_id)
        finally:
            # Answered only now: a client that reconnects and resumes as soon as its close is
            # answered reaches each chat (on any replica) after this socket's close did, so a
            # live session kept for the turn it resumes is not closed under it at the turn's end.
            # Not after the followers have ended: one reading a relay from another replica may
            # take a while to see its cancellation.
            await ws.close()
            await conn.close()
        gateway.metrics.ws_connections.dec()
        gateway.sockets.discard(ws)
        log.info("ws_disconnected", close_code=ws.close_code)
    return ws


async def issue_ticket(request: web.Request) -> web.Response:
    """A single-use ticket for one socket on this route's agent (access/tickets.py), for a page that holds
    its credential in script: it asks with the credential in a header, then opens the socket with
    `?ticket=`, so no long-lived token is in the socket's URL."""
    gateway = request.app[GATEWAY]
    # Not new work: a draining replica still issues (the socket may reach another replica).
    caller = await admit(request, new_work=False)
    ticket = await gateway.tickets.issue(
        caller.identity, agent=caller.agent, origin=request.headers.get("Origin"),
        fingerprint=gateway.auth.fingerprint, ttl=gateway.config.auth.ws_ticket_ttl,
    )
    gateway.metrics.ws_tickets.labels("issued").inc()
    return web.json_response(
        {"ticket": ticket.value, "expires_in": ticket.expires_in},
        headers={"Cache-Control": "no-store"},
    )


def routes() -> list[web.RouteDef]:
    # `/api/chat/ws` is the default agent's; each agent also has its own base path.
    out = []
    for base in ("", "/agents/{agent}"):
        out += [
            web.get(base + "/api/chat/ws", chat_socket),
            web.post(base + "/api/chat/ws-ticket", issue_ticket),
            web.options(base + "/api/chat/ws-ticket", preflight),
        ]
    return out
