"""The approvals API's side of the cluster: the shared directory of pending approvals, and a decision
carried to the replica that runs the call's chat.

The replica running a chat writes each gated call that starts waiting for a decision into the shared
directory (`opened`), so that any replica can list it and read it, and drops it once released
(`closed`). A decision through the API (any replica) is counted there first (`vote`: atomic, so two
replicas never both decide, and one approver never counts twice); once the quorum is reached, the
owner applies it (`Decide`), as the chatting person's answer would be applied, and the plugin's
request waiting for the verdict gets it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from ..chat.service import ChatService
from ..core.approvals import GatedCall
from ..core.refusals import HttpError
from .messages import Answer, Decide, Decided, Work
from .shared import SharedState, SharedStateDown

__all__ = ["ApprovalDesk", "pending_record"]

log = structlog.get_logger("adk_gateway.cluster.approval_desk")

# A record outlives its call's deadline by this much: a late reader still finds what it was.
_MARGIN = 60.0


def pending_record(call: GatedCall, *, agent: str, app_name: str, owner: str, wall: float, now: float) -> dict[str, Any]:
    """A waiting call as the approvals API shows it (its times on the wall clock), plus where it runs."""
    return {
        "id": call.id, "state": "pending", "agent": agent, "app_name": app_name, "tool": call.tool,
        "tool_call_id": call.tool_call_id, "chat_id": call.chat_id, "requester": call.user_id, "args": call.args,
        "rule": call.rule, "hint": call.policy.hint, "approvers": call.approvers, "self_approval": call.self_approval,
        "quorum": call.quorum, "votes": [], "created": wall - (now - call.created), "deadline": wall + (call.deadline - now),
        "owner": owner, "session": call.session_id,
    }


class ApprovalDesk:
    def __init__(
        self, state: SharedState, chats: ChatService, ask: Callable[[str, Work], Awaitable[Answer]],
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._state = state
        self._chats = chats
        self._ask = ask
        self._wall = wall

    # ---- the owner's side ------------------------------------------------------------------

    async def opened(self, call: GatedCall) -> bool:
        """A call waits for a decision: listed for the API (best effort: the chat still shows it).
        False when its user has the agent's `max_pending_approvals_per_user` listed already: the
        caller refuses the call. A call the store cannot list is not refused: it crowds nobody out."""
        agent = self._chats.gates.agent_of(call.user_id, call.session_id)
        config = self._chats.config
        settings = config.agents.get(agent)
        record = pending_record(
            call, agent=agent, app_name=settings.upstream.app_name if settings else "", owner=self._state.replica_id,
            wall=self._wall(), now=self._chats.gates.now(),
        )
        ttl = max(call.deadline - self._chats.gates.now(), 0.0) + _MARGIN
        try:
            return await self._state.put_approval(record, ttl=ttl, cap=config.max_pending_approvals_per_user(agent))
        except SharedStateDown:
            log.warning("approval_not_listed", approval_id=call.id, reason="the shared store is unreachable")
            return True

    async def closed(self, approval_id: str) -> None:
        with contextlib.suppress(SharedStateDown):
            await self._state.drop_approval(approval_id)

    # ---- any replica's side ----------------------------------------------------------------

    async def decide(self, record: dict[str, Any], approved: bool, reason: str | None, deciders: list[dict[str, str]]) -> str:
        """Apply approvers' decision where the call's chat runs: `decided`, `already` or `gone`."""
        work = Decide(record["requester"], record["session"], record["id"], approved, reason or "", {"deciders": deciders})
        if record["owner"] == self._state.replica_id:
            return self._chats.gates.decide_for_approvers(
                user_id=work.user, session_id=work.session, approval_id=work.approval, approved=approved,
                reason=reason, deciders=deciders,
            )
        try:
            answer = await self._ask(record["owner"], work)
        except HttpError as exc:
            # The owner died with the plugin's request (or cannot be reached): nobody holds the call.
            log.warning("approval_owner_unreachable", approval_id=work.approval, error=exc.code)
            return "gone"
        return answer.result if isinstance(answer, Decided) else "gone"
