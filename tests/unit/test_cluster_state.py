"""The shared-state contract (gateway/cluster/shared.py), held against both backends.

Every test gets two replicas, `a` and `b`, on one store: a `MemoryHub`, or a real redis-server
(tests/procs.py). What replicas may rely on must hold for both; the Redis-only tests at the end
cover what only a network store can do (go away, come back empty).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.cluster.memory import MemoryHub, MemoryState
from gateway.core.deadlines import Deadline
from gateway.cluster.shared import LocalChat, RelayEntry, SharedState, SharedStateDown
from gateway.chat.registry import ChatNotFound
from tests.procs import RedisServer
# The store settings every shared-store test uses, one redis-server per module, and a replica on it.
from tests.support.shared_state import OWNER_TIMEOUT, redis, redis_state  # noqa: F401 - `redis` is a fixture


class Replica:
    """A backend plus what it received in its inbox."""

    def __init__(self, state: SharedState) -> None:
        self.state = state
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.local: list[LocalChat] = []

    async def start(self) -> None:
        await self.state.start(self.inbox.put_nowait, lambda: list(self.local))


@pytest.fixture(params=["memory", "redis"])
async def pair(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Replica, Replica]]:
    if request.param == "memory":
        hub = MemoryHub()
        a, b = Replica(MemoryState("a", hub)), Replica(MemoryState("b", hub))
    else:
        server = request.getfixturevalue("redis")
        prefix = "t" + secrets.token_hex(4)  # each test its own keys in the shared server
        a, b = Replica(redis_state(server, "a", prefix)), Replica(redis_state(server, "b", prefix))
    await a.start()
    await b.start()
    try:
        yield a, b
    finally:
        for replica in (a, b):
            await replica.state.close()


# Claims on the default agent's routes (the agent a record without one belongs to).
DEMO: dict[str, str] = {"agent": "demo_agent", "default_agent": "demo_agent"}
SUPPORT: dict[str, str] = {"agent": "support_agent", "default_agent": "demo_agent"}


def chat_id() -> str:
    return "chat-" + secrets.token_hex(4)


async def test_the_first_replica_to_claim_a_chat_owns_it(pair: tuple[Replica, Replica]) -> None:
    a, b = pair
    chat = chat_id()
    first = await a.state.claim("alice", chat, **DEMO, ttl=60)
    assert (first.owner, first.local, first.orphaned_run) == ("a", True, None)
    seen_from_b = await b.state.claim("alice", chat, **DEMO, ttl=60)
    assert (seen_from_b.owner, seen_from_b.local) == ("a", False)
    assert await b.state.owner("alice", chat) == "a"
    assert await a.state.owner("alice", chat) == "a"


async def test_a_chat_id_belongs_to_its_first_user_on_every_replica(pair: tuple[Replica, Replica]) -> None:
    a, b = pair
    chat = chat_id()
    await a.state.claim("alice", chat, **DEMO, ttl=60)
    for replica in (a, b):
        with pytest.raises(ChatNotFound):
            await replica.state.claim("mallory", chat, **DEMO, ttl=60)
        assert await replica.state.owner("mallory", chat) is None
    assert await b.state.owner("alice", "never-claimed") is None


async def test_a_chat_id_belongs_to_its_first_agent_on_every_replica(pair: tuple[Replica, Replica]) -> None:
    a, b = pair
    chat = chat_id()
    await a.state.claim("alice", chat, **SUPPORT, ttl=60)
    for replica in (a, b):
        # The same user, the same id, another agent's routes: not that agent's chat.
        with pytest.raises(ChatNotFound):
            await replica.state.claim("alice", chat, **DEMO, ttl=60)
        with pytest.raises(ChatNotFound):
            await replica.state.claim("alice", chat, **DEMO, ttl=60, create=False)
    assert (await b.state.claim("alice", chat, **SUPPORT, ttl=60)).owner == "a"


async def test_a_record_from_before_agents_is_the_default_agents(redis: RedisServer) -> None:
    """A replica of the release before several agents wrote records without `agent`: during a
    rolling upgrade they stay reachable on the default agent's routes, and only there."""
    import redis.asyncio as aioredis

    state = redis_state(redis, "a", "legacy")
    replica = Replica(state)
    await replica.start()
    client = aioredis.from_url(redis.url)
    try:
        chat = chat_id()
        await client.hset(f"legacy:chat:{chat}", mapping={"user": "alice", "owner": "a", "run": ""})
        assert (await state.claim("alice", chat, **DEMO, ttl=60)).local
        with pytest.raises(ChatNotFound):
            await state.claim("alice", chat, **SUPPORT, ttl=60)
    finally:
        await client.aclose()
        await state.close()


async def test_looking_without_creating_leaves_no_record(pair: tuple[Replica, Replica]) -> None:
    a, b = pair
    chat = chat_id()
    looked = await a.state.claim("alice", chat, **DEMO, ttl=60, create=False)
    assert (looked.owner, looked.local) == ("a", True)
    assert await b.state.owner("alice", chat) is None
    # The id is still free for anyone, on any replica.
    assert (await b.state.claim("bob", chat, **DEMO, ttl=60)).owner == "b"
    # A known chat is answered as usual.
    assert (await a.state.claim("bob", chat, **DEMO, ttl=60, create=False)).owner == "b"


async def test_a_chat_record_expires_ttl_after_its_last_claim(pair: tuple[Replica, Replica]) -> None:
    a, b = pair
    chat, kept = chat_id(), chat_id()
    await a.state.claim("alice", chat, **DEMO, ttl=1.0)
    await a.state.claim("alice", kept, **DEMO, ttl=1.0)
    await asyncio.sleep(0.6)
    await b.state.claim("alice", kept, **DEMO, ttl=1.0)  # used again: lives on
    await asyncio.sleep(0.6)
    await a.state.claim("carol", chat_id(), **DEMO, ttl=60)  # any claim lets the memory hub sweep
    assert await b.state.owner("alice", chat) is None
    assert await b.state.owner("alice", kept) == "a"


async def test_a_dead_owners_chat_moves_to_the_next_replica_asked_and_names_the_lost_run(pair: tuple[Replica, Replica]) -> None:
    a, b = pair
    chat, quiet = chat_id(), chat_id()
    await a.state.claim("alice", chat, **DEMO, ttl=60)
    await a.state.claim("alice", quiet, **DEMO, ttl=60)
    await a.state.mark_run("alice", chat, "msg-1")
    assert await b.state.alive("a")
    await a.state.close()
    assert not await b.state.alive("a")
    assert await b.state.owner("alice", chat) is None  # a dead owner owns nothing
    taken = await b.state.claim("alice", chat, **DEMO, ttl=60)
    assert (taken.owner, taken.local, taken.orphaned_run) == ("b", True, "msg-1")
    again = await b.state.claim("alice", chat, **DEMO, ttl=60)
    assert again.orphaned_run is None  # said once
    idle = await b.state.claim("alice", quiet, **DEMO, ttl=60)
    assert (idle.local, idle.orphaned_run) == (True, None)  # nothing was running there


async def test_only_the_owner_marks_runs_and_releases(pair: tuple[Replica, Replica]) -> None:
    a, b = pair
    chat = chat_id()
    await a.state.claim("alice", chat, **DEMO, ttl=60)
    await b.state.mark_run("alice", chat, "msg-from-b")  # not the owner: ignored
    await b.state.release("alice", chat)  # not the owner: ignored
    assert await b.state.owner("alice", chat) == "a"
    await a.state.mark_run("alice", chat, "msg-1")
    await a.state.mark_run("alice", chat, "")  # the run ended
    await a.state.release("alice", chat)
    assert await a.state.owner("alice", chat) is None
    # Forgotten everywhere: the id is free again, even for another user.
    claimed = await b.state.claim("bob", chat, **DEMO, ttl=60)
    assert (claimed.owner, claimed.local, claimed.orphaned_run) == ("b", True, None)


async def test_messages_reach_the_named_replica_only(pair: tuple[Replica, Replica]) -> None:
    a, b = pair
    await a.state.send("b", {"op": "ping", "n": 1})
    await b.state.send("a", {"reply": "x", "ok": True})
    assert await asyncio.wait_for(b.inbox.get(), 5) == {"op": "ping", "n": 1}
    assert await asyncio.wait_for(a.inbox.get(), 5) == {"reply": "x", "ok": True}
    await asyncio.sleep(0.05)
    assert a.inbox.empty() and b.inbox.empty()


async def test_a_message_sent_the_moment_a_replica_started_reaches_it(redis: RedisServer) -> None:
    """A started replica serves and says it is ready: a message sent to it at once (a forwarded
    answer, a verdict) must not be published to an inbox nobody listens on yet. It was: the
    subscription came a moment after `start` returned, and the answer was lost to the asker's 5 s
    timeout (the ops suite's Redis-restart row, its replicas started together, saw the 503)."""
    prefix = "t" + secrets.token_hex(4)
    b = Replica(redis_state(redis, "b", prefix))
    await b.start()
    a = Replica(redis_state(redis, "a", prefix))
    try:
        await a.start()
        await b.state.send("a", {"op": "ping"})
        assert await asyncio.wait_for(a.inbox.get(), 5) == {"op": "ping"}
    finally:
        for replica in (a, b):
            await replica.state.close()


async def test_a_message_sent_while_its_replica_subscribes_again_reaches_it(redis: RedisServer) -> None:
    """After Redis comes back, a replica's heartbeat can make it available a moment before its
    inbox has subscribed again: a message published then reached nobody and was lost to the
    asker's 5 s timeout (a 503 `replica_unavailable` right after a Redis restart). Published to no
    subscriber, it is published again for a bounded moment."""
    prefix = "t" + secrets.token_hex(4)
    b = Replica(redis_state(redis, "b", prefix))
    await b.start()
    a = Replica(redis_state(redis, "a", prefix))
    try:
        sending = asyncio.create_task(b.state.send("a", {"op": "ping"}))
        await asyncio.sleep(0.3)  # a subscribes only now
        await a.start()
        await asyncio.wait_for(sending, 5)
        assert await asyncio.wait_for(a.inbox.get(), 5) == {"op": "ping"}
    finally:
        for replica in (a, b):
            await replica.state.close()


async def test_a_relay_delivers_every_entry_in_order_then_its_end(pair: tuple[Replica, Replica]) -> None:
    a, b = pair
    key = secrets.token_hex(6)
    position, entries = await b.state.relay_read(key, "", timeout=0.05)
    assert entries == []  # nothing yet: the read times out empty

    async def writer() -> None:
        await a.state.relay_append(key, RelayEntry(0, [b'{"type":"start"}', b'{"type":"text-delta","delta":"a\\nb"}']))
        await asyncio.sleep(0.05)
        await a.state.relay_append(key, RelayEntry(2, [b'{"type":"finish"}']))
        await a.state.relay_append(key, RelayEntry(3, end="done"))

    task = asyncio.create_task(writer())
    got: list[RelayEntry] = []
    while not got or got[-1].end is None:
        position, entries = await b.state.relay_read(key, position, timeout=2)
        got += entries
    await task
    assert [e.seq for e in got] == [0, 2, 3]
    assert [f for e in got for f in e.frames] == [
        b'{"type":"start"}', b'{"type":"text-delta","delta":"a\\nb"}', b'{"type":"finish"}',
    ]
    assert got[-1] == RelayEntry(3, [], "done")
    # A second reader from the start sees the same.
    _, again = await a.state.relay_read(key, "", timeout=1)
    assert [e.seq for e in again] == [0, 2, 3]


async def test_gated_call_records_merge_and_expire(pair: tuple[Replica, Replica]) -> None:
    a, b = pair
    call = "gw-" + secrets.token_hex(6)
    assert await b.state.get_call(call) is None
    await a.state.put_call(call, {"user": "alice", "chat": "c1", "owner": "a", "tool": "pay"}, ttl=60)
    await a.state.put_call(call, {"verdict": '{"verdict":"run"}'}, ttl=0.3)
    assert await b.state.get_call(call) == {
        "user": "alice", "chat": "c1", "owner": "a", "tool": "pay", "verdict": '{"verdict":"run"}',
    }
    await asyncio.sleep(0.5)
    assert await b.state.get_call(call) is None


async def test_a_gated_call_record_lives_as_long_as_its_last_write_says(pair: tuple[Replica, Replica]) -> None:
    """As Redis's PEXPIRE on each write: an earlier, shorter lifetime does not take the record away."""
    a, b = pair
    call = "gw-" + secrets.token_hex(6)
    await a.state.put_call(call, {"user": "alice", "chat": "c1", "owner": "a", "tool": "pay"}, ttl=0.3)
    await a.state.put_call(call, {"verdict": '{"verdict":"run"}'}, ttl=60)
    await asyncio.sleep(0.5)
    assert await b.state.get_call(call) == {
        "user": "alice", "chat": "c1", "owner": "a", "tool": "pay", "verdict": '{"verdict":"run"}',
    }


def _deadline(name: str, due: float) -> Deadline:
    return Deadline("demo_agent", "u1", "chat-" + name, "adk-" + name, "call-" + name, "process_payment", due)


async def test_a_passed_deadline_is_claimed_by_exactly_one_replica(pair: tuple[Replica, Replica]) -> None:
    a, b = pair
    assert await a.state.next_deadline() is None
    await a.state.add_deadline(_deadline("x", 100.0))
    await b.state.add_deadline(_deadline("y", 50.0))
    await a.state.add_deadline(_deadline("z", 300.0))
    assert await b.state.next_deadline() == 50.0
    assert await a.state.claim_deadlines(49.0) == []
    # Replicas racing for what passed: each deadline goes to exactly one of them.
    claims = await asyncio.gather(*(r.state.claim_deadlines(150.0, lease=30.0) for r in (a, b, a, b)))
    assert sorted(d.approval_id for claim in claims for d in claim) == ["adk-x", "adk-y"]
    assert [d for claim in claims for d in claim if d.approval_id == "adk-x"] == [_deadline("x", 100.0)]
    # Claimed, not gone: kept due when the claim's lease ends.
    assert await a.state.next_deadline() == 180.0
    for claimed in (d for claim in claims for d in claim):
        assert await b.state.settle_deadline(claimed, None)
    assert await a.state.next_deadline() == 300.0
    await b.state.drop_deadline(_deadline("z", 0).key)
    assert await a.state.next_deadline() is None and await a.state.claim_deadlines(1e12) == []


async def test_a_chats_held_deadline_is_kept_claimed_and_settled_beside_the_confirmations(pair: tuple[Replica, Replica]) -> None:
    """One queue: a chat's held calls' deadline (one per chat, whichever call is earliest) is kept,
    moved and claimed as a confirmation's is, and comes back as the kind it was stored as."""
    a, b = pair
    held = Deadline("demo_agent", "u1", "chat-x", "gw-1", "call-1", "process_payment", 120.0, kind="held")
    await a.state.add_deadline(_deadline("x", 100.0))
    await a.state.add_deadline(held)
    await b.state.add_deadline(Deadline("demo_agent", "u1", "chat-x", "gw-2", "call-2", "process_payment", 110.0, kind="held"))
    claims = await asyncio.gather(a.state.claim_deadlines(150.0, lease=30.0), b.state.claim_deadlines(150.0, lease=30.0))
    claimed = sorted((d for claim in claims for d in claim), key=lambda d: d.due)
    assert [(d.kind, d.approval_id, d.key) for d in claimed] == [
        ("confirmation", "adk-x", "chat-x/adk-x"), ("held", "gw-2", "chat-x/held"),
    ]
    for one in claimed:
        assert await a.state.settle_deadline(one, None)
    assert await b.state.next_deadline() is None


async def test_a_claimed_deadline_nobody_settles_comes_back_after_the_lease_only(pair: tuple[Replica, Replica]) -> None:
    """The replica that claimed it died before answering (or hangs): another claims it again once
    the lease ended, not before; the first one's claim is then spent."""
    a, b = pair
    await a.state.add_deadline(_deadline("x", 100.0))
    [first] = await a.state.claim_deadlines(100.0, lease=30.0)
    assert first.leased_until == 130.0
    assert await b.state.claim_deadlines(129.9, lease=30.0) == []
    [again] = await b.state.claim_deadlines(130.0, lease=30.0)
    assert again == _deadline("x", 100.0) and again.leased_until == 160.0
    # The first claimer, back after its lease: it neither drops nor moves what b now holds.
    assert not await a.state.settle_deadline(first, None)
    assert not await a.state.settle_deadline(first, 131.0)
    assert await a.state.next_deadline() == 160.0
    assert await b.state.claim_deadlines(159.0) == []
    assert await b.state.settle_deadline(again, 200.0)  # busy: try again at 200
    assert not await b.state.settle_deadline(again, None)  # a claim is settled once
    assert await a.state.next_deadline() == 200.0
    [third] = await a.state.claim_deadlines(200.0, lease=30.0)
    assert third.due == 200.0 and await a.state.settle_deadline(third, None)
    assert await b.state.next_deadline() is None and await b.state.claim_deadlines(1e12) == []


async def test_a_settled_deadline_is_not_brought_back_by_a_claimer_whose_lease_ended(pair: tuple[Replica, Replica]) -> None:
    """a's claim lapsed, b claimed and answered it (dropped): a's late retry does not resurrect it.
    Nor does it when the chat's side dropped it (a person answered) or replaced it (an approval
    moved it): what the claimer learnt is older than that."""
    a, b = pair
    await a.state.add_deadline(_deadline("x", 100.0))
    [first] = await a.state.claim_deadlines(100.0, lease=30.0)
    [second] = await b.state.claim_deadlines(130.0, lease=30.0)
    assert await b.state.settle_deadline(second, None)
    assert not await a.state.settle_deadline(first, 140.0)
    assert await a.state.next_deadline() is None and await a.state.claim_deadlines(1e12) == []
    # Dropped by the chat's side while claimed.
    await a.state.add_deadline(_deadline("y", 100.0))
    [claimed] = await a.state.claim_deadlines(100.0, lease=30.0)
    await b.state.drop_deadline(claimed.key)
    assert not await a.state.settle_deadline(claimed, 101.0)
    assert await a.state.claim_deadlines(1e12) == []
    # Replaced while claimed: the new one stands, claimable at its own time.
    await a.state.add_deadline(_deadline("z", 100.0))
    [claimed] = await a.state.claim_deadlines(100.0, lease=30.0)
    moved = Deadline("demo_agent", "u1", "chat-z", "adk-z", "call-z", "process_payment", 395.0, approved_at=95.0)
    await b.state.add_deadline(moved)
    assert not await a.state.settle_deadline(claimed, None)
    assert await a.state.next_deadline() == 395.0
    [kept] = await b.state.claim_deadlines(395.0)
    assert kept == moved and kept.approved_at == 95.0


async def test_replicas_claiming_at_once_get_disjoint_deadlines_again_after_the_lease(pair: tuple[Replica, Replica]) -> None:
    a, b = pair
    names = [f"n{i}" for i in range(20)]
    for i, name in enumerate(names):
        await (a, b)[i % 2].state.add_deadline(_deadline(name, 100.0 + i))
    for now in (200.0, 260.0):  # the second round: every lease of the first lapsed
        claims = await asyncio.gather(*(r.state.claim_deadlines(now, limit=7, lease=50.0) for r in (a, b, a, b, a)))
        got = [d.approval_id for claim in claims for d in claim]
        assert sorted(got) == sorted("adk-" + n for n in names)  # each once, none lost
    # Settled under the second round's leases: nothing comes back.
    for claim in claims:
        for claimed in claim:
            assert await a.state.settle_deadline(claimed, None)
    assert await b.state.next_deadline() is None


async def test_a_deadline_added_again_keeps_the_latest_due_time(pair: tuple[Replica, Replica]) -> None:
    a, b = pair
    await a.state.add_deadline(_deadline("x", 100.0))
    await b.state.add_deadline(_deadline("x", 200.0))
    assert await a.state.next_deadline() == 200.0
    assert await a.state.claim_deadlines(150.0) == []
    assert await b.state.claim_deadlines(200.0) == [_deadline("x", 200.0)]


async def test_a_deadline_an_approval_moved_is_claimed_at_its_new_time_with_the_approval(pair: tuple[Replica, Replica]) -> None:
    """The replica that took a browser tool's approval replaces the stored deadline (confirm mode):
    no replica claims it at the first due time, and the one that claims it later knows of the
    approval (sealed with the rest on Redis)."""
    a, b = pair
    await a.state.add_deadline(_deadline("x", 100.0))
    moved = Deadline("demo_agent", "u1", "chat-x", "adk-x", "call-x", "process_payment", 395.0, approved_at=95.0)
    await b.state.add_deadline(moved)
    assert await a.state.claim_deadlines(100.0) == []
    assert await a.state.next_deadline() == 395.0
    [claimed] = await a.state.claim_deadlines(395.0)
    assert claimed == moved and claimed.approved_at == 95.0
    assert await a.state.settle_deadline(claimed, None)
    assert await b.state.claim_deadlines(1e12) == []


async def test_a_ticket_is_taken_once_by_any_replica_and_expires(pair: tuple[Replica, Replica]) -> None:
    a, b = pair
    record = {"user": "alice", "claims": "{}", "agent": "demo_agent", "origin": "", "auth": "f"}
    await a.state.put_ticket("t1", record, ttl=60)
    assert await b.state.take_ticket("t1") == record
    assert await a.state.take_ticket("t1") is None  # spent: one socket per ticket
    await a.state.put_ticket("t2", record, ttl=0.2)
    await asyncio.sleep(0.4)
    assert await b.state.take_ticket("t2") is None
    # Two replicas racing for one ticket: exactly one gets it.
    await a.state.put_ticket("t3", record, ttl=60)
    taken = await asyncio.gather(*(replica.state.take_ticket("t3") for replica in (a, b, a, b)))
    assert taken.count(record) == 1


# A chat's state as its machine saves it: a JSON object, nested (core/chat_machine.py).
STATE: dict[str, Any] = {
    "version": 1,
    "ledger": {"adk-1": {"tool": "process_payment", "args": {"amount": 12.5, "to": "Bob"}, "due": 1700000300.0}},
    "answered": ["adk-0"],
    "held": None,
}


async def test_a_chat_state_stored_by_one_replica_is_read_by_another(pair: tuple[Replica, Replica]) -> None:
    a, b = pair
    chat = chat_id()
    assert await b.state.get_chat_state("alice", chat) is None  # never stored
    await a.state.put_chat_state("alice", chat, STATE, ttl=60)
    assert await b.state.get_chat_state("alice", chat) == STATE
    assert await a.state.get_chat_state("alice", chat) == STATE


async def test_a_chat_state_stored_again_replaces_the_last(pair: tuple[Replica, Replica]) -> None:
    a, b = pair
    chat = chat_id()
    await a.state.put_chat_state("alice", chat, STATE, ttl=0.3)
    later = {"version": 1, "ledger": {}, "answered": ["adk-0", "adk-1"], "held": None}
    await b.state.put_chat_state("alice", chat, later, ttl=60)
    assert await a.state.get_chat_state("alice", chat) == later
    # The later state keeps its own lifetime: the earlier one's expiry does not take it away.
    await asyncio.sleep(0.5)
    assert await a.state.get_chat_state("alice", chat) == later


async def test_a_chat_state_is_never_read_under_another_user(pair: tuple[Replica, Replica]) -> None:
    a, b = pair
    chat = chat_id()
    await a.state.put_chat_state("alice", chat, STATE, ttl=60)
    for replica in (a, b):
        assert await replica.state.get_chat_state("mallory", chat) is None
    assert await b.state.get_chat_state("alice", chat) == STATE  # still alice's


async def test_a_chat_state_expires_after_its_ttl(pair: tuple[Replica, Replica]) -> None:
    a, b = pair
    chat = chat_id()
    await a.state.put_chat_state("alice", chat, STATE, ttl=0.2)
    assert await b.state.get_chat_state("alice", chat) == STATE
    await asyncio.sleep(0.4)
    assert await b.state.get_chat_state("alice", chat) is None


async def test_a_chat_state_read_back_is_a_copy(pair: tuple[Replica, Replica]) -> None:
    """What the caller changes after storing, or after reading, is not the stored state (as over a
    network: the memory backend keeps JSON too)."""
    a, b = pair
    chat = chat_id()
    mine = {"ledger": {"adk-1": {"tool": "pay"}}}
    await a.state.put_chat_state("alice", chat, mine, ttl=60)
    mine["ledger"]["adk-2"] = {"tool": "pay"}
    read = await b.state.get_chat_state("alice", chat)
    assert read == {"ledger": {"adk-1": {"tool": "pay"}}}
    read["ledger"].clear()
    assert await b.state.get_chat_state("alice", chat) == {"ledger": {"adk-1": {"tool": "pay"}}}


# ---- Redis only: the store goes away, or comes back empty ---------------------------------------


async def _until(predicate: Any, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def test_redis_down_is_reported_and_recovers_without_restart(tmp_path: Path) -> None:
    server = RedisServer(tmp_path)
    server.start()
    replica = Replica(redis_state(server, "a", "down"))
    try:
        await replica.start()
        assert replica.state.available
        chat = chat_id()
        await replica.state.claim("alice", chat, **DEMO, ttl=60)
        await asyncio.to_thread(server.stop)
        with pytest.raises(SharedStateDown):
            await replica.state.claim("alice", chat, **DEMO, ttl=60)
        assert not replica.state.available
        with pytest.raises(SharedStateDown):
            await replica.state.owner("alice", chat)
        # Back, empty: the replica writes its chats back, then serves claims again.
        replica.local = [LocalChat("alice", chat, "demo_agent", "msg-7")]
        await asyncio.to_thread(server.start)
        await _until(lambda: replica.state.available)
        claim = await replica.state.claim("alice", chat, **DEMO, ttl=60)
        assert (claim.local, claim.orphaned_run) == (True, None)
    finally:
        await replica.state.close()
        server.stop()


async def test_after_redis_lost_its_data_owners_write_their_chats_back_before_others_claim(tmp_path: Path) -> None:
    server = RedisServer(tmp_path)
    server.start()
    a, b = Replica(redis_state(server, "a", "reset")), Replica(redis_state(server, "b", "reset"))
    try:
        await a.start()
        await b.start()
        chat = chat_id()
        await a.state.claim("alice", chat, **SUPPORT, ttl=60)
        a.local = [LocalChat("alice", chat, "support_agent", "msg-9")]
        await asyncio.to_thread(server.restart)
        # Whatever b sees first, it is never handed a's chat: an error to retry, then a's ownership.
        seen: list[str] = []
        deadline = asyncio.get_running_loop().time() + 10
        while True:
            try:
                claim = await b.state.claim("alice", chat, **SUPPORT, ttl=60)
            except SharedStateDown:
                seen.append("retry")
            else:
                assert (claim.owner, claim.local) == ("a", False), "b took a chat its live owner still runs"
                break
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.05)
        with pytest.raises(ChatNotFound):  # written back with its agent
            await b.state.claim("alice", chat, **DEMO, ttl=60)
        # (Whether b saw a retry first depends on whose heartbeat ran first after the restart.)
        # A chat nobody had is claimable once the settling window is over.
        fresh = chat_id()
        while True:
            try:
                assert (await b.state.claim("bob", fresh, **DEMO, ttl=60)).local
                break
            except SharedStateDown:
                assert asyncio.get_running_loop().time() < deadline + OWNER_TIMEOUT * 3
                await asyncio.sleep(0.05)
    finally:
        for replica in (a, b):
            await replica.state.close()
        server.stop()


async def test_chat_states_fail_closed_while_redis_is_down(tmp_path: Path) -> None:
    """A replica that cannot store or read a chat's approvals says so (503), never "no approvals"."""
    server = RedisServer(tmp_path)
    server.start()
    replica = Replica(redis_state(server, "a", "down-state"))
    try:
        await replica.start()
        chat = chat_id()
        await replica.state.put_chat_state("alice", chat, STATE, ttl=60)
        await asyncio.to_thread(server.stop)
        with pytest.raises(SharedStateDown):
            await replica.state.get_chat_state("alice", chat)
        with pytest.raises(SharedStateDown):
            await replica.state.put_chat_state("alice", chat, STATE, ttl=60)
    finally:
        await replica.state.close()
        server.stop()
