"""Confirm mode's timeouts on a chat's side: which confirmations get a deadline, and which answers
come too late.

A confirmation the plugin asked for (`upstream.approvals: confirm`, a tool with `approval: true`
that runs on the server) waits in ADK's session. Its deadline (core/deadlines.py) is set when the run
that asked ends here, kept in the shared store by the cluster (cluster/deadline_timer.py), and
answered by the gateway when it passes. An answer the person gives after it, when nobody answered
the timeout yet (the gateway was down at the deadline), is replaced by the timeout's answer: the
rule works from ADK's own record of when it asked, so it holds after any restart.

A browser tool's call the person approves is handed to the browser with nothing sent to ADK, and
its deadline starts again from the approval (`approved`), as hold mode's does: the replica that took
the approval replaces the stored deadline with one that carries the approval's time, and holds to
it itself whatever deadline it is handed (one claimed before the replacement reached the store).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ..core.chat_events import ConfirmationsSeen
from ..core.chat_request import ApprovalAnswer
from ..core.deadlines import Deadline, asked_at, due_at, passed, timeout_payload
from ..core.ledger import NativeConfirmation
from ..core.chat_outputs import ConfirmationSeen
from ..upstream.agents import Agent, Agents
from ..upstream.client import AskedCall, SessionConfirmations, UpstreamError
from .record import Chat

__all__ = ["EXPIRY_RETRY", "ConfirmTimeouts"]

# How long a passed deadline waits before it is tried again when its chat is busy or ADK failed.
EXPIRY_RETRY = 1.0


class ConfirmTimeouts:
    def __init__(self, agents: Agents, wall: Callable[[], float]) -> None:
        self._agents = agents
        # The wall clock: deadlines are compared with ADK's timestamps, and shared between hosts.
        self.wall = wall

    def new_deadlines(self, chat: Chat) -> list[Deadline]:
        """Deadlines for the confirmations the chat's last run left pending that have none yet
        (the gateway sees them now for the first time)."""
        agent = self._agents.get(chat.agent)
        out: list[Deadline] = []
        now = self.wall()
        for seen in chat.handle(ConfirmationsSeen(now)):
            assert isinstance(seen, ConfirmationSeen)
            confirmation = seen.confirmation
            if agent is None or not agent.config.confirms(confirmation.tool):
                continue
            due = due_at(asked_at(None, now), agent.config.tool_policy(confirmation.tool).timeout)
            if due is not None:
                out.append(Deadline(
                    chat.agent, chat.user_id, chat.chat_id, confirmation.approval_id, confirmation.tool_call_id,
                    confirmation.tool, due,
                ))
        return out

    def approved(self, chat: Chat, confirmation: NativeConfirmation) -> Deadline | None:
        """The person approved a browser tool's call (handed to the browser now): its deadline
        runs from here, so the browser's wait gets the whole timeout. Returns the deadline that
        replaces the stored one (None: its tool has none)."""
        now = confirmation.approved_wall or self.wall()
        agent = self._agents.get(chat.agent)
        if agent is None or not agent.config.confirms(confirmation.tool):
            return None
        due = due_at(asked_at(None, confirmation.seen_at) or now, agent.config.tool_policy(confirmation.tool).timeout, now)
        if due is None:
            return None
        return Deadline(
            chat.agent, chat.user_id, chat.chat_id, confirmation.approval_id, confirmation.tool_call_id,
            confirmation.tool, due, approved_at=now,
        )

    @staticmethod
    def approved_at(chat: Chat, approval_id: str, stored: float | None = None) -> float | None:
        """When the person approved the browser tool's call, as this replica saw it or as the
        stored deadline says (`stored`: taken on another replica); None if not approved."""
        mine = (c.approved_wall for c in chat.ledger.pending_native() if c.approval_id == approval_id)
        known = [t for t in (stored, *mine) if t is not None]
        return max(known) if known else None

    def due(
        self, agent: Agent, chat: Chat, approval_id: str, call: AskedCall, approved: float | None = None,
    ) -> float | None:
        """The confirmation's deadline from ADK's record of it (and this gateway's first sight,
        when it has one), from its approval once approved (a browser tool's); None if its tool has
        none (not gated here, or not the plugin's)."""
        if not agent.config.confirms(call.tool):
            return None
        seen = next((c.seen_at for c in chat.ledger.pending_native() if c.approval_id == approval_id), None)
        return due_at(asked_at(call.timestamp, seen), agent.config.tool_policy(call.tool).timeout, approved)

    async def decide(
        self, agent: Agent, chat: Chat, deadline: Deadline, confirmations: Callable[[Chat], Awaitable[SessionConfirmations]],
    ) -> tuple[ApprovalAnswer, AskedCall] | float | None:
        """What a passed deadline of the chat calls for: the timeout's answer to send now (and the
        call it answers), when to look again (the chat's run streams, ADK did not answer, the
        deadline ADK's session or an approval gives is later), or None: answered already, or not
        asked any more. ADK's session has the last word, so a deadline claimed twice answers ADK once."""
        approval_id = deadline.approval_id
        retry = self.wall() + EXPIRY_RETRY
        if chat.ledger.native_answered(approval_id):
            return None
        if chat.wanted(free=True, claim=False).action != "start":
            return retry  # the chat's run is under way or streams: its answer would start a second
        try:
            held = await confirmations(chat)
        except UpstreamError:
            return retry
        call = held.calls.get(approval_id)
        if call is None or approval_id in held.answered:
            return None
        # Read after ADK was asked: an approval taken here meanwhile counts.
        approved = self.approved_at(chat, approval_id, deadline.approved_at)
        due = self.due(agent, chat, approval_id, call, approved)
        if due is None:
            return None
        if not passed(due, self.wall()):
            return due
        if chat.ledger.native_answered(approval_id):  # answered while ADK was asked
            return None
        return self.answer(agent, approval_id, call, approved=approved is not None), call

    @staticmethod
    def answer(agent: Agent, approval_id: str, call: AskedCall, *, approved: bool = False) -> ApprovalAnswer:
        """What the gateway answers ADK for a confirmation that timed out (the policy's `on_timeout`;
        `approved`: a browser tool's call the person approved, whose browser did not answer)."""
        payload = timeout_payload(agent.config.tool_policy(call.tool).on_timeout, approved=approved)
        return ApprovalAnswer(approval_id, call.tool_call_id, call.tool, False, implicit=True, payload=payload, timed_out=True)

    def too_late(
        self, agent: Agent, chat: Chat, answers: list[ApprovalAnswer], held: SessionConfirmations
    ) -> list[ApprovalAnswer]:
        """`answers`, each one given after its confirmation's deadline replaced by the timeout's
        answer: a late answer never reaches ADK as an approval (nor a late browser output as the
        call's result)."""
        now = self.wall()
        out = []
        for answer in answers:
            call = held.calls.get(answer.approval_id)
            approved = self.approved_at(chat, answer.approval_id)
            if call is not None and passed(self.due(agent, chat, answer.approval_id, call, approved), now):
                out.append(self.answer(agent, answer.approval_id, call, approved=approved is not None))
            else:
                out.append(answer)
        return out
