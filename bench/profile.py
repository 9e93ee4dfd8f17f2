"""Profile a proxy under saturation load with py-spy, and summarise where its CPU goes.

    .venv/bin/pip install py-spy
    python -m bench.profile --route gateway --transport sse --seconds 10 --out /tmp/prof

Starts the fake upstream and the chosen proxy, drives the same load as the saturation phase of
`python -m bench`, samples the proxy with `py-spy record` (collapsed stacks), then prints the hottest functions by
self time and by inclusive time, with file:line.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from . import procs
from .clients import Route
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


async def _load(route: Route, fake: procs.Proc, seconds: float, concurrency: int, n: int) -> dict:
    return await throughput(route, concurrency=concurrency, n=n, seconds=seconds, measure={"proxy": route.proc, "upstream": fake})


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.splitlines()[0])
    parser.add_argument("--route", choices=("gateway", "passthrough"), default="gateway")
    parser.add_argument("--transport", choices=("sse", "ws", "ws-sse"), default="sse",
                        help="sse: POST /api/chat; ws: /api/chat/ws in live mode; ws-sse: /api/chat/ws over /run_sse")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--events", type=int, default=500)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--native", action="store_true", help="include native (C) frames")
    args = parser.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        parser.error("py-spy is not installed: .venv/bin/pip install py-spy")
    out = args.out or Path(tempfile.mkdtemp(prefix="adk-gateway-profile-"))
    out.mkdir(parents=True, exist_ok=True)
    procs.raise_fd_limit()
    fake = procs.start_fake(out)
    try:
        mode = "live" if args.transport == "ws" else "sse"
        if args.route == "gateway":
            proxy = procs.start_gateway(out, fake.base, mode=mode)
            kind = "gw-sse" if args.transport == "sse" else "gw-ws"
        else:
            proxy = procs.start_passthrough(out, fake.base)
            kind = "adk-sse" if args.transport == "sse" else "adk-ws"
        try:
            route = Route(args.route, kind, proxy.base, proxy)
            name = f"{args.route}-{args.transport}"
            collapsed = out / f"{name}.collapsed"
            extra = ["--native"] if args.native else []
            spies = [
                subprocess.Popen([spy, "record", "--pid", str(proxy.popen.pid), "--rate", str(args.rate), "--format", "raw",
                                  "-o", str(collapsed), "--duration", str(int(args.seconds)), "--nonblocking", *extra],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
            ]
            row = asyncio.run(_load(route, fake, args.seconds, args.concurrency, args.events))
            for s in spies:
                s.wait(timeout=args.seconds + 30)
            print(f"{name}: {row['events_per_s']:.0f} events/s, {row['cpu_us_per_event_proxy']:.2f} us CPU per event "
                  f"(sampling slows it a little)")
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
