"""A fake ADK API server that misbehaves on demand, for tests of the gateway's upstream failure handling.

It speaks just enough of ADK's API server for the gateway:

    GET  /list-apps                                  ["demo_agent"] (the gateway's readiness probe)
    GET  /apps/{app}/users/{uid}/sessions            the user's sessions
    GET  /apps/{app}/users/{uid}/sessions/{sid}      the session, or 404
    POST /apps/{app}/users/{uid}/sessions            create ({"sessionId": ...} optional); 409 if it exists
    POST /run_sse                                    a run: 404 if the session does not exist (as ADK does)

Choosing a behaviour
--------------------
Runs are chosen by the user's message: a text part containing ``fault:<name>`` or
``fault:<name>:<arg>`` runs that behaviour (``"fault:reset:3"``, ``"please fault:http:503"``); a run
without one takes the next entry of the run queue, or ``normal`` when the queue is empty. Session
calls (lookup and create) take the next entry of their queue, or answer normally. Queues are filled
by the test and each entry is used once:

- in Python: ``upstream.queue(session_get=[500], session_create=["refuse"], run=["hang:5"])``
- over HTTP, for a server in another thread or process: ``POST /_faults`` with the same keys as
  JSON (``{"session_get": [500], "run": ["reset:2"]}``); ``GET /_faults`` answers the counters
  (``{"injected": {"reset": 1, ...}, "runs": 12}``); ``DELETE /_faults`` empties the queues.

Run behaviours (``name[:arg]``):

=========================  ===================================================================
``normal``                 the events of tests/fixtures/adk/hello_there.jsonl, then the stream ends
``refuse``                 closes the connection at once, before any byte of a response
``slow_headers:S``         waits S seconds (default 2) before answering at all, then ``normal``
``slow_first_event:S``     sends the 200 headers at once, waits S seconds (default 2), then ``normal``
``reset:K``                sends K events (default 2), then aborts the TCP connection mid-body
``garbage``                sends 1 event, then ``data: <not JSON>``, then ends the stream
``http:STATUS``            answers STATUS (default 500) with a short text body
``error_event``            sends 1 event, then ADK's failed-run event ``{"error": ..., "error_details": ...}``
``hang:S``                 sends 1 event, then nothing for S seconds (default 30) or until the client leaves
``missing_session``        answers 404 (ADK lost the session) on the first run per session and text, then ``normal``
``missing_session_always`` answers 404 every time
=========================  ===================================================================

Session queue entries: an HTTP status (``500``: that status with a text body), ``"refuse"``
(close the connection at once) or ``"ok"`` (answer normally).

Two ways to run it:

- in an async test, in-process: ``server = await aiohttp_server(FaultUpstream().app())``
  (pytest-aiohttp), then point a gateway subprocess at ``str(server.make_url("")).rstrip("/")``;
- from synchronous code (hypothesis, module-scoped fixtures): ``with upstream.running() as url:``
  serves it on its own event loop in a background thread.

``injected`` counts every misbehaviour served, by name (``"session_get:500"`` for session calls).
"""

from __future__ import annotations

import asyncio
import collections
import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from aiohttp import web

__all__ = ["FaultUpstream", "RUN_FAULTS", "directive"]

HELLO_EVENTS = Path(__file__).resolve().parents[1] / "fixtures" / "adk" / "hello_there.jsonl"

RUN_FAULTS = (
    "normal", "refuse", "slow_headers", "slow_first_event", "reset", "garbage", "http", "error_event",
    "hang", "missing_session", "missing_session_always",
)

_DIRECTIVE = re.compile(r"fault:([a-z_]+)(?::([0-9]+(?:\.[0-9]+)?))?")

RUN_ERROR_TEXT = "Injected failure: the model backend fell over."
GARBAGE_LINE = b"data: {this is not JSON at all\n\n"


def directive(name: str, arg: float | int | None = None) -> str:
    """The message text that selects a run behaviour: directive("reset", 3) == "fault:reset:3"."""
    return f"fault:{name}" if arg is None else f"fault:{name}:{arg}"


def _parse(entry: str) -> tuple[str, float | None]:
    match = _DIRECTIVE.fullmatch("fault:" + entry) if not entry.startswith("fault:") else _DIRECTIVE.fullmatch(entry)
    if match is None or match.group(1) not in RUN_FAULTS:
        raise ValueError(f"unknown run behaviour {entry!r} (one of {', '.join(RUN_FAULTS)})")
    return match.group(1), float(match.group(2)) if match.group(2) else None


def _sse(event: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


class FaultUpstream:
    def __init__(self, app_name: str = "demo_agent") -> None:
        self.app_name = app_name
        self.events = [json.loads(line) for line in HELLO_EVENTS.read_text().splitlines() if line.strip()]
        self.sessions: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
        self._queues: dict[str, collections.deque[Any]] = {
            "run": collections.deque(), "session_get": collections.deque(), "session_create": collections.deque(),
        }
        self._fired: set[tuple[str, str, str]] = set()
        self._lock = threading.Lock()
        self.injected: collections.Counter[str] = collections.Counter()
        self.runs = 0
        # Every /run_sse body received, in order (for assertions about retries).
        self.run_bodies: list[dict[str, Any]] = []

    # ---- the test's controls ---------------------------------------------------------------

    def queue(self, *, run: list[str] = (), session_get: list[Any] = (), session_create: list[Any] = ()) -> None:  # type: ignore[assignment]
        """Behaviours for the next calls, each used once (see the module docstring)."""
        for entry in run:
            _parse(entry)
        with self._lock:
            self._queues["run"].extend(run)
            self._queues["session_get"].extend(session_get)
            self._queues["session_create"].extend(session_create)

    def clear(self) -> None:
        with self._lock:
            for q in self._queues.values():
                q.clear()

    def _next(self, kind: str) -> Any:
        with self._lock:
            q = self._queues[kind]
            return q.popleft() if q else None

    # ---- the application ------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application()
        base = "/apps/{app}/users/{uid}/sessions"
        app.add_routes([
            web.get("/list-apps", self._list_apps),
            web.get(base, self._list_sessions),
            web.post(base, self._create_session),
            web.get(base + "/{sid}", self._get_session),
            web.post("/run_sse", self._run_sse),
            web.get("/_faults", self._faults_get),
            web.post("/_faults", self._faults_post),
            web.delete("/_faults", self._faults_delete),
        ])
        return app

    @contextmanager
    def running(self, port: int = 0, host: str = "127.0.0.1") -> Iterator[str]:
        """Serve on a background thread's event loop; yields the base URL."""
        loop = asyncio.new_event_loop()
        started = threading.Event()
        box: dict[str, Any] = {}

        async def start() -> None:
            runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=1.0)
            await runner.setup()
            site = web.TCPSite(runner, host, port)
            await site.start()
            box["runner"] = runner
            box["port"] = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

        def main() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(start())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                box["error"] = exc
                started.set()
                return
            started.set()
            loop.run_forever()

        thread = threading.Thread(target=main, name="fault-upstream", daemon=True)
        thread.start()
        started.wait(10)
        if "error" in box:
            raise box["error"]
        try:
            yield f"http://{host}:{box['port']}"
        finally:

            async def stop() -> None:
                await box["runner"].cleanup()
                # Handlers still sleeping (hang, slow_*) end here rather than being destroyed pending.
                rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                for task in rest:
                    task.cancel()
                await asyncio.gather(*rest, return_exceptions=True)

            asyncio.run_coroutine_threadsafe(stop(), loop).result(15)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.close()

    # ---- control endpoint -----------------------------------------------------------------

    async def _faults_get(self, request: web.Request) -> web.Response:
        return web.json_response({"injected": dict(self.injected), "runs": self.runs})

    async def _faults_post(self, request: web.Request) -> web.Response:
        body = await request.json()
        try:
            self.queue(**{k: list(v) for k, v in body.items()})
        except (TypeError, ValueError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response({"ok": True})

    async def _faults_delete(self, request: web.Request) -> web.Response:
        self.clear()
        return web.json_response({"ok": True})

    # ---- sessions ---------------------------------------------------------------------------

    async def _list_apps(self, request: web.Request) -> web.Response:
        return web.json_response([self.app_name])

    def _store(self, request: web.Request) -> dict[str, dict[str, Any]]:
        return self.sessions.setdefault((request.match_info["app"], request.match_info["uid"]), {})

    async def _session_fault(self, kind: str, request: web.Request) -> web.StreamResponse | None:
        entry = self._next(kind)
        if entry is None or entry == "ok":
            return None
        self.injected[f"{kind}:{entry}"] += 1
        if entry == "refuse":
            return self._refuse(request)
        return web.Response(status=int(entry), text=f"injected {kind} failure")

    async def _list_sessions(self, request: web.Request) -> web.Response:
        return web.json_response(list(self._store(request).values()))

    async def _get_session(self, request: web.Request) -> web.StreamResponse:
        fault = await self._session_fault("session_get", request)
        if fault is not None:
            return fault
        session = self._store(request).get(request.match_info["sid"])
        if session is None:
            return web.json_response({"detail": "Session not found"}, status=404)
        return web.json_response(session)

    async def _create_session(self, request: web.Request) -> web.StreamResponse:
        fault = await self._session_fault("session_create", request)
        if fault is not None:
            return fault
        body = await request.json() if request.can_read_body else {}
        sid = (body or {}).get("sessionId") or str(uuid.uuid4())
        store = self._store(request)
        if sid in store:
            return web.json_response({"detail": f"Session already exists: {sid}"}, status=409)
        store[sid] = {
            "id": sid, "appName": request.match_info["app"], "userId": request.match_info["uid"],
            "state": {}, "events": [], "lastUpdateTime": time.time(),
        }
        return web.json_response(store[sid])

    # ---- runs -------------------------------------------------------------------------------

    async def _run_sse(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.runs += 1
        self.run_bodies.append(body)
        text = " ".join(
            str(p.get("text", "")) for p in (body.get("newMessage") or {}).get("parts", []) if isinstance(p, dict)
        )
        match = _DIRECTIVE.search(text)
        if match and match.group(1) in RUN_FAULTS:
            name, arg = match.group(1), float(match.group(2)) if match.group(2) else None
        else:
            queued = self._next("run")
            name, arg = _parse(queued) if queued else ("normal", None)
        uid, sid = str(body.get("userId")), str(body.get("sessionId"))
        session_known = sid in self.sessions.get((str(body.get("appName")), uid), {})

        if name == "missing_session_always" or (
            name == "missing_session" and (uid, sid, text) not in self._fired
        ):
            self._fired.add((uid, sid, text))
            self.injected[name] += 1
            # ADK forgot the session (it restarted): the gateway must create it again.
            self.sessions.get((str(body.get("appName")), uid), {}).pop(sid, None)
            return web.json_response({"detail": "Session not found"}, status=404)
        if not session_known:
            return web.json_response({"detail": "Session not found"}, status=404)
        if name != "normal" and name != "missing_session":
            self.injected[name] += 1

        if name == "refuse":
            return self._refuse(request)
        if name == "http":
            status = int(arg or 500)
            return web.Response(status=status, text=f"injected HTTP {status}: the agent service is overloaded")
        if name == "slow_headers":
            await asyncio.sleep(arg if arg is not None else 2.0)

        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        try:
            return await self._stream(request, resp, name, arg)
        except ConnectionError:
            return resp  # the gateway hung up (its idle timeout, or the browser left): nothing to do

    async def _stream(self, request: web.Request, resp: web.StreamResponse, name: str, arg: float | None) -> web.StreamResponse:
        await resp.prepare(request)
        if name == "slow_first_event":
            await asyncio.sleep(arg if arg is not None else 2.0)
        if name in ("normal", "missing_session", "slow_headers", "slow_first_event"):
            for event in self.events:
                await resp.write(_sse(event))
            await resp.write_eof()
            return resp
        if name == "reset":
            for event in self.events[: int(arg if arg is not None else 2)]:
                await resp.write(_sse(event))
            await asyncio.sleep(0.05)  # let the events leave before the connection is torn down
            return self._abort(request, resp)
        await resp.write(_sse(self.events[0]))
        if name == "garbage":
            await resp.write(GARBAGE_LINE)
        elif name == "error_event":
            await resp.write(_sse({"error": RUN_ERROR_TEXT, "error_details": {"type": "InjectedFailure"}}))
        elif name == "hang":
            deadline = time.monotonic() + (arg if arg is not None else 30.0)
            while time.monotonic() < deadline and request.transport is not None and not request.transport.is_closing():
                await asyncio.sleep(0.05)
            if request.transport is None or request.transport.is_closing():
                return resp
        await resp.write_eof()
        return resp

    @staticmethod
    def _refuse(request: web.Request) -> web.StreamResponse:
        return FaultUpstream._abort(request, web.Response(status=500))

    @staticmethod
    def _abort(request: web.Request, resp: web.StreamResponse) -> web.StreamResponse:
        transport = request.transport
        if transport is not None:
            transport.abort()
        return resp  # aiohttp's attempt to finish it meets a closed transport and gives up
