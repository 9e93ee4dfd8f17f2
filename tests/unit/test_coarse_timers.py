"""Long timers on one loop timer: never early, at most a tick late, cancellable; a held SSE
stream's keep-alive and a held run's idle timeout are filed there, not on the loop one each."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aiohttp.test_utils import TestClient

from gateway.edge.state import GATEWAY
from gateway.ops.coarse_timers import CoarseTimers
from gateway.upstream.idle_reader import IdleReader
from tests.support.adk import ScriptedAdk
from tests.support.waiting import until
from tests.unit.test_transport_stop import USER, adk, chat_body, client

__all__ = ["adk", "client"]  # the fixtures, used by name

TICK = 0.05


async def test_timers_fire_in_their_tick_never_early_and_a_cancelled_one_never() -> None:
    loop = asyncio.get_running_loop()
    timers = CoarseTimers(tick=TICK, short=0.0)
    fired: dict[str, float] = {}
    start = loop.time()
    due = {"a": start + 0.12, "b": start + 0.12, "c": start + 0.3}
    handles = {name: timers.call_at(when, lambda name=name: fired.setdefault(name, loop.time())) for name, when in due.items()}
    gone = timers.call_at(start + 0.1, lambda: fired.setdefault("gone", loop.time()))
    assert len(timers) == 4
    gone.cancel()
    gone.cancel()  # twice: nothing
    assert len(timers) == 3
    for _ in range(300):
        if len(fired) == 3:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)  # and nothing else fires
    assert sorted(fired) == ["a", "b", "c"]
    for name, when in due.items():
        assert when - 0.001 <= fired[name] <= when + TICK + 0.5, (name, fired[name] - when)  # late only by load
    assert len(timers) == 0
    handles["a"].cancel()  # after it fired: nothing


async def test_a_timer_due_sooner_than_short_goes_to_the_loop() -> None:
    loop = asyncio.get_running_loop()
    timers = CoarseTimers(tick=10.0, short=1.0)
    handle = timers.call_at(loop.time() + 0.01, lambda: None)
    assert isinstance(handle, asyncio.TimerHandle) and len(timers) == 0
    handle.cancel()


async def test_a_failing_callback_does_not_keep_the_others_of_its_tick_from_firing() -> None:
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    try:
        timers = CoarseTimers(tick=TICK, short=0.0)
        fired: list[str] = []

        def boom() -> None:
            raise RuntimeError("boom")

        when = loop.time() + 0.06
        timers.call_at(when, boom)
        timers.call_at(when, lambda: fired.append("after"))
        for _ in range(300):
            if fired:
                break
            await asyncio.sleep(0.01)
        assert fired == ["after"]
        assert [type(e["exception"]) for e in errors] == [RuntimeError]
    finally:
        loop.set_exception_handler(None)


async def test_an_idle_reader_on_coarse_timers_times_out_once_silent_for_its_idle() -> None:
    loop = asyncio.get_running_loop()
    content = aiohttp.StreamReader(_Protocol(), 2**16, loop=loop)
    timers = CoarseTimers(tick=TICK, short=0.0)
    reader = IdleReader(content, 0.2, timers=timers)
    content.feed_data(b"data: 1\n\n")
    assert await reader.read() == b"data: 1\n\n"
    assert len(timers) == 1  # its idle timer is filed there, not on the loop
    started = loop.time()
    try:
        await reader.read()  # in this task: the reader cancels the task that made it
    except TimeoutError:
        waited = loop.time() - started
    else:  # pragma: no cover - the assertion below says it
        waited = -1.0
    reader.close()
    assert 0.15 <= waited <= 0.2 + TICK + 0.6, waited  # late only by load
    assert len(timers) == 0


async def test_a_held_sse_stream_files_its_keepalive_on_the_gateway_timers(client: TestClient, adk: ScriptedAdk) -> None:
    # One loop timer each (~540 bytes on uvloop) on every held stream: docs/performance.md, idle.
    timers = client.app[GATEWAY].timers  # type: ignore[index]
    assert len(timers) == 0
    response = await client.post("/api/chat", json=chat_body(USER))
    assert response.status == 200
    adk.says("Once ")
    assert b"text-delta" in await response.content.readuntil(b"text-delta")
    await until(lambda: len(timers) == 1)  # the follower parked: its keep-alive is filed
    adk.ends()
    assert (await response.text()).endswith("data: [DONE]\n\n")
    assert len(timers) == 0  # the follower's end took its keep-alive out


class _Protocol:
    """What aiohttp's StreamReader asks of its protocol (flow control), doing nothing."""

    _reading_paused = False
    connected = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass
