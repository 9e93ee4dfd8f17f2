"""The run log: followers read every chunk once, in order, whenever they attach."""

from __future__ import annotations

import asyncio

import pytest

from gateway.runs import FollowerLagged, Response, Run, RunState


async def collect(response: Response, start: int = 0) -> list[bytes]:
    out: list[bytes] = []
    async for batch in response.follow(start):
        out.extend(batch)
    return out


async def test_live_and_late_followers_see_the_same_response() -> None:
    run = Run("m1")
    early = asyncio.create_task(collect(run.current))
    run.publish([b"a", b"b"])
    await asyncio.sleep(0)
    run.publish([b"c"])
    assert run.unread() is run.current
    late = asyncio.create_task(collect(run.current))
    await asyncio.sleep(0)
    run.end_response(waiting=False, now=10)
    assert await early == [b"a", b"b", b"c"]
    assert await late == [b"a", b"b", b"c"]
    assert run.state is RunState.DONE and not run.streaming
    assert run.unread() is None  # read whole
    # A reconnecting browser cannot say what reached it: recent responses are replayed.
    assert run.resumable(now=15, retention=60) is run.current
    assert run.resumable(now=71, retention=60) is None


async def test_a_waiting_run_continues_in_a_new_response_without_moving_old_followers() -> None:
    run = Run("m1")
    first = run.current
    run.publish([b"x"])
    run.end_response(waiting=True, now=0)
    assert run.state is RunState.WAITING and not run.streaming
    second = run.next_response()
    assert run.streaming and second is run.current
    run.publish([b"y"])
    run.end_response(waiting=False, now=0)
    assert await collect(first) == [b"x"]
    assert await collect(second) == [b"y"]


async def test_a_response_cut_off_mid_way_is_still_unread() -> None:
    run = Run("m1")
    run.publish([b"x", b"y"])
    follower = run.current.follow()
    assert await follower.__anext__() == [b"x", b"y"]
    await follower.aclose()  # the browser went away before the end
    run.end_response(waiting=False, now=0)
    assert run.unread() is run.current
    await collect(run.current)
    assert run.unread() is None


async def test_bounded_log_drops_old_chunks_and_tells_slow_followers() -> None:
    run = Run("m1", limit=100)
    run.publish([b"%d" % i for i in range(150)])
    run.end_response(waiting=False, now=0)
    with pytest.raises(FollowerLagged):
        await collect(run.current)
    assert run.unread() is None and run.resumable(now=0, retention=60) is None
    assert (await collect(run.current, start=100))[0] == b"100"


async def test_cancelled_follower_does_not_break_publishing() -> None:
    run = Run("m1")
    task = asyncio.create_task(collect(run.current))
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    run.publish([b"z"])
    run.end_response(waiting=False, now=0)
    assert await collect(run.current) == [b"z"]
