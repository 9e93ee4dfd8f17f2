"""Where a proxy's memory per held connection goes: tracemalloc snapshots around N held connections.

    python -m bench.memprofile --route gateway --transport sse --count 500

Runs the proxy (the gateway, or the bare passthrough) under tracemalloc in a child process,
holds `--warm` connections, snapshots, holds `--count` more, snapshots again, and prints the
allocation sites that grew, per connection, with file:line (Python-level allocations only: what
C code allocates outside Python's allocators, and kernel socket buffers, are not seen here, but
are in the RSS figures of `python -m bench`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from . import procs
from .clients import Route
from .scenarios import idle

_CHILD_ENV = "BENCH_MEMPROFILE_SNAPSHOT"


def _child(argv: list[str]) -> None:
    """Run a proxy; each SIGUSR1 writes a tracemalloc snapshot to $BENCH_MEMPROFILE_SNAPSHOT.<n>."""
    counter = {"n": 0}

    def dump(_signum: int, _frame: object) -> None:
        # Tracing starts at the first snapshot (after start-up and the warm connections): imports
        # under tracemalloc would take minutes, and only what the held connections keep matters.
        if not tracemalloc.is_tracing():
            tracemalloc.start(int(os.environ.get("BENCH_MEMPROFILE_FRAMES", "12")))
        counter["n"] += 1
        path = f"{os.environ[_CHILD_ENV]}.{counter['n']}"
        tracemalloc.take_snapshot().dump(path + ".tmp")
        os.replace(path + ".tmp", path)

    signal.signal(signal.SIGUSR1, dump)
    target, *rest = argv
    sys.argv = [target, *rest]
    if target == "gateway":
        from gateway.cli import main as gateway_main

        sys.exit(gateway_main(rest))
    from .passthrough import main as passthrough_main

    passthrough_main()


def _snapshot(proc: procs.Proc, base: Path, n: int) -> tracemalloc.Snapshot:
    path = Path(f"{base}.{n}")
    os.kill(proc.popen.pid, signal.SIGUSR1)
    deadline = time.monotonic() + 120
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError("no snapshot from the child")
        time.sleep(0.1)
    return tracemalloc.Snapshot.load(str(path))


def _filters() -> list[tracemalloc.Filter]:
    return [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen importlib._bootstrap>")]


async def _hold(route: Route, count: int, warm: int, snap) -> None:  # type: ignore[no-untyped-def]
    await idle(route, count=count, warm=warm, hold_s=600.0, on_measure=snap)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2:])
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench.memprofile", description=__doc__.splitlines()[0])
    parser.add_argument("--route", choices=("gateway", "passthrough"), default="gateway")
    parser.add_argument("--transport", choices=("sse", "ws", "ws-live"), default="sse")
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--warm", type=int, default=50)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--group", choices=("lineno", "traceback", "filename"), default="lineno")
    args = parser.parse_args()
    procs.raise_fd_limit()
    workdir = Path(tempfile.mkdtemp(prefix="adk-gateway-memprofile-"))
    fake = procs.start_fake(workdir)
    snap_base = workdir / "snapshot"
    try:
        port = procs.free_port()
        env = {_CHILD_ENV: str(snap_base)}
        if args.route == "gateway":
            config = workdir / "gateway.yaml"
            mode = "live" if args.transport == "ws-live" else "sse"
            config.write_text(procs.gateway_yaml(port, fake.base, mode=mode))
            argv = [sys.executable, "-m", "bench.memprofile", "--child", "gateway", "serve", "--config", str(config)]
            kind = "gw-sse" if args.transport == "sse" else "gw-ws"
            health = "/healthz"
        else:
            argv = [sys.executable, "-m", "bench.memprofile", "--child", "passthrough", "--port", str(port), "--upstream", fake.base]
            kind = "adk-sse" if args.transport == "sse" else "adk-ws"
            health = "/list-apps"
        proxy = procs.start(f"{args.route}-traced", argv, port, workdir, health=health, env=env)
        try:
            route = Route(args.route, kind, proxy.base, proxy)
            snaps: list[tracemalloc.Snapshot] = []

            def snap() -> None:
                snaps.append(_snapshot(proxy, snap_base, len(snaps) + 1))

            asyncio.run(_hold(route, args.count, args.warm, snap))
            before, after = (s.filter_traces(_filters()) for s in snaps[:2])
            stats = after.compare_to(before, args.group)
            total = sum(s.size_diff for s in stats)
            print(f"{args.route} {args.transport}: {total / args.count / 1024:.1f} KiB of Python allocations per held connection "
                  f"({args.count} connections)\n")
            for stat in stats[: args.top]:
                where = stat.traceback.format()[-1].strip() if args.group != "traceback" else "\n      ".join(stat.traceback.format())
                print(f"  {stat.size_diff / args.count:8.0f} B/conn  {stat.count_diff / args.count:6.1f} blocks/conn  {where}")
        finally:
            proxy.stop()
    finally:
        fake.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
