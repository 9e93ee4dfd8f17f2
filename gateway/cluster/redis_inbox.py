"""A replica's inbox in Redis (`sessions.backend: redis`): the pub/sub channel `{p}:inbox:{replica}`.

Outgoing messages are stamped on Redis's clock and sealed (sealing.py) for the channel they are
published to; incoming ones are opened before use, and dropped (logged without their content)
when they do not open, are stamped more than 30 s from now, or were received already: a replay.
The subscription reconnects with a `Backoff` (backoff.py) and tries again at once when a
heartbeat reaches Redis (the owner, RedisState, keeps the heartbeat and Redis's clock). Raises
what redis-py raises; RedisState turns it into SharedStateDown.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import orjson
import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

from ..ops.backoff import Backoff
from .sealing import Seal, Tampered, fingerprint
from .shared import Inbox

__all__ = ["RedisInbox"]

log = structlog.get_logger("adk_gateway.cluster.redis_inbox")

# The inbox's read wakes this often to notice close() and a broken subscription.
_INBOX_POLL = 1.0
# How far from now (on Redis's clock) an inbox message's stamp may be. Pub/sub delivers in
# milliseconds: an older message is a replay, and the ones inside the window are told apart by
# their seals, remembered that long.
_INBOX_WINDOW = 30.0
# A message Redis delivered to no subscriber is published again this often, for this long: after a
# Redis restart a replica is available again a moment before its inbox has subscribed again (it
# does so as soon as a heartbeat gets through). A replica that is gone costs its sender this bound.
_UNHEARD_EVERY = 0.05
_UNHEARD_FOR = 1.0


class RedisInbox:
    """Sends to any replica's inbox (through `client`) and listens on this one's (one subscription
    per replica, on `control`, the pool no burst of commands can take). `redis_ms`: now on Redis's clock,
    as of the last heartbeat (None before the first); `closed`: whether the owner closed;
    `beat_now`, `beat_ok`: the owner's heartbeat, asked for now / set by each one that got through."""

    def __init__(
        self,
        client: aioredis.Redis,
        control: aioredis.Redis,
        prefix: str,
        seal: Seal,
        replica_id: str,
        *,
        redis_ms: Callable[[], int | None],
        closed: Callable[[], bool],
        beat_now: asyncio.Event,
        beat_ok: asyncio.Event,
    ) -> None:
        self._redis = client
        self._control = control
        self._prefix = prefix
        self._seal = seal
        self._replica_id = replica_id
        self._redis_ms = redis_ms
        self._closed = closed
        self._beat_now = beat_now
        self._beat_ok = beat_ok
        self._received = _Received(_INBOX_WINDOW)
        # Set while this replica's channel is subscribed: a message published before is lost.
        self.listening = asyncio.Event()

    def _channel(self, replica_id: str) -> str:
        return f"{self._prefix}:inbox:{replica_id}"

    async def send(self, replica_id: str, message: dict[str, Any]) -> None:
        channel = self._channel(replica_id)
        # Stamped inside the seal, so a message published again later is told from the original.
        payload = b"%d\n%s" % (self._redis_ms() or 0, orjson.dumps(message))
        sealed = self._seal.seal(payload, channel)
        # Nobody heard it, so publishing it again delivers it once; the stamp stays the first one.
        for _ in range(int(_UNHEARD_FOR / _UNHEARD_EVERY)):
            if await self._redis.publish(channel, sealed):
                return
            await asyncio.sleep(_UNHEARD_EVERY)

    async def listen(self, deliver: Inbox, interval: float) -> None:
        """Deliver this replica's messages until the owner closes, through any outage."""
        channel = self._channel(self._replica_id)
        # Retries back off (Redis may be down for minutes) but start again at once when a
        # heartbeat gets through; only the changes are logged, not every attempt.
        backoff = Backoff(interval / 2, 5 * interval)
        while not self._closed():
            pubsub = self._control.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(channel)
                self.listening.set()
                failed = backoff.succeeded()
                if failed:
                    log.info("inbox_reconnected", failed_attempts=failed)
                while not self._closed():
                    message = await pubsub.get_message(timeout=_INBOX_POLL)
                    if message is not None and message.get("type") == "message":
                        self._receive(channel, message["data"], deliver)
            except (RedisError, OSError) as exc:
                self.listening.clear()
                if not backoff.failing:
                    log.info("inbox_reconnecting", reason=type(exc).__name__)
                delay = backoff.failed()
                self._beat_ok.clear()
                self._beat_now.set()  # is Redis there? The heartbeat finds out now
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._beat_ok.wait()
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.aclose()

    def _receive(self, channel: str, data: bytes, deliver: Inbox) -> None:
        try:
            stamp, _, body = self._seal.open(data, channel).partition(b"\n")
            sent = int(stamp)
        except (Tampered, ValueError):
            log.warning("inbox_message_tampered", replica=self._replica_id)
            return
        now = self._redis_ms()
        if now is None:
            # Before this replica's first heartbeat: it cannot tell a replay yet.
            log.warning("inbox_message_replayed", replica=self._replica_id, reason="no clock yet")
            return
        if abs(now - sent) > _INBOX_WINDOW * 1000:
            log.warning("inbox_message_replayed", replica=self._replica_id, reason="stale", age_s=round((now - sent) / 1000))
            return
        if not self._received.first(fingerprint(data)):
            log.warning("inbox_message_replayed", replica=self._replica_id, reason="received already")
            return
        try:
            message = orjson.loads(body)
        except orjson.JSONDecodeError:
            log.warning("inbox_message_malformed")
            return
        deliver(message)


class _Received:
    """The inbox messages (their seals' fingerprints) received in the last `window` seconds: one that
    comes again in that time is a replay. Forgotten in arrival order, so the check is O(1)."""

    def __init__(self, window: float) -> None:
        self._window = window
        self._seen: dict[bytes, float] = {}

    def first(self, fingerprint: bytes) -> bool:
        now = time.monotonic()
        while self._seen:
            oldest, at = next(iter(self._seen.items()))
            if at > now - self._window:
                break
            del self._seen[oldest]
        if fingerprint in self._seen:
            return False
        self._seen[fingerprint] = now
        return True
