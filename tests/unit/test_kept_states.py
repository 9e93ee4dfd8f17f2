"""Kept chat states: the chat service's side (chat/kept_states.py) and the cluster's writer (cluster/state_keeper.py).

What a kept state buys across replicas is in test_confirm_timeouts.py (a browser tool approved on a
replica that is gone); here, the rules around it: one read per chat, a state read late never
replaces what this replica recorded, writes in order and folded, and a store that fails costs a
warning, never a request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from gateway.approvals.decision import DECIDER
from gateway.chat.kept_states import KeptStates
from gateway.chat.record import Chat, RunHooks
from gateway.cluster.memory import MemoryHub, MemoryState
from gateway.cluster.shared import SharedStateDown
from gateway.cluster.state_keeper import StateKeeper
from gateway.cluster.tasks import Tasks
from gateway.core.chat_events import NativeAnswered
from gateway.core.chat_machine import ChatMachine
from gateway.ops.metrics import GatewayMetrics


def _chat() -> Chat:
    return Chat("alice", "c1", "c1", 0.0, "agent", RunHooks(GatewayMetrics(), time.monotonic, lambda call: None))


def _answered_elsewhere(approval_id: str) -> dict[str, Any]:
    machine = ChatMachine(decider=DECIDER)
    machine.handle(NativeAnswered(approval_id, "call-1", timed_out=True))
    return machine.snapshot()


class _Store:
    """A `StateStore` (chat/ports.py) that reads with `load` and keeps nothing."""

    def __init__(self, load: Callable[[Chat], Awaitable[dict[str, Any] | None]]) -> None:
        self.load = load

    def save(self, chat: Chat) -> None:
        pass

    async def keep(self, chat: Chat) -> None:
        pass


async def test_two_requests_of_a_new_chat_read_its_state_once_and_both_see_it() -> None:
    reads: list[str] = []
    gate = asyncio.Event()

    async def load(chat: Chat) -> dict[str, Any] | None:
        reads.append(chat.chat_id)
        await gate.wait()
        return _answered_elsewhere("a1")

    states = KeptStates(GatewayMetrics(), time.monotonic)
    states.attach(_Store(load))
    chat = _chat()
    one = asyncio.create_task(states.adopt(chat))
    two = asyncio.create_task(states.adopt(chat))
    await asyncio.sleep(0.01)
    assert not chat.adopted
    gate.set()
    await asyncio.gather(one, two)
    assert reads == ["c1"] and chat.adopted and chat.ledger.native_timed_out("a1")
    await states.adopt(chat)
    assert reads == ["c1"]


async def test_a_request_that_answers_nothing_does_not_wait_for_a_read() -> None:
    states = KeptStates(GatewayMetrics(), time.monotonic)

    async def load(chat: Chat) -> dict[str, Any] | None:
        raise AssertionError("not read")

    states.attach(_Store(load))
    chat = _chat()
    await states.adopt(chat, needed=False)
    assert chat.adopted


async def test_a_state_that_does_not_validate_leaves_the_chat_empty() -> None:
    states = KeptStates(GatewayMetrics(), time.monotonic)

    async def load(chat: Chat) -> dict[str, Any] | None:
        return {"v": 1, "ledger": {"v": 99}}

    states.attach(_Store(load))
    chat = _chat()
    await states.adopt(chat)
    assert chat.adopted and chat.ledger.empty


class Recording(MemoryState):
    def __init__(self, hub: MemoryHub) -> None:
        super().__init__("a", hub)
        self.written: list[dict[str, Any]] = []
        self.release = asyncio.Event()
        self.down = False

    async def put_chat_state(self, user_id: str, chat_id: str, state: dict[str, Any], *, ttl: float) -> None:
        await self.release.wait()
        if self.down:
            raise SharedStateDown("unreachable")
        self.written.append(state)
        await super().put_chat_state(user_id, chat_id, state, ttl=ttl)


class _Chats:
    """The part of a chat service the keeper reads and sets."""

    def __init__(self) -> None:
        self.states = KeptStates(GatewayMetrics(), time.monotonic)
        self.config = type("C", (), {"chat": type("S", (), {"idle_chat_ttl": 60.0})()})()


async def test_saves_asked_for_while_one_is_written_fold_into_one_write_of_the_newest_state() -> None:
    store, chats, tasks = Recording(MemoryHub()), _Chats(), Tasks()
    StateKeeper(store, chats, tasks, timeout=1.0)  # type: ignore[arg-type]
    chat = _chat()
    chats.states.changed(chat)
    await asyncio.sleep(0)  # the first write took its snapshot and waits on the store
    chat.handle(NativeAnswered("a1"))
    chats.states.changed(chat)
    chat.handle(NativeAnswered("a2"))
    chats.states.changed(chat)
    store.release.set()
    await asyncio.sleep(0.05)
    assert len(store.written) == 2  # the first, then one more with everything since
    assert store.written[0]["ledger"]["answered"] == [] and store.written[-1] == chat.machine.snapshot()
    assert await chats.states.store.load(chat) == chat.machine.snapshot()  # type: ignore[misc]
    await tasks.close(1.0)


async def test_keep_returns_once_the_state_as_it_is_now_is_written_and_at_the_bound_if_never() -> None:
    store, chats, tasks = Recording(MemoryHub()), _Chats(), Tasks()
    StateKeeper(store, chats, tasks, timeout=0.2)  # type: ignore[arg-type]
    chat = _chat()
    chats.states.changed(chat)
    await asyncio.sleep(0)  # a write under way, of the state before the change below
    chat.handle(NativeAnswered("a1"))
    keeping = asyncio.create_task(chats.states.keep(chat))
    await asyncio.sleep(0.05)
    assert not keeping.done()
    store.release.set()
    await asyncio.wait_for(keeping, 1.0)
    assert store.written[-1] == chat.machine.snapshot() and len(store.written) == 2
    store.release.clear()  # a store that hangs: keep gives up at the bound, the write goes on
    chat.handle(NativeAnswered("a2"))
    started = time.monotonic()
    await chats.states.keep(chat)
    assert 0.15 < time.monotonic() - started < 1.0 and len(store.written) == 2
    store.release.set()
    await asyncio.sleep(0.05)
    await tasks.close(1.0)


async def test_a_store_that_is_down_is_tried_again_and_one_that_hangs_is_given_up() -> None:
    store, chats, tasks = Recording(MemoryHub()), _Chats(), Tasks()
    StateKeeper(store, chats, tasks, timeout=0.05)  # type: ignore[arg-type]
    chat = _chat()
    store.down = True
    store.release.set()
    chats.states.changed(chat)
    await asyncio.sleep(0.1)
    assert store.written == []
    store.down = False  # back: the next try writes it
    await asyncio.sleep(0.7)
    assert store.written == [chat.machine.snapshot()]
    store.release.clear()  # a write that hangs is given up at the bound, and a new one may start
    chat.handle(NativeAnswered("a1"))
    chats.states.changed(chat)
    await asyncio.sleep(0.2)
    assert len(store.written) == 1
    chats.states.changed(chat)
    store.release.set()
    await asyncio.sleep(0.05)
    assert store.written[-1] == chat.machine.snapshot() and len(store.written) == 2
    await tasks.close(1.0)


async def test_expired_states_do_not_pile_up_in_memory() -> None:
    # The loop's clock stands still while the 200 are written, then jumps past their TTL: how many
    # expire between two puts must not depend on how fast a loaded machine writes them.
    loop = asyncio.get_running_loop()
    clock = [loop.time()]
    loop.time = lambda: clock[0]  # type: ignore[method-assign]
    try:
        hub = MemoryHub()
        store = MemoryState("a", hub)
        for n in range(200):
            await store.put_chat_state("alice", f"c{n}", {"n": n}, ttl=0.001)
        assert len(hub.states) == 200  # nothing expired yet, nothing dropped
        clock[0] += 0.01
        for n in range(100):  # the table doubles since its last purge: the expired ones go
            await store.put_chat_state("alice", f"new{n}", {}, ttl=60)
        assert len(hub.states) <= 100
        assert await store.get_chat_state("alice", "c1") is None
    finally:
        del loop.time  # type: ignore[method-assign]
