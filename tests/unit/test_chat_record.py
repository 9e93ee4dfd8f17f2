"""The chat (chat/record.py): the machine's one caller, its run's task and its deadline timer.

Real event loop, real clock: a deadline is met by the chat's own timer (no sweep runs here), and a
run's end is the machine's to say even when its task never got to run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from gateway.approvals.decision import DECIDER
from gateway.config.schema import ToolPolicy
from gateway.core.approvals import GatedCall, Outcome
from gateway.core.chat_events import GateOpened, RunStarts
from gateway.chat.record import Chat, RunHooks
from gateway.chat.chunk_log import Run
from gateway.ops.metrics import GatewayMetrics
from gateway.upstream.idle_reader import WaitSignal

PAY = ToolPolicy(approval=True, timeout=0.05)


def _chat(hooks: RunHooks) -> Chat:
    return Chat("u", "c", "c", 0.0, "agent", hooks)


def _actor() -> tuple[Chat, list[GatedCall]]:
    released: list[GatedCall] = []
    return _chat(RunHooks(GatewayMetrics(), time.monotonic, released.append)), released


async def _asks_then_waits(call_id: str, hold: asyncio.Event) -> AsyncIterator[list[dict[str, Any]]]:
    yield [{"author": "a", "content": {"role": "model", "parts": [{"functionCall": {"id": call_id, "name": "pay", "args": {}}}]}}]
    await hold.wait()


def _start(actor: Chat, batches: AsyncIterator[Any]) -> asyncio.Task[None]:
    start = RunStarts("m1", time.monotonic(), policy=lambda name: PAY if name == "pay" else ToolPolicy())
    return actor.start(Run("m1"), start, batches, WaitSignal())


async def test_a_gated_call_times_out_on_the_chats_own_timer() -> None:
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
    assert await actor.ended(2) and not actor.machine.running


async def test_a_run_cancelled_before_its_first_step_still_ends_for_the_machine() -> None:
    actor, _ = _actor()
    task = _start(actor, _asks_then_waits("c1", asyncio.Event()))
    assert actor.machine.running
    task.cancel()  # before the task ever ran: its own `finally` never runs
    await asyncio.gather(task, return_exceptions=True)
    await asyncio.sleep(0)
    assert not actor.machine.running
    run = actor.run
    assert run is not None and run.current.closed  # its response is closed, so the chat is not busy for ever


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
    assert not actor.machine.running and call.outcome is Outcome.CANCELLED and released == [call]
    assert actor.machine.next_deadline() is None
    # The task ends later: what it says then no longer reaches the machine.
    assert await actor.ended(2) and not actor.machine.running


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
    await actor.stop(0.05, how="cancel", reason="The gateway is shutting down.")
    run = actor.run
    assert run is not None and run.current.closed and not actor.machine.running
    frames = b"".join(run.current.frames)
    assert b'"type":"error"' in frames and b"The gateway is shutting down." in frames
    assert await actor.ended(2)


# ---- tokens and time to first token ---------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def _recorded(name: str, clock: _Clock) -> AsyncIterator[list[dict[str, Any]]]:
    # Real ADK events, one read each; every read takes the model half a second.
    from tests.unit.fixtures import events

    for event in events(name):
        clock.now += 0.5
        yield [event]


async def test_each_llm_calls_tokens_are_counted_once_and_the_first_words_timed_once() -> None:
    from gateway.config.schema import parse_config

    clock = _Clock()
    metrics = GatewayMetrics()
    metrics.know_agents(parse_config("agents: {agent: {upstream: {app_name: a}}}\nmetrics: {models: [demo-scripted]}\n", env={}))
    actor = _chat(RunHooks(metrics, clock, lambda call: None))
    start = RunStarts("m1", clock(), policy=lambda name: ToolPolicy())
    actor.start(Run("m1"), start, _recorded("weather_tokyo", clock), WaitSignal())
    assert await actor.ended(2)
    sample = metrics.registry.get_sample_value

    def tokens(kind: str, model: str = "demo-scripted") -> float | None:
        return sample("adk_gateway_tokens_total", {"agent": "agent", "model": model, "kind": kind})

    # weather_tokyo: the tool call's model call (16 in, 8 out), then the text's (16 in, 7 out).
    assert (tokens("input"), tokens("output"), tokens("total")) == (32, 15, 47)
    assert tokens("cached") == tokens("thinking") == tokens("input", "other") == 0
    assert sample("adk_gateway_first_token_seconds_count", {"agent": "agent"}) == 1
    # The fourth event is the text's first partial: two seconds after the run started.
    assert sample("adk_gateway_first_token_seconds_sum", {"agent": "agent"}) == 2.0


async def test_a_model_the_config_does_not_list_counts_as_other() -> None:
    clock = _Clock()
    metrics = GatewayMetrics()
    actor = _chat(RunHooks(metrics, clock, lambda call: None))
    actor.start(Run("m1"), RunStarts("m1", clock()), _recorded("hello_there", clock), WaitSignal())
    assert await actor.ended(2)
    assert metrics.registry.get_sample_value(
        "adk_gateway_tokens_total", {"agent": "agent", "model": "other", "kind": "input"}
    ) == 16


async def test_words_after_a_persons_decision_are_not_a_time_to_first_token() -> None:
    clock = _Clock()
    metrics = GatewayMetrics()
    actor = _chat(RunHooks(metrics, clock, lambda call: None))
    hold = asyncio.Event()

    async def batches() -> AsyncIterator[list[dict[str, Any]]]:
        yield [{"author": "a", "content": {"role": "model", "parts": [{"functionCall": {"id": "c1", "name": "pay", "args": {}}}]}}]
        await hold.wait()
        clock.now += 60  # the person took a minute
        yield [{"author": "a", "partial": True, "content": {"role": "model", "parts": [{"text": "Paid."}]}}]

    start = RunStarts("m1", clock(), policy=lambda name: PAY if name == "pay" else ToolPolicy())
    actor.start(Run("m1"), start, batches(), WaitSignal())
    await asyncio.sleep(0.01)
    call = actor.machine.ledger.add(GatedCall.open(
        user_id="u", chat_id="c", session_id="c", tool_call_id="c1", tool="pay", args={}, policy=PAY, now=clock(),
    ))
    actor.handle(GateOpened(call, clock()))
    assert actor.machine.waiting_for_person
    for _ in range(100):  # the call times out: released, as a decision would release it
        if call.released:
            break
        await asyncio.sleep(0.01)
    hold.set()
    assert await actor.ended(2)
    assert metrics.chunk_counts.get("text-delta") == 1  # the words were written, and not timed
    assert not metrics.registry.get_sample_value("adk_gateway_first_token_seconds_count", {"agent": "agent"})


async def test_what_a_run_made_to_end_says_later_reaches_no_newer_run() -> None:
    """Which run counts is the machine's: the stuck run's late end does not end the run after it."""
    actor, _ = _actor()
    let_go = asyncio.Event()

    async def stuck() -> AsyncIterator[list[dict[str, Any]]]:
        yield [{"author": "a", "content": {"role": "model", "parts": [{"text": "one"}]}}]
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await let_go.wait()  # lets go only once the next run is under way
            yield [{"author": "a", "content": {"role": "model", "parts": [{"text": "late"}]}}]

    _start(actor, stuck())
    await asyncio.sleep(0.01)
    await actor.stop(0.05)
    hold = asyncio.Event()
    _start(actor, _asks_then_waits("c2", hold))
    second = actor.run
    await asyncio.sleep(0.01)
    assert actor.machine.run == 2 and actor.machine.running
    let_go.set()
    await asyncio.sleep(0.05)
    assert actor.machine.running and actor.machine.under_way(2)  # the first run's end did not end it
    assert second is not None and b"late" not in b"".join(second.current.frames)
    hold.set()
    assert await actor.ended(2) and not actor.machine.running


def test_every_chat_decides_the_plugins_asks_in_the_approvals_room() -> None:
    # The machine takes the decision through its port (core/gate_decider.py); a chat hands it the
    # room's (approvals/decision.py), not the fail-closed default a machine built alone has.
    assert Chat("u", "c", "c", 0.0).machine.decider is DECIDER
    assert Chat("u", "d", "d", 0.0).machine is not Chat("u", "d", "d", 0.0).machine


async def _ended_by(end: str) -> bytes:
    """A run writing, then ended by `end` through the chat: the frames its response got."""
    actor, _ = _actor()

    async def writes() -> AsyncIterator[list[dict[str, Any]]]:
        yield [{"author": "a", "content": {"role": "model", "parts": [{"text": "Working "}]}}]
        await asyncio.sleep(10)

    task = _start(actor, writes())
    await asyncio.sleep(0.01)
    if end == "abort":
        assert actor.abort()
    elif end == "close_soon":
        assert actor.close_soon("The agent support was removed from the gateway; this response was ended.")
    else:  # a shutdown's word to a run already aborted: the abort stands
        assert actor.abort() and actor.end_asked("cancel", "The gateway is shutting down.")
    await asyncio.gather(task, return_exceptions=True)
    run = actor.run
    assert run is not None and run.current.closed and not actor.machine.running
    assert not actor.abort() and not actor.close_soon("again")  # nothing under way to end any more
    return b"".join(run.current.frames)


async def test_a_cancelled_task_ends_as_the_chat_told_its_machine() -> None:
    for end in ("abort", "abort then shutdown"):
        frames = await _ended_by(end)
        assert frames.endswith(b'{"type":"finish-step"}{"type":"abort"}') and b'"type":"error"' not in frames, end
    frames = await _ended_by("close_soon")
    assert b'"type":"error","errorText":"The agent support was removed' in frames and b'"type":"abort"' not in frames
