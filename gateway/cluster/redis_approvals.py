"""The directory of pending approvals in Redis (`sessions.backend: redis`): a hash per approval and
an index to list them.

Keys, under `sessions.key_prefix` (docs/scaling.md has the table):
- `{p}:approval:{id}`: a hash per pending approval, expiring with it (its deadline plus a margin,
  the caller's `ttl`): `sealed`, the record as the API shows it (its arguments among it), sealed for
  this key and field (sealing.py); and beside the seal what a Lua script must read and write in one
  step with a vote, which it could not do inside a seal: `state` (pending, approved or denied) and
  `votes` (JSON, [{user, approved, tag}]: user ids and answers only; the tag is the voting replica's
  seal over the approval, the user and the answer); and where the put listed it (`pos`, `index`,
  `count`), for the drop.
- `{p}:approvals` and `{p}:approvals:{digest}`: the indexes of approvals/index.py (every approval;
  an agent's; an audience's; an audience's of one agent), sorted sets of positions read in lexical
  order; each expires with its longest-lived approval, and a position whose hash expired is removed
  by the listing that meets it.
- `{p}:approvals:user:{digest}`: a requester's approvals kept, scored by when each expires, for
  `limits.max_pending_approvals_per_user`.
Putting and voting are Lua scripts (redis_scripts.py APPROVAL_PUT, APPROVAL_VOTE), so two replicas
voting at once never both decide. What the scripts cannot check, a replica checks when it reads: a
record that does not open is absent, a vote whose tag does not open is not counted, and a decision
the genuine votes do not make is no decision (the approval reads as absent, a vote on it as gone);
each logged without its content. Raises what redis-py raises; the owner, RedisState, turns it into
SharedStateDown.
"""

from __future__ import annotations

import hashlib
from typing import Any, cast

import orjson
import redis.asyncio as aioredis
import structlog

from ..approvals.index import ALL, ApprovalPage, ApprovalQuery, Index, indexes_of, position, wanted_indexes
from .redis_scripts import APPROVAL_COUNT, APPROVAL_PUT, APPROVAL_VOTE
from .sealing import Seal, Tampered, fingerprint
from ..approvals.votes import Tally, TallyState, Verdict, approval_view, approvals

__all__ = ["RedisApprovals"]

log = structlog.get_logger("adk_gateway.cluster.redis_approvals")

# Index entries read per round trip while listing: pending approvals are few (each is a person's
# wait), so a listing is one or two round trips.
_BATCH = 100
_VERDICTS: tuple[Verdict, ...] = ("pending", "approved", "denied")
_SEAL_VERSION = b"\x01"


class RedisApprovals:
    """The approvals directory of one RedisState (its client, key prefix and seal)."""

    def __init__(self, client: aioredis.Redis, prefix: str, seal: Seal, replica_id: str) -> None:
        self._redis = client
        self._prefix = prefix
        self._all = f"{prefix}:approvals"
        self._seal = seal
        self._replica_id = replica_id
        self._put = client.register_script(APPROVAL_PUT)
        self._vote = client.register_script(APPROVAL_VOTE)
        self._count_script = client.register_script(APPROVAL_COUNT)

    def _name(self, approval_id: str) -> str:
        return f"{self._prefix}:approval:{approval_id}"

    def _index(self, index: Index) -> str:
        if index == (ALL, ALL):
            return self._all
        # Hashed: group names, user ids and agent names stay out of key names, and no two read alike.
        return f"{self._all}:{_digest(orjson.dumps(index))}"

    def _count(self, requester: str) -> str:
        return f"{self._all}:user:{_digest(requester.encode())}"

    async def put(self, record: dict[str, Any], *, ttl: float, cap: int | None = None) -> bool:
        approval_id = str(record["id"])
        name = self._name(approval_id)
        sealed = self._seal.seal(orjson.dumps(record), f"{name}:sealed")
        keys = [name, self._count(str(record.get("requester", ""))), *map(self._index, indexes_of(record))]
        kept = await self._put(keys=keys, args=[sealed, max(int(ttl * 1000), 1), position(record), approval_id, cap or 0])
        return bool(kept)

    async def pending_of(self, requester: str) -> int:
        return int(await self._count_script(keys=[self._count(requester)]))

    async def get(self, approval_id: str) -> dict[str, Any] | None:
        name = self._name(approval_id)
        sealed, votes, verdict = await self._redis.hmget(name, ["sealed", "votes", "state"])
        if sealed is None:
            return None
        return self._view(approval_id, sealed, votes, verdict)

    async def drop(self, approval_id: str) -> None:
        name = self._name(approval_id)
        # Where the put listed and counted it (outside the seal: a forged field only makes these
        # removals miss, and a listing forgets an entry whose approval is gone anyway).
        place, indexes, count = await self._redis.hmget(name, ["pos", "index", "count"])
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.delete(name)
            if place is not None:
                for index in (indexes or b"").split(b"\n"):
                    if index:
                        pipe.zrem(index, place)
            if count is not None:
                pipe.zrem(count, approval_id)
            await pipe.execute()

    async def page(self, query: ApprovalQuery) -> ApprovalPage:
        """Reads the query's indexes in batches, merged in position order: of each round, only the
        positions up to the smallest last one of a full batch are taken (beyond it another index
        may hold earlier ones), and the next round starts after them."""
        keys = [self._index(index) for index in wanted_indexes(query)]
        found: list[dict[str, Any]] = []
        expired: list[bytes] = []
        after = query.after
        try:
            while True:
                async with self._redis.pipeline(transaction=False) as pipe:
                    for key in keys:
                        pipe.zrange(key, f"({after}" if after else "-", "+", bylex=True, offset=0, num=_BATCH)
                    batches: list[list[bytes]] = await pipe.execute()
                full = [batch[-1] for batch in batches if len(batch) == _BATCH]
                frontier = min(full) if full else None
                places = sorted({p for batch in batches for p in batch if frontier is None or p <= frontier})
                for place, view in zip(places, await self._read(places, expired), strict=True):
                    if view is not None and query.matches(view):
                        found.append(view)
                        if len(found) >= query.limit:
                            return ApprovalPage(found, place.decode())
                if frontier is None:
                    return ApprovalPage(found, None)
                after = frontier.decode()
        finally:
            if expired:
                # After the scan, so that the positions it pages by do not move under it.
                async with self._redis.pipeline(transaction=False) as pipe:
                    for key in keys:
                        pipe.zrem(key, *expired)
                    await pipe.execute()

    async def _read(self, places: list[bytes], expired: list[bytes]) -> list[dict[str, Any] | None]:
        """The pending approvals at `places` (None for one decided, unreadable or gone; a gone
        one's position added to `expired`)."""
        if not places:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for place in places:
                pipe.hmget(self._name(place.partition(b"|")[2].decode()), ["sealed", "votes", "state"])
            rows = await pipe.execute()
        views: list[dict[str, Any] | None] = []
        for place, (sealed, votes, verdict) in zip(places, rows, strict=True):
            if sealed is None:
                expired.append(place)
                views.append(None)
            elif verdict != b"pending":
                views.append(None)  # decided by a vote: its owner drops it once it acted on it
            else:
                views.append(self._view(place.partition(b"|")[2].decode(), sealed, votes, verdict))
        return views

    async def vote(self, approval_id: str, user: str, approved: bool, quorum: int) -> Tally:
        name = self._name(approval_id)
        answer = await self._vote(keys=[name], args=[user, "1" if approved else "0", quorum, self._tag(name, user, approved)])
        result = cast(TallyState, answer[0].decode())
        if len(answer) < 4:
            return Tally("gone")
        view = self._view(approval_id, answer[2], answer[1], answer[3], quorum=quorum)
        if view is None:
            # The decision (or the record) is not the gateway's: nothing is decided here, and the
            # approval reads as absent from now on (fail closed: it times out).
            return Tally("gone")
        return Tally(result, view)

    def _tag(self, name: str, user: str, approved: bool) -> str:
        return fingerprint(self._seal.seal(_vote_payload(user, approved), f"{name}:vote")).hex()

    def _view(
        self, approval_id: str, sealed: bytes, raw_votes: bytes | None, raw_verdict: bytes | None, *, quorum: int | None = None,
    ) -> dict[str, Any] | None:
        """The approval, once its record opens and its verdict is what its genuine votes make; else
        None, logged."""
        name = self._name(approval_id)
        try:
            record = orjson.loads(self._seal.open(sealed, f"{name}:sealed"))
        except (Tampered, orjson.JSONDecodeError):
            log.warning("approval_record_tampered", replica=self._replica_id, approval_id=approval_id)
            return None
        if not isinstance(record, dict):
            log.warning("approval_record_unreadable", replica=self._replica_id, approval_id=approval_id)
            return None
        votes = self._genuine_votes(approval_id, name, raw_votes)
        verdict = (raw_verdict or b"").decode(errors="replace")
        needed = quorum if quorum is not None else _quorum(record)
        if verdict not in _VERDICTS or votes is None or (
            verdict == "approved" and approvals(votes) < needed
        ) or (verdict == "denied" and all(vote["approved"] for vote in votes)):
            log.warning("approval_decision_tampered", replica=self._replica_id, approval_id=approval_id)
            return None
        return approval_view(record, votes, cast(Verdict, verdict))

    def _genuine_votes(self, approval_id: str, name: str, raw: bytes | None) -> list[dict[str, Any]] | None:
        try:
            stored = orjson.loads(raw or b"[]")
        except orjson.JSONDecodeError:
            return None
        # Lua's cjson writes an empty list as {}.
        if stored == {}:
            stored = []
        if not isinstance(stored, list):
            return None
        votes: list[dict[str, Any]] = []
        for vote in stored:
            if not isinstance(vote, dict):
                return None
            user, approved, tag = vote.get("user"), vote.get("approved"), vote.get("tag")
            if isinstance(user, str) and isinstance(approved, bool) and isinstance(tag, str) and self._genuine(
                name, user, approved, tag
            ):
                votes.append({"user": user, "approved": approved})
            else:
                # Not counted, and not shown: a vote nobody gave through a replica.
                log.warning("approval_vote_tampered", replica=self._replica_id, approval_id=approval_id)
        return votes

    def _genuine(self, name: str, user: str, approved: bool, tag: str) -> bool:
        try:
            self._seal.open(_SEAL_VERSION + bytes.fromhex(tag) + _vote_payload(user, approved), f"{name}:vote")
        except (Tampered, ValueError):
            return False
        return True


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]


def _vote_payload(user: str, approved: bool) -> bytes:
    # The user id first with its length: no user id and answer pair reads as another.
    encoded = user.encode()
    return len(encoded).to_bytes(4, "big") + encoded + (b"1" if approved else b"0")


def _quorum(record: dict[str, Any]) -> int:
    quorum = record.get("quorum", 1)
    return quorum if isinstance(quorum, int) and quorum >= 1 else 1
