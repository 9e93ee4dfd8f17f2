"""Every stop path is bounded: a task that swallows its cancellation, or a close that never
returns, costs the bound and is logged, and the process exits whatever its tasks do."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace
from typing import Any

from gateway.ops.tracing import Tracing
from gateway.cluster.memory import MemoryHub, MemoryState
from gateway.cluster.relay import RelayFeed
from gateway.cluster.router import Cluster
from gateway.cluster.shared import RelayEntry
from gateway.config.schema import GatewayConfig
from gateway.ops.metrics import GatewayMetrics
from gateway.core.protocol import encode_chunk
from gateway.edge.server import stop_listeners
from gateway.ops.stopping import cancel_and_wait, within


async def _stubborn(swallow: int, released: asyncio.Event | None = None) -> None:
    """Swallows its first `swallow` cancellations (all of them until `released`), as a Redis call
    under wait_for can on 3.11. Released, the next cancellation ends it, so the test's loop can close."""
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            if swallow == 0 or (released is not None and released.is_set()):
                raise
            swallow -= 1


async def test_cancel_and_wait_returns_what_would_not_stop_within_the_bound() -> None:
    released = asyncio.Event()
    quick = asyncio.create_task(_stubborn(0), name="quick")
    stuck = asyncio.create_task(_stubborn(1_000_000, released), name="stuck")
    await asyncio.sleep(0)
    started = time.monotonic()
    left = await cancel_and_wait({quick, stuck}, 0.2, what="test")
    assert time.monotonic() - started < 1.0
    assert left == {stuck} and quick.cancelled()
    released.set()


async def test_within_gives_up_on_work_that_ignores_its_cancellation() -> None:
    released = asyncio.Event()
    started = time.monotonic()
    assert await within(_stubborn(1_000_000, released), 0.2, what="test") is False
    assert time.monotonic() - started < 2.0
    assert await within(asyncio.sleep(0), 1.0, what="test") is True
    released.set()


async def test_within_reports_a_failing_step_instead_of_raising() -> None:
    async def broken() -> None:
        raise RuntimeError("boom")

    assert await within(broken(), 1.0, what="test") is False


async def test_stop_listeners_goes_on_when_a_runner_cleanup_hangs() -> None:
    cleaned: list[str] = []
    released = asyncio.Event()

    class Runner:
        def __init__(self, name: str, hang: bool) -> None:
            self.name, self.hang = name, hang

        async def cleanup(self) -> None:
            if self.hang:
                await _stubborn(1_000_000, released)
            cleaned.append(self.name)

    loop = asyncio.get_running_loop()
    started = time.monotonic()
    await stop_listeners([Runner("public", True), Runner("internal", False)], loop.time() + 0.3)  # type: ignore[list-item]
    assert time.monotonic() - started < 3.0
    assert cleaned == ["internal"]  # the internal listener still stopped, after the stuck one
    released.set()


def test_the_watchdog_ends_a_process_whose_stop_hangs() -> None:
    script = textwrap.dedent("""
        import time
        from gateway.edge.server import StopWatchdog
        StopWatchdog(0.3).start()
        time.sleep(60)  # a stop that never ends, with the event loop itself stuck
    """)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert time.monotonic() - started < 20
    assert "stop_forced" in proc.stdout + proc.stderr


# ---- a relayed response ends once ----------------------------------------------------------


def _cluster(hub: MemoryHub) -> Cluster:
    config = GatewayConfig.model_validate({"sessions": {"heartbeat_interval": "50ms", "owner_timeout": "100ms"}})
    # A stand-in chat service: the cluster attaches its ports (chat/ports.py), takes its faces to the
    # remote gate and the approval desk, and asks for nothing else here.
    chats: Any = SimpleNamespace(
        config=config, states=SimpleNamespace(), tracing=Tracing.off(), attach=lambda **ports: None,
        gates=SimpleNamespace(), desk_view=SimpleNamespace(),
    )
    return Cluster(MemoryState("b", hub), chats, GatewayMetrics())


async def _read(feed: RelayFeed) -> list[bytes]:
    frames: list[bytes] = []
    async for batch in feed.follow(0):
        frames += batch
    return frames


async def test_a_relay_cut_after_its_finish_adds_no_second_terminal_chunk() -> None:
    """The owner ended the response, then stopped before writing the relay's end (issue 13, defect 3)."""
    hub = MemoryHub()
    cluster = _cluster(hub)
    finish = [encode_chunk({"type": "error", "errorText": "shutting down"}), encode_chunk({"type": "finish"})]
    await cluster.state.relay_append("k", RelayEntry(0, [encode_chunk({"type": "start"}), *finish]))
    frames = await asyncio.wait_for(_read(cluster.relays.feed("a", "k", "u")), 5)  # "a" has no heartbeat: dead
    assert frames == [encode_chunk({"type": "start"}), *finish]


async def test_a_relay_cut_mid_response_ends_with_one_error_then_finish() -> None:
    hub = MemoryHub()
    cluster = _cluster(hub)
    await cluster.state.relay_append("k", RelayEntry(0, [encode_chunk({"type": "start"})]))
    frames = await asyncio.wait_for(_read(cluster.relays.feed("a", "k", "u")), 5)
    assert frames[0] == encode_chunk({"type": "start"})
    # As a local run's error ends (nothing was open after `start`): one error, then finish.
    assert [f[:16] for f in frames[1:]] == [b'{"type":"error",', b'{"type":"finish"']
