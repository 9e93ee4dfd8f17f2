"""A fast fake ADK API server for benchmarks only: replays recorded ADK events at full speed.

The real ADK server spends about 200 us of CPU per streamed event, so it cannot be the load for a
gateway that costs a fraction of that. This one answers what the gateway calls:

- `GET /list-apps`; `GET/POST /apps/{app}/users/{uid}/sessions[/{sid}]` (in-memory sessions);
- `POST /run_sse`: on any session id, as ADK's `--auto_create_session` server answers a run on a
  session it does not hold (it creates it; here nothing is kept, so bare proxies and the direct
  route need no sessions); with `--stock-sessions`, a 404 `Session not found` for a session not
  created through the sessions API first, as a server without the flag answers;
  the events of the `StreamSpec` found in `newMessage`'s text, as ADK frames them
  (`data: <json>\\n\\n`), pre-encoded, written `batch` events per write (`burst`, and `tools` for
  the tool-heavy stream); `gate_before` / `gate_after` stream the two halves of a `gate` run as two
  runs that end (what a bare proxy carries for an approval's two requests);
- `GET /run_live` (WebSocket): for each `{"content": ...}` frame, that turn's events as text
  frames ending with `turnComplete` (a `gate` turn, the held engine's, waits for its release as
  `/run_sse`'s does); `{"close": true}` closes;
- `POST /bench/release?call=<id>`: lets a `gate` run go on (its tool was "released").

Run: `python -m bench.fake_upstream --port 8000`. Paced events carry their send time (see
bench/events.py), so clients measure latency without a shared clock besides CLOCK_MONOTONIC.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import orjson
from aiohttp import WSMsgType, web

from .events import StreamSpec, burst_events, gate_events, hold_events, paced_template, stream_events

_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
_MAX_HOLD_S = 600.0

SESSIONS = web.AppKey("sessions", dict)
STOCK_SESSIONS = web.AppKey("stock_sessions", bool)
GATES = web.AppKey("gates", dict)


def _frame(raw: bytes) -> bytes:
    return b"data: " + raw + b"\n\n"


_burst_cache: dict[tuple[str, int, int, int], list[bytes]] = {}


def _sse_batches(spec: StreamSpec) -> list[bytes]:
    key = (spec.mode, spec.n, spec.size, max(1, spec.batch))
    batches = _burst_cache.get(key)
    if batches is None:
        frames = [_frame(raw) for raw in stream_events(spec)]
        step = key[3]
        batches = _burst_cache[key] = [b"".join(frames[i : i + step]) for i in range(0, len(frames), step)]
    return batches


def _spec_of(message: Any) -> StreamSpec:
    try:
        text = message["parts"][0]["text"]
    except (KeyError, IndexError, TypeError):
        text = ""
    return StreamSpec.parse(text if isinstance(text, str) else "")


# ---- sessions API ----------------------------------------------------------------------------


def _session_json(app: str, uid: str, sid: str) -> dict[str, Any]:
    return {"id": sid, "appName": app, "userId": uid, "state": {}, "events": [], "lastUpdateTime": time.time()}


async def list_apps(request: web.Request) -> web.Response:
    return web.json_response(["demo_agent"])


async def get_session(request: web.Request) -> web.Response:
    app, uid, sid = (request.match_info[k] for k in ("app", "uid", "sid"))
    if (app, uid, sid) not in request.app[SESSIONS]:
        return web.json_response({"detail": "Session not found"}, status=404)
    return web.json_response(_session_json(app, uid, sid))


async def list_sessions(request: web.Request) -> web.Response:
    app, uid = request.match_info["app"], request.match_info["uid"]
    found = [_session_json(a, u, s) for (a, u, s) in request.app[SESSIONS] if a == app and u == uid]
    return web.json_response(found)


async def create_session(request: web.Request) -> web.Response:
    app, uid = request.match_info["app"], request.match_info["uid"]
    sid = request.match_info.get("sid")
    if sid is None:
        body = await request.read()
        sid = (orjson.loads(body) if body else {}).get("sessionId") or f"s-{len(request.app[SESSIONS])}"
    key = (app, uid, sid)
    if key in request.app[SESSIONS]:
        return web.json_response({"detail": "Session already exists"}, status=409)
    request.app[SESSIONS][key] = True
    return web.json_response(_session_json(app, uid, sid))


# ---- /run_sse ----------------------------------------------------------------------------------


async def run_sse(request: web.Request) -> web.StreamResponse:
    body = orjson.loads(await request.read())
    if request.app[STOCK_SESSIONS] and (body.get("appName"), body.get("userId"), body.get("sessionId")) not in request.app[SESSIONS]:
        return web.json_response({"detail": f"Session not found: {body.get('sessionId')}"}, status=404)
    spec = _spec_of(body.get("newMessage"))
    response = web.StreamResponse(headers=_SSE_HEADERS)
    await response.prepare(request)
    try:
        if spec.mode in ("burst", "tools", "text"):
            for batch in _sse_batches(spec):
                await response.write(batch)
        elif spec.mode == "paced":
            prefix, suffix, final, _ = paced_template(spec.size)
            interval = spec.interval_ms / 1000
            for i in range(spec.n):
                if i:
                    await asyncio.sleep(interval)
                await response.write(b"data: " + prefix + b"%019d" % time.monotonic_ns() + suffix + b"\n\n")
            await response.write(_frame(final))
        elif spec.mode == "hold":
            for raw in hold_events():
                await response.write(_frame(raw))
            await asyncio.sleep(min(spec.hold_s, _MAX_HOLD_S))
        elif spec.mode == "gate":
            call_id = f"bench-{body.get('sessionId')}"
            before, after = gate_events(call_id, spec.tool)
            release = request.app[GATES].setdefault(call_id, asyncio.Event())
            for raw in before:
                await response.write(_frame(raw))
            try:
                await asyncio.wait_for(release.wait(), _MAX_HOLD_S)
            finally:
                request.app[GATES].pop(call_id, None)
            for raw in after:
                await response.write(_frame(raw))
        elif spec.mode in ("gate_before", "gate_after"):
            before, after = gate_events(f"bench-{body.get('sessionId')}", spec.tool)
            for raw in before if spec.mode == "gate_before" else after:
                await response.write(_frame(raw))
        await response.write_eof()
    except (ConnectionError, asyncio.CancelledError):
        pass
    return response


async def release(request: web.Request) -> web.Response:
    call_id = request.query.get("call", "")
    event = request.app[GATES].setdefault(call_id, asyncio.Event())
    event.set()
    return web.json_response({"released": call_id})


# ---- /run_live ---------------------------------------------------------------------------------


async def run_live(request: web.Request) -> web.WebSocketResponse:
    ws = web.WebSocketResponse(max_msg_size=64 * 1024 * 1024, compress=False)
    await ws.prepare(request)
    try:
        async for msg in ws:
            if msg.type is not WSMsgType.TEXT:
                continue
            frame = orjson.loads(msg.data)
            if frame.get("close"):
                break
            if "content" not in frame:
                continue  # realtime blobs and the like: nothing to answer
            spec = _spec_of(frame["content"])
            if spec.mode == "paced":
                prefix, suffix, final, complete = paced_template(spec.size, live=True)
                interval = spec.interval_ms / 1000
                for i in range(spec.n):
                    if i:
                        await asyncio.sleep(interval)
                    await ws.send_str((prefix + b"%019d" % time.monotonic_ns() + suffix).decode())
                await ws.send_str(final.decode())
                await ws.send_str(complete.decode())  # type: ignore[union-attr]
            elif spec.mode == "hold":
                for raw in hold_events(live=True):
                    await ws.send_str(raw.decode())
            elif spec.mode == "gate":
                await _live_gate(request, ws, spec)
            else:
                for raw in _live_frames(spec):
                    await ws.send_str(raw)
    except (ConnectionError, asyncio.CancelledError):
        pass
    return ws


async def _live_gate(request: web.Request, ws: web.WebSocketResponse, spec: StreamSpec) -> None:
    """A gated tool turn on the live socket: the call, then (once released) the rest of the turn."""
    call_id = f"bench-{request.query.get('session_id')}"
    before, after = gate_events(call_id, spec.tool, live=True)
    release = request.app[GATES].setdefault(call_id, asyncio.Event())
    for raw in before:
        await ws.send_str(raw.decode())
    try:
        await asyncio.wait_for(release.wait(), _MAX_HOLD_S)
    finally:
        request.app[GATES].pop(call_id, None)
    for raw in after:
        await ws.send_str(raw.decode())


_live_cache: dict[tuple[int, int], list[str]] = {}


def _live_frames(spec: StreamSpec) -> list[str]:
    key = (spec.n, spec.size)
    frames = _live_cache.get(key)
    if frames is None:
        frames = _live_cache[key] = [raw.decode() for raw in burst_events(spec.n, spec.size, live=True)]
    return frames


# ---- app -----------------------------------------------------------------------------------------


def create_app(*, stock_sessions: bool = False) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[SESSIONS] = {}
    app[STOCK_SESSIONS] = stock_sessions
    app[GATES] = {}
    base = "/apps/{app}/users/{uid}/sessions"
    app.add_routes(
        [
            web.get("/list-apps", list_apps),
            web.get(base, list_sessions),
            web.post(base, create_session),
            web.get(base + "/{sid}", get_session),
            web.post(base + "/{sid}", create_session),
            web.post("/run_sse", run_sse),
            web.get("/run_live", run_live),
            web.post("/bench/release", release),
        ]
    )
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--stock-sessions", action="store_true",
        help="answer a run on a session not created first with 404, as ADK without --auto_create_session does",
    )
    args = parser.parse_args()
    web.run_app(create_app(stock_sessions=args.stock_sessions), host=args.host, port=args.port, access_log=None, print=None, backlog=4096)


if __name__ == "__main__":
    main()
