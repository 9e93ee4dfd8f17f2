"""The directory of pending approvals in this process (`sessions.backend: memory`): what memory.py's
`MemoryHub` keeps of them, laid out as redis_approvals.py lays them out in Redis.

Each approval is kept as JSON (what the caller changes afterwards is not stored, and what is not
JSON fails here as it would there) with its votes and verdict beside it; it is listed in the
indexes of approvals/index.py (sorted lists of positions) and counted under its requester for
`limits.max_pending_approvals_per_user`. Approvals expire `ttl` after they were last put, dropped
when met expired (and all expired ones whenever the table has doubled since the last purge).
Nothing here awaits: each method is one step, as a Lua script is in Redis. `now` is the caller's
clock.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..approvals.index import ApprovalPage, ApprovalQuery, Index, indexes_of, position, wanted_indexes
from ..approvals.votes import Tally, Verdict, approval_view, count_vote

__all__ = ["ApprovalTable"]


@dataclass
class _Kept:
    record: bytes
    place: str
    requester: str
    indexes: list[Index]
    expires: float
    votes: list[dict[str, Any]] = field(default_factory=list)
    verdict: Verdict = "pending"

    def view(self) -> dict[str, Any]:
        return approval_view(orjson.loads(self.record), self.votes, self.verdict)


class ApprovalTable:
    """The pending approvals the replicas of one hub share."""

    def __init__(self) -> None:
        self._kept: dict[str, _Kept] = {}
        # Each index: the positions of its approvals, sorted.
        self._indexes: dict[Index, list[str]] = {}
        self._by_user: dict[str, set[str]] = {}
        self._purge_at = 64

    def put(self, record: dict[str, Any], *, ttl: float, now: float, cap: int | None = None) -> bool:
        approval_id = str(record["id"])
        kept = self._live(approval_id, now)
        encoded = orjson.dumps(record)
        if kept is not None:
            # The votes, the verdict and the first place in the listing stay, as in Redis.
            kept.record, kept.expires = encoded, now + ttl
            return True
        requester = str(record.get("requester", ""))
        if cap is not None and self.pending_of(requester, now) >= cap:
            return False
        kept = self._kept[approval_id] = _Kept(encoded, position(record), requester, indexes_of(record), now + ttl)
        for index in kept.indexes:
            bisect.insort(self._indexes.setdefault(index, []), kept.place)
        self._by_user.setdefault(requester, set()).add(approval_id)
        if len(self._kept) >= self._purge_at:
            for key in [key for key, kept in self._kept.items() if kept.expires <= now]:
                self.drop(key)
            self._purge_at = max(64, 2 * len(self._kept))
        return True

    def pending_of(self, requester: str, now: float) -> int:
        return sum(1 for approval_id in list(self._by_user.get(requester, ())) if self._live(approval_id, now) is not None)

    def _live(self, approval_id: str, now: float) -> _Kept | None:
        kept = self._kept.get(approval_id)
        if kept is not None and kept.expires <= now:
            self.drop(approval_id)
            return None
        return kept

    def get(self, approval_id: str, now: float) -> dict[str, Any] | None:
        kept = self._live(approval_id, now)
        return kept.view() if kept is not None else None

    def drop(self, approval_id: str) -> None:
        kept = self._kept.pop(approval_id, None)
        if kept is None:
            return
        for index in kept.indexes:
            places = self._indexes.get(index, [])
            at = bisect.bisect_left(places, kept.place)
            if at < len(places) and places[at] == kept.place:
                del places[at]
            if not places:
                self._indexes.pop(index, None)
        mine = self._by_user.get(kept.requester)
        if mine is not None:
            mine.discard(approval_id)
            if not mine:
                del self._by_user[kept.requester]

    def page(self, query: ApprovalQuery, now: float) -> ApprovalPage:
        """The listing of approvals/index.py: only the indexes the query names are read."""
        after = query.after or ""
        lists = []
        for index in wanted_indexes(query):
            places = self._indexes.get(index, [])
            lists.append(places[bisect.bisect_right(places, after):])
        found: list[dict[str, Any]] = []
        last = ""
        # Copied first: an approval met expired is dropped from the lists meanwhile.
        for place in list(heapq.merge(*lists)):
            if place == last:
                continue
            last = place
            kept = self._live(place.partition("|")[2], now)
            if kept is None or kept.verdict != "pending":
                continue
            view = kept.view()
            if query.matches(view):
                found.append(view)
                if len(found) >= query.limit:
                    return ApprovalPage(found, place)
        return ApprovalPage(found, None)

    def vote(self, approval_id: str, user: str, approved: bool, quorum: int, now: float) -> Tally:
        kept = self._live(approval_id, now)
        if kept is None:
            return Tally("gone")
        state, kept.verdict, kept.votes = count_vote(kept.verdict, kept.votes, user, approved, quorum)
        return Tally(state, kept.view())
