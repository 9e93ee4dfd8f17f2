"""The measurements. Each returns plain figures (dicts of numbers) for bench/results.json.

Every loop here is bounded both in count and in time.
"""

from __future__ import annotations

import asyncio
import gc
import random
import statistics
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import aiohttp
import orjson

from .clients import Route, Sink, Totals, client_session
from .events import StreamSpec, burst_events, recorded_runs, stream_events
from .procs import Proc

_JSON = {"Content-Type": "application/json"}

Runs = list[tuple[str, tuple[bytes, ...]]]


def pct(values: list[float] | list[int], q: float) -> float:
    """The q-th percentile (0-100), nearest rank; NaN when there is nothing to rank."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return float(ordered[rank])


# ---- converter alone, in process -----------------------------------------------------------------


def _convert_all(runs: Runs) -> int:
    """JSON bytes in, SSE bytes out, the way the gateway does it: parse, convert, encode, frame."""
    from gateway.core.converter import Converter
    from gateway.core.protocol import encode_chunk, sse_frame

    loads = orjson.loads
    out_bytes = 0
    for _name, events in runs:
        converter = Converter("msg-bench")
        for chunk in converter.start():
            out_bytes += len(sse_frame(encode_chunk(chunk)))
        for raw in events:
            for chunk in converter.feed(loads(raw)):
                out_bytes += len(sse_frame(encode_chunk(chunk)))
        for chunk in converter.finish():
            out_bytes += len(sse_frame(encode_chunk(chunk)))
    return out_bytes


def _feed_only(runs: Runs) -> int:
    """The converter's share: events already parsed, chunks not encoded."""
    from gateway.core.converter import Converter

    count = 0
    for _name, events in runs:
        converter = Converter("msg-bench")
        count += len(converter.start())
        for event in events:
            count += len(converter.feed(event))  # type: ignore[arg-type]
        count += len(converter.finish())
    return count


def _floor(runs: Runs) -> int:
    """The orjson floor: parse each event, build one small chunk dict from it, dump and frame it."""
    loads, dumps = orjson.loads, orjson.dumps
    out_bytes = 0
    for _name, events in runs:
        for raw in events:
            event = loads(raw)
            out_bytes += len(b"data: " + dumps({"type": "data-adk", "id": event.get("id"), "data": event.get("content")}) + b"\n\n")
    return out_bytes


def _pydantic(runs: Runs) -> int:
    from google.adk.events import Event

    validate = Event.model_validate_json
    for _name, events in runs:
        for raw in events:
            validate(raw)
    return 0


def _time_per_event(fn: Callable[[Runs], int], runs: Runs, events: int, seconds: float, trials: int) -> float:
    """Best-of-`trials` CPU microseconds per event; each trial repeats `fn` for about `seconds`."""
    fn(runs)  # warm
    best = float("inf")
    for _ in range(trials):
        gc.collect()
        gc.disable()
        try:
            reps = 0
            start = time.process_time_ns()
            deadline = time.perf_counter() + seconds
            while reps < 1_000_000 and (reps == 0 or time.perf_counter() < deadline):
                fn(runs)
                reps += 1
            spent = time.process_time_ns() - start
        finally:
            gc.enable()
        best = min(best, spent / 1000 / (reps * events))
    return best


def converter_bench(*, seconds: float, trials: int, with_pydantic: bool = True) -> dict[str, Any]:
    """Converter vs the orjson floor on the recorded event mixes, and its growth with stream length."""
    mixes: dict[str, Runs] = {
        "recorded_run_sse": recorded_runs("adk"),
        "recorded_run_live": recorded_runs("adk_live"),
        "stream_mix": [("stream", burst_events(1020))],
    }
    out: dict[str, Any] = {}
    for name, runs in mixes.items():
        events = sum(len(e) for _n, e in runs)
        parsed: Runs = [(n, tuple(orjson.loads(r) for r in e)) for n, e in runs]  # type: ignore[misc]
        row: dict[str, Any] = {"events": events, "bytes_per_event": sum(len(r) for _n, e in runs for r in e) / events}
        # Interleaved, so drift on a noisy machine hits both sides alike.
        floor = conv = feed = float("inf")
        for _ in range(trials):
            floor = min(floor, _time_per_event(_floor, runs, events, seconds / trials, 1))
            conv = min(conv, _time_per_event(_convert_all, runs, events, seconds / trials, 1))
            feed = min(feed, _time_per_event(_feed_only, parsed, events, seconds / trials, 1))
        row.update(
            floor_us_per_event=floor, converter_us_per_event=conv, feed_only_us_per_event=feed,
            converter_events_per_s=1e6 / conv, floor_events_per_s=1e6 / floor, ratio_to_floor=conv / floor,
        )
        if with_pydantic and name == "recorded_run_sse":
            try:
                row["pydantic_event_validate_us_per_event"] = _time_per_event(_pydantic, runs, events, seconds / trials, trials)
            except Exception as exc:  # noqa: BLE001 - a reference only
                row["pydantic_event_validate_us_per_event"] = None
                row["pydantic_error"] = repr(exc)
        out[name] = row
    # Growth: one message of 1x and 16x the events; the cost per event must stay flat.
    short, long_ = [("1x", burst_events(1020))], [("16x", burst_events(16 * 1020))]
    one = sixteen = float("inf")
    for _ in range(trials):  # interleaved, like the floor and the converter above
        one = min(one, _time_per_event(_convert_all, short, 1020, seconds / trials, 1))
        sixteen = min(sixteen, _time_per_event(_convert_all, long_, 16 * 1020, seconds / trials, 1))
    out["growth"] = {"us_per_event_1x": one, "us_per_event_16x": sixteen, "ratio_16x_to_1x": sixteen / one}
    return out


# ---- end to end: saturation -------------------------------------------------------------------------


class CpuWindow:
    """CPU time spent by processes (and by this client) between `start()` and `stop()`."""

    def __init__(self, procs: dict[str, Proc]) -> None:
        self.procs = procs

    def start(self) -> None:
        self._cpu = {k: p.cpu_ns() for k, p in self.procs.items()}
        self._faults = {k: p.minor_faults() for k, p in self.procs.items()}
        self._client = time.process_time_ns()
        self._t = time.perf_counter()

    def stop(self) -> dict[str, float]:
        wall = time.perf_counter() - self._t
        out = {f"cpu_s_{k}": (p.cpu_ns() - self._cpu[k]) / 1e9 for k, p in self.procs.items()}
        out.update({f"minor_faults_{k}": p.minor_faults() - self._faults[k] for k, p in self.procs.items()})
        out["cpu_s_client"] = (time.process_time_ns() - self._client) / 1e9
        out["wall_s"] = wall
        return out


async def _open(route: Route, http: aiohttp.ClientSession, tag: str, count: int) -> list[Any]:
    convs = [route.conversation(http, f"{tag}-{i}") for i in range(count)]
    sem = asyncio.Semaphore(100)

    async def one(c: Any) -> None:
        async with sem:
            await c.open()

    await asyncio.gather(*(one(c) for c in convs))
    return convs


async def _warm(convs: list[Any], spec: StreamSpec) -> Totals:
    """One turn per conversation: sessions created, connections pooled."""
    totals = Totals()
    sem = asyncio.Semaphore(100)

    async def one(c: Any) -> None:
        async with sem:
            sink = Sink()
            totals.add(sink, await c.turn(spec, sink))

    await asyncio.gather(*(one(c) for c in convs))
    return totals


async def throughput(
    route: Route, *, concurrency: int, n: int, seconds: float, size: int = 0, tag: str = "t",
    measure: dict[str, Proc] | None = None, max_streams: int = 100_000, mode: str = "burst",
) -> dict[str, Any]:
    """`concurrency` browsers each running turns of n events back to back for about `seconds`
    (`mode`: burst, the recorded text and tool mix; tools, the tool-heavy stream)."""
    spec = StreamSpec(mode=mode, n=n, size=size)
    events_per_stream = len(stream_events(spec, live=route.kind.endswith("ws")))
    measure = measure or {"proxy": route.proc}
    async with client_session() as http:
        convs = await _open(route, http, f"{tag}-{route.name}-{concurrency}", concurrency)
        warm = await _warm(convs, StreamSpec(mode="burst", n=9))
        totals = Totals()
        peak = {"rss": 0}
        window = CpuWindow(measure)
        deadline = time.perf_counter() + seconds
        budget = {"left": max_streams}

        async def worker(c: Any) -> None:
            while budget["left"] > 0:
                budget["left"] -= 1
                sink = Sink()
                totals.add(sink, await c.turn(spec, sink))
                if time.perf_counter() >= deadline:
                    return

        async def sample() -> None:
            while True:
                peak["rss"] = max(peak["rss"], route.proc.rss())
                await asyncio.sleep(0.05)

        rss0 = route.proc.rss()
        sampler = asyncio.create_task(sample())
        window.start()
        await asyncio.gather(*(worker(c) for c in convs))
        cpu = window.stop()
        sampler.cancel()
        await asyncio.gather(*(c.close() for c in convs), return_exceptions=True)
    events = totals.streams * events_per_stream
    row: dict[str, Any] = {
        "concurrency": concurrency, "events_per_stream": events_per_stream, "streams": totals.streams,
        "failed": totals.failed + warm.failed, "errors": totals.errors + warm.errors, "events": events,
        "frames": totals.frames, "bytes_out": totals.bytes, "events_per_s": events / cpu["wall_s"],
        "rss_before": rss0, "rss_peak": peak["rss"],
    }
    row.update(cpu)
    for k in measure:
        row[f"cpu_us_per_event_{k}"] = cpu[f"cpu_s_{k}"] * 1e6 / max(events, 1)
        row[f"minor_faults_per_event_{k}"] = cpu[f"minor_faults_{k}"] / max(events, 1)
    row["cpu_us_per_event_client"] = cpu["cpu_s_client"] * 1e6 / max(events, 1)
    return row


# ---- end to end: isolated events ---------------------------------------------------------------------


async def latency(
    route: Route, *, concurrency: int, seconds: float, size: int = 0, tag: str = "l",
    aggregate_rate: float = 1000.0, min_interval_ms: float = 10.0, ramp_ms_per_stream: float = 5.0,
) -> dict[str, Any]:
    """Paced events (each alone on the wire): their latency from the upstream's write to the client.

    Each of `concurrency` streams gets an event every interval, so the path carries about
    `aggregate_rate` events/s in all (fewer at 1 stream: one per `min_interval_ms`). Streams start
    `ramp_ms_per_stream` apart (a burst of requests would measure request handling, not events);
    only events sent while every stream is running count.
    """
    interval_ms = max(min_interval_ms, concurrency * 1000 / aggregate_rate)
    ramp_ms = ramp_ms_per_stream * (concurrency - 1)
    per_stream = max(5, min(5000, int((ramp_ms + seconds * 1000) / interval_ms) + 2))
    spec = StreamSpec(mode="paced", n=per_stream, interval_ms=interval_ms, size=size)
    async with client_session() as http:
        convs = await _open(route, http, f"{tag}-{route.name}-{concurrency}", concurrency)
        # The first turn of a chat (the gateway creates the ADK session): time to first event, cold.
        cold = Totals()
        sem = asyncio.Semaphore(8)

        async def first_turn(c: Any) -> None:
            async with sem:
                sink = Sink()
                cold.add(sink, await c.turn(StreamSpec(mode="paced", n=1), sink))

        await asyncio.gather(*(first_turn(c) for c in convs))
        totals = Totals()
        window = CpuWindow({"proxy": route.proc})
        t0 = time.monotonic_ns() + 20_000_000
        measured = (t0 + int((ramp_ms + interval_ms) * 1e6), t0 + int((per_stream - 1) * interval_ms * 1e6))

        async def worker(i: int, c: Any) -> None:
            await asyncio.sleep(max(0.0, (t0 - time.monotonic_ns()) / 1e9 + i * ramp_ms_per_stream / 1000))
            sink = Sink(window=measured)
            totals.add(sink, await c.turn(spec, sink))

        window.start()
        await asyncio.gather(*(worker(i, c) for i, c in enumerate(convs)))
        cpu = window.stop()
        await asyncio.gather(*(c.close() for c in convs), return_exceptions=True)
    lat = [v / 1000 for v in totals.latencies]
    first = [v / 1000 for v in totals.first]
    cold_first = [v / 1000 for v in cold.first]
    return {
        "concurrency": concurrency, "interval_ms": interval_ms, "events_per_stream": per_stream,
        "events": len(lat), "events_received": totals.frames, "failed": totals.failed + cold.failed,
        "errors": totals.errors + cold.errors, "window_s": (measured[1] - measured[0]) / 1e9,
        "latency_us_p50": pct(lat, 50), "latency_us_p90": pct(lat, 90), "latency_us_p99": pct(lat, 99),
        "latency_us_max": max(lat) if lat else float("nan"),
        "first_event_us_p50": pct(first, 50), "first_event_us_p99": pct(first, 99),
        "first_event_cold_us_p50": pct(cold_first, 50),
        "cpu_us_per_event_proxy": cpu["cpu_s_proxy"] * 1e6 / max(concurrency * per_stream, 1),
    }


# ---- idle scale ------------------------------------------------------------------------------------


async def _settled_rss(proc: Proc, seconds: float = 1.0) -> int:
    """RSS once the process has settled: the median of a few samples after `seconds`."""
    await asyncio.sleep(seconds)
    samples = [proc.rss()]
    for _ in range(4 if seconds else 0):
        await asyncio.sleep(0.1)
        samples.append(proc.rss())
    return int(statistics.median(samples))


async def idle(
    route: Route, *, count: int, warm: int, hold_s: float, open_timeout: float = 60.0,
    on_measure: Callable[[], None] | None = None, settle_s: float = 1.0,
) -> dict[str, Any]:
    """RSS per held connection: SSE streams whose run waits upstream, or open WebSocket sessions.

    `warm` connections are opened first (code paths loaded, pools grown), then RSS is taken, then
    `count` more are opened and held; the difference per connection is the figure.
    """
    held: list[asyncio.Task[Any]] = []
    ws = route.kind.endswith("ws")
    async with client_session() as http:
        convs: list[Any] = []

        async def open_many(n: int, tag: str) -> int:
            sem = asyncio.Semaphore(200)
            ready = 0

            async def one(i: int) -> None:
                nonlocal ready
                async with sem:
                    conv = route.conversation(http, f"{tag}-{i}")
                    convs.append(conv)
                    if ws:
                        # An open session that already had a turn (so the gateway holds its chat).
                        await conv.open()
                        if await conv.turn(StreamSpec(mode="burst", n=9), Sink()):
                            ready += 1
                        held.append(asyncio.create_task(conv.hold()))
                    else:
                        # A held stream: one event arrived, the upstream run still going.
                        sink = Sink(want=b"You said")
                        held.append(asyncio.create_task(conv.turn(StreamSpec(mode="hold", hold_s=hold_s), sink)))
                        assert sink.seen is not None
                        await asyncio.wait_for(sink.seen.wait(), open_timeout)
                        ready += 1

            await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(n))), open_timeout * 2)
            return ready

        started = time.perf_counter()
        warm_ready = await open_many(warm, f"idle-warm-{route.name}")
        rss0 = await _settled_rss(route.proc, settle_s)
        if on_measure is not None:
            on_measure()
        ready = await open_many(count, f"idle-{route.name}")
        rss1 = await _settled_rss(route.proc, settle_s)
        if on_measure is not None:
            on_measure()
        opened_s = time.perf_counter() - started
        for task in held:
            task.cancel()
        await asyncio.gather(*held, return_exceptions=True)
        if ws:
            await asyncio.gather(*(c.close() for c in convs), return_exceptions=True)
    return {
        "connections": count, "ready": ready, "warm": warm, "warm_ready": warm_ready, "rss_before": rss0,
        "rss_after": rss1, "kib_per_connection": (rss1 - rss0) / max(count, 1) / 1024, "open_s": opened_s,
    }


# ---- approval round trip -----------------------------------------------------------------------


async def approval(gateway: Route, fake: Route, *, internal: str, secret: str, iterations: int, seconds: float, warm: int = 5) -> dict[str, Any]:
    """The browser's decision arriving at the gateway -> the plugin's before_tool_callback returning.

    Real code path: gateway.agent_plugin.GatewayPlugin (in this process, as in the agent's) asks the
    gateway's internal listener and waits; the browser's answering POST releases it.
    """
    from gateway.agent_plugin import GatewayPlugin

    plugin = GatewayPlugin(url=internal, secret=secret)
    trips: list[float] = []
    failures = 0
    deadline = time.perf_counter() + seconds
    async with client_session() as http:

        async def one(i: int) -> float:
            return await approval_pair(http, gateway.base, fake.base, plugin, f"appr-{i}-{random.randrange(1 << 30)}", i)

        for i in range(warm + iterations):
            try:
                trip = await asyncio.wait_for(one(i), 20)
            except Exception as exc:  # noqa: BLE001 - counted and reported
                failures += 1
                last_error = repr(exc)
                if failures > 5:
                    raise RuntimeError(f"approval round trips keep failing: {last_error}") from None
                continue
            if i >= warm:
                trips.append(trip)  # type: ignore[arg-type]
            if time.perf_counter() > deadline and len(trips) >= min(iterations, 20):
                break
    await plugin.close()
    return {
        "iterations": len(trips), "failures": failures, "round_trip_us_p50": pct(trips, 50),
        "round_trip_us_p90": pct(trips, 90), "round_trip_us_p99": pct(trips, 99),
        "round_trip_us_max": max(trips) if trips else float("nan"),
    }


async def _read_until(resp: aiohttp.ClientResponse, needle: bytes, buf: bytearray) -> None:
    while needle not in buf:
        data = await resp.content.readany()
        if not data:
            raise RuntimeError(f"stream ended before {needle!r}: {bytes(buf)[-500:]!r}")
        buf += data


async def approval_pair(http: aiohttp.ClientSession, gateway: str, fake: str, plugin: Any, chat: str, seq: int) -> float:
    """One approval round trip through the gateway, as a browser and the agent's plugin make it: the
    first turn streams the gated call, the plugin (`before_tool_callback`, in this process) asks the
    gateway, the browser's answering POST releases it, the fake lets the run go on and the browser
    reads the rest. Returns the microseconds from sending the answer to the callback returning."""
    tool = SimpleNamespace(name="process_payment")
    args = {"amount": 50, "recipient": "Hanako", "currency": "USD"}
    spec = StreamSpec(mode="gate", tool="process_payment")
    user = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": spec.text()}]}
    ctx = SimpleNamespace(
        session=SimpleNamespace(app_name="demo_agent", id=chat), user_id="anonymous",
        invocation_id=f"inv-{seq}", function_call_id=f"bench-{chat}", tool_confirmation=None,
    )
    released: dict[str, int] = {}

    async def agent_side() -> Any:
        verdict = await plugin.before_tool_callback(tool=tool, tool_args=args, tool_context=ctx)
        released["ns"] = time.perf_counter_ns()
        return verdict

    body = orjson.dumps({"id": chat, "messages": [user], "trigger": "submit-message"})
    async with http.post(gateway + "/api/chat", data=body, headers=_JSON) as first:
        if first.status != 200:
            raise RuntimeError(f"first turn answered HTTP {first.status}: {(await first.read())[:300]!r}")
        buf = bytearray()
        await _read_until(first, b"tool-input-available", buf)
        plugin_task = asyncio.create_task(agent_side())  # ADK runs the tool: the plugin asks
        buf += await first.read()
    chunks = [orjson.loads(line[6:]) for line in bytes(buf).split(b"\n") if line.startswith(b"data: {")]
    request = next((c for c in chunks if c["type"] == "tool-approval-request"), None)
    if request is None:
        plugin_task.cancel()
        raise RuntimeError(f"no approval request in the first turn: {bytes(buf)[-400:]!r}")
    message_id = chunks[0]["messageId"]
    assistant = {
        "id": message_id, "role": "assistant",
        "parts": [
            {"type": "step-start"},
            {
                "type": "tool-process_payment", "toolCallId": request["toolCallId"], "state": "approval-responded",
                "input": args, "approval": {"id": request["approvalId"], "approved": True},
            },
        ],
    }
    answer = orjson.dumps({"id": chat, "messages": [user, assistant], "trigger": "submit-message", "messageId": message_id})
    sent = time.perf_counter_ns()
    async with http.post(gateway + "/api/chat", data=answer, headers=_JSON) as second:
        verdict = await asyncio.wait_for(plugin_task, 10)
        # The tool ran; the agent goes on (the fake releases the held run) and the browser reads the rest.
        async with http.post(fake + f"/bench/release?call=bench-{chat}") as r:
            await r.read()
        rest = await second.read()
    if verdict is not None or b"tool-output-available" not in rest or b'"finish"' not in rest:
        raise RuntimeError(f"approval flow went wrong: verdict={verdict!r} second={rest[-400:]!r}")
    return (released["ns"] - sent) / 1000
