"""The chat directory in Redis (`sessions.backend: redis`): which user and agent a chat belongs to,
which replica runs it, and which message it is running.

One key per chat under `sessions.key_prefix` (docs/scaling.md has the table):
- `{p}:chat:{chat id}`: hash {user, agent, owner, run}, expiring `chat.idle_chat_ttl` after its
  last use. A claim (redis_scripts.py CLAIM, one Lua script, so two replicas racing for a chat
  cannot both win) makes this replica its owner when nobody alive is; only the owner writes it
  after that (OWNER_SET); after Redis lost its data, each replica writes back the chats it holds.

A chat whose owner's heartbeat (`{p}:replica:{id}`) is missing is another replica's to take, except
while a missing heartbeat may be a live replica's that has not beaten since an outage: the owner,
RedisState, keeps the heartbeat and the epoch and tells this part both. The directory is not
sealed: it routes and it times out, it authorizes nothing (docs/security.md). Raises what redis-py
raises; the owner, RedisState, turns it into SharedStateDown.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import redis.asyncio as aioredis

from ..chat.registry import ChatNotFound
from .redis_scripts import CLAIM, OWNER_SET
from .shared import Claim, SharedStateDown, LocalChat

__all__ = ["RedisDirectory"]


class RedisDirectory:
    """The chat directory of one RedisState (its client and key prefix). `epoch`: the dataset's
    epoch as this replica last saw it (None before its first heartbeat); `may_be_live`: whether a
    missing heartbeat may still be a live replica's (after an outage); `reset_seen`: called when a
    claim finds the epoch changed before this replica's heartbeat did (Redis lost its data)."""

    def __init__(
        self,
        client: aioredis.Redis,
        prefix: str,
        replica_id: str,
        *,
        owner_timeout: float,
        epoch: Callable[[], str | None],
        may_be_live: Callable[[], bool],
        reset_seen: Callable[[], None],
    ) -> None:
        self._redis = client
        self._prefix = prefix
        self._replica_id = replica_id
        self._owner_timeout = owner_timeout
        self._epoch = epoch
        self._may_be_live = may_be_live
        self._reset_seen = reset_seen
        self._claim = client.register_script(CLAIM)
        self._owner_set = client.register_script(OWNER_SET)
        # The chat record lifetime last asked for (chat.idle_chat_ttl may change on reload).
        self._chat_ttl = 3600.0

    def _key(self, *parts: str) -> str:
        return ":".join((self._prefix, *parts))

    async def claim(self, user_id: str, chat_id: str, *, agent: str, default_agent: str, ttl: float, create: bool) -> Claim:
        self._chat_ttl = ttl
        result = await self._claim(
            keys=[self._key("chat", chat_id), self._key("epoch"), self._key("beats")],
            args=[user_id, self._replica_id, int(ttl * 1000), self._key("replica", ""), self._epoch() or "",
                  int(self._owner_timeout * 1000), "1" if create else "0", agent, default_agent],
        )
        kind = result[0].decode()
        if kind == "local":
            return Claim(self._replica_id, local=True)
        if kind == "remote":
            return Claim(result[1].decode(), local=False)
        if kind == "took_over":
            run = result[2].decode()
            return Claim(self._replica_id, local=True, orphaned_run=run or None)
        if kind == "foreign":
            raise ChatNotFound(chat_id)
        if kind == "reset":
            self._reset_seen()
            raise SharedStateDown("the shared session store (Redis) lost its data and the replicas are restoring it; retry")
        raise SharedStateDown("the replicas are restoring the shared session store; retry in a moment")

    async def owner(self, user_id: str, chat_id: str) -> str | None:
        user, owner = await self._redis.hmget(self._key("chat", chat_id), ["user", "owner"])
        if user is None or user.decode() != user_id:
            return None
        owner_id: str = owner.decode()
        if owner_id == self._replica_id or self._may_be_live():
            return owner_id
        if await self._redis.exists(self._key("replica", owner_id)):
            return owner_id
        return None

    async def mark_run(self, user_id: str, chat_id: str, message_id: str) -> None:
        await self._owner_write(user_id, chat_id, "run", message_id)

    async def release(self, user_id: str, chat_id: str) -> None:
        await self._owner_write(user_id, chat_id, "", "")  # no field: the record is deleted

    async def _owner_write(self, user_id: str, chat_id: str, field: str, value: str) -> None:
        await self._owner_set(keys=[self._key("chat", chat_id)], args=[user_id, self._replica_id, field, value])

    async def alive(self, replica_id: str) -> bool:
        return bool(await self._redis.exists(self._key("replica", replica_id))) or self._may_be_live()

    async def restore(self, chats: Iterable[LocalChat]) -> None:
        """Write back the chats this replica holds, after Redis lost what it had written."""
        ttl_ms = int(self._chat_ttl * 1000)
        async with self._redis.pipeline(transaction=False) as pipe:
            for chat in chats:
                key = self._key("chat", chat.chat)
                pipe.hset(key, mapping={"user": chat.user, "owner": self._replica_id, "run": chat.run, "agent": chat.agent})
                pipe.pexpire(key, ttl_ms)
            await pipe.execute()
