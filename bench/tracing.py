"""What traces cost (issue 27): the same short turns through gateways that differ only in tracing.

Four gateway processes on one fake upstream, started together:

- `off_a`, `off_b`: tracing off (`telemetry.enabled: false`), twice: the two show the noise floor
  (off against off is "the same gateway", so their ratio is what this machine calls equal);
- `on_default`: traces exported over OTLP/HTTP with the gateway's default sampling (no
  OTEL_TRACES_SAMPLER: parent-based, 10% of the traces the browser did not start);
- `on_full`: the same with every trace sampled (`OTEL_TRACES_SAMPLER=always_on`), for information.

Each exports to a sink in this process that answers 200 to `POST /v1/traces` and keeps nothing
(it counts the batches and bytes: traces were really sent). Each repetition runs the same turns
(`chat_turns`: warm chats, C browsers back to back) against every gateway in turn, interleaved, so
the machine's drift falls on all alike; CPU per turn is from /proc schedstat, every thread (the
exporter's too). The targets are medians over the repetitions of ratios within one repetition: on
at the default sampling within 5% of off (the mean of the two offs), and off against off (this
run's noise: when it misses, so may the other for no fault of the code). Beside them, steadier, a
turn's tracing calls timed alone in this process (`in_process`), added to the offs' CPU per turn.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import web

from . import procs
from .agentic import chat_turns
from .clients import Route
from .events import StreamSpec

__all__ = ["GATEWAYS", "tracing_phase", "tracing_table", "tracing_targets"]

# Name -> the environment that sets its tracing (the sink's endpoint is added to those that trace).
GATEWAYS: dict[str, dict[str, str] | None] = {
    "off_a": None,
    "off_b": None,
    "on_default": {},
    "on_full": {"OTEL_TRACES_SAMPLER": "always_on"},
}
# Removed from the gateways' environment: they trace only as GATEWAYS says, whatever this one's says.
_CLEARED = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_TRACES_SAMPLER",
            "OTEL_TRACES_SAMPLER_ARG", "OTEL_SDK_DISABLED")


class _Sink:
    """An OTLP/HTTP endpoint that accepts every export and discards it, counting what came."""

    def __init__(self) -> None:
        self.batches = 0
        self.bytes = 0

    async def _traces(self, request: web.Request) -> web.Response:
        self.bytes += len(await request.read())
        self.batches += 1
        return web.Response(status=200, content_type="application/x-protobuf", body=b"")

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[str]:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/traces", self._traces)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        port = procs.free_port()
        site = web.TCPSite(runner, "127.0.0.1", port)
        await site.start()
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            await runner.cleanup()


def _env(traced: dict[str, str] | None, endpoint: str) -> dict[str, str | None]:
    env: dict[str, str | None] = dict.fromkeys(_CLEARED)
    if traced is not None:
        env.update({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, **traced})
    return env


async def tracing_phase(
    workdir: Path, *, reps: int, seconds: float, concurrency: int, turn_events: int, history_turns: int, log: Any,
) -> dict[str, Any]:
    sink = _Sink()
    async with sink.serving() as endpoint:
        fake = procs.start_fake(workdir, "tracing-fake", wait=False)
        gateways = {
            name: procs.start_gateway(
                workdir, fake.base, name=f"tracing-{name}", wait=False, env=_env(traced, endpoint),
                extra="" if traced is not None else "telemetry:\n  enabled: false\n",
            )
            for name, traced in GATEWAYS.items()
        }
        everything = [fake, *gateways.values()]
        procs.ready(*everything)
        spec = StreamSpec(mode="burst", n=turn_events)
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in gateways}
        try:
            for rep in range(reps):
                # Interleaved: each repetition measures every gateway once, in a rotated order.
                order = list(gateways)[rep % len(gateways):] + list(gateways)[: rep % len(gateways)]
                for name in order:
                    proc = gateways[name]
                    row = await chat_turns(
                        Route(name, "gw-sse", proc.base, proc), concurrency=concurrency, spec=spec, new=False,
                        seconds=seconds, measure={"proxy": proc, "upstream": fake}, history_turns=history_turns,
                        tag=f"trace{rep}",
                    )
                    runs[name].append(row)
                    log(f"  tracing {name:10} rep {rep + 1}/{reps} x{concurrency} {row['turns_per_s']:>7.0f} turns/s "
                        f"{row['cpu_us_per_turn_proxy']:7.0f} us/turn  failed={row['failed']} errors={row['errors']}")
        finally:
            for proc in reversed(everything):
                proc.stop()
    out: dict[str, Any] = {
        "in_process_us_per_turn": in_process(turns=max(reps, 1) * 1000),
        "reps": reps, "concurrency": concurrency, "events_per_turn": runs["off_a"][0]["events_per_turn"] if reps else 0,
        "sink": {"batches": sink.batches, "bytes": sink.bytes}, "gateways": {},
    }
    # Paired by repetition (the machine's drift falls on the pair alike): on against the mean of
    # the two offs measured in the same repetition, and the two offs against each other.
    off = [(a["cpu_us_per_turn_proxy"], b["cpu_us_per_turn_proxy"]) for a, b in zip(runs["off_a"], runs["off_b"], strict=True)]
    out["paired"] = {
        name: statistics.median(r["cpu_us_per_turn_proxy"] / ((a + b) / 2) for r, (a, b) in zip(runs[name], off, strict=True))
        for name in runs if name.startswith("on_") and off
    }
    if off:
        noise = statistics.median(a / b for a, b in off)
        out["paired"]["off_vs_off"] = max(noise, 1 / noise)
    for name, rows in runs.items():
        per_turn = [r["cpu_us_per_turn_proxy"] for r in rows]
        out["gateways"][name] = {
            "cpu_us_per_turn_proxy": statistics.median(per_turn) if per_turn else None,
            "cpu_us_per_turn_each": per_turn,
            "turns_per_s": statistics.median(r["turns_per_s"] for r in rows) if rows else None,
            "turns": sum(r["turns"] for r in rows), "failed": sum(r["failed"] for r in rows),
            "errors": sum(r["errors"] for r in rows),
        }
    return out


# ---- in process: a turn's tracing calls alone ---------------------------------------------------


def _synthetic_turn(tracing: Any) -> None:
    """The tracing calls of one warm SSE turn, in the gateway's order (edge/app.py, edge/sse.py,
    chat/actor.py, upstream/client.py): the request's span, the turn's, the `/run_sse` call's,
    their ends and the exemplars the histograms ask for."""
    import contextvars

    started = tracing.server_span({}, "POST", "/api/chat", "/api/chat", agent=None)
    tracing.annotate(agent="demo_agent", chat_id="bench-chat")
    span = tracing.start_turn("demo_agent", "bench-chat") if tracing.enabled else None

    def run() -> None:
        with tracing.client("POST", "/run_sse", "http://127.0.0.1:1/run_sse", {"Content-Type": "application/json"}, app="demo_agent") as call:
            call.answered(200)
            tracing.exemplar()  # first event
        tracing.exemplar()  # first token

    (tracing.context_with(span) if span is not None else contextvars.copy_context()).run(run)
    if span is not None:
        tracing.end_turn_outcome(span, "completed")
        tracing.end_turn(span)
    tracing.server_exemplar(started)
    tracing.end_server(started, 200)


def in_process(turns: int) -> dict[str, float]:
    """CPU us per turn of `_synthetic_turn` alone: off, and on with each sampler, the spans
    exported by the SDK's batch processor to an exporter that encodes them as OTLP does (protobuf)
    and drops them. Steadier than the end-to-end figures on a busy machine: no other process, no I/O."""
    import time

    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, TraceIdRatioBased

    from gateway.ops.trace_export import DEFAULT_SAMPLE_RATIO
    from gateway.ops.tracing import Tracing

    class Encoded(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            encode_spans(spans).SerializeToString()
            return SpanExportResult.SUCCESS

    out: dict[str, float] = {}
    for name, sampler in (("off", None), ("on_default", ParentBased(TraceIdRatioBased(DEFAULT_SAMPLE_RATIO))), ("on_full", ALWAYS_ON)):
        provider = None
        if sampler is not None:
            provider = TracerProvider(sampler=sampler, shutdown_on_exit=False)
            provider.add_span_processor(BatchSpanProcessor(Encoded(), max_queue_size=1 << 16))
        tracing = Tracing(provider, "bench", "r1") if provider is not None else Tracing.off()
        for _ in range(min(turns, 200)):
            _synthetic_turn(tracing)
        if provider is not None:
            provider.force_flush()
        # Process CPU, the exporter thread's included: the flush waits for its encoding.
        before = time.process_time()
        for _ in range(turns):
            _synthetic_turn(tracing)
        if provider is not None:
            provider.force_flush()
            provider.shutdown()
        out[name] = (time.process_time() - before) * 1e6 / max(turns, 1)
    return out


def _per_turn(results: dict[str, Any], name: str) -> float | None:
    row = ((results.get("tracing") or {}).get("gateways") or {}).get(name)
    return row and row.get("cpu_us_per_turn_proxy")


def tracing_targets(results: dict[str, Any], add: Any) -> None:
    """The phase's targets (`add` is run.py's): the median over repetitions of each one's ratio."""
    paired = (results.get("tracing") or {}).get("paired") or {}
    off = [v for v in (_per_turn(results, "off_a"), _per_turn(results, "off_b")) if v]
    base = statistics.mean(off) if off else None
    on, full = _per_turn(results, "on_default"), _per_turn(results, "on_full")
    add("tracing on (default sampling, 1 in 10) vs off: gateway CPU per turn", paired.get("on_default"), "<=", 1.05,
        detail=on and base and f"medians {on:.0f} vs {base:.0f} us/turn (off: two processes); every trace sampled: "
        f"{full or float('nan'):.0f} us/turn ({paired.get('on_full', float('nan')):.2f}x)")
    alone = (results.get("tracing") or {}).get("in_process_us_per_turn") or {}
    cost = alone.get("on_default")
    add("tracing on (default sampling): a turn's tracing calls in process vs off gateway CPU per turn",
        # None (n/a) when the phase did not run: `False` would read as a ratio of 0 and PASS.
        (base + cost - alone.get("off", 0.0)) / base if cost is not None and base else None, "<=", 1.05,
        detail=cost is not None and base and f"{cost:.0f} us/turn in process (off {alone.get('off', 0):.1f}, every trace "
        f"{alone.get('on_full', float('nan')):.0f}) over {base:.0f} us/turn")
    a, b = _per_turn(results, "off_a"), _per_turn(results, "off_b")
    add("tracing off vs off: two identical gateways agree (this run's noise)", paired.get("off_vs_off"), "<=", 1.05,
        detail=a and b and f"medians {a:.0f} vs {b:.0f} us/turn")


def tracing_table(results: dict[str, Any]) -> list[str]:
    data = results.get("tracing")
    if not data:
        return []
    lines = ["", f"Tracing: warm short turns of {data['events_per_turn']} events, x{data['concurrency']}, "
             f"median of {data['reps']} interleaved repetitions (gateway CPU us per turn)"]
    for name, row in data["gateways"].items():
        each = ", ".join(f"{v:.0f}" for v in row["cpu_us_per_turn_each"])
        per_turn = row["cpu_us_per_turn_proxy"]
        lines.append(f"  {name:10} {per_turn if per_turn is not None else float('nan'):7.0f} us/turn  "
                     f"{row['turns_per_s'] or 0:6.0f} turns/s  (each: {each}; failed {row['failed']})")
    lines.append(f"  the OTLP sink received {data['sink']['batches']} batches, {data['sink']['bytes'] / 1024:.0f} KiB")
    alone = data.get("in_process_us_per_turn") or {}
    if alone:
        lines.append("  a turn's tracing calls alone, in process (CPU us per turn, export encoding included): "
                     + ", ".join(f"{k} {v:.1f}" for k, v in alone.items()))
    return lines
