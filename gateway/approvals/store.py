"""The approvals room's port to the store: what it keeps in the state the replicas share.

Two things of an approval are kept outside the replica that runs its chat: the directory of pending
approvals (listed by any replica for the approvals API, a vote counted there in one step with every
other, `index.py` and `votes.py` say how) and the audit trail of decided ones (`audit_trail.py`
appends and reads it). `ApprovalStore` names them once: the shared state (cluster/shared.py
`SharedState`, in this process or in Redis: cluster/memory_approvals.py, cluster/redis_approvals.py,
cluster/redis_audit.py) inherits it, so each method is declared here and implemented there; the
room reaches the store only through it. A store that cannot answer raises `StoreDown` (503): the
shared state's `SharedStateDown` is one.
"""

from __future__ import annotations

import abc
import re
from dataclasses import dataclass
from typing import Any, Protocol

from ..core.refusals import Refusal
from .grants import Grant
from .index import ApprovalPage, ApprovalQuery
from .votes import Tally

__all__ = ["AUDIT_CURSOR", "ApprovalStore", "AuditEntry", "AuditQuery", "GrantStore", "StoreDown", "audit_position"]


class StoreDown(Refusal):
    """The store cannot be reached (or is recovering): the request is answered 503."""

    status = 503
    code = "sessions_unavailable"
    retry_after = 1


# An audit record's place in the store, and the paging cursor: "<ms>-<seq>", as Redis numbers a
# stream's entries. Both backends number them alike, so a cursor means the same on either.
AUDIT_CURSOR = re.compile(r"^(\d{1,15})-(\d{1,15})$")


def audit_position(cursor: str) -> tuple[int, int]:
    """The (ms, seq) of a cursor; ValueError when it is not one (the API answers 400)."""
    match = AUDIT_CURSOR.match(cursor)
    if match is None:
        raise ValueError("not an audit cursor: expected <ms>-<seq> as a record's `cursor` says")
    return int(match.group(1)), int(match.group(2))


@dataclass(frozen=True)
class AuditEntry:
    """One record as appended: the JSON record, its approval id (once per id) and its time."""

    approval_id: str
    # The decision's wall-clock time (UNIX seconds): where the store places the record, unless a
    # record placed later is there already (then at that one's time: the store's order is append order).
    at: float
    record: dict[str, Any]


@dataclass(frozen=True)
class AuditQuery:
    """Which records to read, oldest first. `since` and `until` (UNIX seconds, inclusive) compare
    with the record's place in the store (its `cursor`'s milliseconds: the decision's time, or a
    little later for a record stored late); `after` is the `cursor` of the last record of the
    previous page."""

    since: float | None = None
    until: float | None = None
    agent: str | None = None
    tool: str | None = None
    limit: int = 100
    after: str | None = None

    def matches(self, agent: Any, tool: Any) -> bool:
        """Whether a record of `agent` and `tool`, as the record itself says them (inside its seal
        in Redis: nothing written beside it decides what a read shows), is selected."""
        return (self.agent is None or agent == self.agent) and (self.tool is None or tool == self.tool)


class GrantStore(Protocol):
    """Standing grants (approvals/grants.py), kept until they expire or are revoked, their uses
    counted in one step with every replica's. Every method may raise StoreDown. Kept beside the
    approvals' store rather than in it: one concept, and the shared state's modules stay small."""

    @abc.abstractmethod
    async def put_grant(self, grant: Grant) -> None:
        """Keep `grant` until its `expires_at` (wall-clock seconds), listed under its user (or
        every user's, without one) and its authority."""

    @abc.abstractmethod
    async def get_grant(self, grant_id: str) -> Grant | None:
        """The grant with its uses left now, or None: unknown, expired or revoked."""

    @abc.abstractmethod
    async def grants_of(self, user_id: str) -> list[Grant]:
        """The live grants that may cover `user_id`'s calls: theirs, and those over every user."""

    @abc.abstractmethod
    async def grants_by(self, authority: str) -> list[Grant]:
        """The live grants of `authority` (an approver group's name)."""

    @abc.abstractmethod
    async def revoke_grant(self, grant_id: str) -> bool:
        """Forget the grant: no use of it is taken from now on. False if it was not kept."""

    @abc.abstractmethod
    async def take_grant_use(self, grant_id: str) -> bool:
        """Reserve one use of a live grant, in one step with every replica's: False when it is
        gone (expired, revoked) or has no use left. A grant without a count only needs to be live."""

    @abc.abstractmethod
    async def give_back_grant_use(self, grant_id: str) -> None:
        """Return a use `take_grant_use` reserved and the decision did not spend (a grant without
        a count, or gone meanwhile: nothing)."""


class ApprovalStore(Protocol):
    """What the approvals room keeps in the store the replicas share. Every method may raise StoreDown."""

    # The standing grants: a store of their own (above).
    grants: GrantStore

    # ---- the audit trail ---------------------------------------------------------------------

    @abc.abstractmethod
    async def audit_append(self, entry: AuditEntry, *, keep: int, max_age: float) -> bool:
        """Append a record, unless one for the same approval id is kept already (then False, and
        nothing changes). Then the store keeps the newest `keep` records, none placed more than
        `max_age` seconds ago (on the store's clock)."""

    @abc.abstractmethod
    async def audit_read(self, query: AuditQuery, *, max_age: float) -> list[dict[str, Any]]:
        """Records that match `query`, oldest first, at most `query.limit`, none placed more than
        `max_age` seconds ago; each with its `cursor` (its place: pass the last one as `after`
        for the next page)."""

    # ---- the directory of pending approvals --------------------------------------------------

    @abc.abstractmethod
    async def put_approval(self, record: dict[str, Any], *, ttl: float, cap: int | None = None) -> bool:
        """Keep a pending approval for `ttl` seconds (its deadline plus a margin): `record` is the
        approval as the API shows it (a JSON object with at least `id`, `agent`, `tool`,
        `requester`, `approvers` and `created`, UNIX seconds) plus `owner`, the replica running its
        chat; listed in the indexes of approvals/index.py. Put again, the record and its lifetime
        are replaced and the votes counted so far kept (as is a decision, and its place in the
        listing). A new approval whose requester already has `cap` approvals kept is not kept:
        False, in one step with every replica's puts (so replicas agree on the count)."""

    @abc.abstractmethod
    async def pending_approvals(self, requester: str) -> int:
        """How many approvals of `requester` are kept (put's `cap` counts the same): a call that
        would be listed only later (an ADK confirmation, listed once ADK's run asked it) is held to
        the cap before it is asked."""

    @abc.abstractmethod
    async def get_approval(self, approval_id: str) -> dict[str, Any] | None:
        """The approval (votes.py `approval_view`: the record with its votes, and once decided its `state` and
        `outcome`), or None: unknown, expired, dropped, or (Redis) not sealed by a replica (logged
        without its content)."""

    @abc.abstractmethod
    async def drop_approval(self, approval_id: str) -> None:
        """Forget an approval (answered, timed out, cancelled), votes and all."""

    @abc.abstractmethod
    async def page_approvals(self, query: ApprovalQuery) -> ApprovalPage:
        """The approvals still pending (not decided by a vote) that `query` names, in their order
        (approvals/index.py `position`: oldest `created` first) after `query.after`, as get_approval
        answers them; only the indexes of the query's audiences are read. `next`: the position of
        the last one when the page is full. What expired meanwhile is skipped, and forgotten by
        the indexes as it is met."""

    async def list_approvals(self, *, agent: str | None = None, tool: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """The first page of every pending approval (of `agent` and `tool` when given)."""
        return (await self.page_approvals(ApprovalQuery(agent=agent, tool=tool, limit=limit))).approvals

    @abc.abstractmethod
    async def vote_approval(self, approval_id: str, user: str, approved: bool, quorum: int) -> Tally:
        """Count `user`'s vote on a pending approval, in one step with every other vote on it
        (votes.py `count_vote`'s rule): two votes at once, on any replicas, never both decide it. `quorum`: the
        distinct approvals that decide it (from the approval's record; one deny decides at once).
        The vote is kept in the approval; a decision stays with it until it is dropped."""
