"""The gateway's instructions per upstream event, counted by valgrind (callgrind): a measure that
does not move with the machine's load, for A/B decisions while other work shares the CPUs.

    python -m bench.instructions --shapes text,tools new= old=ADK_GATEWAY_LOOP=asyncio

Each variant (`name=ENV=VALUE;ENV2=VALUE`, as in bench.variants; `GATEWAY_ROOT=DIR` runs the
`gateway` package found in DIR, e.g. an older commit's `git archive`) is a gateway started under
`valgrind --tool=callgrind` with that environment; it serves `--small` and then, in a second
process, `--large` streams of each shape (`--concurrency` at once, after the same warm-up), and
stops with SIGTERM so callgrind writes its counts. (large - small) / (the events between them)
is the instructions per event (per turn for `newchat`: each turn a new chat's first, a short
answer): start-up, imports and the warm-up cancel out. Everything in the
process counts (the event loop, aiohttp, the gateway, the collector), the kernel does not.
Slow: valgrind runs the gateway ~50x slower; a shape and a variant take about a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import sys
import tempfile
from pathlib import Path

from . import procs
from .clients import Route
from .agentic import chat_turns
from .events import StreamSpec
from .scenarios import throughput

# `newchat`: turns that each open a new chat (a fresh chat id), of a short burst answer, counted per
# turn rather than per event: the per-turn path (body, chat, session, admission, the response's set-up).
NEW_CHAT_EVENTS = 20  # the ttft phase's turn (Sizes.turn_events)

SHAPES = {"text": ("text", 2001), "tools": ("tools", 3030), "burst": ("burst", 500), "newchat": ("newchat", NEW_CHAT_EVENTS)}


def _instructions(out: Path) -> int:
    text = out.read_text(errors="replace")
    found = re.search(r"^(?:summary|totals):\s*(\d+)", text, re.M)
    if not found:
        raise RuntimeError(f"no instruction total in {out}")
    return int(found.group(1))


def _run(workdir: Path, fake: procs.Proc, env: dict[str, str], tag: str, mode: str, n: int, streams: int, concurrency: int) -> tuple[int, int]:
    port = procs.free_port()
    path = workdir / f"{tag}.yaml"
    # GATEWAY_ROOT in a variant's environment: the gateway package of another checkout (old code).
    root = env.get("GATEWAY_ROOT")
    # An older gateway refuses a setting it does not know.
    known = not root or "auto_create_session" in (Path(root) / "gateway" / "config" / "agent.py").read_text(encoding="utf-8")
    path.write_text(procs.gateway_yaml(port, fake.base, auto_create_session=True if known else None))
    out = workdir / f"{tag}.callgrind"
    gateway = ["-m", "gateway"] if not root else [
        "-c", f"import sys, runpy; sys.path.insert(0, {root!r}); runpy.run_module('gateway', run_name='__main__')",
    ]
    argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, *gateway, "serve", "--config", str(path)]
    proc = procs.start(tag, argv, port, workdir, health="/healthz", env=env, wait=False, graceful=True)
    try:
        procs.ready(proc, timeout=600.0)
        route = Route(tag, "gw-sse", proc.base, proc)
        if mode == "newchat":
            row = asyncio.run(chat_turns(
                route, concurrency=concurrency, spec=StreamSpec(mode="burst", n=n), new=True, seconds=1e9,
                measure={"proxy": proc}, tag=tag, max_turns=streams,
            ))
            events = row["turns"]  # counted per turn
        else:
            row = asyncio.run(throughput(route, concurrency=concurrency, n=n, seconds=1e9, max_streams=streams, mode=mode, tag=tag))
            events = row["events"]
        if row["failed"] or row["errors"]:
            raise RuntimeError(f"{tag}: {row['failed']} streams failed")
    finally:
        proc.popen.terminate()
        proc.popen.wait(timeout=600)
    return _instructions(out), events


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="text,tools", help=f"comma-separated: {', '.join(SHAPES)}")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--small", type=int, default=4, help="streams in the first process")
    parser.add_argument("--large", type=int, default=12, help="streams in the second process")
    parser.add_argument("variants", nargs="+", help="name=ENV=VALUE;ENV2=VALUE (empty after = for none)")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        parser.error("valgrind is not installed (apt-get install valgrind)")
    workdir = Path(tempfile.mkdtemp(prefix="bench-instructions-"))
    procs.raise_fd_limit()
    fake = procs.start_fake(workdir)
    try:
        for shape in (s for s in args.shapes.split(",") if s):
            mode, n = SHAPES[shape]
            for variant in args.variants:
                name, _, spec = variant.partition("=")
                env = dict(kv.partition("=")[::2] for kv in spec.split(";") if kv)
                small, small_events = _run(workdir, fake, env, f"{name}-{shape}-s", mode, n, args.small, args.concurrency)
                large, large_events = _run(workdir, fake, env, f"{name}-{shape}-l", mode, n, args.large, args.concurrency)
                per_event = (large - small) / (large_events - small_events)
                unit = "turn" if mode == "newchat" else "event"
                print(f"{shape:6} {name:12} {per_event:10.0f} instructions per {unit} "
                      f"({large_events - small_events} {unit}s; {small} / {large} instructions in all)", flush=True)
    finally:
        fake.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
