"""The approvals room's ports to the chat: how the plugin's ask reaches a chat, and how a decision
the approvals API counted reaches its call.

`GatedCalls` is what the cluster's remote gate (cluster/remote_gate.py) does with this replica's
chats when the plugin asks about a call: find the call it asked about before, have the chat's
machine decide a new ask (given its user's count of listed approvals, read from the store first
when `may_be_listed` says it matters), show it, wait for its verdict, cancel it. The chat's gates
(chat/gates.py `Gates`) implement it; the remote gate imports nothing of gateway/chat/.

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
`ApprovalDecisions` names them once; the chat's desk view (chat/desk_view.py) implements it and the
cluster calls it, so the desk depends on this port, not on the chat layer's classes.

`ApprovalChats` is the rest of what the cluster's approval desk reads of this replica's chats to
list an approval and to answer a deadline (whose agent a session is, the gateway's clock, the
configuration, an ADK confirmation a chat here waits for its approvers on, as plain
`WaitingConfirmation` values): the desk view implements it too, and the desk is built with it
and imports nothing of gateway/chat/. Plain types only (sans-IO).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from collections.abc import Mapping
from typing import Any

from ..config.approvers import ApproversConfig
from ..config.schema import GatewayConfig
from .grants import Grant
from ..core.approvals import GatedCall, Verdict
from ..core.deadlines import Deadline
from ..core.native_confirmation import NativeConfirmation

__all__ = ["ApprovalChats", "ApprovalDecisions", "GatedCalls", "GrantScope", "WaitingConfirmation"]


@dataclass(frozen=True)
class GrantScope:
    """What standing grants (grants.py `candidates`) are matched against for one session's calls:
    the gateway's name of its agent, the chat id, the chatting user's latest claims, and the
    approvers as the config is now (whose group grants still stand)."""

    agent: str
    chat_id: str
    claims: Mapping[str, Any]
    approvers: ApproversConfig


class GatedCalls(Protocol):
    """This replica's chats as the plugin's asks reach them (cluster/remote_gate.py)."""

    def find(self, *, app_name: str, user_id: str, session_id: str, tool_call_id: str) -> GatedCall | None:
        """The call the plugin already asked about for this tool call, if a chat here holds it."""
        ...

    def open(
        self, *, app_name: str, user_id: str, session_id: str, tool_call_id: str, tool: str, args: dict[str, Any],
        announce: bool = True, confirm: bool = False, approvers: bool = False, user_waiting: int | None = None,
        grants: tuple[Grant, ...] = (),
    ) -> GatedCall | Verdict:
        """A new ask, decided by its chat's machine: a call that waits, or the verdict at once.
        `user_waiting`: its user's count of listed approvals (None: not read, or unknown);
        `grants`: standing grants that could decide it, a use of each reserved."""
        ...

    def grant_scope(self, app_name: str, user_id: str, session_id: str) -> GrantScope | None:
        """The agent, chat and claims a call of this session is judged by for standing grants
        (None: no chat here has the session)."""
        ...

    def may_be_listed(self, app_name: str, tool: str, *, confirm: bool) -> bool:
        """Whether an ask about `tool` could be listed for the approvals API (its user's count matters)."""
        ...

    def announce(self, call: GatedCall) -> None:
        """Show a call just opened (and recorded) to the browser."""
        ...

    async def wait(self, call: GatedCall) -> Verdict:
        """The call's verdict, once its chat's machine released it."""
        ...

    def cancel(self, call: GatedCall, why: str) -> None:
        """Release the call refused: nobody will answer it (`why` is what the model reads)."""
        ...

    def agent_of(self, user_id: str, session_id: str) -> str:
        """The agent whose chat holds the session ("" if no chat here does)."""
        ...

    def timeout(self, app_name: str, tool: str) -> float:
        """How long a call of `tool` of ADK app `app_name` may wait (its policy's timeout)."""
        ...

    def now(self) -> float:
        """The gateway's monotonic clock, which a gated call's times are on."""
        ...


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


@dataclass(frozen=True, slots=True)
class WaitingConfirmation:
    """An ADK confirmation a chat of this replica waits for its approvers on, and whose chat it is."""

    agent: str
    user_id: str
    chat_id: str
    session_id: str
    confirmation: NativeConfirmation


class ApprovalChats(ApprovalDecisions, Protocol):
    """This replica's chats as the cluster's approval desk sees them (cluster/approval_desk.py)."""

    @property
    def config(self) -> GatewayConfig:
        """The configuration in force (a reload replaces it): the agents, their caps and TTLs."""
        ...

    def now(self) -> float:
        """The gateway's monotonic clock, which a gated call's times are on."""
        ...

    def agent_of(self, user_id: str, session_id: str) -> str:
        """The agent whose chat holds the session ("" if no chat here does)."""
        ...

    def native_waiting(self, agent: str, user_id: str, chat_id: str, approval_id: str) -> WaitingConfirmation | None:
        """The ADK confirmation `approval_id`, if a chat here waits for its approvers on it."""
        ...

    async def expire_confirmation(self, deadline: Deadline) -> float | None:
        """A confirmation's deadline passed where its chat runs: answered with the tool's
        `on_timeout`; when to look again, or None (done)."""
        ...
