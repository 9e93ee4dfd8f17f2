"""The approvals room's port to the chat: how a decision the approvals API counted reaches its call.

Approvers decide through the approvals API on any replica; their decision is counted in the store
(`votes.py`) and, once the quorum is reached, carried to the replica that runs the call's chat
(cluster/approval_desk.py, and cluster/forwarding.py for a decision another replica sent). There it
is applied by the chat, in one of the two ways a call waits (docs/approvals.md):

- `decide_for_approvers`: a call held in the plugin's request (`/run_live`), in the chat's ledger;
  the chat's machine releases it (`ApproversDecided`);
- `answer_for_approvers`: an ADK confirmation marked theirs (`/run_sse`), kept in ADK's session;
  the chat answers ADK with it and the run goes on.

Each says `decided`, `already` (decided before: a deadline, the end of the run, another vote),
`gone` (no such call here), or, for a confirmation, `busy` (the chat is streaming: try again).
`ApprovalDecisions` names them once; the chat service (chat/service.py) implements it and the
cluster calls it, so the desk depends on this port, not on the chat layer's classes. Plain types
only (sans-IO).
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["ApprovalDecisions"]


class ApprovalDecisions(Protocol):
    def decide_for_approvers(
        self, *, user_id: str, session_id: str, approval_id: str, approved: bool, reason: str | None,
        deciders: list[dict[str, str]],
    ) -> str:
        """Approvers decided a call held here (their quorum reached): `decided`, `already` or `gone`."""
        ...

    async def answer_for_approvers(
        self, agent: str, user_id: str, chat_id: str, approval_id: str, *, approved: bool, reason: str | None,
        deciders: list[dict[str, str]],
    ) -> str:
        """Approvers decided an ADK confirmation marked theirs: `decided`, `already`, `gone` or `busy`."""
        ...
