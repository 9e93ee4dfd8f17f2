"""The chat (chat/record.py): the machine's one caller, its run's task and its deadline in the queue.

Real event loop: a run's end is the machine's to say even when its task never got to run. The
chat keeps its machine's next deadline in the deadline queue (here a dict standing for it, as
the chat's port sees it), and the cluster says when it passed (`deadlines_due`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from gateway.approvals.decision import DECIDER
from gateway.config.schema import ToolPolicy
from gateway.core.approvals import CallState, GatedCall, Outcome
from gateway.core.chat_events import ApproversDecided, CallCancelled, GateOpened, RunStarts
from gateway.core.deadlines import Deadline
from gateway.chat.record import Chat, RunHooks
from gateway.chat.chunk_log import Run
from gateway.ops.metrics import GatewayMetrics
from gateway.upstream.idle_reader import WaitSignal
from tests.support.clock import Clock

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


# The queue's wall clock, this far ahead of the machine's (the chat service's monotonic clock).
EPOCH = 1_700_000_000.0


def _queued() -> tuple[Chat, dict[str, Deadline], Clock, list[GatedCall]]:
    """A chat whose deadline queue is a dict, on a clock the test moves."""
    queue: dict[str, Deadline] = {}
    clock, released = Clock(100.0), []

    def kept(deadline: Deadline) -> None:
        queue[deadline.key] = deadline

    def settled(key: str) -> None:
        queue.pop(key, None)

    hooks = RunHooks(GatewayMetrics(), clock, released.append, kept=kept, settled=settled, wall=lambda: clock.now + EPOCH)
    return _chat(hooks), queue, clock, released


def _opened(actor: Chat, call_id: str, policy: ToolPolicy, now: float) -> GatedCall:
    call = actor.machine.ledger.add(GatedCall.open(
        user_id="u", chat_id="c", session_id="c", tool_call_id=call_id, tool="pay", args={}, policy=policy, now=now,
    ))
    actor.handle(GateOpened(call, now))
    return call


async def test_a_gated_call_times_out_when_the_queue_says_its_deadline_passed() -> None:
    actor, queue, clock, released = _queued()
    hold = asyncio.Event()
    _start(actor, _asks_then_waits("c1", hold))
    await asyncio.sleep(0.01)
    call = _opened(actor, "c1", ToolPolicy(approval=True, timeout=30), clock.now)
    assert actor.machine.waiting_for_person and actor.upstream_wait.waiting
    [kept] = queue.values()
    assert kept.held and kept.key == "c/held" and kept.due == EPOCH + 130.0
    assert (kept.agent, kept.user, kept.chat, kept.approval_id, kept.tool_call_id) == ("agent", "u", "c", call.id, "c1")

    # Claimed a moment early (the two clocks are read apart): nothing times out, it stays queued.
    clock.now += 29.9
    again = actor.deadlines_due(clock.now)
    assert not call.released and again is not None and again.due == EPOCH + 130.0 and queue == {"c/held": kept}
    clock.now += 0.1
    assert actor.deadlines_due(clock.now) is None
    assert call.outcome is Outcome.TIMEOUT and released == [call]
    assert queue == {}  # nothing waits: nothing left in the queue
    assert not actor.upstream_wait.waiting  # the wait is over: silence upstream is idleness again
    hold.set()
    assert await actor.ended(2) and not actor.machine.running


async def test_the_queued_deadline_follows_the_machines_next_one_and_leaves_with_the_last_call() -> None:
    actor, queue, clock, _ = _queued()
    _start(actor, _asks_then_waits("c1", asyncio.Event()))
    await asyncio.sleep(0.01)
    browser = ToolPolicy(approval=True, runs_in="browser", timeout=30)
    first = _opened(actor, "c1", browser, clock.now)
    clock.now += 10
    second = _opened(actor, "c2", ToolPolicy(approval=True, timeout=30), clock.now)
    assert [(d.approval_id, d.due) for d in queue.values()] == [(first.id, EPOCH + 130.0)]  # the earliest only

    # Approved, the browser tool's call waits again, for the browser, with the whole timeout: the
    # deadline moves to the other call's, now the earliest.
    clock.now += 5
    actor.handle(ApproversDecided(first, True, None, clock.now))
    assert first.state is CallState.AWAITING_OUTPUT and first.deadline == clock.now + 30
    assert [(d.approval_id, d.due) for d in queue.values()] == [(second.id, EPOCH + 140.0)]

    actor.handle(CallCancelled(second, "its plugin request went away", clock.now))
    assert [(d.approval_id, d.due) for d in queue.values()] == [(first.id, EPOCH + 145.0)]
    actor.handle(CallCancelled(first, "its plugin request went away", clock.now))
    assert queue == {} and actor.machine.next_deadline() is None


async def test_a_forgotten_chat_takes_its_deadline_out_of_the_queue() -> None:
    actor, queue, clock, _ = _queued()
    _opened(actor, "c1", ToolPolicy(approval=True, timeout=30), clock.now)  # no run: the call waits alone
    assert list(queue) == ["c/held"]
    actor.drop_deadline()
    assert queue == {}


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


async def _recorded(name: str, clock: Clock) -> AsyncIterator[list[dict[str, Any]]]:
    # Real ADK events, one read each; every read takes the model half a second.
    from tests.unit.fixtures import events

    for event in events(name):
        clock.now += 0.5
        yield [event]


async def test_each_llm_calls_tokens_are_counted_once_and_the_first_words_timed_once() -> None:
    from gateway.config.schema import parse_config

    clock = Clock(100.0)
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
    clock = Clock(100.0)
    metrics = GatewayMetrics()
    actor = _chat(RunHooks(metrics, clock, lambda call: None))
    actor.start(Run("m1"), RunStarts("m1", clock()), _recorded("hello_there", clock), WaitSignal())
    assert await actor.ended(2)
    assert metrics.registry.get_sample_value(
        "adk_gateway_tokens_total", {"agent": "agent", "model": "other", "kind": "input"}
    ) == 16


async def test_words_after_a_persons_decision_are_not_a_time_to_first_token() -> None:
    clock = Clock(100.0)
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
