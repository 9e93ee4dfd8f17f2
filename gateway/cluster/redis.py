"""Shared state in Redis (`sessions.backend: redis`): what lets several replicas serve one chat.

`RedisState` owns the heartbeat, the epoch and Redis's clock. Its parts own the other keys, each
given the client and prefix (and the seal, this replica's id, or the heartbeat's answers it needs):
the chat directory redis_directory.py, the inbox redis_inbox.py, the relays, call records, tickets
and chat states redis_records.py, the deadlines redis_deadlines.py, the audit store redis_audit.py,
the approvals directory redis_approvals.py, the per-user limits redis_limits.py. docs/scaling.md's
table ("What lives in Redis") has every key. This module's, under `sessions.key_prefix`:
- `{p}:epoch`: an id for the Redis dataset, "token|reset_ms". A replica that finds it missing or
  changed knows Redis lost its data (a restart without persistence) and writes its chats back;
  for `owner_timeout` after such a reset, claims of unknown chats answer "settling" (503, retry),
  so a chat is not taken by one replica before its owner has written it back. Every replica reads
  the window from the epoch and Redis's clock at each heartbeat, and reports it (`restoring`).
- `{p}:replica:{id}`: a replica's heartbeat, expiring after `owner_timeout`.
- `{p}:beats`: when any replica last beat, and when the beats last resumed after a gap (an outage).
  After an outage longer than `owner_timeout` every heartbeat has expired, live replicas' too: a
  missing heartbeat means dead only once the beats have gone on for `owner_timeout` since (claims
  that would take a chat over answer "settling" meanwhile: 503, retry).

What one replica writes for another to act on is sealed with `sessions.secret` (sealing.py) by the
part that writes it, and opened before use; what does not open is logged without its content and
treated as absent. The directory, heartbeats and epoch are not sealed: they route and they time
out, they authorize nothing (docs/security.md).

Every Redis error becomes SharedStateDown, and an overload of this replica SharedStateBusy
(redis_calls.py); the heartbeat loop notices recovery and marks the backend available again.
Redis Cluster is not supported (the claim script touches keys it is not given). Sentinel and managed
failover endpoints are (the client is redis_client.py's): a promoted replica holds the epoch as of its
last replication, so a failover is not taken for lost data; what the old primary acknowledged and had
not yet replicated is lost (docs/scaling.md says what that can be, and why it fails closed).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Mapping, Sequence
from typing import Any

import redis.asyncio as aioredis
import structlog
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from ..ops.stopping import cancel_and_wait
from ..core.deadlines import Deadline
from .redis_approvals import RedisApprovals
from .redis_grants import RedisGrants
from .redis_audit import RedisAudit
from .redis_calls import RedisCalls, reason
from .redis_client import RedisTarget, connect
from .redis_pool import DEFAULT_MAX_CONNECTIONS, PoolWatch
from .redis_deadlines import RedisDeadlines
from .redis_directory import RedisDirectory
from .redis_inbox import RedisInbox
from .redis_limits import RedisLimits
from .redis_records import RedisRecords
from .redis_scripts import BEAT, NEW_EPOCH
from .sealing import Seal
from .shared import (
    DEADLINE_LEASE, AuditEntry, AuditQuery, Claim, Inbox, Reassert, RelayEntry, SharedState,
)
from ..approvals.index import ApprovalPage, ApprovalQuery
from ..approvals.votes import Tally

__all__ = ["RedisState"]

log = structlog.get_logger("adk_gateway.cluster.redis")

# Redis on the same network answers in a millisecond: a connect slower than 2 s is a Redis that is
# down, and a command waiting 5 s is one that hangs (relay reads pass shorter deadlines of their own).
_CONNECT_TIMEOUT = 2.0
_COMMAND_TIMEOUT = 5.0
# A per-user limit check (redis_limits.py) holds a request's admission: it waits no longer than a
# connect may take, not a command's timeout and its retry (10 s). Beyond it the check falls back
# (limits.shared_fallback), and the backend counts as down until its heartbeat gets through, unless
# Redis answered other commands meanwhile (redis_calls.py).
_LIMIT_TIMEOUT = _CONNECT_TIMEOUT
# close(), step by step. The loops were cancelled and also stop on their own once closed, so they
# are given little time: more than that means something below lost the cancellation. The goodbye
# (deleting the heartbeat) and closing the connections each get a second: a Redis that does not
# answer must not hold up the process's exit (socket_timeout alone would allow 5 s per try).
_STOP_GRACE = 1.0
# How long `start` waits for the inbox's subscription when Redis answered the first beat: the
# replica serves once `start` returns, and a message sent to it before it listens is lost.
_SUBSCRIBE_WAIT = 2.0
_GOODBYE_TIMEOUT = 1.0
# How long `{p}:beats` outlives the last beat: a cluster stopped longer than this starts with no
# gap to wait out (its replicas are new, and the old ones' chats are theirs to take).
_BEATS_KEPT_MS = 3_600_000


class RedisState(SharedState):
    """The Redis backend: its parts share one client, and their Redis errors become SharedStateDown here."""

    outlives_process = True
    shares_limits = True

    def __init__(
        self, replica_id: str, url: str | RedisTarget, *, prefix: str, heartbeat_interval: float, owner_timeout: float, seal: Seal,
        max_connections: int = DEFAULT_MAX_CONNECTIONS, pool_watch: PoolWatch | None = None,
    ) -> None:
        super().__init__(replica_id)
        self.available = False
        self._prefix = prefix
        self._interval = heartbeat_interval
        self._owner_timeout = owner_timeout
        # One immediate retry: after Redis restarts, every pooled connection fails once before
        # reconnecting, and that must not lose a write. No backoff: a Redis that is down answers
        # 503 now. Reads that block (relays) pass their own deadline, well under socket_timeout.
        # With Sentinel, that retry also follows a promotion (redis_client.py).
        self._client = connect(
            url if isinstance(url, RedisTarget) else RedisTarget(url=url),
            connect_timeout=_CONNECT_TIMEOUT, command_timeout=_COMMAND_TIMEOUT, retry=Retry(NoBackoff(), 1),
            max_connections=max_connections, watch=pool_watch,
        )
        self._redis: aioredis.Redis = self._client.redis
        self._op = RedisCalls(self._client, available=lambda: self.available, went_down=self._went_down)
        self._epoch: str | None = None
        self._closed = False
        self._tasks: list[asyncio.Task[None]] = []
        self._new_epoch = self._redis.register_script(NEW_EPOCH)
        # On the control client: the heartbeat never queues behind the commands of a burst.
        self._beat_script = self._client.control.register_script(BEAT)
        # A pause in every replica's beats longer than this is an outage (heartbeats may have expired
        # then); beats come every heartbeat_interval, so a gap of one and a half is not one.
        self._gap_ms = int(max(owner_timeout - heartbeat_interval, 1.5 * heartbeat_interval) * 1000)
        # When the beats last resumed after an outage (ms, Redis's clock; 0: none seen), as of the last beat.
        self._serving_since = 0
        self._deadlines = RedisDeadlines(self._redis, prefix, seal)
        self._beat_now = asyncio.Event()
        # Set by every heartbeat that reached Redis: a reconnecting inbox retries then, not only
        # when its backoff runs out.
        self._beat_ok = asyncio.Event()
        # Until when (time.monotonic) claims of unknown chats are refused after Redis lost its data.
        self._restored_at = 0.0
        # Redis's clock minus this process's monotonic one (ms), measured at every heartbeat:
        # inbox messages are stamped and checked on Redis's clock, so hosts' clocks do not matter.
        self._clock_offset: float | None = None
        # What this replica writes for others to act on is sealed, and what it reads is opened
        # before use (sealing.py): Redis is not trusted with the integrity of gated calls, tickets,
        # relayed chunks and forwarded work.
        self._records = RedisRecords(self._redis, prefix, seal, replica_id, self._redis_ms)
        self._audit = RedisAudit(self._redis, prefix, seal, self._redis_ms)
        self._approvals = RedisApprovals(self._redis, prefix, seal, replica_id)
        self.grants = RedisGrants(self._redis, prefix, seal, self._op)
        self._limits = RedisLimits(self._redis, prefix)
        self._directory = RedisDirectory(
            self._redis, prefix, replica_id, owner_timeout=owner_timeout,
            epoch=lambda: self._epoch, may_be_live=self._missing_beat_may_be_live, reset_seen=self._reset_seen,
        )
        self._inbox_link = RedisInbox(
            self._client.redis, self._client.control, prefix, seal, replica_id,
            redis_ms=self._redis_ms, closed=lambda: self._closed, beat_now=self._beat_now, beat_ok=self._beat_ok,
        )

    @property
    def restoring(self) -> bool:
        return time.monotonic() < self._restored_at

    def _key(self, *parts: str) -> str:
        return ":".join((self._prefix, *parts))

    # ---- lifecycle -------------------------------------------------------------------------

    async def start(self, inbox: Inbox, reassert: Reassert) -> None:
        self._reassert = reassert
        # The first beat before serving, so /readyz is true as soon as Redis is; a Redis that is
        # down at start is not fatal (the loop keeps trying and /readyz says why).
        await self._beat()
        self._tasks = [
            asyncio.create_task(self._heartbeats(), name="redis-heartbeat"),
            asyncio.create_task(self._inbox_link.listen(inbox, self._interval), name="redis-inbox"),
        ]
        if self.available:
            # Bounded: a Redis that fails now is the loops' to retry, and /readyz says why.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_SUBSCRIBE_WAIT):
                    await self._inbox_link.listening.wait()

    async def close(self) -> None:
        """Stop the loops, delete the heartbeat (the other replicas may take this one's chats at
        once) and close the connections: each step bounded, each done even if the last failed."""
        if self._closed:
            return
        self._closed = True
        self.available = False
        self._beat_ok.set()  # a reconnecting inbox wakes and sees _closed
        # Bounded: a cancellation lost inside redis-py (wait_for, on Python 3.11) must not hang
        # shutdown; the loops also stop by themselves once they see _closed.
        await cancel_and_wait(self._tasks, _STOP_GRACE, what="redis loops")
        try:
            async with asyncio.timeout(_GOODBYE_TIMEOUT):
                await self._redis.delete(self._key("replica", self.replica_id))
        except (RedisError, OSError, TimeoutError) as exc:
            # The others take this replica's chats over once the heartbeat expires instead.
            log.warning("heartbeat_not_deleted", reason=reason(exc), expires_in_s=self._owner_timeout)
        try:
            async with asyncio.timeout(_GOODBYE_TIMEOUT):
                await self._client.aclose()
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning("redis_connections_not_closed", reason=reason(exc))

    async def _heartbeats(self) -> None:
        while not self._closed:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow the cancellation
            # that close() sends, and this loop would then never end.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._interval):
                    await self._beat_now.wait()
            self._beat_now.clear()
            await self._beat()

    async def _beat(self) -> None:
        if self._closed:
            return  # a beat after close() would bring the deleted heartbeat back
        try:
            raw, seconds, micros, since = await self._beat_script(
                keys=[self._key("replica", self.replica_id), self._key("beats"), self._key("epoch")],
                args=[int(self._owner_timeout * 1000), self._gap_ms, _BEATS_KEPT_MS],
            )
            epoch = raw.decode() or None
            seconds, micros = int(seconds), int(micros)
            self._serving_since = int(since)
            if epoch is None or epoch != self._epoch:
                await self._adopt_epoch(epoch)
        except (RedisError, OSError) as exc:
            if self.available:
                log.warning("shared_state_down", reason=reason(exc))
            self.available = False
            return
        # Before `available` turns true, so readiness never shows the restore window as ready.
        self._note_restore(seconds * 1000 + micros // 1000)
        self._clock_offset = seconds * 1000 + micros / 1000 - time.monotonic() * 1000
        if not self.available:
            log.info("shared_state_up", replica=self.replica_id)
        self.available = True
        self._beat_ok.set()

    def _note_restore(self, redis_now_ms: int) -> None:
        # The window the claim script applies (reset_ms + owner_timeout, on Redis's clock), moved
        # to this process's clock. Measured after the reply, so it ends no earlier than Redis's.
        reset_ms = int(self._epoch.rpartition("|")[2]) if self._epoch else 0
        left = (reset_ms + self._owner_timeout * 1000 - redis_now_ms) / 1000 if reset_ms else 0.0
        self._restored_at = time.monotonic() + max(left, 0.0)

    async def _adopt_epoch(self, seen: str | None) -> None:
        lost = self._epoch is not None
        if seen is None:
            token = secrets.token_hex(8)
            raw = await self._new_epoch(keys=[self._key("epoch")], args=["1" if lost else "0", token])
            seen = raw.decode()
        if lost:
            # Redis lost what we had written: write our chats back before serving again.
            chats = self._reassert()
            log.warning("shared_state_reset", chats_restored=len(chats))
            await self._directory.restore(chats)
        self._epoch = seen

    def _redis_ms(self) -> int | None:
        """Now on Redis's clock, as of the last heartbeat (None before the first)."""
        return None if self._clock_offset is None else int(time.monotonic() * 1000 + self._clock_offset)

    def _reset_seen(self) -> None:
        # A claim found the epoch changed before this replica's heartbeat did (which runs now, and
        # measures the window): restoring from here on, so readiness does not wait for it.
        self._restored_at = max(self._restored_at, time.monotonic() + self._owner_timeout)
        self._beat_now.set()

    def _missing_beat_may_be_live(self) -> bool:
        """Whether the beats resumed after an outage less than `owner_timeout` ago (as of this
        replica's last beat): a heartbeat missing now may be a live replica's that has not beaten yet."""
        now = self._redis_ms()
        return bool(self._serving_since) and now is not None and now - self._serving_since < self._owner_timeout * 1000

    # ---- calls into Redis ------------------------------------------------------------------

    async def claim(
        self, user_id: str, chat_id: str, *, agent: str, default_agent: str, ttl: float, create: bool = True
    ) -> Claim:
        claiming = self._directory.claim(user_id, chat_id, agent=agent, default_agent=default_agent, ttl=ttl, create=create)
        return await self._op(claiming)  # type: ignore[no-any-return]

    async def owner(self, user_id: str, chat_id: str) -> str | None:
        return await self._op(self._directory.owner(user_id, chat_id))  # type: ignore[no-any-return]

    async def mark_run(self, user_id: str, chat_id: str, message_id: str) -> None:
        await self._op(self._directory.mark_run(user_id, chat_id, message_id))

    async def release(self, user_id: str, chat_id: str) -> None:
        await self._op(self._directory.release(user_id, chat_id))

    async def alive(self, replica_id: str) -> bool:
        if replica_id == self.replica_id:
            return True  # also while Redis is down
        return await self._op(self._directory.alive(replica_id))  # type: ignore[no-any-return]

    async def send(self, replica_id: str, message: dict[str, Any]) -> None:
        await self._op(self._inbox_link.send(replica_id, message))

    async def relay_append(self, key: str, entry: RelayEntry) -> None:
        await self._op(self._records.relay_append(key, entry))

    async def relay_read(self, key: str, after: str, *, timeout: float) -> tuple[str, list[RelayEntry]]:
        return await self._op(self._records.relay_read(key, after, timeout=timeout))  # type: ignore[no-any-return]

    async def put_call(self, call_id: str, record: dict[str, str], *, ttl: float) -> None:
        await self._op(self._records.put_call(call_id, record, ttl=ttl))

    async def get_call(self, call_id: str) -> dict[str, str] | None:
        return await self._op(self._records.get_call(call_id))  # type: ignore[no-any-return]

    async def put_ticket(self, key: str, record: dict[str, str], *, ttl: float) -> None:
        await self._op(self._records.put_ticket(key, record, ttl=ttl))

    async def take_ticket(self, key: str) -> dict[str, str] | None:
        return await self._op(self._records.take_ticket(key))  # type: ignore[no-any-return]

    async def put_chat_state(self, user_id: str, chat_id: str, state: dict[str, Any], *, ttl: float) -> None:
        await self._op(self._records.put_chat_state(user_id, chat_id, state, ttl=ttl))

    async def get_chat_state(self, user_id: str, chat_id: str) -> dict[str, Any] | None:
        return await self._op(self._records.get_chat_state(user_id, chat_id))  # type: ignore[no-any-return]

    async def add_deadline(self, deadline: Deadline) -> None:
        await self._op(self._deadlines.add(deadline))

    async def drop_deadline(self, key: str) -> None:
        await self._op(self._deadlines.drop(key))

    async def claim_deadlines(self, now: float, *, limit: int = 100, lease: float = DEADLINE_LEASE) -> list[Deadline]:
        return await self._op(self._deadlines.claim(now, limit, now + lease))  # type: ignore[no-any-return]

    async def settle_deadline(self, claimed: Deadline, again: float | None) -> bool:
        return await self._op(self._deadlines.settle(claimed, again))  # type: ignore[no-any-return]

    async def next_deadline(self) -> float | None:
        return await self._op(self._deadlines.next_due())  # type: ignore[no-any-return]

    async def audit_append(self, entry: AuditEntry, *, keep: int, max_age: float) -> bool:
        return await self._op(self._audit.append(entry, keep=keep, max_age=max_age))  # type: ignore[no-any-return]

    async def audit_read(self, query: AuditQuery, *, max_age: float) -> list[dict[str, Any]]:
        return await self._op(self._audit.read(query, max_age=max_age))  # type: ignore[no-any-return]

    async def put_approval(self, record: dict[str, Any], *, ttl: float, cap: int | None = None) -> bool:
        return await self._op(self._approvals.put(record, ttl=ttl, cap=cap))  # type: ignore[no-any-return]

    async def pending_approvals(self, requester: str) -> int:
        return await self._op(self._approvals.pending_of(requester))  # type: ignore[no-any-return]

    async def get_approval(self, approval_id: str) -> dict[str, Any] | None:
        return await self._op(self._approvals.get(approval_id))  # type: ignore[no-any-return]

    async def drop_approval(self, approval_id: str) -> None:
        await self._op(self._approvals.drop(approval_id))

    async def page_approvals(self, query: ApprovalQuery) -> ApprovalPage:
        return await self._op(self._approvals.page(query))  # type: ignore[no-any-return]

    async def vote_approval(self, approval_id: str, user: str, approved: bool, quorum: int) -> Tally:
        return await self._op(self._approvals.vote(approval_id, user, approved, quorum))  # type: ignore[no-any-return]

    async def take_token(self, user_id: str, *, rate: float, burst: int, now: float | None = None) -> float | None:
        return await self._limit_op(self._limits.take_token(user_id, rate, burst, now))  # type: ignore[no-any-return]

    async def open_slot(
        self, user_id: str, slot_id: str, *, cap: int, lease: float, now: float | None = None,
    ) -> bool:
        return await self._limit_op(self._limits.open_slot(user_id, slot_id, cap, lease, now))  # type: ignore[no-any-return]

    async def take_token_and_slot(
        self, user_id: str, slot_id: str, *, rate: float, burst: int, cap: int, lease: float, now: float | None = None,
    ) -> tuple[float | None, bool]:
        return await self._limit_op(self._limits.take_token_and_slot(user_id, slot_id, rate, burst, cap, lease, now))  # type: ignore[no-any-return]

    async def _limit_op(self, op: Any) -> Any:
        # Past the timeout, a slot the script may still have taken is not renewed: its lease frees it.
        return await self._op.within(op, _LIMIT_TIMEOUT)

    async def close_slot(self, user_id: str, slot_id: str) -> None:
        await self._op(self._limits.close_slot(user_id, slot_id))

    async def renew_slots(self, slots: Mapping[str, Sequence[str]], *, lease: float, now: float | None = None) -> int:
        return await self._op(self._limits.renew(slots, lease, now))  # type: ignore[no-any-return]

    def _went_down(self, exc: BaseException) -> None:
        if self.available:
            log.warning("shared_state_down", reason=reason(exc))
        self.available = False
        self._beat_now.set()
