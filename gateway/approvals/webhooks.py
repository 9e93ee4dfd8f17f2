"""Delivering approval notices to webhooks: signed POSTs, retried with backoff, never in the chat's way.

`Webhooks.notify(notice)` is what the chat layer calls when an approval starts waiting, is decided
or expires (approvals/notice.py). It only enqueues: one delivery per webhook that wants the
notice (`notifications.webhooks[].events/agents/tools/rules`), each an asyncio task that POSTs the
body, signed as the Standard Webhooks spec says (standardwebhooks.com: `webhook-id`,
`webhook-timestamp`, `webhook-signature: v1,<base64 HMAC-SHA256>`), and retries 5xx, 429 and calls
that got no answer after a growing, jittered delay, up to `max_attempts`. Other answers are final:
a 4xx will not change by asking again, and a 3xx is not followed (the signed body goes where the
operator configured, nowhere else).

Each webhook has its own bound on pending deliveries (`queue`) and on calls in flight
(`concurrency`), so a receiver that hangs or is down delays and drops only its own notices. A
delivery waiting for its next attempt holds no slot. Order is best effort: notices of one approval
are sent in the order they were made, but a retried `waiting` can arrive after its `decided`
(receivers order by the body's `timestamp`, and dedupe by `webhook-id`, which every retry repeats).

The config is read through a callable at each notice, so a reload applies to the notices after it;
a delivery keeps the webhook settings it was made with. Nothing here may fail a decision: `notify`
never raises or blocks, and a stop waits at most its timeout, counting what it leaves as dropped.
Log lines name the webhook, never its URL (it may carry a token), its secret or the arguments.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import random
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson
import structlog

# Retry-After's reading is shared with the Slack channel (approvals/slack.py).
from ..ops.backoff import Backoff, retry_after as _retry_after
from ..config.notifications import NotificationsConfig, WebhookConfig, secret_bytes
from .notice import ApprovalNotice
from ..ops.metrics import GatewayMetrics
from ..ops.stopping import drain, pause

__all__ = ["Webhooks", "notice_body", "sign"]

log = structlog.get_logger("adk_gateway.approvals.webhooks")

_USER_AGENT = "adk-gateway-webhooks"


def sign(key: bytes, webhook_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header's value: `v1,` and the base64 HMAC-SHA256 of `{id}.{timestamp}.{body}`."""
    mac = hmac.new(key, f"{webhook_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode("ascii")


def notice_body(notice: ApprovalNotice, *, include_args: bool, public_url: str) -> bytes:
    """The JSON a webhook receives: the event's type, when it happened, the notice and the approval's link."""
    data: dict[str, Any] = notice.as_json(with_args=include_args)
    data["links"] = {"approval": f"{public_url}/api/approvals/{quote(notice.approval_id, safe='')}"}
    when = datetime.fromtimestamp(notice.at, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return orjson.dumps({"type": f"approval.{notice.kind}", "timestamp": when, "data": data})


@dataclass(frozen=True, slots=True)
class _Delivery:
    """One notice to one webhook, with the settings in force when it was made."""

    hook: WebhookConfig
    key: bytes
    webhook_id: str
    event: str
    approval_id: str
    body: bytes
    at: float
    max_attempts: int
    backoff: float
    backoff_max: float


@dataclass(eq=False)
class _Lane:
    """One webhook's share: its calls in flight (`slots`) and its pending deliveries."""

    slots: asyncio.Semaphore
    concurrency: int
    pending: int = 0
    tasks: set[asyncio.Task[None]] = field(default_factory=set)


class Webhooks:
    """The approval webhooks of one replica: `notify` from the chat layer, `start` and a bounded
    `stop` with the app. `config` is read at each notice (a reload applies to the notices after it)."""

    def __init__(
        self, config: Callable[[], NotificationsConfig], metrics: GatewayMetrics, *,
        wall: Callable[[], float] = time.time, jitter: Callable[[], float] = random.random,
    ) -> None:
        self._config = config
        self._metrics = metrics
        self._wall = wall
        # 0..1: where in [half the delay, the delay] a retry waits, so receivers that come back
        # are not hit by every replica's retries at the same instant.
        self._jitter = jitter
        self._lanes: dict[str, _Lane] = {}
        self._session: aiohttp.ClientSession | None = None
        # Set by stop: deliveries between attempts make their last attempt now, new notices are dropped.
        self._stopping = asyncio.Event()

    def start(self) -> None:
        """Open the HTTP client (in the running loop); notices before this are dropped."""
        if self._session is None:
            # Its own pool, apart from the upstream clients; no proxy from the environment, no
            # cookies kept between receivers; each call gets its webhook's timeout.
            self._session = aiohttp.ClientSession(
                cookie_jar=aiohttp.DummyCookieJar(), headers={"User-Agent": _USER_AGENT},
            )

    @property
    def pending(self) -> int:
        return sum(lane.pending for lane in self._lanes.values())

    def notify(self, notice: ApprovalNotice) -> None:
        """Enqueue `notice` for each webhook that wants it. Never blocks, never raises."""
        try:
            self._enqueue(notice)
        except Exception as exc:  # a notice that cannot be sent must not fail the decision it tells of
            log.error("webhook_notify_failed", approval_id=notice.approval_id, kind=notice.kind, error=repr(exc))

    def _enqueue(self, notice: ApprovalNotice) -> None:
        config = self._config()
        hooks = [h for h in config.webhooks if h.wants(notice.kind, notice.agent, notice.tool, notice.rule)]
        if not hooks:
            return
        # One id per notice, the same for every webhook and every retry: receivers dedupe by it.
        webhook_id = "msg_" + secrets.token_hex(16)
        bodies: dict[bool, bytes] = {}
        for hook in hooks:
            body = bodies.get(hook.include_args)
            if body is None:
                body = bodies[hook.include_args] = notice_body(
                    notice, include_args=hook.include_args, public_url=config.public_url
                )
            delivery = _Delivery(
                hook=hook, key=secret_bytes(hook.secret.get_secret_value()), webhook_id=webhook_id,
                event=notice.kind, approval_id=notice.approval_id, body=body, at=notice.at,
                max_attempts=config.max_attempts, backoff=config.backoff, backoff_max=config.backoff_max,
            )
            self._start(delivery, config.queue)

    def _lane(self, hook: WebhookConfig) -> _Lane:
        lane = self._lanes.get(hook.name)
        if lane is None:
            lane = self._lanes[hook.name] = _Lane(asyncio.Semaphore(hook.concurrency), hook.concurrency)
        elif lane.concurrency != hook.concurrency:
            # A reload changed it: every delivery takes the new bound from its next attempt on
            # (calls in flight finish under the old one).
            lane.slots, lane.concurrency = asyncio.Semaphore(hook.concurrency), hook.concurrency
        return lane

    def _start(self, delivery: _Delivery, queue: int) -> None:
        lane = self._lane(delivery.hook)
        why = "stopped" if self._stopping.is_set() else "not_started" if self._session is None else (
            "queue_full" if lane.pending >= queue else None
        )
        if why is not None:
            self._dropped(delivery, why)
            return
        task = asyncio.get_running_loop().create_task(
            self._deliver(delivery, lane), name=f"webhook-{delivery.hook.name}-{delivery.webhook_id}"
        )
        lane.pending += 1
        self._metrics.webhooks.queue(delivery.hook.name, lane.pending)
        lane.tasks.add(task)
        task.add_done_callback(lane.tasks.discard)

    async def _deliver(self, delivery: _Delivery, lane: _Lane) -> None:
        backoff = Backoff(delivery.backoff, delivery.backoff_max)
        attempt = 0
        try:
            while True:
                attempt += 1
                # An attempt begun after a stop is the last one; one begun before gets another, now.
                last = self._stopping.is_set()
                async with lane.slots:
                    outcome, status, retry_after = await self._attempt(delivery)
                self._metrics.webhooks.attempt(delivery.hook.name, outcome)
                if outcome == "2xx":
                    self._delivered(delivery, attempt, status)
                    return
                if outcome not in ("429", "5xx", "timeout", "error"):
                    self._failed(delivery, attempt, status, outcome, "refused")
                    return
                if attempt >= delivery.max_attempts:
                    self._failed(delivery, attempt, status, outcome, "attempts_exhausted")
                    return
                if last:
                    self._dropped(delivery, "stopped", attempts=attempt)
                    return
                delay = backoff.failed()
                delay = delay / 2 + delay / 2 * self._jitter()
                if retry_after is not None:
                    delay = min(max(retry_after, delay), delivery.backoff_max)
                await pause(delay, self._stopping)
        except asyncio.CancelledError:
            self._dropped(delivery, "stopped", attempts=attempt)
            raise
        except Exception as exc:  # a bug here costs this delivery alone, counted and logged
            log.error("webhook_delivery_error", webhook=delivery.hook.name, approval_id=delivery.approval_id, error=repr(exc))
            self._metrics.webhooks.delivery(delivery.hook.name, delivery.event, "failed")
        finally:
            lane.pending -= 1
            self._metrics.webhooks.queue(delivery.hook.name, lane.pending)

    async def _attempt(self, delivery: _Delivery) -> tuple[str, int | None, float | None]:
        """One POST: (outcome, status, Retry-After in seconds)."""
        assert self._session is not None  # deliveries start only once it is open
        timestamp = int(self._wall())
        headers = {
            "Content-Type": "application/json",
            "webhook-id": delivery.webhook_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": sign(delivery.key, delivery.webhook_id, timestamp, delivery.body),
        }
        try:
            async with self._session.post(
                delivery.hook.url, data=delivery.body, headers=headers, allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=delivery.hook.timeout),
            ) as response:
                status = response.status
                retry_after = _retry_after(response.headers.get("Retry-After"), self._wall())
        except TimeoutError:
            return "timeout", None, None
        except (aiohttp.ClientError, OSError, ValueError):
            return "error", None, None
        if status == 429:
            return "429", status, retry_after
        return f"{min(max(status // 100, 2), 5)}xx", status, retry_after if status >= 500 else None

    def _delivered(self, delivery: _Delivery, attempts: int, status: int | None) -> None:
        seconds = max(self._wall() - delivery.at, 0.0)
        self._metrics.webhooks.delivery(delivery.hook.name, delivery.event, "delivered", seconds)
        log.info(
            "webhook_delivered", webhook=delivery.hook.name, kind=delivery.event, approval_id=delivery.approval_id,
            webhook_id=delivery.webhook_id, attempts=attempts, status=status, seconds=round(seconds, 3),
        )

    def _failed(self, delivery: _Delivery, attempts: int, status: int | None, outcome: str, why: str) -> None:
        self._metrics.webhooks.delivery(delivery.hook.name, delivery.event, "failed")
        log.warning(
            "webhook_failed", webhook=delivery.hook.name, kind=delivery.event, approval_id=delivery.approval_id,
            webhook_id=delivery.webhook_id, attempts=attempts, status=status, outcome=outcome, reason=why,
        )

    def _dropped(self, delivery: _Delivery, why: str, *, attempts: int = 0) -> None:
        self._metrics.webhooks.delivery(delivery.hook.name, delivery.event, "dropped")
        log.warning(
            "webhook_dropped", webhook=delivery.hook.name, kind=delivery.event, approval_id=delivery.approval_id,
            webhook_id=delivery.webhook_id, attempts=attempts, reason=why,
        )

    async def stop(self, timeout: float) -> None:
        """Stop taking notices, give pending deliveries up to `timeout` (those between attempts make
        their last one now), then cancel what is left (counted and logged as dropped) and close the client."""
        self._stopping.set()
        await drain({task for lane in self._lanes.values() for task in lane.tasks}, timeout, what="webhook deliveries")
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

