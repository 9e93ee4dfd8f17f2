"""Memory per chat the gateway keeps between turns: RSS per finished chat (docs/scaling.md "Sizing").

    python -m bench.kept_chats --chats 2000

A chat is kept for `chat.idle_chat_ttl` (1 h) after its last request, and its last response for
`chat.run_retention` (60 s) for resume. A fresh fake ADK and gateway (`chat.run_retention: 2s`
here, so both states are seen in one run); `--warm` chats of one 20-event turn each, RSS; `--chats`
more, RSS at once (each with its response kept), then again once run_retention has passed. RSS
does not fall then: CPython keeps the freed memory for the next chats' responses, so the first
figure is what a steady stream of new chats costs per chat kept. The `idle` phase of
`python -m bench` gives the other figure, per held stream.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

from . import procs
from .agentic import ChatTurns
from .clients import Route, Sink, client_session
from .events import StreamSpec
from .scenarios import _settled_rss

_RETENTION_S = 2.0


async def _turns(route: Route, count: int, tag: str, spec: StreamSpec) -> int:
    """`count` new chats of one turn each, 50 at a time; how many ended well."""
    done = 0
    sem = asyncio.Semaphore(50)
    async with client_session() as http:

        async def one(i: int) -> None:
            nonlocal done
            async with sem:
                chat = ChatTurns(route, http, f"{tag}-{i}", new=False)
                if await chat.turn(spec, Sink()):
                    done += 1

        await asyncio.gather(*(one(i) for i in range(count)))
    return done


async def measure(workdir: Path, *, chats: int, warm: int, events: int) -> dict[str, Any]:
    fake = procs.start_fake(workdir, "kept-fake")
    gateway = procs.start_gateway(
        workdir, fake.base, name="kept-gateway",
        extra=f"chat:\n  run_retention: {_RETENTION_S}s\n  idle_chat_ttl: 1h\n",
    )
    try:
        route = Route("gateway", "gw-sse", gateway.base, gateway)
        spec = StreamSpec(mode="burst", n=events)
        warm_done = await _turns(route, warm, "kept-warm", spec)
        await asyncio.sleep(_RETENTION_S + 1)
        rss0 = await _settled_rss(gateway)
        done = await _turns(route, chats, "kept", spec)
        rss_with_responses = await _settled_rss(gateway)
        await asyncio.sleep(_RETENTION_S + 1)  # the retained responses dropped
        rss_after_retention = await _settled_rss(gateway, 2.0)
        n = max(done, 1)
        return {
            "chats": chats, "done": done, "warm": warm, "warm_done": warm_done, "events_per_turn": events,
            "rss_before": rss0, "rss_with_responses": rss_with_responses, "rss_after_retention": rss_after_retention,
            "kib_per_chat": (rss_with_responses - rss0) / 1024 / n,
            "kib_per_chat_after_retention": (rss_after_retention - rss0) / 1024 / n,
        }
    finally:
        gateway.stop()
        fake.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chats", type=int, default=2000)
    parser.add_argument("--warm", type=int, default=100)
    parser.add_argument("--events", type=int, default=20, help="events in each chat's turn")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-kept-") as tmp:
        row = asyncio.run(measure(Path(tmp), chats=args.chats, warm=args.warm, events=args.events))
    print(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
