"""Shared state in this process: the default backend (`sessions.backend: memory`).

A `MemoryHub` is what replicas would share; each `MemoryState` is one replica's view of it. In
production there is one replica and one hub per process, so every chat is local and nothing is
ever forwarded. Tests put several replicas on one hub to run the same contract as the Redis
backend (tests/unit/test_cluster_state.py) and to drive the router without a network.
Chat records expire `ttl` after their last claim, as in Redis; call records after theirs; chat
states `ttl` after they were last stored.
The deadline queue lives as long as the process, and so does the audit trail's store: a bounded
deque of records (the newest `audit.keep`, none older than `audit.max_age`) and the set of their
approval ids, numbered and placed as the Redis backend places them.
Per-user limits (token buckets and stream slots) are kept here as Redis keeps them, for the tests'
shared table (tests/unit/test_shared_limits.py); a gateway on this backend counts its limits in
`Admission` (core/limits.py), `shares_limits` being false.
Pending approvals: memory_approvals.py.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import structlog

from ..chat.registry import ChatNotFound
from ..core.deadlines import Deadline, DeadlineQueue
from ..core.limits import LeasedLimits
from ..approvals.index import ApprovalPage, ApprovalQuery
from ..approvals.votes import Tally
from .memory_approvals import ApprovalTable
from .memory_grants import GrantTable, MemoryGrants
from .shared import (
    DEADLINE_LEASE, AuditEntry, AuditQuery, Claim, Inbox, Reassert, RelayEntry, SharedState, audit_position,
)

__all__ = ["MemoryHub", "MemoryState"]

log = structlog.get_logger("adk_gateway.cluster.memory")


# How long an ended relay stays readable: a reader a little behind still finds its end.
_ENDED_RELAY_KEEP = 60.0


@dataclass(slots=True)
class _ChatRecord:
    user_id: str
    owner: str
    expires: float
    agent: str
    run: str = ""


@dataclass(frozen=True)
class _ChatState:
    user_id: str
    # As JSON, as Redis keeps it: what the caller changes afterwards is not stored, and what is
    # not JSON fails here as it would there.
    state: bytes
    expires: float


@dataclass(frozen=True)
class _AuditKept:
    # Where the store placed it: (milliseconds, sequence), its cursor "<ms>-<seq>".
    position: tuple[int, int]
    approval_id: str
    # As JSON, as Redis keeps it (see _ChatState).
    record: bytes


@dataclass
class _Relay:
    entries: list[RelayEntry] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(eq=False)
class MemoryHub:
    """What the replicas of one process share."""

    chats: dict[str, _ChatRecord] = field(default_factory=dict)
    inboxes: dict[str, Inbox] = field(default_factory=dict)
    relays: dict[str, _Relay] = field(default_factory=dict)
    calls: dict[str, dict[str, str]] = field(default_factory=dict)
    call_expiry: dict[str, float] = field(default_factory=dict)
    tickets: dict[str, dict[str, str]] = field(default_factory=dict)
    states: dict[str, _ChatState] = field(default_factory=dict)
    states_purge_at: int = 64
    # The deadline queue: kept by the process, so lost with it (the late-answer rule covers a
    # restart: docs/approvals.md; held calls die with the process anyway).
    deadlines: DeadlineQueue = field(default_factory=DeadlineQueue)
    next_sweep: float = 0.0
    # The audit trail: its records oldest first, their approval ids, and the wall clock the
    # records are placed and aged on (as Redis's clock is, for the Redis backend).
    audit: deque[_AuditKept] = field(default_factory=deque)
    audit_ids: set[str] = field(default_factory=set)
    audit_last: tuple[int, int] = (0, 0)
    wall: Callable[[], float] = time.time
    # The directory of pending approvals.
    approvals: ApprovalTable = field(default_factory=ApprovalTable)
    # The standing grants (memory_grants.py).
    grants: GrantTable = field(default_factory=GrantTable)
    # Per-user limits: each user's bucket and stream slots.
    limits: LeasedLimits = field(default_factory=LeasedLimits)


class MemoryState(SharedState):
    def __init__(self, replica_id: str, hub: MemoryHub | None = None) -> None:
        super().__init__(replica_id)
        self.hub = hub if hub is not None else MemoryHub()
        self.grants = MemoryGrants(self.hub.grants, lambda: self.hub.wall())

    async def start(self, inbox: Inbox, reassert: Reassert) -> None:
        self.hub.inboxes[self.replica_id] = inbox

    async def close(self) -> None:
        self.hub.inboxes.pop(self.replica_id, None)

    async def claim(
        self, user_id: str, chat_id: str, *, agent: str, default_agent: str, ttl: float, create: bool = True
    ) -> Claim:
        now = asyncio.get_running_loop().time()
        self._expire(now)
        record = self.hub.chats.get(chat_id)
        if record is None:
            if create:
                self.hub.chats[chat_id] = _ChatRecord(user_id, self.replica_id, now + ttl, agent)
            return Claim(self.replica_id, local=True)
        if record.user_id != user_id or (record.agent or default_agent) != agent:
            raise ChatNotFound(chat_id)
        record.expires = now + ttl
        if record.owner == self.replica_id:
            return Claim(self.replica_id, local=True)
        if record.owner in self.hub.inboxes:
            return Claim(record.owner, local=False)
        orphaned = record.run or None
        record.owner, record.run = self.replica_id, ""
        return Claim(self.replica_id, local=True, orphaned_run=orphaned)

    def _expire(self, now: float) -> None:
        # As Redis expires keys: a record outlives its last claim by `ttl`. Swept at most once a
        # second, so claims stay O(1) on average.
        if now < self.hub.next_sweep:
            return
        self.hub.next_sweep = now + 1.0
        for chat_id in [c for c, r in self.hub.chats.items() if r.expires <= now]:
            del self.hub.chats[chat_id]

    async def owner(self, user_id: str, chat_id: str) -> str | None:
        record = self.hub.chats.get(chat_id)
        if record is None or record.user_id != user_id or record.owner not in self.hub.inboxes:
            return None
        return record.owner

    async def mark_run(self, user_id: str, chat_id: str, message_id: str) -> None:
        record = self.hub.chats.get(chat_id)
        if record is not None and record.user_id == user_id and record.owner == self.replica_id:
            record.run = message_id

    async def release(self, user_id: str, chat_id: str) -> None:
        record = self.hub.chats.get(chat_id)
        if record is not None and record.user_id == user_id and record.owner == self.replica_id:
            del self.hub.chats[chat_id]

    async def alive(self, replica_id: str) -> bool:
        return replica_id in self.hub.inboxes

    async def send(self, replica_id: str, message: dict[str, Any]) -> None:
        inbox = self.hub.inboxes.get(replica_id)
        if inbox is not None:
            # As over a network: delivered later, never inside the sender's call.
            asyncio.get_running_loop().call_soon(inbox, message)

    async def relay_append(self, key: str, entry: RelayEntry) -> None:
        relay = self.hub.relays.setdefault(key, _Relay())
        relay.entries.append(entry)
        relay.changed.set()
        if entry.end is not None:
            # Readers hold their position; the relay is gone once the last one finished reading.
            asyncio.get_running_loop().call_later(_ENDED_RELAY_KEEP, self.hub.relays.pop, key, None)

    async def relay_read(self, key: str, after: str, *, timeout: float) -> tuple[str, list[RelayEntry]]:
        position = int(after or 0)
        relay = self.hub.relays.setdefault(key, _Relay())
        if position >= len(relay.entries):
            relay.changed.clear()
            try:
                async with asyncio.timeout(timeout):  # not wait_for: see RedisState._heartbeats
                    await relay.changed.wait()
            except TimeoutError:
                return after, []
        entries = relay.entries[position:]
        return str(position + len(entries)), entries

    async def put_call(self, call_id: str, record: dict[str, str], *, ttl: float) -> None:
        loop = asyncio.get_running_loop()
        self.hub.calls.setdefault(call_id, {}).update(record)
        # The last write's lifetime, as Redis's PEXPIRE: an earlier write's timer leaves it be.
        expires = self.hub.call_expiry[call_id] = loop.time() + ttl
        loop.call_later(ttl, self._drop_call, call_id, expires)

    def _drop_call(self, call_id: str, expires: float) -> None:
        if self.hub.call_expiry.get(call_id) == expires:
            del self.hub.call_expiry[call_id]
            self.hub.calls.pop(call_id, None)

    async def get_call(self, call_id: str) -> dict[str, str] | None:
        record = self.hub.calls.get(call_id)
        return dict(record) if record is not None else None

    async def put_ticket(self, key: str, record: dict[str, str], *, ttl: float) -> None:
        self.hub.tickets[key] = dict(record)
        asyncio.get_running_loop().call_later(ttl, self.hub.tickets.pop, key, None)

    async def take_ticket(self, key: str) -> dict[str, str] | None:
        return self.hub.tickets.pop(key, None)

    async def put_chat_state(self, user_id: str, chat_id: str, state: dict[str, Any], *, ttl: float) -> None:
        now = asyncio.get_running_loop().time()
        states = self.hub.states
        states[chat_id] = _ChatState(user_id, orjson.dumps(state), now + ttl)
        # No timer per put (each would keep its state until the TTL): expired states are dropped
        # when read, and all at once whenever the table has doubled since the last purge.
        if len(states) >= self.hub.states_purge_at:
            for key in [key for key, kept in states.items() if kept.expires <= now]:
                del states[key]
            self.hub.states_purge_at = max(64, 2 * len(states))

    async def get_chat_state(self, user_id: str, chat_id: str) -> dict[str, Any] | None:
        stored = self.hub.states.get(chat_id)
        if stored is None:
            return None
        if stored.expires <= asyncio.get_running_loop().time():
            del self.hub.states[chat_id]
            return None
        if stored.user_id != user_id:
            log.warning("chat_state_foreign", replica=self.replica_id, chat_id=chat_id)
            return None
        state: dict[str, Any] = orjson.loads(stored.state)
        return state

    async def add_deadline(self, deadline: Deadline) -> None:
        self.hub.deadlines.add(deadline)

    async def drop_deadline(self, key: str) -> None:
        self.hub.deadlines.drop(key)

    async def claim_deadlines(self, now: float, *, limit: int = 100, lease: float = DEADLINE_LEASE) -> list[Deadline]:
        # No await: the claim is one step under the hub, as the Lua script is in Redis.
        return self.hub.deadlines.claim(now, now + lease, limit)

    async def settle_deadline(self, claimed: Deadline, again: float | None) -> bool:
        return self.hub.deadlines.settle(claimed, again)

    async def next_deadline(self) -> float | None:
        return self.hub.deadlines.next_due()

    async def audit_append(self, entry: AuditEntry, *, keep: int, max_age: float) -> bool:
        hub = self.hub
        # No await: the check and the append are one step, as the Lua script is in Redis.
        if entry.approval_id in hub.audit_ids:
            self._audit_trim(keep, max_age)
            return False
        # Placed at the decision's time, unless a record is placed later already: the store's
        # order is the order of appends (as a Redis stream's).
        ms = max(int(entry.at * 1000), hub.audit_last[0])
        seq = hub.audit_last[1] + 1 if ms == hub.audit_last[0] else 0
        hub.audit_last = (ms, seq)
        hub.audit.append(_AuditKept((ms, seq), entry.approval_id, orjson.dumps(entry.record)))
        hub.audit_ids.add(entry.approval_id)
        self._audit_trim(keep, max_age)
        return True

    def _audit_trim(self, keep: int, max_age: float) -> None:
        hub = self.hub
        oldest = int((hub.wall() - max_age) * 1000)
        while hub.audit and (len(hub.audit) > keep or hub.audit[0].position[0] < oldest):
            hub.audit_ids.discard(hub.audit.popleft().approval_id)

    async def audit_read(self, query: AuditQuery, *, max_age: float) -> list[dict[str, Any]]:
        start = max(int((self.hub.wall() - max_age) * 1000), int((query.since or 0) * 1000))
        after = audit_position(query.after) if query.after else (-1, -1)
        end = int(query.until * 1000) if query.until is not None else None
        found: list[dict[str, Any]] = []
        for kept in self.hub.audit:
            ms = kept.position[0]
            if ms < start or kept.position <= after:
                continue
            if (end is not None and ms > end) or len(found) >= query.limit:
                break
            record: dict[str, Any] = orjson.loads(kept.record)
            # Selected on the record, as in Redis (where only the record is sealed).
            if not query.matches(record.get("agent"), record.get("tool")):
                continue
            record["cursor"] = f"{ms}-{kept.position[1]}"
            found.append(record)
        return found

    # ---- the directory of pending approvals (memory_approvals.py) -------------------------------

    async def put_approval(self, record: dict[str, Any], *, ttl: float, cap: int | None = None) -> bool:
        return self.hub.approvals.put(record, ttl=ttl, now=self._now(None), cap=cap)

    async def pending_approvals(self, requester: str) -> int:
        return self.hub.approvals.pending_of(requester, self._now(None))

    async def get_approval(self, approval_id: str) -> dict[str, Any] | None:
        return self.hub.approvals.get(approval_id, self._now(None))

    async def drop_approval(self, approval_id: str) -> None:
        self.hub.approvals.drop(approval_id)

    async def page_approvals(self, query: ApprovalQuery) -> ApprovalPage:
        return self.hub.approvals.page(query, self._now(None))

    async def vote_approval(self, approval_id: str, user: str, approved: bool, quorum: int) -> Tally:
        return self.hub.approvals.vote(approval_id, user, approved, quorum, self._now(None))

    async def take_token(self, user_id: str, *, rate: float, burst: int, now: float | None = None) -> float | None:
        return self.hub.limits.take_token(user_id, rate, burst, self._now(now))

    async def open_slot(
        self, user_id: str, slot_id: str, *, cap: int, lease: float, now: float | None = None,
    ) -> bool:
        return self.hub.limits.open_slot(user_id, slot_id, cap, lease, self._now(now))

    async def take_token_and_slot(
        self, user_id: str, slot_id: str, *, rate: float, burst: int, cap: int, lease: float, now: float | None = None,
    ) -> tuple[float | None, bool]:
        now = self._now(now)
        wait = self.hub.limits.take_token(user_id, rate, burst, now)
        if wait is not None:
            return wait, False
        return None, self.hub.limits.open_slot(user_id, slot_id, cap, lease, now)

    async def close_slot(self, user_id: str, slot_id: str) -> None:
        self.hub.limits.close_slot(user_id, slot_id)

    async def renew_slots(self, slots: Mapping[str, Sequence[str]], *, lease: float, now: float | None = None) -> int:
        return self.hub.limits.renew(slots, lease, self._now(now))

    @staticmethod
    def _now(now: float | None) -> float:
        return asyncio.get_running_loop().time() if now is None else now
