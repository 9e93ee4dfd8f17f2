"""This replica's chats as the cluster's approval desk sees them: the chat layer's side of the
approvals room's port `approvals/ports.py` `ApprovalChats`.

The desk (cluster/approval_desk.py) lists what waits for approvers, answers a confirmation's
deadline and applies approvers' counted decision where the call's chat runs; it imports nothing of
gateway/chat/ and reaches the chats only through this view, which reads them as plain values (whose
agent a session is, the configuration in force, the gateway's clock, an ADK confirmation a chat
waits on for its approvers) and hands each decision to the part of the chat shell that carries it
out: a held call's to the gates (chat/gates.py), an ADK confirmation's and a deadline's to the
gateway's own answers to ADK (chat/gateway_answers.py). The cluster's forwarding applies a decision
another replica sent through it too.
"""

from __future__ import annotations

from collections.abc import Callable

from ..approvals.ports import WaitingConfirmation
from ..config.schema import GatewayConfig
from ..core.deadlines import Deadline
from .gates import Gates
from .gateway_answers import GatewayAnswers
from .registry import Registry

__all__ = ["DeskView"]


class DeskView:
    """`ApprovalChats` over this replica's chats (the chat service builds it; the router hands it to the desk)."""

    def __init__(
        self, *, config: Callable[[], GatewayConfig], clock: Callable[[], float], registry: Registry, gates: Gates,
        answers: GatewayAnswers,
    ) -> None:
        self._config = config
        self._clock = clock
        self._registry = registry
        self._gates = gates
        self._answers = answers

    @property
    def config(self) -> GatewayConfig:
        return self._config()

    def now(self) -> float:
        return self._clock()

    def agent_of(self, user_id: str, session_id: str) -> str:
        return self._gates.agent_of(user_id, session_id)

    def native_waiting(self, agent: str, user_id: str, chat_id: str, approval_id: str) -> WaitingConfirmation | None:
        return self._registry.waiting_for_approvers(agent, user_id, chat_id, approval_id)

    async def expire_confirmation(self, deadline: Deadline) -> float | None:
        """chat/gateway_answers.py."""
        return await self._answers.expire(deadline)

    def decide_for_approvers(
        self, *, user_id: str, session_id: str, approval_id: str, approved: bool, reason: str | None,
        deciders: list[dict[str, str]],
    ) -> str:
        """Approvers decided a call held here (`ApprovalDecisions`): chat/gates.py."""
        return self._gates.decide_for_approvers(
            user_id=user_id, session_id=session_id, approval_id=approval_id, approved=approved, reason=reason,
            deciders=deciders,
        )

    async def answer_for_approvers(
        self, agent: str, user_id: str, chat_id: str, approval_id: str, *, approved: bool, reason: str | None,
        deciders: list[dict[str, str]],
    ) -> str:
        """Approvers decided an ADK confirmation marked theirs (`ApprovalDecisions`): chat/gateway_answers.py."""
        return await self._answers.for_approvers(
            agent, user_id, chat_id, approval_id, approved=approved, reason=reason, deciders=deciders,
        )
