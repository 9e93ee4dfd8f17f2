"""The gateway's own answers to ADK's confirmations: a deadline that passed, and the approvers' decision.

A confirmation waits in ADK's session (confirm mode, DESIGN.md section 6). Two answers to it come
from the gateway rather than the chatting person: the tool's `on_timeout` once its deadline passed
(chat/confirm_timeouts.py decides when; the cluster's deadline timer calls `expire`), and the
decision of its approvers once their quorum is reached or one denied (`for_approvers`; the approvals
API calls it where the chat runs, cluster/approval_desk.py). Either is sent in a run that continues
the message the browser holds the call in, and kept for the browser's next attach. ADK's session has
the last word on what is still asked, so an answer claimed twice reaches ADK once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from ..core.chat_request import ApprovalAnswer, TurnPlan
from ..core.deadlines import Deadline
from ..core.limits import Limited
from ..upstream.agents import Agent, Agents
from ..upstream.client import AskedCall, UpstreamError
from .agent_runs import AgentRuns
from .approver_waits import ApproverWaits
from .attachment import Attachment, ChatBusy
from .confirm_timeouts import EXPIRY_RETRY, ConfirmTimeouts
from .record import Chat
from .registry import ChatNotFound, Registry

__all__ = ["GatewayAnswers"]


class GatewayAnswers:
    def __init__(
        self, *, agents: Agents, registry: Registry, chat: Callable[[Agent, str, str], Chat],
        adopt: Callable[[Chat], Awaitable[Any]], runs: AgentRuns, timeouts: ConfirmTimeouts,
        start_run: Callable[..., Awaitable[Attachment]], waits: ApproverWaits,
        rebuild: Callable[[str, str, str], Awaitable[Attachment | None]],
    ) -> None:
        self._agents = agents
        self._registry = registry
        self._chat = chat
        self._adopt = adopt
        self._runs = runs
        self._timeouts = timeouts
        self._start_run = start_run
        self._waits = waits
        self._rebuild = rebuild

    async def expire(self, deadline: Deadline) -> float | None:
        """A confirmation's deadline passed (this replica runs the chat): answer ADK with the
        tool's `on_timeout`, unless someone answered it already. ADK's session decides what is
        still asked, and when it was. Returns when to look again (the chat is busy, ADK did not
        answer, the deadline ADK's session gives is later), or None: answered, or nothing to do."""
        agent = self._agents.get(deadline.agent)
        if agent is None or agent.live:
            return None
        try:
            chat = self._registry.find(agent.name, deadline.user, deadline.chat) or self._chat(agent, deadline.user, deadline.chat)
        except (ChatNotFound, Limited):
            return None
        await self._adopt(chat)
        if self._waits.waits(chat, deadline.approval_id):
            # The run waits open for its approvers: the timeout's answer goes on in it.
            asked = AskedCall(deadline.tool_call_id, deadline.tool, None)
            self._waits.deliver(chat, self._timeouts.answer(agent, deadline.approval_id, asked))
            return None
        decided = await self._timeouts.decide(agent, chat, deadline, self._runs.confirmations)
        if not isinstance(decided, tuple):
            return decided
        answer, call = decided
        return None if await self._answer_adk(agent, chat, answer, call) else self._timeouts.wall() + EXPIRY_RETRY

    async def for_approvers(
        self, agent_name: str, user_id: str, chat_id: str, approval_id: str, *, approved: bool, reason: str | None,
        deciders: list[dict[str, str]],
    ) -> str:
        """Approvers decided an ADK confirmation marked theirs (this replica runs the chat): the
        gateway answers ADK, as for a deadline. `decided`; `already` (answered before: a deadline,
        a decision through another replica); `gone` (ADK's session holds no such confirmation of
        theirs); `busy` (the chat streams, or ADK did not answer: try again)."""
        agent = self._agents.get(agent_name)
        if agent is None or agent.live:
            return "gone"
        try:
            chat = self._registry.find(agent.name, user_id, chat_id) or self._chat(agent, user_id, chat_id)
        except (ChatNotFound, Limited):
            return "gone"
        await self._adopt(chat)
        who = tuple((d.get("user", ""), d.get("auth", "")) for d in deciders)
        if self._waits.waits(chat, approval_id):
            # The run waits open for them here: their answer goes on in it, into the requester's response.
            asked = next(c for c in chat.ledger.asked_for_approvers() or () if c.approval_id == approval_id)
            answer = ApprovalAnswer(approval_id, asked.tool_call_id, asked.tool, approved, reason=reason, deciders=who)
            return "decided" if self._waits.deliver(chat, answer, tuple(u for u, _ in who)) else "already"
        if chat.ledger.native_answered(approval_id):
            return "already"
        try:
            held = await self._runs.confirmations(chat)  # ADK's session has the last word: answered once
        except UpstreamError:
            return "busy"
        call = held.calls.get(approval_id)
        if call is None or not call.for_approvers:
            return "gone"
        if approval_id in held.answered or chat.ledger.native_answered(approval_id):
            return "already"
        answer = ApprovalAnswer(approval_id, call.tool_call_id, call.tool, approved, reason=reason, deciders=who)
        if chat.run is None and (rebuilt := await self._rebuild(agent.name, chat.user_id, chat.chat_id)) is not None:
            # This replica never wrote the message (it restarted, or took the chat over): rebuilt from
            # ADK's session first, so that the outcome continues it and a resume reads it whole.
            rebuilt.response.close()
        return "decided" if await self._answer_adk(agent, chat, answer, call) else "busy"

    async def _answer_adk(self, agent: Agent, chat: Chat, answer: ApprovalAnswer, call: AskedCall) -> bool:
        """The gateway's own answer to a confirmation (a deadline's, the approvers'), in a run that
        continues the message the browser holds the call in; False when the chat is busy or ADK failed."""
        # The one this replica wrote, or the one the gateway told ADK it was writing when ADK asked
        # (the chat moved here, or this replica restarted). A new id would show the message twice.
        message_id = chat.run.message_id if chat.run is not None else call.message_id
        known = frozenset({call.tool_call_id})
        turn = chat.machine.turn
        version = turn.converter.version if turn is not None else 6
        try:
            attachment = await self._start_run(
                agent, chat, TurnPlan(None, (answer,), (), message_id, known), [], [answer], version, browser=False,
            )
        except (ChatBusy, UpstreamError):
            return False
        # Nobody reads it here: kept for the browser's next attach (a follower, a resume).
        attachment.response.close()
        return True
