"""The chat actor (chat/actor.py): the machine's one caller, its run's task and its deadline timer.

Real event loop, real clock: a deadline is met by the actor's own timer (no sweep runs here), and a
run's end is the machine's to say even when its task never got to run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from gateway.config.schema import ToolPolicy
from gateway.core.approvals import GatedCall, Outcome
from gateway.core.chat_events import GateOpened, RunStarts
from gateway.core.chat_machine import ChatMachine
from gateway.chat.actor import ChatActor, RunHooks
from gateway.chat.chunk_log import Run
from gateway.ops.metrics import GatewayMetrics
from gateway.upstream.idle_reader import WaitSignal

PAY = ToolPolicy(approval=True, timeout=0.05)


def _actor() -> tuple[ChatActor, list[GatedCall]]:
    released: list[GatedCall] = []
    return ChatActor(ChatMachine(), RunHooks(GatewayMetrics(), time.monotonic, released.append), "agent"), released


async def _asks_then_waits(call_id: str, hold: asyncio.Event) -> AsyncIterator[list[dict[str, Any]]]:
    yield [{"author": "a", "content": {"role": "model", "parts": [{"functionCall": {"id": call_id, "name": "pay", "args": {}}}]}}]
    await hold.wait()


def _start(actor: ChatActor, batches: AsyncIterator[Any]) -> asyncio.Task[None]:
    start = RunStarts("m1", time.monotonic(), policy=lambda name: PAY if name == "pay" else ToolPolicy())
    return actor.start(Run("m1"), start, batches, WaitSignal(), lambda: "The gateway is shutting down.")


async def test_a_gated_call_times_out_on_the_actors_own_timer() -> None:
    actor, released = _actor()
    hold = asyncio.Event()
    _start(actor, _asks_then_waits("c1", hold))
    await asyncio.sleep(0.01)
    call = actor.machine.ledger.add(GatedCall.open(
        user_id="u", chat_id="c", session_id="c", tool_call_id="c1", tool="pay", args={}, policy=PAY, now=time.monotonic(),
    ))
    actor.handle(GateOpened(call, time.monotonic()))
    assert actor.machine.waiting_for_person and actor.upstream_wait.waiting
    for _ in range(100):
        if call.released:
            break
        await asyncio.sleep(0.01)
    assert call.outcome is Outcome.TIMEOUT and released == [call]
    assert not actor.upstream_wait.waiting  # the wait is over: silence upstream is idleness again
    hold.set()
    assert await actor.ended(2) and not actor.running


async def test_a_run_cancelled_before_its_first_step_still_ends_for_the_machine() -> None:
    actor, _ = _actor()
    task = _start(actor, _asks_then_waits("c1", asyncio.Event()))
    assert actor.running
    task.cancel()  # before the task ever ran: its own `finally` never runs
    await asyncio.gather(task, return_exceptions=True)
    await asyncio.sleep(0)
    assert not actor.running
    run = actor.run
    assert run is not None and not run.streaming  # its response is closed, so the chat is not busy for ever


async def test_stop_ends_a_stuck_run_and_the_timer_is_gone_with_it() -> None:
    actor, released = _actor()

    async def stuck() -> AsyncIterator[list[dict[str, Any]]]:
        yield [{"author": "a", "content": {"role": "model", "parts": [{"functionCall": {"id": "c1", "name": "pay", "args": {}}}]}}]
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await asyncio.sleep(0.3)  # an upstream read slow to let go

    _start(actor, stuck())
    await asyncio.sleep(0.01)
    call = actor.machine.ledger.add(GatedCall.open(
        user_id="u", chat_id="c", session_id="c", tool_call_id="c1", tool="pay", args={}, policy=ToolPolicy(approval=True),
        now=time.monotonic(),
    ))
    actor.handle(GateOpened(call, time.monotonic()))
    await actor.stop(0.05)
    assert not actor.running and call.outcome is Outcome.CANCELLED and released == [call]
    assert actor.machine.next_deadline() is None
    # The task ends later: what it says then no longer reaches the machine.
    assert await actor.ended(2) and not actor.running


async def test_a_shutdown_ends_a_stuck_run_with_its_reason() -> None:
    actor, _ = _actor()

    async def stuck() -> AsyncIterator[list[dict[str, Any]]]:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await asyncio.sleep(0.3)
        yield []

    _start(actor, stuck())
    await asyncio.sleep(0.01)
    await actor.stop(0.05, abort=False, reason="The gateway is shutting down.")
    run = actor.run
    assert run is not None and not run.streaming and not actor.running
    frames = b"".join(run.current.frames)
    assert b'"type":"error"' in frames and b"The gateway is shutting down." in frames
    assert await actor.ended(2)
