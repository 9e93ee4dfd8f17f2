"""Where a passed deadline of the one deadline queue is answered: the replica that runs its chat.

Every call that waits for a person has its deadline in the shared store's queue (core/deadlines.py),
watched by each replica's timer (deadline_timer.py). The replica whose timer claims a passed one
has it answered where its chat runs:

- an ADK confirmation's (`/run_sse`): here, also for a chat this replica takes over from a dead
  owner (ADK's session holds the confirmation, whichever replica dies), or on the live owner, told
  by an `Expire` notice (forwarding.py). The approvals desk answers it (cluster/approval_desk.py
  `deadline_passed`: the approvers' decision the store holds, else the tool's `on_timeout`);
- a chat's held calls' (`/run_live`, the plugin's request held open): where the chat keeps it,
  here (a chat here with a held deadline holds its calls' requests here) or on the chat's live
  owner, told by the same `Expire` notice, where the chat's machine is fed `DeadlineReached` and
  decides which calls time out (chat/record.py `deadlines_due`). Never taken over: a held call is a
  request held open by the replica that runs the chat, gone with it, and so is the machine that
  waited. Once that replica died (no live owner, and nothing of the chat waiting here) the
  deadline is moot: the claimer drops it (`deadline_moot`).

The owner that handled an `Expire` keeps the deadline, as it now stands, in the queue, or drops it:
that ends the claimer's lease (it set the deadline due `recheck` later, in case the owner died
with the notice).
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from dataclasses import replace

import structlog

from ..chat.registry import ChatNotFound
from ..chat.service import ChatService
from ..core.deadlines import Deadline, MalformedDeadline
from .approval_desk import ApprovalDesk
from .deadline_timer import DeadlineTimer
from .messages import Expire, Forwarded
from .shared import Claim, SharedState, SharedStateDown
from .tasks import Tasks

__all__ = ["DeadlineAnswers"]

log = structlog.get_logger("adk_gateway.cluster.deadline_answers")

# A passed deadline whose store is down is tried again this much later.
_RETRY = 1.0

# The router's claim of a chat (agent, user, chat id; create false): where it runs.
ClaimChat = Callable[..., Awaitable[Claim]]


class DeadlineAnswers:
    """The deadline queue's timer on this replica, and what answers each deadline it claims."""

    def __init__(
        self, state: SharedState, chats: ChatService, desk: ApprovalDesk, tasks: Tasks, claim: ClaimChat, *, recheck: float,
    ) -> None:
        self._state = state
        self._chats = chats
        self._desk = desk
        self._tasks = tasks
        self._claim = claim
        # How long a deadline handed to a live owner waits before it is claimed again (owner_timeout).
        self._recheck = recheck
        self.timer = DeadlineTimer(
            state, tasks, self.answer, poll=recheck, wall=self._wall, kept=desk.confirmation_waiting,
        )

    def _wall(self) -> float:
        return self._chats.timeouts.wall()

    async def answer(self, deadline: Deadline) -> float | None:
        """A passed deadline this replica claimed: answered where its chat runs, or handed to its
        live owner. Returns when to look again, or None: answered, or moot (deadline_timer.py
        settles the claim with it)."""
        if deadline.held:
            return await self._answer_held(deadline)
        try:
            claim = await self._claim(deadline.agent, deadline.user, deadline.chat, create=False)
        except SharedStateDown:
            return self._wall() + _RETRY
        except ChatNotFound:
            return None
        if claim.local:
            return await self._desk.deadline_passed(deadline)
        return await self._expire_on(claim.owner, deadline)

    async def _answer_held(self, deadline: Deadline) -> float | None:
        # Here first: a chat that keeps a held deadline here holds its calls' requests here too.
        try:
            kept = self._chats.held_deadline_passed(deadline)
        except ChatNotFound:
            pass
        else:
            return kept.due if kept is not None else None
        try:
            owner = await self._state.owner(deadline.user, deadline.chat)
        except SharedStateDown:
            return self._wall() + _RETRY
        if owner is not None and owner != self._state.replica_id:
            return await self._expire_on(owner, deadline)
        log.info("deadline_moot", approval_id=deadline.approval_id, reason="its held calls went with their replica")
        return None

    async def _expire_on(self, owner: str, deadline: Deadline) -> float | None:
        notice = Forwarded(self._state.replica_id, secrets.token_hex(8), Expire(deadline.user, deadline.to_json()))
        try:
            await self._state.send(owner, notice.to_json())
        except SharedStateDown:
            return self._wall() + _RETRY
        # Still in the store, leased to this replica, while the notice goes; then due `recheck`
        # later: if the owner dies with the notice, it is claimed again, from a dead owner by
        # then. The owner drops it (or moves it) once it handled it, which ends this claim: this
        # replica's later "again" changes nothing then.
        return self._wall() + self._recheck

    def expire_forwarded(self, raw: str) -> None:
        """Another replica claimed a deadline of a chat run here (its `Expire` notice)."""
        try:
            deadline = Deadline.from_json(raw)
        except MalformedDeadline:
            log.warning("deadline_malformed")
            return
        self._tasks.spawn(self._expire_here(deadline))

    async def _expire_here(self, deadline: Deadline) -> None:
        if deadline.held:
            try:
                kept = self._chats.held_deadline_passed(deadline)
            except ChatNotFound:
                kept = None  # the chat moved on, or nothing of it waits here any more
            if kept is None:
                self.timer.drop(deadline.key)
            else:
                self.timer.add(kept)
            return
        again = await self._desk.deadline_passed(deadline)
        if again is None:
            self.timer.drop(deadline.key)
        else:
            self.timer.add(replace(deadline, due=again))
