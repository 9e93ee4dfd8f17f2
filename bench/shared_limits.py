"""The cost of per-user limits shared by the replicas through Redis (issue 28): the `limits` phase.

Two gateways on the fake upstream, alike but for `sessions.backend`: memory (the limits counted in
the process) and redis (a real redis-server on a loopback port: each user's token bucket and stream
slots counted there, edge/limiter.py). Measured on each:

- the cheapest admitted request (`GET /api/agents`: identity, then the rate check, nothing else):
  requests per second and gateway CPU per request, and on the shared one the Redis script calls
  per request (INFO commandstats: one EVALSHA each, the bucket's script) and Redis's own CPU;
- new-chat turns (the agentic shape's short turn): turns per second, gateway CPU per turn, and the
  shared limits' Redis round trips per turn (the gateway's `adk_gateway_shared_limit_checks_total`
  rate checks, each of which took the stream slot in the same script, plus the slot's release). The redis gateway's turns also pay the chat directory's round trips:
  the limits' part of the difference is the round trips times the per-request cost above.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any


from . import procs
from .agentic import chat_turns
from .clients import Route, client_session
from .events import StreamSpec
from .procs import Proc
from .scenarios import CpuWindow

__all__ = ["limits_phase", "limits_table"]

_CHECKS = "adk_gateway_shared_limit_checks_total"


def _start_redis(workdir: Path) -> tuple[Proc, int]:
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    port = procs.free_port()
    log = workdir / "limits-redis.log"
    with log.open("w") as out:
        popen = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(workdir)],
            stdout=out, stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 10
    while _redis(port, b"PING") != b"+PONG\r\n":
        if time.monotonic() > deadline or popen.poll() is not None:
            popen.kill()
            raise RuntimeError(f"redis-server did not start:\n{log.read_text()[-2000:]}")
        time.sleep(0.05)
    return Proc("limits-redis", popen, f"redis://127.0.0.1:{port}/0", log), port


def _redis(port: int, command: bytes) -> bytes:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(command + b"\r\n")
            data = sock.recv(65536)
            if data.startswith(b"$"):  # a bulk reply: read it whole
                size = int(data[1:data.index(b"\r\n")])
                while len(data) < data.index(b"\r\n") + 2 + size + 2:
                    data += sock.recv(65536)
            return data
    except OSError:
        return b""


def _calls(port: int) -> dict[str, int]:
    """Redis's calls so far, by command (INFO commandstats)."""
    out = {}
    for line in _redis(port, b"INFO commandstats").decode(errors="replace").splitlines():
        if line.startswith("cmdstat_"):
            name, _, rest = line.partition(":")
            out[name.removeprefix("cmdstat_")] = int(rest.split("calls=")[1].split(",")[0])
    return out


def _metric(base: str, name: str, label: str) -> float:
    with urllib.request.urlopen(base + "/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return sum(
        float(line.rpartition(" ")[2]) for line in text.splitlines() if line.startswith(name + "{") and label in line
    )


async def _cheap_requests(gateway: Proc, redis: Proc | None, concurrency: int, seconds: float) -> dict[str, Any]:
    measure = {"proxy": gateway} if redis is None else {"proxy": gateway, "redis": redis}
    count = {"ok": 0, "other": 0}
    async with client_session() as http:

        async def one() -> None:
            async with http.get(gateway.base + "/api/agents") as reply:
                await reply.read()
                count["ok" if reply.status == 200 else "other"] += 1

        await asyncio.gather(*(one() for _ in range(concurrency)))  # connections pooled, unmeasured
        count.update(ok=0, other=0)
        window = CpuWindow(measure)
        deadline = time.perf_counter() + seconds
        window.start()

        async def worker() -> None:
            while True:
                await one()
                if time.perf_counter() >= deadline:
                    return

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        cpu = window.stop()
    done = max(count["ok"], 1)
    row = {
        "requests": count["ok"], "refused": count["other"], "requests_per_s": count["ok"] / cpu["wall_s"],
        "cpu_us_per_request_proxy": cpu["cpu_s_proxy"] * 1e6 / done,
    }
    if redis is not None:
        row["cpu_us_per_request_redis"] = cpu["cpu_s_redis"] * 1e6 / done
    return row


async def limits_phase(workdir: Path, sizes: Any, log: Any) -> dict[str, Any]:
    redis, port = _start_redis(workdir)
    fake = procs.start_fake(workdir, "limits-fake", wait=False)
    shared_extra = (
        f"sessions:\n  backend: redis\n  redis_url: {redis.base}\n  secret: {secrets.token_hex(24)}\n"
    )
    local = procs.start_gateway(workdir, fake.base, name="limits-local", wait=False)
    shared = procs.start_gateway(workdir, fake.base, name="limits-shared", extra=shared_extra, wait=False)
    everything = [fake, local, shared]
    procs.ready(*everything)
    results: dict[str, Any] = {}
    try:
        await asyncio.sleep(0.5)  # the redis gateway's first heartbeats
        concurrency = max(sizes.turns_concurrency)
        seconds = max(sizes.turns_seconds, 0.2)
        cheap: dict[str, Any] = {}
        for name, gateway in (("local", local), ("shared", shared)):
            before = _calls(port)
            cheap[name] = row = await _cheap_requests(gateway, redis if gateway is shared else None, concurrency, seconds)
            if gateway is shared:
                after = _calls(port)
                # The unmeasured first request of each connection counts too.
                sent = max(row["requests"] + row["refused"] + concurrency, 1)
                row["redis_evalsha_per_request"] = (after.get("evalsha", 0) - before.get("evalsha", 0)) / sent
            log(f"  GET /api/agents {name:6} x{concurrency:<3} {row['requests_per_s']:>8.0f} req/s "
                f"{row['cpu_us_per_request_proxy']:6.0f} us/req"
                + (f"  redis {row['cpu_us_per_request_redis']:5.1f} us/req, {row['redis_evalsha_per_request']:.2f} scripts/req"
                   if gateway is shared else ""))
        results["cheap_request"] = cheap
        turns: dict[str, Any] = {}
        spec = StreamSpec(mode="burst", n=sizes.turn_events)
        for name, gateway in (("local", local), ("shared", shared)):
            # A POST's token and slot are one script, counted once per check: its rate checks are
            # its round trips, plus the slot's release (HDEL).
            checks, before = _metric(gateway.base, _CHECKS, 'check="rate"'), _calls(port)
            row = await chat_turns(
                Route("gateway", "gw-sse", gateway.base, gateway), concurrency=concurrency, spec=spec, new=True,
                seconds=seconds, measure={"proxy": gateway, "upstream": fake}, tag=f"limits-{name}",
            )
            if gateway is shared:
                after = _calls(port)
                # The chat_turns' warm-up turns count too: per turn, over every turn sent.
                sent = max(row["turns"] + concurrency, 1)
                row["limit_round_trips_per_turn"] = (
                    _metric(gateway.base, _CHECKS, 'check="rate"') - checks + after.get("hdel", 0) - before.get("hdel", 0)
                ) / sent
                row["redis_commands_per_turn"] = (sum(after.values()) - sum(before.values())) / sent
            turns[name] = row
            log(f"  new-chat turns  {name:6} x{concurrency:<3} {row['turns_per_s']:>8.0f} turns/s "
                f"{row['cpu_us_per_turn_proxy']:6.0f} us/turn"
                + (f"  limits {row['limit_round_trips_per_turn']:.2f} Redis round trips/turn "
                   f"(of {row['redis_commands_per_turn']:.1f} commands)" if gateway is shared else "")
                + f"  failed={row['failed']}")
        results["new_chat_turns"] = turns
    finally:
        for proc in (shared, local, fake, redis):
            proc.stop()
    return results


def limits_table(results: dict[str, Any]) -> list[str]:
    data = results.get("limits")
    if not data:
        return []
    lines = ["", "Per-user limits shared through Redis (limits phase: backend memory = local, redis = shared)"]
    cheap = data.get("cheap_request", {})
    if cheap:
        local, shared = cheap.get("local", {}), cheap.get("shared", {})
        lines.append(
            f"  GET /api/agents: local {local.get('requests_per_s', 0):.0f} req/s {local.get('cpu_us_per_request_proxy', 0):.0f} us/req;"
            f" shared {shared.get('requests_per_s', 0):.0f} req/s {shared.get('cpu_us_per_request_proxy', 0):.0f} us/req"
            f" (+ Redis {shared.get('cpu_us_per_request_redis', 0):.1f} us), {shared.get('redis_evalsha_per_request', 0):.2f} round trips/req"
        )
    turns = data.get("new_chat_turns", {})
    if turns:
        local, shared = turns.get("local", {}), turns.get("shared", {})
        lines.append(
            f"  new-chat turns: local {local.get('turns_per_s', 0):.0f} turns/s {local.get('cpu_us_per_turn_proxy', 0):.0f} us/turn;"
            f" redis {shared.get('turns_per_s', 0):.0f} turns/s {shared.get('cpu_us_per_turn_proxy', 0):.0f} us/turn,"
            f" of which the limits' {shared.get('limit_round_trips_per_turn', 0):.2f} round trips (token and slot, release)"
            f" (the rest: the chat directory's, {shared.get('redis_commands_per_turn', 0):.1f} Redis commands in all)"
        )
    return lines
