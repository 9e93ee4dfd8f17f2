"""An approver's vote on a pending approval, counted (sans IO): what one vote does to an approval's
verdict and votes, and the approval as the directory answers it. A quorum is of distinct voters
(`approvals`), and of voters who still count: `needed` raises it by the votes a reload took away.

Both backends of the shared state (cluster/shared.py) count with these rules: the memory backend calls
`count_vote` as is, Redis runs the same rule as a Lua script (cluster/redis_scripts.py APPROVAL_VOTE), and
tests/unit/test_approvals_directory.py holds the two to one table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["Tally", "TallyState", "Verdict", "approval_view", "approvals", "count_vote", "needed"]

# What a vote did: the approval is decided (approved or denied: one deny denies), "counted" (more
# approvals are needed), "already" (this user voted on it before: nothing changed) or "gone" (no
# pending approval of that id: unknown, expired, dropped, or decided before this vote).
TallyState = Literal["decided_approved", "decided_denied", "counted", "already", "gone"]
# Where an approval of the directory stands, as the stores keep it beside the record.
Verdict = Literal["pending", "approved", "denied"]


@dataclass(frozen=True)
class Tally:
    """The answer to a vote. `approval`: the approval as stored after the vote (its `votes`, and
    `state` "decided" with its `outcome` once decided), so that the caller answers without another
    read: for "gone", the decided approval when a decision came first, None when there is none."""

    state: TallyState
    approval: dict[str, Any] | None = None


def count_vote(
    verdict: Verdict, votes: list[dict[str, Any]], user: str, approved: bool, quorum: int,
) -> tuple[TallyState, Verdict, list[dict[str, Any]]]:
    """One vote on an approval that stands at `verdict` with `votes` ({user, approved} each): what it
    did, the new verdict and votes (sans IO). The memory backend runs it as is; Redis runs the same
    rule as a Lua script (cluster/redis_scripts.py APPROVAL_VOTE)."""
    if verdict != "pending":
        return "gone", verdict, votes
    if any(vote["user"] == user for vote in votes):
        return "already", verdict, votes
    votes = [*votes, {"user": user, "approved": approved}]
    if not approved:
        return "decided_denied", "denied", votes
    if approvals(votes) >= quorum:
        return "decided_approved", "approved", votes
    return "counted", verdict, votes


def approvals(votes: list[dict[str, Any]]) -> int:
    """The distinct voters who approved: a second vote of one voter is "already" when counted, but
    a stored list may hold a copy (a Redis writer can repeat a genuine vote, tag and all), and one
    person never makes two of a quorum."""
    return len({vote["user"] for vote in votes if vote["approved"] is True})


def needed(votes: list[dict[str, Any]], quorum: int, counts: Callable[[str], bool]) -> int:
    """The approvals a store must count (`count_vote`'s `quorum`) for `quorum` of them to come from
    voters who still count (`counts`, as the config is now: a reload may have removed one from the
    group): one more per voter of `votes`, the approval as read before the vote, who does not. A
    vote added since was accepted under the config of now, and a removed voter cannot add one."""
    return quorum + len({vote["user"] for vote in votes if vote["approved"] is True and not counts(vote["user"])})


def approval_view(record: dict[str, Any], votes: list[dict[str, Any]], verdict: Verdict) -> dict[str, Any]:
    """The approval as the directory answers it: the stored record with the votes as counted, and
    `state` "decided" with its `outcome` once a vote decided it (the caller, who knows what decided
    it, adds the `source`)."""
    view = dict(record)
    view["votes"] = [{"user": vote["user"], "approved": vote["approved"]} for vote in votes]
    if verdict != "pending":
        view["state"] = "decided"
        view["outcome"] = verdict
    return view
