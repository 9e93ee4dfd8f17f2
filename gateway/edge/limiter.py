"""The per-user limits as the edge applies them: on this replica alone, or shared by every replica.

With the memory backend (one replica) `Limiter` is `Admission` (core/limits.py) and nothing more.
With a store that shares limits (`sessions.backend: redis`), each user's token bucket and concurrent
stream cap are counted in Redis by all replicas together (one script per decision:
cluster/redis_limits.py), so N replicas behind a balancer admit a user's configured rate, not N
times it. The total stream cap (`limits.max_streams_total`) stays this replica's own: it protects
this process. A shared stream slot is leased, and the lease renewed every heartbeat while the
stream lasts; a replica that dies or loses a release frees it within `sessions.owner_timeout`.

When Redis cannot be reached (the backend raises SharedStateDown: at once while it knows Redis is
down, else after 2 s at most: cluster/redis.py), `limits.shared_fallback` decides: `local` applies the same
limits on this replica alone (each replica's own, so up to N times the rate across N replicas),
`refuse` answers 503 `limits_unavailable` with Retry-After. Either is counted
(`adk_gateway_shared_limit_checks_total`) and logged once per transition, never unlimited.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from dataclasses import dataclass, field
from typing import Final

import structlog

from ..cluster.shared import SharedState, SharedStateDown
from ..config.schema import LimitsConfig, SessionsConfig
from ..core.limits import Admission, Limited, StreamSlot, too_many_streams
from ..ops.metrics import GatewayMetrics
from ..ops.stopping import cancel_and_wait, within

__all__ = ["Limiter", "Slot"]

log = structlog.get_logger("adk_gateway.edge.limiter")

# How long the close waits for the slots' last releases to reach Redis: a release lost then is
# freed by its lease anyway.
_RELEASE_FLUSH: Final = 1.0


@dataclass(eq=False, slots=True)
class Slot:
    """A held stream: this replica's slot, and its shared one if the store counts it. `release()`
    gives both back (idempotent); the shared one in the background, the caller does not wait."""

    local: StreamSlot
    limiter: Limiter | None = None
    shared_id: str | None = None
    released: bool = field(default=False)

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        self.local.release()
        if self.limiter is not None and self.shared_id is not None:
            self.limiter._close_shared(self.local.user_id, self.shared_id)


class Limiter:
    """This replica's Admission, and the store's shared counts when it keeps them."""

    def __init__(self, admission: Admission, shared: SharedState, metrics: GatewayMetrics, sessions: SessionsConfig) -> None:
        self.local = admission
        self._shared = shared if shared.shares_limits else None
        self._metrics = metrics
        # A stream's lease lasts as long as a silent replica is deemed alive, and is renewed at
        # its heartbeat: a live replica renews it two or more times before it could end.
        self._lease = sessions.owner_timeout
        self._renew_every = sessions.heartbeat_interval
        self._ids = itertools.count()
        # Shared slots this replica holds: slot id -> user, renewed until released.
        self._held: dict[str, str] = {}
        self._releases: set[asyncio.Task[None]] = set()
        self._renewer: asyncio.Task[None] | None = None
        # Whether the last shared check fell back (logged once per change).
        self._degraded = False

    # What the rest of the edge reads as it read it of Admission (a reload replaces `config`).
    @property
    def config(self) -> LimitsConfig:
        return self.local.config

    @config.setter
    def config(self, value: LimitsConfig) -> None:
        self.local.config = value

    @property
    def streams_total(self) -> int:
        return self.local.streams_total

    def forget_idle_buckets(self, now: float) -> None:
        self.local.forget_idle_buckets(now)

    # ---- the checks ------------------------------------------------------------------------

    async def check_rate(self, user_id: str, now: float) -> None:
        """Spend one of the user's tokens; raises Limited (429, or 503 when refusing without Redis)."""
        if self._shared is None:
            self.local.check_rate(user_id, now)
            return
        config = self.config
        try:
            wait = await self._shared.take_token(user_id, rate=config.rate_per_user, burst=config.burst_per_user)
        except SharedStateDown:
            self._fall_back("rate")
            self.local.check_rate(user_id, now)
            return
        self._shared_ok("rate", wait is None)
        if wait is not None:
            raise Limited(429, "rate_limited", "too many requests", wait)

    async def open_stream(self, user_id: str) -> Slot:
        """A stream slot under this replica's total cap and the user's cap; raises Limited."""
        if self._shared is None:
            return Slot(self.local.open_stream(user_id))
        # This replica's slot first (the total cap, 503), so concurrent openings cannot overshoot it
        # while the shared one is asked for.
        local = self.local.open_stream(user_id, per_user=False)
        slot_id = f"{self._shared.replica_id}:{next(self._ids)}"
        try:
            taken = await self._shared.open_slot(user_id, slot_id, cap=self.config.max_streams_per_user, lease=self._lease)
        except SharedStateDown:
            local.release()
            self._fall_back("stream")
            return Slot(self.local.open_stream(user_id))
        except BaseException:
            local.release()
            raise
        self._shared_ok("stream", taken)
        if not taken:
            local.release()
            raise too_many_streams(self.config)
        self._held[slot_id] = user_id
        return Slot(local, self, slot_id)

    async def admit_stream(self, user_id: str, now: float) -> Slot:
        """check_rate, then open_stream, as one: with a shared store, one round trip for both (a
        request refused for its rate takes no slot; one refused for the cap has spent its token, as
        check_rate then open_stream would). Raises Limited."""
        if self._shared is None:
            self.local.check_rate(user_id, now)
            return Slot(self.local.open_stream(user_id))
        local = self.local.open_stream(user_id, per_user=False)
        slot_id = f"{self._shared.replica_id}:{next(self._ids)}"
        config = self.config
        try:
            wait, taken = await self._shared.take_token_and_slot(
                user_id, slot_id, rate=config.rate_per_user, burst=config.burst_per_user,
                cap=config.max_streams_per_user, lease=self._lease,
            )
        except SharedStateDown:
            local.release()
            self._fall_back("rate")
            self.local.check_rate(user_id, now)
            self._fall_back("stream")
            return Slot(self.local.open_stream(user_id))
        except BaseException:
            local.release()
            raise
        self._shared_ok("rate", wait is None)
        if wait is not None:
            local.release()
            raise Limited(429, "rate_limited", "too many requests", wait)
        self._shared_ok("stream", taken)
        if not taken:
            local.release()
            raise too_many_streams(config)
        self._held[slot_id] = user_id
        return Slot(local, self, slot_id)

    def _fall_back(self, check: str) -> None:
        mode = self.config.shared_fallback
        if not self._degraded:
            self._degraded = True
            log.warning("shared_limits_unavailable", fallback=mode)
        self._metrics.shared_limits.labels(check, "local" if mode == "local" else "refused").inc()
        if mode == "refuse":
            raise Limited(503, "limits_unavailable", "the per-user limits cannot be checked right now; try again shortly", 1)

    def _shared_ok(self, check: str, admitted: bool) -> None:
        if self._degraded:
            self._degraded = False
            log.info("shared_limits_restored")
        self._metrics.shared_limits.labels(check, "admitted" if admitted else "limited").inc()

    # ---- shared slots' lifetime ------------------------------------------------------------

    def _close_shared(self, user_id: str, slot_id: str) -> None:
        # Out of the renewals first: a renewal that crosses the release does not take it again.
        self._held.pop(slot_id, None)
        task = asyncio.get_running_loop().create_task(self._close_slot(user_id, slot_id), name="close-stream-slot")
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def _close_slot(self, user_id: str, slot_id: str) -> None:
        assert self._shared is not None
        with contextlib.suppress(SharedStateDown):
            # Lost when Redis is down: the lease, no longer renewed, frees it.
            await self._shared.close_slot(user_id, slot_id)

    def start(self) -> None:
        if self._shared is not None:
            self._renewer = asyncio.get_running_loop().create_task(self._renew(), name="stream-slot-leases")

    async def _renew(self) -> None:
        assert self._shared is not None
        while True:
            await asyncio.sleep(self._renew_every)
            if not self._held:
                continue
            by_user: dict[str, list[str]] = {}
            for slot_id, user_id in self._held.items():
                by_user.setdefault(user_id, []).append(slot_id)
            with contextlib.suppress(SharedStateDown):
                await self._shared.renew_slots(by_user, lease=self._lease)

    async def close(self) -> None:
        """Stop renewing, and give the last releases a moment to reach Redis. Before the store closes."""
        if self._renewer is not None:
            await cancel_and_wait([self._renewer], 1.0, what="stream slot renewals")
        if self._releases:
            await within(asyncio.gather(*self._releases, return_exceptions=True), _RELEASE_FLUSH, what="stream slot releases")
