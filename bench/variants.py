"""Gateway variants side by side, interleaved with the passthrough: for changes too small to see
between separate runs on a noisy machine.

    python -m bench.variants --reps 4 --phases lat1,lat200,sat50 new= old=MY_SWITCH=1
    python -m bench.variants --transport ws new= old=MY_SWITCH=1
    python -m bench.variants --phases tools50,warm50,new50 new= old=MY_SWITCH=1   # issue 18's shapes

Each variant is `name=ENV=VALUE;ENV2=VALUE` (empty: the code as it is): a gateway in SSE mode
(`upstream.mode: sse`) started from this checkout with that environment added, so an experiment
puts the old and the new behaviour behind a switch the code reads from the environment (removed
before committing). Phases, as in `python -m bench`: `lat1` and `lat200` (isolated events at 1 and
200 streams: p50, p99, gateway CPU per event), `sat50` (saturation at 50 streams: events/s, CPU
per event); and issue 18's agentic shapes at 50 browsers (bench/agentic.py): `tools50` (the
tool-heavy stream of 3,030 events: events/s, CPU per event), `warm50` and `new50` (20-event turns
on warm or new chats: turns/s, CPU per turn) and `toolturns50` (the tool-heavy stream in turns of
303 events, a new chat each: events/s, CPU per event, CPU per turn); issue 29's `long8` and `tools8` (a
long text answer of 2,001 events, the tool-heavy stream of 3,030; 8 streams: events/s, CPU per event). `--transport ws` measures the browser's WebSocket (`/api/chat/ws`; the passthrough
splices `/run_live`) instead of SSE; `--direct` adds the fake upstream reached straight, the
reference `make bench` takes added latency from. Every repetition runs each phase on every route
in turn, the variants in a rotating order; the median per route is printed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
from pathlib import Path

from . import procs
from .agentic import chat_turns
from .clients import Route
from .events import TOOL_TURN, StreamSpec
from .scenarios import latency, throughput

PHASES = ("lat1", "lat200", "sat50", "tools50", "warm50", "new50", "toolturns50", "long8", "tools8")


def _measure(phase: str, route: Route, fake: procs.Proc, rep: int) -> tuple[float, ...]:
    measure = {"proxy": route.proc, "upstream": fake}
    if phase in ("long8", "tools8"):  # issue 29's shapes: a long text answer, the tool-heavy stream; 8 streams
        mode, n = ("text", 2001) if phase == "long8" else ("tools", 3030)
        row = asyncio.run(throughput(route, concurrency=8, n=n, seconds=3.0, measure=measure, mode=mode))
        return row["events_per_s"], row["cpu_us_per_event_proxy"]
    if phase == "tools50":
        row = asyncio.run(throughput(route, concurrency=50, n=3030, seconds=4.0, measure=measure, mode="tools"))
        return row["events_per_s"], row["cpu_us_per_event_proxy"]
    if phase in ("warm50", "new50", "toolturns50"):
        spec = StreamSpec(mode="tools", n=TOOL_TURN) if phase == "toolturns50" else StreamSpec(mode="burst", n=20)
        row = asyncio.run(chat_turns(route, concurrency=50, spec=spec, new=phase != "warm50", seconds=3.0, measure=measure, tag=f"{phase}-{rep}"))
        if phase == "toolturns50":
            return row["events_per_s"], row["cpu_us_per_event_proxy"], row["cpu_us_per_turn_proxy"]
        return row["turns_per_s"], row["cpu_us_per_turn_proxy"]
    if phase in ("lat1", "lat200"):
        row = asyncio.run(latency(route, concurrency=1 if phase == "lat1" else 200, seconds=2.0, tag=f"{phase}-{rep}"))
        return row["latency_us_p50"], row["latency_us_p99"], row["cpu_us_per_event_proxy"]
    row = asyncio.run(throughput(route, concurrency=50, n=500, seconds=3.0, measure={"proxy": route.proc, "upstream": fake}))
    return row["events_per_s"], row["cpu_us_per_event_proxy"]


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.variants", description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--phases", default="lat1,lat200,sat50")
    parser.add_argument("--transport", choices=("sse", "ws"), default="sse")
    parser.add_argument(
        "--direct", action="store_true", help="also measure the fake upstream straight, for added latency as make bench reports it"
    )
    parser.add_argument("--nginx", action="store_true", help="also measure nginx (issue 29's targets compare with it)")
    parser.add_argument("variants", nargs="+", help="name=ENV=VALUE;ENV2=VALUE (empty after = for none)")
    args = parser.parse_args()
    phases = [p for p in args.phases.split(",") if p]
    if unknown := set(phases) - set(PHASES):
        parser.error(f"unknown phases: {', '.join(sorted(unknown))}")
    if args.transport != "sse" and set(phases) - {"lat1", "lat200", "sat50"}:
        parser.error("the agentic phases (tools50, warm50, new50, toolturns50, long8, tools8) are SSE only")
    workdir = Path(tempfile.mkdtemp(prefix="bench-variants-"))
    procs.raise_fd_limit()
    fake = procs.start_fake(workdir)
    started = [procs.start_passthrough(workdir, fake.base)]
    upstream_kind, gateway_kind = ("adk-sse", "gw-sse") if args.transport == "sse" else ("adk-ws", "gw-ws")
    references = [Route("passthrough", upstream_kind, started[0].base, started[0])]
    if args.direct:
        references.insert(0, Route("direct", upstream_kind, fake.base, fake))
    if args.nginx:
        started.append(procs.start_nginx(workdir, fake.base))
        references.append(Route("nginx", upstream_kind, started[-1].base, started[-1]))
    variants: list[Route] = []
    try:
        for variant in args.variants:
            name, _, spec = variant.partition("=")
            env = dict(kv.partition("=")[::2] for kv in spec.split(";") if kv)
            saved = dict(os.environ)
            os.environ.update(env)
            try:
                gateway = procs.start_gateway(workdir, fake.base, mode="sse", name=name)
            finally:
                os.environ.clear()
                os.environ.update(saved)
            started.append(gateway)
            variants.append(Route(name, gateway_kind, gateway.base, gateway))
        results: dict[tuple[str, str], list[tuple[float, ...]]] = {}
        for rep in range(args.reps):
            # Each variant goes first in turn: whatever runs right after another phase's load does not
            # always land on the same one.
            shift = rep % len(variants)
            routes = references + variants[shift:] + variants[:shift]
            for phase in phases:
                for route in routes:
                    values = _measure(phase, route, fake, rep)
                    results.setdefault((phase, route.name), []).append(values)
                    print(rep, phase, route.name, tuple(round(v, 1) for v in values), flush=True)
    finally:
        for proc in started:
            proc.stop()
        fake.stop()
    print("\nmedians (lat: p50 us, p99 us, CPU us/event; sat, tools50: events/s, CPU us/event; warm50, new50: turns/s, "
          "CPU us/turn; toolturns50: events/s, CPU us/event, CPU us/turn)")
    for (phase, name), rows in results.items():
        print(f"  {phase:7} {name:14}", [round(statistics.median(r[i] for r in rows), 1) for i in range(len(rows[0]))])
    return 0


if __name__ == "__main__":
    sys.exit(main())
