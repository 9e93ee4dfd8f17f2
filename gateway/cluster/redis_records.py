"""Sealed records in Redis (`sessions.backend: redis`): what one replica writes for another to read.

Four kinds, under `sessions.key_prefix` (docs/scaling.md has the table):
- `{p}:relay:{key}`: a stream per relayed response, one sealed entry per batch of chunks, capped
  and expiring;
- `{p}:call:{approval id}`: a gated call's hash, each field sealed on its own (the verdict is
  written after the rest, by the same owner);
- `{p}:ticket:{sha256 of the ticket}`: a WebSocket ticket's record, its expiry on Redis's clock
  inside the seal, taken with GETDEL so it opens one socket;
- `{p}:state:{chat id}`: a chat's state (its approvals, as its machine saved them) with its user,
  one sealed JSON value replaced at every save, expiring with the chat.

Each seal covers where the value is written (sealing.py), so none can be moved elsewhere; what does
not open is logged without its content and treated as absent. Raises what redis-py raises; the
owner, RedisState, turns it into SharedStateDown (as with redis_deadlines.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import redis.asyncio as aioredis
import structlog

from .sealing import Seal, Tampered
from .shared import RelayEntry

__all__ = ["RedisRecords"]

log = structlog.get_logger("adk_gateway.cluster.redis_records")

_RELAY_CAP = 20_000  # entries; a relay carries one response, itself bounded by chat.run_buffer_chunks
_RELAY_TTL_MS = 300_000


class RedisRecords:
    """The relays, call records, tickets and chat states of one RedisState (its client, key prefix and seal).
    `redis_ms`: now on Redis's clock, as of the last heartbeat (None before the first)."""

    def __init__(
        self, client: aioredis.Redis, prefix: str, seal: Seal, replica_id: str, redis_ms: Callable[[], int | None],
    ) -> None:
        self._redis = client
        self._prefix = prefix
        self._seal = seal
        self._replica_id = replica_id
        self._redis_ms = redis_ms

    def _key(self, *parts: str) -> str:
        return ":".join((self._prefix, *parts))

    async def relay_append(self, key: str, entry: RelayEntry) -> None:
        name = self._key("relay", key)
        # One seal per entry, and an entry is a batch of chunks: the cost is one HMAC per batch.
        # The entry's number is inside the seal, so a genuine entry copied further down the stream
        # reads as the hole it makes.
        payload = b"%d\n%s\n%s" % (entry.seq, (entry.end or "").encode(), b"\n".join(entry.frames))
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.xadd(name, {"s": self._seal.seal(payload, name)}, maxlen=_RELAY_CAP, approximate=True)
            pipe.pexpire(name, _RELAY_TTL_MS)
            await pipe.execute()

    async def relay_read(self, key: str, after: str, *, timeout: float) -> tuple[str, list[RelayEntry]]:
        name = self._key("relay", key)
        answer = await self._redis.xread({name: after or "0-0"}, block=max(1, int(timeout * 1000)), count=500)
        if not answer:
            return after, []
        entries = []
        position = after
        for entry_id, fields in answer[0][1]:
            position = entry_id.decode()
            try:
                seq, end, frames = self._seal.open(fields.get(b"s", b""), name).split(b"\n", 2)
            except (Tampered, ValueError):
                # Skipped: the genuine entry of that number still comes, or its absence is the hole
                # the reader ends the response at (relay.py).
                log.warning("relay_entry_tampered", replica=self._replica_id)
                continue
            entries.append(RelayEntry(int(seq), frames.split(b"\n") if frames else [], end.decode() or None))
        return position, entries

    async def put_call(self, call_id: str, record: dict[str, str], *, ttl: float) -> None:
        name = self._key("call", call_id)
        # Field by field: the verdict is written after the rest, by the same owner. Each seal
        # covers the call and the field's name, so no sealed value can be moved to another.
        sealed = {field: self._seal.seal(value.encode(), f"{name}:{field}") for field, value in record.items()}
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hset(name, mapping=sealed)
            pipe.pexpire(name, int(ttl * 1000))
            await pipe.execute()

    async def get_call(self, call_id: str) -> dict[str, str] | None:
        name = self._key("call", call_id)
        raw = await self._redis.hgetall(name)
        try:
            return {k.decode(): self._seal.open(v, f"{name}:{k.decode()}").decode() for k, v in raw.items()} or None
        except (Tampered, UnicodeDecodeError):
            # A record with one forged field is lost whole: the asker then refuses the call when
            # its deadline passes (remote_gate.py), as when Redis lost it.
            log.warning("call_record_tampered", replica=self._replica_id, approval_id=call_id)
            return None

    async def put_ticket(self, key: str, record: dict[str, str], *, ttl: float) -> None:
        name = self._key("ticket", key)
        # The expiry goes inside the seal, on Redis's clock: a sealed record written back into
        # Redis after it expired (or was taken) opens nothing once the ticket's lifetime is over.
        until = (self._redis_ms() or 0) + ttl * 1000
        sealed = self._seal.seal(orjson.dumps({"until": until, "record": record}), name)
        await self._redis.set(name, sealed, px=max(int(ttl * 1000), 1))

    async def take_ticket(self, key: str) -> dict[str, str] | None:
        name = self._key("ticket", key)
        # GETDEL (Redis 6.2): two replicas handed the same ticket cannot both take it.
        raw = await self._redis.getdel(name)
        if raw is None:
            return None
        try:
            stored = orjson.loads(self._seal.open(raw, name))
        except (Tampered, orjson.JSONDecodeError):
            log.warning("ticket_record_tampered", replica=self._replica_id)
            return None
        now = self._redis_ms()
        if now is None or stored["until"] < now:
            log.warning("ticket_record_replayed", replica=self._replica_id)
            return None
        record: dict[str, str] = stored["record"]
        return record

    async def put_chat_state(self, user_id: str, chat_id: str, state: dict[str, Any], *, ttl: float) -> None:
        name = self._key("state", chat_id)
        # The user inside the seal: chat ids are global, and a state is read back under its user only.
        sealed = self._seal.seal(orjson.dumps({"user": user_id, "state": state}), name)
        await self._redis.set(name, sealed, px=max(int(ttl * 1000), 1))

    async def get_chat_state(self, user_id: str, chat_id: str) -> dict[str, Any] | None:
        name = self._key("state", chat_id)
        raw = await self._redis.get(name)
        if raw is None:
            return None
        try:
            stored = orjson.loads(self._seal.open(raw, name))
        except (Tampered, orjson.JSONDecodeError):
            log.warning("chat_state_tampered", replica=self._replica_id, chat_id=chat_id)
            return None
        state = stored.get("state") if isinstance(stored, dict) else None
        if not isinstance(state, dict):
            # Sealed by a replica, so not a forgery: a shape this release does not read.
            log.warning("chat_state_unreadable", replica=self._replica_id, chat_id=chat_id)
            return None
        if stored.get("user") != user_id:
            log.warning("chat_state_foreign", replica=self._replica_id, chat_id=chat_id)
            return None
        return state
