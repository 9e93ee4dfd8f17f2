"""Standing grants in this process (`sessions.backend: memory`): the approvals room's `GrantStore`
(approvals/store.py), laid out as redis_grants.py lays them out in Redis.

Each grant is kept as JSON with its uses left beside it, listed under its user (or every user's)
and its authority, and forgotten when met expired (the clock is the hub's wall clock, as Redis's
is for the Redis backend). Nothing here awaits between reading and writing a grant: each method is
one step, as a Lua script is in Redis, so two calls never spend one use twice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from ..approvals.grants import Grant
from ..approvals.store import GrantStore

__all__ = ["GrantTable", "MemoryGrants"]

@dataclass
class _Kept:
    record: bytes
    uses: int | None
    expires: float
    user: str | None
    authority: str

    def grant(self) -> Grant | None:
        grant = Grant.from_json(orjson.loads(self.record))
        return replace(grant, uses_left=self.uses) if grant is not None else None


@dataclass
class GrantTable:
    """The grants the replicas of one hub share (memory.py `MemoryHub` holds it)."""

    kept: dict[str, _Kept] = field(default_factory=dict)
    # Under its user; a grant over every user of its agent under None.
    by_user: dict[str | None, set[str]] = field(default_factory=dict)
    by_authority: dict[str, set[str]] = field(default_factory=dict)


class MemoryGrants(GrantStore):
    """A replica's face of its hub's `GrantTable`; `wall`: the hub's wall clock."""

    def __init__(self, table: GrantTable, wall: Callable[[], float]) -> None:
        self._table = table
        self._wall = wall

    async def put_grant(self, grant: Grant) -> None:
        table = self._table
        table.kept[grant.id] = _Kept(
            orjson.dumps(grant.as_json()), grant.uses_left, grant.expires_at, grant.user_id, grant.authority,
        )
        table.by_user.setdefault(grant.user_id, set()).add(grant.id)
        table.by_authority.setdefault(grant.authority, set()).add(grant.id)

    def _live(self, grant_id: str) -> _Kept | None:
        kept = self._table.kept.get(grant_id)
        if kept is not None and kept.expires <= self._wall():
            self._drop(grant_id)
            return None
        return kept

    def _drop(self, grant_id: str) -> bool:
        table = self._table
        kept = table.kept.pop(grant_id, None)
        if kept is None:
            return False
        _unlist(table.by_user, kept.user, grant_id)
        _unlist(table.by_authority, kept.authority, grant_id)
        return True

    def _listed(self, ids: set[str]) -> list[Grant]:
        found = []
        for grant_id in sorted(ids):
            kept = self._live(grant_id)
            grant = kept.grant() if kept is not None else None
            if grant is not None:
                found.append(grant)
        return sorted(found, key=lambda grant: (grant.created_at, grant.id))

    async def get_grant(self, grant_id: str) -> Grant | None:
        kept = self._live(grant_id)
        return kept.grant() if kept is not None else None

    async def grants_of(self, user_id: str) -> list[Grant]:
        table = self._table
        return self._listed(table.by_user.get(user_id, set()) | table.by_user.get(None, set()))

    async def grants_by(self, authority: str) -> list[Grant]:
        return self._listed(set(self._table.by_authority.get(authority, set())))

    async def revoke_grant(self, grant_id: str) -> bool:
        return self._live(grant_id) is not None and self._drop(grant_id)

    async def take_grant_use(self, grant_id: str) -> bool:
        kept = self._live(grant_id)
        if kept is None or (kept.uses is not None and kept.uses <= 0):
            return False
        if kept.uses is not None:
            kept.uses -= 1
        return True

    async def give_back_grant_use(self, grant_id: str) -> None:
        kept = self._live(grant_id)
        if kept is not None and kept.uses is not None:
            kept.uses += 1


def _unlist(listing: dict[Any, set[str]], key: Any, grant_id: str) -> None:
    ids = listing.get(key)
    if ids is not None:
        ids.discard(grant_id)
        if not ids:
            del listing[key]
