"""A run that waits, open, for the approvers of the ADK confirmations it asked (`/run_sse`).

A call its approvers decide waits as an ADK confirmation (core/approver_confirmations.py): ADK's
run ends with it in its session, which is what makes it durable. The chatting person has nothing to
answer, so their response does not end there: when ADK's stream ends with only approvers'
confirmations asked, the run's task stays and waits for their decisions (`follow`), then sends ADK
the answers and streams the continuation into the same response. The wait is listed and given its
deadline at once (the cluster's deadline queue; the approvals API's directory), and each decision
reaches it through `deliver` (the approvals API's quorum, or the deadline) on the replica that runs
the chat. What this replica loses (a restart, the task cancelled by a new message) is not lost: ADK's
session still holds the confirmation, and the gateway answers it in a new run instead
(chat/gateway_answers.py), which a resume shows.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from ..core.chat_events import ConfirmationDecided
from ..core.chat_request import ApprovalAnswer
from ..core.deadlines import Deadline, deadline_key
from ..core.native_confirmation import NativeConfirmation
from ..ops.metrics import GatewayMetrics
from ..upstream.agents import Agent
from ..upstream.idle_reader import WaitSignal
from .record import Batches
from .agent_runs import AgentRuns
from .confirmations import NativeConfirmations
from ..approvals.reports import Notices
from .record import Chat

__all__ = ["ApproverWaits"]

log = structlog.get_logger("adk_gateway.chat.approver_waits")


class ApproverWaits:
    def __init__(
        self, *, runs: AgentRuns, native: NativeConfirmations, metrics: GatewayMetrics, notices: Notices,
        clock: Callable[[], float], wall: Callable[[], float], kept: Callable[[Deadline], None],
        settled: Callable[[str], None],
    ) -> None:
        self._runs = runs
        self._native = native
        self._metrics = metrics
        self._notices = notices
        self._clock = clock
        self._wall = wall
        self._kept = kept
        self._settled = settled
        # (chat id, approval id) -> the decision the run's task waits for.
        self._waiting: dict[tuple[str, str], asyncio.Future[ApprovalAnswer]] = {}

    async def follow(self, chat: Chat, agent: Agent, batches: Batches, wait: WaitSignal, message_id: str) -> Batches:
        """The run's events; past ADK's end, while it asked only its approvers, their answers' runs too."""
        async for batch in batches:
            yield batch
            batch = None  # type: ignore[assignment]  # a held run keeps no spent batch
        while asked := chat.ledger.asked_for_approvers():
            decisions = [self._open(chat, agent, confirmation) for confirmation in asked]
            try:
                answers = [await decision for decision in decisions]
            finally:
                for confirmation in asked:
                    self._waiting.pop((chat.chat_id, confirmation.approval_id), None)
            async for batch in self._runs.turn(chat, None, answers, wait, message_id):
                yield batch
                batch = None  # type: ignore[assignment]

    def _open(self, chat: Chat, agent: Agent, confirmation: NativeConfirmation) -> asyncio.Future[ApprovalAnswer]:
        decision: asyncio.Future[ApprovalAnswer] = asyncio.get_running_loop().create_future()
        self._waiting[(chat.chat_id, confirmation.approval_id)] = decision
        now = self._wall()
        confirmation.asked_at = self._clock()
        confirmation.seen_at = confirmation.seen_at or now
        self._metrics.approvals_pending.labels(chat.agent).inc()
        self._notices.native_waiting(chat.agent, chat.chat_id, chat.user_id, confirmation, chat.span)
        log.info("approval_requested", approval_id=confirmation.approval_id, tool=confirmation.tool, approvers=True)
        timeout = agent.config.tool_policy(confirmation.tool).timeout
        self._kept(Deadline(
            chat.agent, chat.user_id, chat.chat_id, confirmation.approval_id, confirmation.tool_call_id,
            confirmation.tool, now + timeout,
        ))
        return decision

    def waits(self, chat: Chat, approval_id: str) -> bool:
        decision = self._waiting.get((chat.chat_id, approval_id))
        return decision is not None and not decision.done()

    def deliver(self, chat: Chat, answer: ApprovalAnswer, by: tuple[str, ...] = ()) -> bool:
        """A decision for a confirmation the chat's run waits for here: shown in its response, and
        handed to the run, which sends it to ADK. False if the run does not wait for it (any more)."""
        decision = self._waiting.get((chat.chat_id, answer.approval_id))
        if decision is None or decision.done():
            return False
        asked = next((c for c in chat.ledger.asked_for_approvers() or () if c.approval_id == answer.approval_id), None)
        now = self._clock()
        chat.handle(ConfirmationDecided(answer.approval_id, answer.approved, answer.reason, by, now, answer.timed_out))
        self._settled(deadline_key(chat.chat_id, answer.approval_id))
        if asked is not None:
            outcome = "timeout" if answer.timed_out else "approved" if answer.approved else "denied"
            self._native.observe_native(chat, asked, outcome, now, answer.reason, answer.deciders)
            log.info("approval_answered", approval_id=answer.approval_id, tool=asked.tool, outcome=outcome)
        decision.set_result(answer)
        return True
