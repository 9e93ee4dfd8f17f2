"""Confirm mode's timeouts on a chat's side: which confirmations get a deadline, and which answers
come too late.

A confirmation the plugin asked for (`upstream.approvals: confirm`, a tool with `approval: true`
that runs on the server) waits in ADK's session. Its deadline (core/deadlines.py) is set when the run
that asked ends here, kept in the shared store by the cluster (cluster/deadline_timer.py), and
answered by the gateway when it passes. An answer the person gives after it, when nobody answered
the timeout yet (the gateway was down at the deadline), is replaced by the timeout's answer: the
rule works from ADK's own record of when it asked, so it holds after any restart.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ..core.chat_request import ApprovalAnswer
from ..core.deadlines import Deadline, asked_at, due_at, passed, timeout_payload
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
        for confirmation in chat.ledger.pending_native():
            if confirmation.seen_at is not None:
                continue
            confirmation.seen_at = now
            if agent is None or not agent.config.confirms(confirmation.tool):
                continue
            due = due_at(asked_at(None, now), agent.config.tool_policy(confirmation.tool).timeout)
            if due is not None:
                out.append(Deadline(
                    chat.agent, chat.user_id, chat.chat_id, confirmation.approval_id, confirmation.tool_call_id,
                    confirmation.tool, due,
                ))
        return out

    def due(self, agent: Agent, chat: Chat, approval_id: str, call: AskedCall) -> float | None:
        """The confirmation's deadline from ADK's record of it (and this gateway's first sight,
        when it has one); None if its tool has none (not gated here, or not the plugin's)."""
        if not agent.config.confirms(call.tool):
            return None
        seen = next((c.seen_at for c in chat.ledger.pending_native() if c.approval_id == approval_id), None)
        return due_at(asked_at(call.timestamp, seen), agent.config.tool_policy(call.tool).timeout)

    async def decide(
        self, agent: Agent, chat: Chat, approval_id: str, confirmations: Callable[[Chat], Awaitable[SessionConfirmations]],
    ) -> tuple[ApprovalAnswer, AskedCall] | float | None:
        """What a passed deadline of the chat calls for: the timeout's answer to send now (and the
        call it answers), when to look again (the chat's run streams, ADK did not answer, the
        deadline ADK's session gives is later), or None: answered already, or not asked any more.
        ADK's session has the last word, so a deadline claimed twice answers ADK once."""
        retry = self.wall() + EXPIRY_RETRY
        if chat.ledger.native_answered(approval_id):
            return None
        if chat.running or (chat.run is not None and chat.run.streaming):
            return retry
        try:
            held = await confirmations(chat)
        except UpstreamError:
            return retry
        call = held.calls.get(approval_id)
        if call is None or approval_id in held.answered:
            return None
        due = self.due(agent, chat, approval_id, call)
        if due is None:
            return None
        if not passed(due, self.wall()):
            return due
        if chat.ledger.native_answered(approval_id):  # answered while ADK was asked
            return None
        return self.answer(agent, approval_id, call), call

    @staticmethod
    def answer(agent: Agent, approval_id: str, call: AskedCall) -> ApprovalAnswer:
        """What the gateway answers ADK for a confirmation that timed out (the policy's `on_timeout`)."""
        payload = timeout_payload(agent.config.tool_policy(call.tool).on_timeout)
        return ApprovalAnswer(approval_id, call.tool_call_id, call.tool, False, implicit=True, payload=payload, timed_out=True)

    def too_late(
        self, agent: Agent, chat: Chat, answers: list[ApprovalAnswer], held: SessionConfirmations
    ) -> list[ApprovalAnswer]:
        """`answers`, each one given after its confirmation's deadline replaced by the timeout's
        answer: a late answer never reaches ADK as an approval."""
        now = self.wall()
        out = []
        for answer in answers:
            call = held.calls.get(answer.approval_id)
            if call is not None and passed(self.due(agent, chat, answer.approval_id, call), now):
                out.append(self.answer(agent, answer.approval_id, call))
            else:
                out.append(answer)
        return out
