"""A chat's held calls in the one deadline queue (cluster/deadline_answers.py), on the memory backend.

A call the plugin's request waits on, held open (live mode), has its deadline in the same shared
queue as ADK's confirmations: kept while it waits, gone once it is decided, answered where its
chat runs (here, or on its live owner by an `Expire` notice), and dropped when that owner died,
whose held request died with it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest

from gateway.chat.record import Chat
from gateway.chat.service import ChatService
from gateway.cluster.memory import MemoryHub, MemoryState
from gateway.cluster.router import Cluster
from gateway.config.schema import ToolPolicy
from gateway.core.approvals import GatedCall, Outcome
from gateway.core.chat_events import CallCancelled, GateOpened
from gateway.core.deadlines import Deadline
from tests.support.clock import Clock
from tests.support.service import chat_service
from tests.support.waiting import until

CONFIG = """
sessions:
  heartbeat_interval: 10ms
  forward_timeout: 2s
"""
BOUND = 2.0


@dataclass
class Replica:
    cluster: Cluster
    chats: ChatService


class Hub:
    """The memory backend's shared store, and the replicas a test started on it (closed after)."""

    def __init__(self) -> None:
        self.shared = MemoryHub()
        self.started: list[Replica] = []

    async def replica(self, name: str, clock: Callable[[], float] | None = None) -> Replica:
        chats = chat_service(CONFIG, clock=clock)
        cluster = Cluster(MemoryState(name, self.shared), chats, chats.metrics)
        await cluster.start()
        self.started.append(Replica(cluster, chats))
        return self.started[-1]

    async def chat_waiting(self, one: Replica, chat_id: str, timeout: float, now: float) -> tuple[Chat, GatedCall]:
        """A chat run on `one` whose call waits, held, for a person (no run: the call waits alone),
        once its deadline is in the shared queue."""
        agent = one.chats.config.default
        claim = await one.cluster.state.claim("alice", chat_id, agent=agent, default_agent=agent, ttl=60)
        assert claim.local
        chat = one.chats._registry.get(agent, "alice", chat_id, now=now)
        call = chat.machine.ledger.add(GatedCall.open(
            user_id="alice", chat_id=chat_id, session_id=chat_id, tool_call_id="call-1", tool="process_payment",
            args={}, policy=ToolPolicy(approval=True, timeout=timeout), now=now,
        ))
        chat.handle(GateOpened(call, now))
        await until(lambda: len(self.shared.deadlines) == 1, BOUND)
        return chat, call


@pytest.fixture
async def hub() -> AsyncIterator[Hub]:
    made = Hub()
    try:
        yield made
    finally:
        for one in made.started:
            await one.cluster.close()


async def test_a_held_calls_deadline_is_in_the_shared_queue_and_times_the_call_out_where_it_runs(hub: Hub) -> None:
    a = await hub.replica("a")
    chat, call = await hub.chat_waiting(a, "c1", 0.05, a.chats._clock())
    kept = hub.shared.deadlines.get("c1/held")
    assert kept is not None and kept.held and kept.approval_id == call.id and kept.tool_call_id == "call-1"

    await until(lambda: call.released, BOUND)
    assert call.outcome is Outcome.TIMEOUT
    await until(lambda: len(hub.shared.deadlines) == 0, BOUND)  # answered: nothing left in the queue
    assert chat.due is None


async def test_a_held_call_decided_before_its_deadline_leaves_the_queue(hub: Hub) -> None:
    a = await hub.replica("a")
    now = a.chats._clock()
    chat, call = await hub.chat_waiting(a, "c1", 30, now)
    chat.handle(CallCancelled(call, "its plugin request went away", now))
    await until(lambda: len(hub.shared.deadlines) == 0, BOUND)
    assert call.outcome is Outcome.CANCELLED


async def test_a_held_deadline_another_replica_claims_is_answered_on_the_live_owner(hub: Hub) -> None:
    clock = Clock()
    a, b = await hub.replica("a", clock), await hub.replica("b")
    chat, call = await hub.chat_waiting(a, "c1", 30, clock.now)
    deadline = hub.shared.deadlines.get("c1/held")
    assert deadline is not None

    clock.now += 30  # passed, on the owner's clock
    again = await b.cluster._deadlines.answer(deadline)
    assert again is not None  # handed to the owner, and looked at again later if it died with the notice
    await until(lambda: call.released, BOUND)
    assert call.outcome is Outcome.TIMEOUT
    await until(lambda: len(hub.shared.deadlines) == 0, BOUND)  # the owner dropped it: the claim is over


async def test_a_held_deadline_whose_owner_died_is_dropped_and_its_chat_stays_where_it_was(hub: Hub) -> None:
    clock = Clock()
    a, b = await hub.replica("a", clock), await hub.replica("b")
    chat, call = await hub.chat_waiting(a, "c1", 30, clock.now)
    deadline = hub.shared.deadlines.get("c1/held")
    assert isinstance(deadline, Deadline)
    hub.shared.inboxes.pop("a")  # kill -9: no heartbeat from now on, and its held request is gone with it

    assert await b.cluster._deadlines.answer(deadline) is None  # moot: the claim drops it
    assert hub.shared.chats["c1"].owner == "a"  # not taken over for a deadline nobody can answer
    assert not call.released  # (a's process is gone in truth: nothing of it is told)


async def test_a_store_that_lost_its_data_gets_the_held_deadlines_back_from_their_chats(hub: Hub) -> None:
    """Redis restarted empty: the replica writes its chats back (`reassert`), and with them the held
    calls' deadlines, which no other replica knows of."""
    a = await hub.replica("a")
    _, call = await hub.chat_waiting(a, "c1", 30, a.chats._clock())
    hub.shared.deadlines = type(hub.shared.deadlines)()  # the store's data is gone

    assert [c.chat for c in a.cluster._local_chats()] == ["c1"]
    await until(lambda: len(hub.shared.deadlines) == 1, BOUND)
    kept = hub.shared.deadlines.get("c1/held")
    assert kept is not None and kept.approval_id == call.id
