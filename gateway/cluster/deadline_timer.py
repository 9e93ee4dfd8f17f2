"""The one deadline queue, kept in the shared store: each replica's timer, and each passed deadline
claimed and answered (ADK confirmations' and chats' held calls': core/deadlines.py).

Each replica arms one timer for the earliest deadline in the store, not a polling loop. It knows
at once of the deadlines it adds itself; of those other replicas add (Redis), it learns by reading
the earliest due time again every `poll` seconds, the one slow safety poll: a replica that dies
leaves its chats' deadlines to the others, and a chat cannot move to another replica before its
owner is `sessions.owner_timeout` silent anyway (the poll's period).

When the timer fires, the replica claims what passed and has each answered where its chat runs
(`answer`: deadline_answers.py): here, also for a chat it takes over from a dead owner (a
confirmation's), or on the live owner, told by an `Expire` notice. A claim is a lease (shared.py's
DEADLINE_LEASE): the deadline stays in the store, due again when the lease ends, and nobody else
claims it before.
The claimer settles it when done: drops it once answered or moot; what cannot be answered yet (the
chat busy, ADK unreachable) it keeps due when to try again; one handed to another replica, due
`recheck` later, and that replica drops it once it handled it, so a notice lost with its replica is
claimed again, by then from a dead owner. A replica that dies (or hangs) holding a claim settles
nothing: the deadline is claimed again when the lease ends, by whichever replica's timer fires
first. A claimer whose lease ended before it settled changes nothing (the store refuses it): what
it learnt is older than what the next claimer, or the chat's side, did since.

A deadline the store cannot take (down) is lost for a confirmation (the late-answer rule still
holds: ADK's session says when it was asked); a chat's held calls' deadline, which only this
replica knows, is tried again every `_STORE_RETRY` until kept, moved or dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import Awaitable, Callable

import structlog

from ..core.deadlines import Deadline
from .shared import DEADLINE_LEASE, SharedState, SharedStateDown
from .tasks import Tasks

__all__ = ["DeadlineTimer"]

log = structlog.get_logger("adk_gateway.cluster.deadline_timer")

# How many passed deadlines one claim takes; more are claimed at once after those.
_CLAIM_BATCH = 100
# A store that is down is tried again this much later.
_STORE_RETRY = 1.0

# Answers a passed deadline; returns when to try again (wall clock), or None: answered, moot, or
# handed to the owner.
Answer = Callable[[Deadline], Awaitable[float | None]]


class DeadlineTimer:
    def __init__(
        self, state: SharedState, tasks: Tasks, answer: Answer, *, poll: float | None,
        wall: Callable[[], float] = time.time, lease: float = DEADLINE_LEASE,
        kept: Callable[[Deadline], Awaitable[None]] | None = None,
    ) -> None:
        self._state = state
        self._lease = lease
        self._tasks = tasks
        self._answer = answer
        self._poll = poll
        self._wall = wall
        self._handle: asyncio.TimerHandle | None = None
        self._armed_for: float | None = None
        # Told of each deadline added here once it is kept (the approvals API lists approvers' ones).
        self._kept = kept
        # Held calls' deadlines added here and not kept in the store yet, by key: the latest only.
        self._held: dict[str, Deadline] = {}

    def start(self) -> None:
        self._tasks.spawn(self._watch())

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def add(self, deadline: Deadline) -> None:
        """Keep a new deadline (a run here left a confirmation pending, a chat's held calls'
        next deadline moved), or one moved."""
        if deadline.held:
            self._held[deadline.key] = deadline
        self._tasks.spawn(self._keep(deadline))

    def drop(self, key: str) -> None:
        """Forget a deadline: its call was answered, or handled here for another replica."""
        self._held.pop(key, None)
        self._tasks.spawn(self._drop(key))

    async def _keep(self, deadline: Deadline) -> None:
        while True:
            try:
                await self._state.add_deadline(deadline)
                break
            except SharedStateDown:
                log.warning("deadline_not_kept", approval_id=deadline.approval_id, reason="the shared store is unreachable")
                if not deadline.held or self._tasks.closed:
                    # Lost: the rule that a late answer gets the timeout still holds (docs/approvals.md).
                    return
            # A held call's deadline only this replica knows: kept once the store is back, unless
            # it moved or was dropped meanwhile (the later one is kept instead, or nothing).
            await asyncio.sleep(_STORE_RETRY)
            if self._held.get(deadline.key) is not deadline:
                return
        if self._held.get(deadline.key) is deadline:
            del self._held[deadline.key]
        self._arm(deadline.due)
        if self._kept is not None:
            await self._kept(deadline)

    async def _drop(self, key: str) -> None:
        with contextlib.suppress(SharedStateDown):
            await self._state.drop_deadline(key)

    def _arm(self, due: float) -> None:
        """The timer fires at `due` unless it already fires sooner."""
        if self._tasks.closed or (self._handle is not None and self._armed_for is not None and self._armed_for <= due):
            return
        if self._handle is not None:
            self._handle.cancel()
        self._armed_for = due
        # In a context of its own: whatever request last armed the timer is not the timeout's.
        self._handle = asyncio.get_running_loop().call_later(
            max(0.0, due - self._wall()), self._fire, context=contextvars.Context(),
        )

    def _fire(self) -> None:
        self._handle = self._armed_for = None
        if not self._tasks.closed:
            self._tasks.spawn(self._claim())

    async def _claim(self) -> None:
        try:
            claimed = await self._state.claim_deadlines(self._wall(), limit=_CLAIM_BATCH, lease=self._lease)
            upcoming = await self._state.next_deadline()
        except SharedStateDown:
            self._arm(self._wall() + _STORE_RETRY)
            return
        for deadline in claimed:
            self._tasks.spawn(self._settle(deadline))
        if upcoming is not None:
            self._arm(upcoming)

    async def _settle(self, claimed: Deadline) -> None:
        try:
            again = await self._answer(claimed)
        except Exception:
            log.exception("deadline_failed", approval_id=claimed.approval_id)
            again = self._wall() + _STORE_RETRY
        try:
            settled = await self._state.settle_deadline(claimed, again)
        except SharedStateDown:
            # Still leased to this replica in the store: claimed again when the lease ends.
            log.warning("deadline_not_settled", approval_id=claimed.approval_id, reason="the shared store is unreachable")
            self._arm(self._wall() + self._lease)
            return
        if not settled:
            log.info("deadline_lease_lapsed", approval_id=claimed.approval_id)
        elif again is not None:
            self._arm(again)

    async def _watch(self) -> None:
        """The earliest deadline now, then again every `poll` seconds (None: only now)."""
        while not self._tasks.closed:
            with contextlib.suppress(SharedStateDown):
                upcoming = await self._state.next_deadline()
                if upcoming is not None:
                    self._arm(upcoming)
            if self._poll is None:
                return
            await asyncio.sleep(self._poll)
