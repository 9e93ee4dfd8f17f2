"""Profile a proxy under saturation load with py-spy, and summarise where its CPU goes.

    .venv/bin/pip install py-spy
    python -m bench.profile --route gateway --transport sse --seconds 10 --out /tmp/prof
    python -m bench.profile --load turns-new --seconds 10      # issue 18's shapes, SSE only

Starts the fake upstream and the chosen proxy, drives the same load as the saturation phase of
`python -m bench` (or, with `--load`, one of the agentic phases': `tools`, the tool-heavy stream;
`turns-new` / `turns-warm`, 20-event turns on new or warm chats; `tool-turns`, the tool-heavy
stream in turns of 303 events, a new chat each; `pairs`, approval pairs on a gated tool), samples the proxy with `py-spy record`
(collapsed stacks), then prints the hottest functions by self time and by inclusive time, with
file:line.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import secrets
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from . import procs
from .agentic import approval_pairs, chat_turns
from .clients import Route
from .events import TOOL_TURN, StreamSpec
from .run import _approval_extra
from .scenarios import throughput


def _frames(stack: str) -> list[str]:
    return [f for f in stack.split(";") if f]


def summarise(collapsed: Path, top: int = 40, prefix_filter: str = "") -> str:
    self_counts: collections.Counter[str] = collections.Counter()
    incl_counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        frames = _frames(stack)
        if frames:
            self_counts[frames[-1]] += n
        for frame in set(frames):
            incl_counts[frame] += n
    out = [f"{total} samples"]
    out.append(f"\nTop {top} by self time:")
    for frame, n in self_counts.most_common(top):
        out.append(f"  {100 * n / total:5.1f}%  {frame}")
    # The same with a function's lines merged: "name (file)" instead of "name (file:line)".
    by_function: collections.Counter[str] = collections.Counter()
    for frame, n in self_counts.items():
        by_function[re.sub(r":\d+\)$", ")", frame)] += n
    out.append(f"\nTop {top} by self time, lines of a function merged:")
    for frame, n in by_function.most_common(top):
        out.append(f"  {100 * n / total:5.1f}%  {frame}")
    out.append(f"\nTop {top} by inclusive time{' (' + prefix_filter + ')' if prefix_filter else ''}:")
    shown = 0
    for frame, n in incl_counts.most_common():
        if prefix_filter and prefix_filter not in frame:
            continue
        out.append(f"  {100 * n / total:5.1f}%  {frame}")
        shown += 1
        if shown >= top:
            break
    return "\n".join(out)


async def _load(
    route: Route, fake: procs.Proc, seconds: float, concurrency: int, n: int, load: str = "stream", internal: tuple[str, str] = ("", "")
) -> dict:
    measure = {"proxy": route.proc, "upstream": fake}
    if load == "pairs":
        row = await approval_pairs(
            route, concurrency=concurrency, seconds=seconds, measure=measure, fake=fake.base, internal=internal[0], secret=internal[1]
        )
        row["events_per_s"] = row["pairs_per_s"] * row["events_per_pair"]
        row["cpu_us_per_event_proxy"] = row["cpu_us_per_pair_proxy"] / row["events_per_pair"]
        row["cpu_us_per_turn_proxy"] = row["cpu_us_per_pair_proxy"] / 2
        return row
    if load in ("stream", "tools"):
        mode = "burst" if load == "stream" else "tools"
        return await throughput(route, concurrency=concurrency, n=n, seconds=seconds, measure=measure, mode=mode)
    spec = StreamSpec(mode="tools", n=TOOL_TURN) if load == "tool-turns" else StreamSpec(mode="burst", n=20)
    row = await chat_turns(route, concurrency=concurrency, spec=spec, new=load != "turns-warm", seconds=seconds, measure=measure)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.splitlines()[0])
    parser.add_argument("--route", choices=("gateway", "passthrough"), default="gateway")
    parser.add_argument("--transport", choices=("sse", "ws", "ws-sse"), default="sse",
                        help="sse: POST /api/chat; ws: /api/chat/ws in live mode; ws-sse: /api/chat/ws over /run_sse")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--events", type=int, default=500, help="events a stream (--load stream, tools: default 500, 3030)")
    parser.add_argument("--load", choices=("stream", "tools", "turns-new", "turns-warm", "tool-turns", "pairs"), default="stream",
                        help="stream: the saturation phase's; the others: issue 18's agentic phases (SSE)")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--native", action="store_true", help="include native (C) frames")
    parser.add_argument("--blocking", action="store_true",
                        help="pause the proxy for each sample: exact stacks (without it, a sample taken while the proxy runs "
                        "can join frames of two moments), at the price of a slower proxy")
    args = parser.parse_args()
    if args.load != "stream" and args.transport != "sse":
        parser.error("--load other than stream is SSE only")
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        parser.error("py-spy is not installed: .venv/bin/pip install py-spy")
    out = args.out or Path(tempfile.mkdtemp(prefix="adk-gateway-profile-"))
    out.mkdir(parents=True, exist_ok=True)
    procs.raise_fd_limit()
    fake = procs.start_fake(out)
    try:
        mode = "live" if args.transport == "ws" else "sse"
        internal = (f"http://127.0.0.1:{procs.free_port()}", secrets.token_urlsafe(16))
        if args.route == "gateway":
            # Approval pairs need a gated tool in the policy and the plugin's internal listener.
            extra = _approval_extra(int(internal[0].rsplit(":", 1)[1]), internal[1]) if args.load == "pairs" else ""
            proxy = procs.start_gateway(out, fake.base, mode=mode, extra=extra)
            kind = "gw-sse" if args.transport == "sse" else "gw-ws"
        else:
            proxy = procs.start_passthrough(out, fake.base)
            kind = "adk-sse" if args.transport == "sse" else "adk-ws"
        try:
            route = Route(args.route, kind, proxy.base, proxy)
            name = f"{args.route}-{args.transport}" + ("" if args.load == "stream" else f"-{args.load}")
            collapsed = out / f"{name}.collapsed"
            extra = (["--native"] if args.native else []) + ([] if args.blocking else ["--nonblocking"])
            spies = [
                subprocess.Popen([spy, "record", "--pid", str(proxy.popen.pid), "--rate", str(args.rate), "--format", "raw",
                                  "-o", str(collapsed), "--duration", str(int(args.seconds)), *extra],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
            ]
            events = 3030 if args.load == "tools" and args.events == 500 else args.events
            row = asyncio.run(_load(route, fake, args.seconds, args.concurrency, events, args.load, internal))
            for s in spies:
                s.wait(timeout=args.seconds + 30)
            per_turn = f", {row['cpu_us_per_turn_proxy']:.0f} us per turn" if "cpu_us_per_turn_proxy" in row else ""
            print(f"{name} ({args.load}): {row['events_per_s']:.0f} events/s, {row['cpu_us_per_event_proxy']:.2f} us CPU per event"
                  f"{per_turn} (sampling slows it a little)")
            if collapsed.exists():
                print(summarise(collapsed))
                print(f"\ncollapsed stacks (speedscope.app or flamegraph.pl read them): {collapsed}")
        finally:
            proxy.stop()
    finally:
        fake.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
