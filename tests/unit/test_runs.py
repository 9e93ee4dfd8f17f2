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
    assert run.resumable() is run.current
    late = asyncio.create_task(collect(run.current))
    await asyncio.sleep(0)
    run.end_response(waiting=False)
    assert await early == [b"a", b"b", b"c"]
    assert await late == [b"a", b"b", b"c"]
    assert run.state is RunState.DONE and not run.streaming
    assert run.resumable() is None  # complete and delivered


async def test_a_waiting_run_continues_in_a_new_response_without_moving_old_followers() -> None:
    run = Run("m1")
    first = run.current
    run.publish([b"x"])
    run.end_response(waiting=True)
    assert run.state is RunState.WAITING and not run.streaming
    second = run.next_response()
    assert run.streaming and second is run.current
    run.publish([b"y"])
    run.end_response(waiting=False)
    assert await collect(first) == [b"x"]
    assert await collect(second) == [b"y"]


async def test_an_unread_complete_response_is_still_resumable() -> None:
    run = Run("m1")
    run.publish([b"x"])
    run.end_response(waiting=False)
    assert run.resumable() is run.current
    await collect(run.current)
    assert run.resumable() is None


async def test_bounded_log_drops_old_chunks_and_tells_slow_followers() -> None:
    run = Run("m1", limit=100)
    run.publish([b"%d" % i for i in range(150)])
    run.end_response(waiting=False)
    with pytest.raises(FollowerLagged):
        await collect(run.current)
    assert run.resumable() is None
    assert (await collect(run.current, start=100))[0] == b"100"


async def test_cancelled_follower_does_not_break_publishing() -> None:
    run = Run("m1")
    task = asyncio.create_task(collect(run.current))
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    run.publish([b"z"])
    run.end_response(waiting=False)
    assert await collect(run.current) == [b"z"]
