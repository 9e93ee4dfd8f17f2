"""The deadline timer (gateway/cluster/deadline_timer.py) on the memory backend: one timer for the
next deadline, each passed deadline answered once, what cannot be answered yet put back."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from gateway.cluster.deadline_timer import DeadlineTimer
from gateway.cluster.memory import MemoryHub, MemoryState
from gateway.cluster.tasks import Tasks
from gateway.core.deadlines import Deadline
from tests.support.clock import Clock
from tests.support.waiting import until


# A wall clock (the deadline queue's time): epoch seconds.
EPOCH = 1_700_000_000.0


def deadline(name: str, due: float) -> Deadline:
    return Deadline("demo_agent", "u1", "chat-" + name, "adk-" + name, "call-" + name, "process_payment", due)


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def test_each_passed_deadline_is_answered_once_by_one_of_the_replicas() -> None:
    hub, clock = MemoryHub(), Clock(EPOCH)
    answered: list[tuple[str, str]] = []

    def replica(name: str) -> tuple[DeadlineTimer, Tasks]:
        async def answer(d: Deadline) -> float | None:
            answered.append((name, d.approval_id))
            return None

        tasks = Tasks()
        return DeadlineTimer(MemoryState(name, hub), tasks, answer, poll=0.01, wall=clock), tasks

    (a, tasks_a), (b, tasks_b) = replica("a"), replica("b")
    a.start()
    b.start()
    a.add(deadline("x", clock.now + 0.05))
    b.add(deadline("y", clock.now + 0.05))
    a.add(deadline("z", clock.now + 60))
    await asyncio.sleep(0.02)
    assert answered == []
    clock.now += 0.05
    await until(lambda: len(answered) == 2)
    assert sorted(approval for _, approval in answered) == ["adk-x", "adk-y"]
    a.drop(deadline("z", 0).key)
    clock.now += 60
    await asyncio.sleep(0.05)
    assert len(answered) == 2
    for timer, tasks in ((a, tasks_a), (b, tasks_b)):
        timer.close()
        await tasks.close(1.0)


async def test_a_deadline_that_cannot_be_answered_yet_comes_back_when_asked() -> None:
    hub, clock = MemoryHub(), Clock(EPOCH)
    tries: list[float] = []

    async def answer(d: Deadline) -> float | None:
        tries.append(clock.now)
        return clock.now + 0.05 if len(tries) == 1 else None  # the chat was busy the first time

    tasks = Tasks()
    timer = DeadlineTimer(MemoryState("a", hub), tasks, answer, poll=None, wall=clock)
    timer.start()
    timer.add(deadline("x", clock.now))
    await until(lambda: len(tries) == 1 and len(hub.deadlines) == 1)
    assert len(tries) == 1 and len(hub.deadlines) == 1
    clock.now += 0.05
    await until(lambda: len(tries) == 2 and not hub.deadlines)
    assert len(tries) == 2 and len(hub.deadlines) == 0
    timer.close()
    await tasks.close(1.0)


async def test_a_deadline_moved_later_fires_at_its_new_time_only() -> None:
    """An approval of a browser tool (confirm mode) replaces a deadline the timer is armed for."""
    hub, clock = MemoryHub(), Clock(EPOCH)
    answered: list[Deadline] = []

    async def answer(d: Deadline) -> float | None:
        answered.append(d)
        return None

    tasks = Tasks()
    timer = DeadlineTimer(MemoryState("a", hub), tasks, answer, poll=None, wall=clock)
    timer.start()
    timer.add(deadline("x", clock.now + 0.05))
    await settle()
    moved = Deadline("demo_agent", "u1", "chat-x", "adk-x", "call-x", "process_payment", clock.now + 0.15, approved_at=clock.now)
    timer.add(moved)
    clock.now += 0.05
    await asyncio.sleep(0.1)
    assert answered == []
    clock.now = moved.due
    await asyncio.sleep(0.1)
    assert answered == [moved]
    timer.close()
    await tasks.close(1.0)


async def test_a_deadline_whose_claimer_died_is_answered_by_another_replica_after_the_lease() -> None:
    """Replica a claims a passed deadline and dies before answering it (its answer never returns,
    then its tasks are gone, as with kill -9): it is not lost with a; b answers it once a's lease
    ended, and not before."""
    hub, clock = MemoryHub(), Clock(EPOCH)
    stuck: asyncio.Future[float | None] = asyncio.get_running_loop().create_future()
    claimed_by_a: list[Deadline] = []
    answered_by_b: list[Deadline] = []

    async def answer_a(d: Deadline) -> float | None:
        claimed_by_a.append(d)
        return await stuck  # dies mid-answer

    async def answer_b(d: Deadline) -> float | None:
        answered_by_b.append(d)
        return None

    tasks_a, tasks_b = Tasks(), Tasks()
    a = DeadlineTimer(MemoryState("a", hub), tasks_a, answer_a, poll=None, wall=clock, lease=0.2)
    a.start()
    a.add(deadline("x", clock.now))
    await until(lambda: bool(claimed_by_a))
    assert [d.approval_id for d in claimed_by_a] == ["adk-x"]
    a.close()
    await tasks_a.close(0.1)
    b = DeadlineTimer(MemoryState("b", hub), tasks_b, answer_b, poll=0.01, wall=clock, lease=0.2)
    b.start()
    claimed_at = clock.now
    clock.now = claimed_at + 0.1
    await asyncio.sleep(0.05)
    assert answered_by_b == []  # a's lease still holds
    clock.now = claimed_at + 0.2
    await until(lambda: bool(answered_by_b) and not hub.deadlines)  # b's timer waits on the loop's clock
    assert [d.approval_id for d in answered_by_b] == ["adk-x"]
    assert len(hub.deadlines) == 0  # answered: dropped, not claimed again
    clock.now += 1.0
    await asyncio.sleep(0.05)
    assert len(answered_by_b) == 1
    b.close()
    await tasks_b.close(1.0)


async def test_a_claimer_that_answers_after_its_lease_ended_does_not_bring_the_deadline_back() -> None:
    """a's answer takes longer than its lease: b claims and answers the deadline meanwhile (ADK's
    session and the chat make the second answer a no-op: here, b finds nothing to do). a's late
    "try again" is not kept: the deadline stays gone."""
    hub, clock = MemoryHub(), Clock(EPOCH)
    slow: asyncio.Future[float | None] = asyncio.get_running_loop().create_future()
    answered: list[str] = []

    async def answer_a(d: Deadline) -> float | None:
        answered.append("a")
        return await slow

    async def answer_b(d: Deadline) -> float | None:
        answered.append("b")
        return None

    tasks_a, tasks_b = Tasks(), Tasks()
    a = DeadlineTimer(MemoryState("a", hub), tasks_a, answer_a, poll=None, wall=clock, lease=0.2)
    b = DeadlineTimer(MemoryState("b", hub), tasks_b, answer_b, poll=0.01, wall=clock, lease=0.2)
    a.start()
    a.add(deadline("x", clock.now))
    await until(lambda: answered == ["a"])
    b.start()
    clock.now += 0.2
    await until(lambda: len(answered) == 2 and not hub.deadlines)
    assert answered == ["a", "b"] and len(hub.deadlines) == 0
    slow.set_result(clock.now + 0.05)  # a, late: "the chat was busy, try again"
    await asyncio.sleep(0.05)
    assert len(hub.deadlines) == 0
    clock.now += 1.0
    await asyncio.sleep(0.05)
    assert answered == ["a", "b"]
    for timer, tasks in ((a, tasks_a), (b, tasks_b)):
        timer.close()
        await tasks.close(1.0)


async def test_a_held_deadline_the_store_could_not_take_is_kept_once_it_is_back_unless_it_moved(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A chat's held calls' deadline is known to its replica alone: an outage as it is added does
    not lose it (a confirmation's is re-derived from ADK's session, and is not retried), and a
    retry never brings back one the chat moved or dropped meanwhile."""
    from gateway.cluster import deadline_timer
    from gateway.cluster.shared import SharedStateDown

    monkeypatch.setattr(deadline_timer, "_STORE_RETRY", 0.01)

    class Flaky(MemoryState):
        down = True

        async def add_deadline(self, deadline: Deadline) -> None:
            if self.down:
                raise SharedStateDown("unreachable")
            await super().add_deadline(deadline)

    hub, clock, tasks = MemoryHub(), Clock(EPOCH), Tasks()
    state = Flaky("a", hub)
    timer = DeadlineTimer(state, tasks, lambda d: asyncio.sleep(0, None), poll=None, wall=clock)
    held = replace(deadline("x", clock.now + 60), kind="held")
    timer.add(deadline("y", clock.now + 60))  # a confirmation's: lost
    timer.add(held)
    await asyncio.sleep(0.03)
    state.down = False
    await asyncio.sleep(0.05)
    assert [hub.deadlines.get(k) for k in ("chat-x/held", "chat-y/adk-y")] == [held, None]

    state.down = True
    moved = replace(held, due=clock.now + 90)
    timer.add(moved)
    timer.drop(held.key)  # nothing waits any more: the retry stops
    await asyncio.sleep(0.03)
    state.down = False
    await asyncio.sleep(0.05)
    assert hub.deadlines.get(held.key) is None
    timer.close()
    await tasks.close(1.0)
