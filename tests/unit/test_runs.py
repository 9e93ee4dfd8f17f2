"""The run log: followers read every chunk once, in order, whenever they attach."""

from __future__ import annotations

import asyncio

import pytest

from gateway.chat.chunk_log import Feed, FollowerLagged, Reader, Response, Run
from tests.support.service import GONE


async def collect(response: Feed, start: int = 0) -> list[bytes]:
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
    run.end_response(now=10)
    assert await early == [b"a", b"b", b"c"]
    assert await late == [b"a", b"b", b"c"]
    assert not run.streaming
    assert run.unread() is None  # read whole
    # A reconnecting browser cannot say what reached it: recent responses are replayed.
    assert run.resumable(now=15, retention=60).response is run.current  # type: ignore[union-attr]
    assert run.resumable(now=71, retention=60) is None


async def test_a_waiting_run_continues_in_a_new_response_without_moving_old_followers() -> None:
    run = Run("m1")
    first = run.current
    run.publish([b"x"])
    run.end_response(now=0)
    assert not run.streaming
    second = run.next_response()
    assert run.streaming and second is run.current
    run.publish([b"y"])
    run.end_response(now=0)
    assert await collect(first) == [b"x"]
    assert await collect(second) == [b"y"]


async def test_a_response_cut_off_mid_way_is_still_unread() -> None:
    run = Run("m1")
    run.publish([b"x", b"y"])
    follower = run.current.follow()
    assert await follower.__anext__() == [b"x", b"y"]
    await follower.aclose()  # the browser went away before the end
    run.end_response(now=0)
    assert run.unread() is run.current
    await collect(run.current)
    assert run.unread() is None


async def test_bounded_log_drops_old_chunks_and_tells_slow_followers() -> None:
    run = Run("m1", limit=100)
    run.publish([b"%d" % i for i in range(150)])
    run.end_response(now=0)
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
    run.end_response(now=0)
    assert await collect(run.current) == [b"z"]


class _DirectSink:
    """A transport for `follow_direct`: takes frames synchronously unless told it has a backlog."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.direct = 0
        self.backlog = False

    def write_now(self, frames: list[bytes]) -> bool:
        if self.backlog:
            return False
        self.direct += 1
        self.written.extend(frames)
        return True


async def _follow_direct(response: Response, sink: _DirectSink, *, idle: float | None = None, start: int = 0) -> int:
    keepalives = 0
    async for batch in response.follow_direct(sink.write_now, start, idle=idle):
        if not batch:
            keepalives += 1
        sink.written.extend(batch)
        await asyncio.sleep(0)  # an async transport write
    return keepalives


async def test_a_parked_direct_follower_is_written_by_the_publisher_in_order() -> None:
    run = Run("m1")
    run.publish([b"a"])
    sink = _DirectSink()
    task = asyncio.create_task(_follow_direct(run.current, sink))
    await asyncio.sleep(0.01)  # it took `a` through the iterator and parked
    run.publish([b"b", b"c"])
    assert sink.written == [b"a", b"b", b"c"] and sink.direct == 1  # written by publish itself
    sink.backlog = True
    run.publish([b"d"])  # declined: the follower wakes and takes it through the iterator
    run.publish([b"e"])  # not parked any more: queued for it
    sink.backlog = False
    await asyncio.sleep(0.01)
    run.publish([b"f"])
    other = asyncio.create_task(collect(run.current))  # a second follower: never direct
    await asyncio.sleep(0.01)
    run.end_response(now=0)
    await task
    assert sink.written == [b"a", b"b", b"c", b"d", b"e", b"f"]
    assert sink.direct == 2
    assert await other == [b"a", b"b", b"c", b"d", b"e", b"f"]
    assert run.unread() is None  # read whole


async def test_a_direct_follower_still_gets_keepalives_and_lags_like_any_other() -> None:
    run = Run("m1", limit=4)
    sink = _DirectSink()
    task = asyncio.create_task(_follow_direct(run.current, sink, idle=0.02))
    await asyncio.sleep(0.07)
    run.publish([b"a"])
    run.end_response(now=0)
    assert await task >= 1 and sink.written == [b"a"]
    # Past the bound while it is busy writing: told so, as with `follow`.
    run = Run("m1", limit=4)
    run.publish([b"x"])
    sink = _DirectSink()
    sink.backlog = True
    task = asyncio.create_task(_follow_direct(run.current, sink))
    await asyncio.sleep(0.01)
    run.publish([b"%d" % i for i in range(9)])  # declined, then dropped before the follower reads it
    run.end_response(now=0)
    with pytest.raises(FollowerLagged):
        await task


async def test_a_closed_response_costs_the_garbage_collector_nothing_and_replays_as_before() -> None:
    """A chat keeps its last response for resume, often as long as the chat lives: its frames must
    not be walked by every full collection (issue 18: tool turns, a new chat each)."""
    import gc

    run = Run("m1")
    run.publish([b"a", b"b"])
    run.publish([b"c"])
    assert gc.is_tracked(run.current.frames)  # a list while it grows
    run.end_response(0.0)
    gc.collect()
    assert not gc.is_tracked(run.current.frames)
    replayed = [batch async for batch in run.current.follow(1)]
    assert replayed == [[b"b", b"c"]] and all(type(batch) is list for batch in replayed)
    with pytest.raises(AssertionError):
        run.current.append([b"late"])


def test_a_response_is_read_while_a_reader_holds_it_and_its_browser_is_there() -> None:
    response = Response(limit=100)
    assert not response.read
    first, second = response.reader(), response.reader()
    assert isinstance(first, Reader) and response.read and response.read_here
    first.close()
    assert response.read  # the other one still reads
    second.watch(GONE)  # its connection dropped; nothing was written since
    assert not response.read and not response.read_here
    relay = response.reader()
    relay.remote = True
    assert response.read and not response.read_here  # read only through another replica
    relay.close()
    assert not response.read


def test_a_closed_response_forgets_its_readers() -> None:
    response = Response(limit=100)
    reader = response.reader()
    response.close(0.0)
    assert not response.read
    reader.close()  # after the close: nothing to forget, no error
    assert not response.reader().response.read


# ---- resume: the whole message ------------------------------------------------------------------

START = b'{"type":"start","messageId":"m1"}'
ASK = [
    START, b'{"type":"start-step"}',
    b'{"type":"tool-input-start","toolCallId":"c1","toolName":"pay"}',
    b'{"type":"tool-input-available","toolCallId":"c1","toolName":"pay","input":{}}',
    b'{"type":"tool-approval-request","approvalId":"gw-1","toolCallId":"c1"}',
    b'{"type":"finish-step"}',
    b'{"type":"finish","finishReason":"tool-calls","messageMetadata":{"usage":{"inputTokens":16}}}',
]
# The finish of the first response, inside a replay: its metadata, and no end.
ASK_METADATA = b'{"type":"message-metadata","messageMetadata":{"usage":{"inputTokens":16}}}'
GOES_ON = [
    START, b'{"type":"tool-output-available","toolCallId":"c1","output":{"ok":true}}',
    b'{"type":"start-step"}', b'{"type":"text-start","id":"t1"}',
]
ENDS = [
    b'{"type":"text-delta","id":"t1","delta":"Paid."}', b'{"type":"text-end","id":"t1"}',
    b'{"type":"finish-step"}', b'{"type":"finish","finishReason":"stop"}',
]


async def test_a_resume_in_a_continuation_replays_the_whole_message_as_one_stream() -> None:
    """Issue 24, defect 11: the AI SDK rebuilds the message from a resumed stream's `start`; a replay of
    the continuation alone began with the output of a call it had never seen."""
    run = Run("m1")
    run.publish(ASK)
    run.end_response(now=0)
    run.next_response()
    run.publish(GOES_ON)
    replay = run.resumable(now=1, retention=60)
    assert replay is not None
    follower = asyncio.create_task(collect(replay))
    await asyncio.sleep(0)
    run.publish(ENDS)
    run.end_response(now=2)
    whole = [*ASK[:-1], ASK_METADATA, *GOES_ON, *ENDS]
    assert await follower == whole
    assert run.unread() is None  # the replay read the current response whole
    # Positions count the whole replay, the same in every replay: a WebSocket `lastSequence` is one of them.
    again = run.resumable(now=3, retention=60)
    assert again is not None
    assert await collect(again, start=5) == whole[5:]
    assert await collect(again, start=9) == whole[9:]
    assert run.resumable(now=63, retention=60) is None


async def test_a_finish_without_metadata_keeps_its_place_as_a_chunk_the_sdk_ignores() -> None:
    run = Run("m1")
    run.publish([START, b'{"type":"finish","finishReason":"tool-calls"}'])
    run.end_response(now=0)
    run.next_response()
    run.publish([START])
    replay = run.resumable(now=0, retention=60)
    assert replay is not None and replay.earlier == (START, b'{"type":"message-metadata","messageMetadata":null}')


async def test_a_run_continuing_a_message_replays_what_the_earlier_run_wrote_and_what_the_browser_added() -> None:
    first = Run("m1")
    first.publish(ASK)
    first.end_response(now=0)
    answer = b'{"type":"tool-approval-response","approvalId":"gw-1","approved":true}'
    second = Run("m1", earlier=first.message())
    second.browser_added([answer])
    second.publish([*GOES_ON, *ENDS])
    second.end_response(now=1)
    replay = second.resumable(now=1, retention=60)
    assert replay is not None
    assert await collect(replay) == [*ASK[:-1], ASK_METADATA, answer, *GOES_ON, *ENDS]
    # A continuation whose beginning is not here (a restart, another replica) has nothing to resume.
    lost = Run("m1", earlier=None)
    lost.publish(GOES_ON)
    assert lost.resumable(now=1, retention=60) is None and lost.unread() is lost.current


async def test_a_message_longer_than_the_bound_cannot_be_resumed_rather_than_replayed_with_a_hole() -> None:
    run = Run("m1", limit=100)
    run.publish([START, *[b'{"type":"text-delta","id":"t1","delta":"x"}'] * 80, ASK[-1]])
    run.end_response(now=0)
    run.next_response()
    run.publish([START])
    assert run.resumable(now=0, retention=60) is not None  # 82 earlier chunks: kept
    run.publish([b'{"type":"text-delta","id":"t1","delta":"y"}'] * 20 + [ASK[-1]])
    run.end_response(now=0)
    run.next_response()
    run.publish([START])
    assert run.resumable(now=0, retention=60) is None  # 104 in all: the message's start is gone
    assert run.message() is None
