"""Standing grants in Redis (`sessions.backend: redis`): the approvals room's `GrantStore`
(approvals/store.py).

Keys, under `sessions.key_prefix`:
- `{p}:grant:{id}`: a hash per grant, expiring with it: `sealed`, the grant as JSON sealed for this
  key and field (sealing.py: no replica acts on a grant no replica wrote); `uses`, the uses left
  ('' for a grant without a count), beside the seal because a Lua script counts them down
  (redis_scripts.py GRANT_TAKE, GRANT_GIVE_BACK: no use is spent twice); `lists`, the listings it
  is in, for a revocation.
- `{p}:grants:{digest}`: a listing (a user's grants, every user's, an authority's) as a sorted set
  of ids scored by when each expires (ms); what expired or was revoked is removed as it is read.
A record that does not open is absent (logged without its content). The uses count, outside the
seal, is Redis's to keep: a forged count can let a grant decide more calls than it was given, never
a call no grant covers, nor one after its expiry (checked on the sealed record). Raises what
redis-py raises, through the owner's `op` (RedisState's), which turns it into SharedStateDown.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import orjson
import redis.asyncio as aioredis
import structlog

from ..approvals.grants import Grant
from ..approvals.store import GrantStore
from .redis_scripts import GRANT_GIVE_BACK, GRANT_TAKE
from .sealing import Seal, Tampered

__all__ = ["RedisGrants"]

log = structlog.get_logger("adk_gateway.cluster.redis_grants")

Op = Callable[[Coroutine[Any, Any, Any]], Awaitable[Any]]


class RedisGrants(GrantStore):
    """The grants of one RedisState (its client, key prefix, seal, and its way of calling Redis)."""

    def __init__(self, client: aioredis.Redis, prefix: str, seal: Seal, op: Op, wall: Callable[[], float] = time.time) -> None:
        self._redis = client
        self._prefix = prefix
        self._seal = seal
        self._op = op
        self._wall = wall
        self._take = client.register_script(GRANT_TAKE)
        self._give_back = client.register_script(GRANT_GIVE_BACK)

    def _name(self, grant_id: str) -> str:
        return f"{self._prefix}:grant:{grant_id}"

    def _listing(self, kind: str, key: str | None) -> str:
        # Hashed: user ids and group names stay out of key names.
        return f"{self._prefix}:grants:{hashlib.sha256(orjson.dumps([kind, key])).hexdigest()[:32]}"

    async def put_grant(self, grant: Grant) -> None:
        await self._op(self._put(grant))

    async def _put(self, grant: Grant) -> None:
        name = self._name(grant.id)
        lists = [self._listing("user", grant.user_id), self._listing("authority", grant.authority)]
        expires_ms = int(grant.expires_at * 1000)
        ttl_ms = max(expires_ms - int(self._wall() * 1000), 1)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(name, mapping={
                "sealed": self._seal.seal(orjson.dumps(grant.as_json()), f"{name}:sealed"),
                "uses": "" if grant.uses_left is None else str(grant.uses_left), "lists": "\n".join(lists),
            })
            pipe.pexpire(name, ttl_ms)
            for listing in lists:
                pipe.zadd(listing, {grant.id: expires_ms})
                pipe.pexpire(listing, ttl_ms, gt=True)
                pipe.pexpire(listing, ttl_ms, nx=True)
            await pipe.execute()

    async def get_grant(self, grant_id: str) -> Grant | None:
        sealed, uses = await self._op(self._redis.hmget(self._name(grant_id), ["sealed", "uses"]))
        return self._opened(grant_id, sealed, uses)

    async def grants_of(self, user_id: str) -> list[Grant]:
        return await self._op(self._listed([self._listing("user", user_id), self._listing("user", None)]))  # type: ignore[no-any-return]

    async def grants_by(self, authority: str) -> list[Grant]:
        return await self._op(self._listed([self._listing("authority", authority)]))  # type: ignore[no-any-return]

    async def _listed(self, listings: list[str]) -> list[Grant]:
        now_ms = int(self._wall() * 1000)
        async with self._redis.pipeline(transaction=False) as pipe:
            for listing in listings:
                pipe.zremrangebyscore(listing, "-inf", now_ms)
                pipe.zrange(listing, 0, -1)
            answers = await pipe.execute()
        ids = sorted({member.decode() for found in answers[1::2] for member in found})
        async with self._redis.pipeline(transaction=False) as pipe:
            for grant_id in ids:
                pipe.hmget(self._name(grant_id), ["sealed", "uses"])
            rows = await pipe.execute()
        grants, gone = [], []
        for grant_id, (sealed, uses) in zip(ids, rows, strict=True):
            grant = self._opened(grant_id, sealed, uses)
            if grant is None:
                gone.append(grant_id)
            else:
                grants.append(grant)
        if gone:
            async with self._redis.pipeline(transaction=False) as pipe:
                for listing in listings:
                    pipe.zrem(listing, *gone)
                await pipe.execute()
        return sorted(grants, key=lambda grant: (grant.created_at, grant.id))

    def _opened(self, grant_id: str, sealed: bytes | None, uses: bytes | None) -> Grant | None:
        """The grant a hash holds, live and with its uses left; None (logged if forged) otherwise."""
        if sealed is None:
            return None
        grant = self._record(grant_id, sealed)
        if grant is None or grant.expires_at <= self._wall():
            return None
        if grant.uses_left is None:
            return grant
        try:
            left = int(uses or b"")
        except ValueError:
            log.warning("grant_uses_unreadable", grant_id=grant_id)
            return None
        return Grant(**{**grant.__dict__, "uses_left": left})

    def _record(self, grant_id: str, sealed: bytes) -> Grant | None:
        name = self._name(grant_id)
        try:
            record = orjson.loads(self._seal.open(sealed, f"{name}:sealed"))
        except (Tampered, orjson.JSONDecodeError):
            log.warning("grant_record_tampered", grant_id=grant_id)
            return None
        grant = Grant.from_json(record) if isinstance(record, dict) else None
        if grant is None or grant.id != grant_id:
            log.warning("grant_record_unreadable", grant_id=grant_id)
            return None
        return grant

    async def revoke_grant(self, grant_id: str) -> bool:
        return await self._op(self._revoke(grant_id))  # type: ignore[no-any-return]

    async def _revoke(self, grant_id: str) -> bool:
        name = self._name(grant_id)
        lists = await self._redis.hget(name, "lists")
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.delete(name)
            for listing in (lists or b"").split(b"\n"):
                if listing:
                    pipe.zrem(listing, grant_id)
            deleted, *_ = await pipe.execute()
        return bool(deleted)

    async def take_grant_use(self, grant_id: str) -> bool:
        answer = await self._op(self._take(keys=[self._name(grant_id)]))
        if not answer:
            return False
        grant = self._record(grant_id, answer[0])
        # A record that does not open, or a key kept past the grant's expiry, grants nothing.
        return grant is not None and grant.expires_at > self._wall()

    async def give_back_grant_use(self, grant_id: str) -> None:
        await self._op(self._give_back(keys=[self._name(grant_id)]))
