"""The client side of the gateway: talking to an ADK API server over HTTP.

One long-lived aiohttp `ClientSession` per gateway (it pools connections). Requests carry only
what ADK needs: the browser's Host, Origin, Cookie and Authorization never travel upstream (ADK on
loopback rejects a foreign Host or Origin with 403, and credentials are not the agent's business).
Streams have a connect timeout and an idle-read timeout but no total timeout, because a run may
stream for as long as it likes while it keeps talking.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any, Final
from urllib.parse import quote

import aiohttp
import orjson

from ..config.agent import UpstreamConfig
from ..core.refusals import HttpError, Refusal
from ..core.eventstream import EventStreamDecoder, EventStreamError
from ..core.adk_events import REFUSED, AdkEvent, decode_struct
from .idle_reader import IdleReader, WaitSignal
# Re-exported: what a session's history says of its confirmations is read from here too.
from .session_history import (  # noqa: F401 - the two private readers: tests read them here
    AskedCall, SessionConfirmations, _asked_calls, _confirmation_ids, session_confirmations,
)
from ..core.live_frames import InvalidLiveFrame, encode_live_frame
from ..ops.coarse_timers import CoarseTimers
from ..ops.tracing import Tracing

__all__ = ["AdkClient", "AskedCall", "LiveConnection", "SessionConfirmations", "UpstreamError", "WaitSignal", "parse_live_event"]

_JSON_HEADERS: Final = {"Content-Type": "application/json", "Accept": "application/json"}
_SSE_HEADERS: Final = {"Content-Type": "application/json", "Accept": "text/event-stream"}
# The spans' route templates: no user or session id in a span's name.
_SESSIONS: Final = "/apps/{app_name}/users/{user_id}/sessions"
# Seconds an idle pooled connection is kept: under the 5 s after which uvicorn, which serves ADK's
# API, closes one (its `timeout_keep_alive`), so a request never goes out on a closing connection.
_KEEPALIVE: Final = 4.0


class UpstreamError(Refusal):
    """The ADK server could not be used. `kind` labels the metric and the log line; `status` is
    the upstream's HTTP status, if it answered one (the browser gets 502 either way)."""

    code = "upstream_unavailable"

    def __init__(self, kind: str, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status  # type: ignore[assignment]

    def http(self) -> HttpError:
        return HttpError(502, self.code, str(self))


class AdkClient:
    """Calls to one ADK API server. `start()` and `close()` bracket its life inside the event loop."""

    def __init__(self, config: UpstreamConfig, tracing: Tracing | None = None, timers: CoarseTimers | None = None) -> None:
        self._session: aiohttp.ClientSession | None = None
        # Where a held stream's idle timer goes: one loop timer for many (None: the loop's own).
        self._timers = timers
        # A CLIENT span per call (not the health probe), its `traceparent` sent so ADK's spans join.
        self._tracing = tracing or Tracing.off()
        self._max_connections = config.max_connections
        self._base = str(config.url).rstrip("/")
        self._app = config.app_name
        # No sock_read here: the idle limit is applied per read in run_sse, because a run that
        # waits for a person is silent for as long as the person takes, and that is not idleness.
        self._stream_timeout = aiohttp.ClientTimeout(total=None, sock_connect=config.connect_timeout)
        self._connect_timeout = config.connect_timeout
        self._idle_timeout = config.idle_timeout
        self._call_timeout = aiohttp.ClientTimeout(
            total=config.connect_timeout + 30, sock_connect=config.connect_timeout
        )
        # Whether a run may go out before its session is created: the server creates it (ADK's
        # `--auto_create_session`). From the config; turned off for this client's life by a 404 to
        # a run whose session was not created first (chat/agent_runs.py): a server without the flag
        # costs one wasted round trip, once, not one per chat.
        self.auto_creates_sessions = config.auto_create_session

    async def start(self) -> None:
        self.open()

    def open(self) -> None:
        """`start` for code that cannot await (a reload adding an agent); inside the event loop."""
        # Not aiohttp's default keep-alive (15 s): it reused connections uvicorn was closing, and
        # under a burst of approvals (connections idle while people answer) runs failed with
        # ClientOSError before reaching ADK.
        connector = aiohttp.TCPConnector(
            limit=self._max_connections, limit_per_host=self._max_connections, keepalive_timeout=_KEEPALIVE,
        )
        # No cookie jar: nothing from one browser's run may ride along on another's.
        self._session = aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar())

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("AdkClient.start() was not awaited")
        return self._session

    @property
    def app_name(self) -> str:
        return self._app

    def _session_url(self, user_id: str, session_id: str | None = None) -> str:
        # User ids come from auth (e.g. a JWT `sub`), so they are quoted into the path.
        url = f"{self._base}/apps/{self._app}/users/{quote(user_id, safe='')}/sessions"
        return f"{url}/{quote(session_id, safe='')}" if session_id else url

    def _traced_url(self, user_id: str, session_id: str | None = None) -> str:
        """A session URL as its span's `url.full` says it: the user id as the logs write it."""
        if not self._tracing.enabled:
            return ""
        return self._session_url(self._tracing.user_shown(user_id), session_id)

    async def ensure_session(self, user_id: str, session_id: str) -> None:
        """Make sure the ADK session exists: create it, and take 409 (it exists) as done.

        One round trip, not a lookup first: every supported ADK answers a create of an existing
        id 409 (tests/fixtures/adk*/sessions.json), and a lookup would download the session's
        whole history just to learn that it exists (a chat that moved replicas, or a restart).
        """
        url = self._session_url(user_id)
        with self._tracing.client("POST", _SESSIONS, self._traced_url(user_id), _JSON_HEADERS, app=self._app) as call:
            await self._create_session(url, session_id, call.headers or _JSON_HEADERS, call.answered)

    async def _create_session(self, url: str, session_id: str, headers: Mapping[str, str], answered: Any) -> None:
        try:
            body = orjson.dumps({"sessionId": session_id})
            async with self._http.post(url, data=body, headers=headers, timeout=self._call_timeout) as resp:
                answered(resp.status)
                if resp.status not in (200, 409):
                    raise UpstreamError("http", f"session create answered HTTP {resp.status}", resp.status)
        except aiohttp.ClientError as exc:
            raise _client_error(exc) from None
        except TimeoutError:
            raise UpstreamError("timeout", "the agent service did not answer in time") from None

    async def session(self, user_id: str, session_id: str) -> Any:
        """The session as ADK's GET answers it (its whole history), or None if it does not exist."""
        url = self._session_url(user_id, session_id)
        with self._tracing.client("GET", _SESSIONS + "/{session_id}", self._traced_url(user_id, session_id), app=self._app) as call:
            return await self._read_session(url, call.headers, call.answered)

    async def _read_session(self, url: str, headers: Mapping[str, str] | None, answered: Any) -> Any:
        try:
            async with self._http.get(url, headers=headers, timeout=self._call_timeout) as resp:
                answered(resp.status)
                if resp.status == 404:
                    return None
                if resp.status != 200:
                    raise UpstreamError("http", f"session lookup answered HTTP {resp.status}", resp.status)
                return orjson.loads(await resp.read())
        except aiohttp.ClientError as exc:
            raise _client_error(exc) from None
        except TimeoutError:
            raise UpstreamError("timeout", "the agent service did not answer in time") from None
        except orjson.JSONDecodeError:
            raise UpstreamError("protocol", "the agent service's session is not JSON") from None

    async def confirmations(self, user_id: str, session_id: str) -> SessionConfirmations:
        """The native confirmations the session asked and those it holds an answer to (a download
        of the session's history)."""
        return session_confirmations(await self.session(user_id, session_id))

    def run_sse_batches(
        self, *, user_id: str, session_id: str, new_message: dict[str, Any],
        wait: WaitSignal | None = None, state_delta: Mapping[str, Any] | None = None,
    ) -> AsyncIterator[Iterator[AdkEvent | dict[str, Any]]]:
        """Start a run and yield its events until the upstream closes the stream, one batch per
        upstream read: the events that read completed (at least one), as `AdkEvent`s (a dict for
        what msgspec refused and orjson read: core/adk_events.py).
        `state_delta`: session state ADK stores with the new message's event (RunAgentRequest's).

        The stream may be silent for `upstream.idle_timeout` at most, not counting the time `wait`
        says the run waits for a person (the approval's own deadline bounds that wait).

        The hot path: whatever is done per event downstream (publishing, waking followers,
        writing) is then done once per read, and a busy stream's reads carry several events.
        A batch parses each event as it is iterated, so only one parsed event is alive at a time
        (parsing a whole read first left hundreds of fresh containers for the garbage collector
        to walk, which cost more than batching saved); iterate it before asking for the next one.
        A bad event raises UpstreamError from the iteration, after the events before it.
        """
        # Encoded here, and the one generator returned: a generator around it would keep a frame
        # (and its locals) for as long as the run is held open (bench.memprofile).
        body = orjson.dumps({
            "appName": self._app,
            "userId": user_id,
            "sessionId": session_id,
            "newMessage": new_message,
            "streaming": True,
            **({"stateDelta": state_delta} if state_delta else {}),
        })
        return self._run_sse(body, wait)

    async def _run_sse(self, body: bytes, wait: WaitSignal | None) -> AsyncIterator[Iterator[AdkEvent | dict[str, Any]]]:
        url = f"{self._base}/run_sse"
        # The span lasts the whole stream, a person's wait included.
        with self._tracing.client("POST", "/run_sse", url, _SSE_HEADERS, app=self._app) as call:
            try:
                async with asyncio.timeout(self._idle_timeout):
                    resp = await self._http.post(url, data=body, headers=call.headers or _SSE_HEADERS, timeout=self._stream_timeout)
                    # Else the frame keeps the body as long as the stream runs: orjson's 4 KiB
                    # buffer on every held stream (bench.memprofile).
                    del body
                call.answered(resp.status)
                async with resp:
                    if resp.status == 404:
                        raise UpstreamError("session_missing", "the agent service does not know this session", 404)
                    if resp.status != 200:
                        detail = (await resp.content.read(300)).decode("utf-8", "replace").strip()
                        raise UpstreamError("http", f"the agent service answered HTTP {resp.status}: {detail}", resp.status)
                    decoder = EventStreamDecoder()
                    reader = IdleReader(resp.content, self._idle_timeout, wait, timers=self._timers)
                    try:
                        while data := await reader.read():
                            raws = decoder.feed(data)
                            del data
                            if raws:
                                yield _parsed(raws)
                            del raws  # a run waiting for a person does not keep its last events
                    finally:
                        reader.close()
            except aiohttp.ClientError as exc:
                raise _client_error(exc) from None
            except EventStreamError as exc:
                raise UpstreamError("protocol", str(exc)) from None
            except TimeoutError:
                raise UpstreamError("timeout", "the agent service stopped sending events (idle timeout)") from None

    async def open_live(self, *, user_id: str, session_id: str, modalities: list[str]) -> LiveConnection:
        """Open ADK's `/run_live` socket for a session (it must exist: see ensure_session)."""
        params = [("app_name", self._app), ("user_id", user_id), ("session_id", session_id)]
        params += [("modalities", m) for m in modalities]
        url = self._base.replace("http", "ws", 1) + "/run_live"
        # The connect's span: the socket lives for the chat, across turns.
        with self._tracing.client("GET", "/run_live", url, app=self._app) as call:
            return await self._connect_live(url, params, call.headers, call.answered)

    async def _connect_live(self, url: str, params: Any, headers: Mapping[str, str] | None, answered: Any) -> LiveConnection:
        try:
            async with asyncio.timeout(self._connect_timeout):
                ws = await self._http.ws_connect(
                    url, params=params, timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=5),
                    heartbeat=None, max_msg_size=64 * 1024 * 1024, headers=headers,
                )
            answered(101)
        except aiohttp.WSServerHandshakeError as exc:
            raise UpstreamError("http", f"the agent service refused the live session: HTTP {exc.status}", exc.status) from None
        except aiohttp.ClientError as exc:
            raise _client_error(exc) from None
        except TimeoutError:
            raise UpstreamError("timeout", "the agent service did not open the live session in time") from None
        return LiveConnection(ws)

    async def ping(self) -> bool:
        """True when the ADK server answers its app listing and this client's app is in it (a
        server that serves other apps would fail every chat of this one)."""
        try:
            async with self._http.get(f"{self._base}/list-apps", timeout=self._call_timeout) as resp:
                if resp.status != 200:
                    return False
                apps = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return False
        # A listing that is not ADK's list of names says nothing about the app: the server answered.
        return self._app in apps if isinstance(apps, list) and all(isinstance(a, str) for a in apps) else True


def _parsed(raws: list[bytes]) -> Iterator[AdkEvent | dict[str, Any]]:
    decode = decode_struct
    for raw in raws:
        try:
            event = decode(raw)
        except REFUSED:
            event = _refused(raw)
        yield event


def _refused(raw: bytes) -> dict[str, Any]:
    """What msgspec refused, read as before: orjson says what it is."""
    try:
        event = orjson.loads(raw)
    except orjson.JSONDecodeError:
        event = _unescaped_run_error(raw)
        if event is None:
            raise UpstreamError("protocol", "the agent service sent an event that is not JSON") from None
    if type(event) is not dict:
        raise UpstreamError("protocol", "the agent service sent an event that is not an object")
    return event


_RUN_ERROR_PREFIX: Final = b'{"error": "'


def _unescaped_run_error(raw: bytes) -> dict[str, Any] | None:
    """ADK 1.22 (not 1.39.1 or 2.x) writes a failed run as ``data: {"error": "<str(exc)>"}`` without escaping
    the text (docs/protocol.md, "Differences between ADK versions"): a message holding a quote,
    a backslash or a newline is not JSON, and a newline even cuts the ``data:`` line, so the
    payload is the message's first line. It is still the run's error: keep what arrived."""
    if not raw.startswith(_RUN_ERROR_PREFIX):
        return None
    text = raw[len(_RUN_ERROR_PREFIX):].decode("utf-8", "replace").removesuffix('"}')
    return {"error": text.strip() or "the agent run failed"}


def _client_error(exc: aiohttp.ClientError) -> UpstreamError:
    if isinstance(exc, aiohttp.ServerTimeoutError):
        return UpstreamError("timeout", "the agent service stopped sending events (idle timeout)")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return UpstreamError("connect", "the agent service is unreachable")
    if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError)):
        return UpstreamError("reset", "the agent service closed the connection mid-stream")
    return UpstreamError("http", f"upstream request failed: {type(exc).__name__}")


class LiveConnection:
    """One ADK `/run_live` socket.

    ADK stops reading a live socket for good after one frame it cannot validate, and says nothing.
    So every frame is checked before it is sent (core/live_frames.py, the gateway's own model of what
    ADK's `LiveRequest` accepts), and a frame that would fail is refused here instead.
    """

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws

    @property
    def closed(self) -> bool:
        return self._ws.closed

    async def send(self, request: dict[str, Any]) -> None:
        try:
            text = encode_live_frame(request)
        except InvalidLiveFrame as exc:
            raise UpstreamError("protocol", f"refusing to send an invalid live frame: {exc}") from None
        try:
            await self._ws.send_str(text)
        except (ConnectionError, aiohttp.ClientError):
            raise UpstreamError("reset", "the live session with the agent service is closed") from None

    async def messages(self) -> AsyncIterator[str]:
        """The events' JSON text, unparsed, until the socket closes (see parse_live_event)."""
        async for msg in self._ws:
            if msg.type is aiohttp.WSMsgType.TEXT:
                yield msg.data

    @property
    def close_reason(self) -> str:
        code = self._ws.close_code
        return f"closed by the agent service (code {code})" if code else "closed"

    async def close(self) -> None:
        """Ask ADK to end the session, then close the socket ourselves (ADK will not)."""
        if not self._ws.closed:
            try:
                await self._ws.send_str('{"close": true}')
            except (ConnectionError, aiohttp.ClientError):
                pass
            await self._ws.close()


def parse_live_event(data: str | bytes) -> dict[str, Any] | None:
    """A live event from its JSON text; None for JSON that is not an object (ignored)."""
    try:
        event = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise UpstreamError("protocol", "the agent service sent a live event that is not JSON") from None
    return event if type(event) is dict else None
