"""The audit trail's store in Redis (`sessions.backend: redis`): one stream of sealed records.

Two keys, under `sessions.key_prefix` (docs/scaling.md has the table):
- `{p}:audit`: a stream, one entry per decided approval: the record, sealed (sealing.py) for its
  place, the entry's id. Whoever can write to Redis cannot put a record there that reads as the
  gateway's, nor copy a genuine one to another place (a replay, or a record back after it was
  trimmed): it does not open there. Reads select on the agent and tool inside the seal, so nothing
  written beside a record hides it from a filtered read. Entry ids are the records' places and the
  readers' cursors: the decision's time in ms, or a little later for a record stored late.
- `{p}:audit_ids`: the approval ids of the records kept (a sorted set, scored by place): a second
  record for the same approval is not appended.
Both are trimmed at every append to the newest `audit.keep` records, none placed more than
`audit.max_age` ago on Redis's clock, and expire when nothing was appended for `max_age`; one Lua
script (redis_scripts.py AUDIT_APPEND) does it all in one round trip, and one more per place taken
meanwhile (the record is sealed for the place it asks for). Raises what redis-py raises;
the owner, RedisState, turns it into SharedStateDown.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson
import redis.asyncio as aioredis
import structlog

from .redis_scripts import AUDIT_APPEND
from .sealing import Seal, Tampered
from .shared import AuditEntry, AuditQuery, audit_position

__all__ = ["RedisAudit"]

log = structlog.get_logger("adk_gateway.cluster.redis_audit")

# Entries read per XRANGE while a read's filters skip some: a page is a few round trips at most
# unless the filters match few records (the store is scanned then: keep bounds it).
_BATCH = 500
# Places asked for one record before giving up: each refusal means another record took the place
# just then, so several in a row take as many replicas appending in the same millisecond.
_PLACE_TRIES = 16


class RedisAudit:
    """The audit store of one RedisState (its client, key prefix and seal). `redis_ms`: now on
    Redis's clock, as of the last heartbeat (None before the first)."""

    def __init__(self, client: aioredis.Redis, prefix: str, seal: Seal, redis_ms: Callable[[], int | None]) -> None:
        self._redis = client
        self._stream = f"{prefix}:audit"
        self._ids = f"{prefix}:audit_ids"
        self._seal = seal
        self._redis_ms = redis_ms
        self._append = client.register_script(AUDIT_APPEND)

    async def append(self, entry: AuditEntry, *, keep: int, max_age: float) -> bool:
        payload = orjson.dumps(entry.record)
        # At the decision's time, unless the stream has a later entry: then just after it (a
        # stream's order is the order of appends, and a cursor never skips a record stored late).
        place = (int(entry.at * 1000), 0)
        for _ in range(_PLACE_TRIES):
            where = f"{place[0]}-{place[1]}"
            placed = await self._append(
                keys=[self._stream, self._ids],
                args=[entry.approval_id, where, keep, max(int(max_age * 1000), 1), self._seal.seal(payload, self._at(where))],
            )
            if not isinstance(placed, list):
                return placed is not None
            newest = audit_position(placed[0].decode())
            place = max((newest[0], newest[1] + 1), place)
        raise RuntimeError("no place for the audit record: every one asked for was taken")

    async def read(self, query: AuditQuery, *, max_age: float) -> list[dict[str, Any]]:
        now_ms = self._redis_ms()
        if now_ms is None:
            now_ms = int(time.time() * 1000)
        start_ms = max(now_ms - int(max_age * 1000), int((query.since or 0) * 1000))
        start = f"{start_ms}-0"
        if query.after:
            after = audit_position(query.after)
            if after >= (start_ms, 0):
                start = f"({after[0]}-{after[1]}"
        end = str(int(query.until * 1000)) if query.until is not None else "+"
        found: list[dict[str, Any]] = []
        while len(found) < query.limit:
            batch = await self._redis.xrange(self._stream, start, end, count=_BATCH)
            for entry_id, fields in batch:
                cursor = entry_id.decode()
                record = self._open(fields.get(b"s", b""), cursor)
                if record is None or not query.matches(record.get("agent"), record.get("tool")):
                    continue
                record["cursor"] = cursor
                found.append(record)
                if len(found) >= query.limit:
                    break
            if len(batch) < _BATCH:
                break
            start = "(" + batch[-1][0].decode()
        return found

    def _at(self, cursor: str) -> str:
        """The seal's context of the entry at `cursor`: the stream and the place in it."""
        return f"{self._stream}@{cursor}"

    def _open(self, sealed: bytes, cursor: str) -> dict[str, Any] | None:
        try:
            record = orjson.loads(self._seal.open(sealed, self._at(cursor)))
        except (Tampered, orjson.JSONDecodeError):
            # Skipped, without its content: written by someone who does not hold the secret, or a
            # genuine record copied to a place it was not sealed for.
            log.warning("audit_record_tampered", cursor=cursor)
            return None
        return record if isinstance(record, dict) else None
