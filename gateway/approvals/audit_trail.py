"""The audit trail of approvals: one record per decided approval, as a JSON log line and in the shared store.

The chat layer hands every approval notice to `AuditTrail.record` (approvals/notice.py); a
notice of kind `decided` or `expired` becomes a record: the notice's fields, the digest of the
call's arguments always and the arguments themselves only with `audit.include_args`. The record is
written at once as one log line (logger `adk_gateway.cluster.audit_trail`, event `approval_audit`): the
long-term copy, kept as long as the logs are. Then it is appended to the shared store (memory or
Redis, through the room's port, store.py), which keeps the newest `audit.keep` records for at most
`audit.max_age` and which any replica reads (`AuditTrail.read`, for the approvals API), so an
auditor needs neither log access nor Redis.

The log line names people as `logging.user_id` says of every line: with `hash`, `requester_hash`
and each approver's `user_hash` (the keyed digest of logs.py) instead of their ids; with `omit`,
neither. The store keeps the ids as they are: reading it takes the approvals API's credentials.

Recording never blocks nor fails the chat: the append runs in the background, one record at a time
in the order they were made; a store that is down is tried again with backoff for `retry_for`
seconds from the record's making, after which the record is counted `failed` (it is in the log);
past `pending_max` records waiting, a new one is counted `dropped`. The store appends a record once
per approval id (a retry whose first try did reach Redis is counted `duplicate`, not appended twice).
Counted in `adk_gateway_audit_records_total{result}`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import structlog

from ..ops.backoff import Backoff
from ..config.audit import AuditConfig
from ..config.sections import LoggingConfig
from .notice import ApprovalNotice
from ..core.refusals import Refusal
from ..ops.logs import user_id_digest
from ..ops.metrics import GatewayMetrics
from ..ops.stopping import cancel_and_wait
from .store import ApprovalStore, AuditEntry, AuditQuery, StoreDown, audit_position

__all__ = ["MAX_PAGE", "AuditTrail", "InvalidAuditQuery"]

log = structlog.get_logger("adk_gateway.cluster.audit_trail")

# The notices that end an approval: each makes one record.
_RECORDED = frozenset({"decided", "expired"})
# The most records one read returns.
MAX_PAGE = 1000
# A store that is down is tried again after 0.5 s, then twice as long each time, up to 5 s.
_BACKOFF_FIRST = 0.5
_BACKOFF_CAP = 5.0


class InvalidAuditQuery(Refusal):
    """A read of the audit trail that asks for something it cannot answer (a bad cursor or limit)."""

    status = 400
    code = "invalid_request"


class AuditTrail:
    """Records decided approvals (`record`) and reads them back (`read`). `config` gives the
    running `audit:` section (read at each use: a reload changes it); `timeout` bounds each call
    into the store."""

    def __init__(
        self,
        store: ApprovalStore,
        metrics: GatewayMetrics,
        config: Callable[[], AuditConfig],
        *,
        logging: LoggingConfig | None = None,
        timeout: float = 5.0,
        retry_for: float = 60.0,
        pending_max: int = 10_000,
    ) -> None:
        self._store = store
        self._logging = logging or LoggingConfig()
        records = metrics.audit_records
        self._counted = {
            "stored": records.labels("stored"), "duplicate": records.labels("duplicate"),
            "failed": records.labels("failed"), "dropped": records.labels("dropped"),
        }
        self._config = config
        self._timeout = timeout
        self._retry_for = retry_for
        self._pending_max = pending_max
        # Records not yet in the store, oldest first, each with when (time.monotonic) to give up.
        self._pending: deque[tuple[AuditEntry, float]] = deque()
        self._wake = asyncio.Event()
        self._stop_now = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._stopped = False

    # ---- recording -------------------------------------------------------------------------

    def record(self, notice: ApprovalNotice) -> None:
        """Record a notice that ends an approval (others are ignored): the log line now, the store
        later. Never blocks, never raises."""
        try:
            self._record(notice)
        except Exception as exc:  # noqa: BLE001 - the audit must not break the decision it records
            with contextlib.suppress(Exception):  # not even when the log itself fails
                log.error("approval_audit_failed", approval_id=notice.approval_id, error=type(exc).__name__)

    def _record(self, notice: ApprovalNotice) -> None:
        if notice.kind not in _RECORDED:
            return
        record = notice.as_json(with_args=self._config().include_args)
        try:
            log.info("approval_audit", **self._as_logged(record))
        except Exception as exc:  # noqa: BLE001 - a log that fails must not keep the record from the store
            with contextlib.suppress(Exception):
                log.error("approval_audit_failed", approval_id=notice.approval_id, error=type(exc).__name__)
        entry = AuditEntry(notice.approval_id, notice.at, record)
        if self._stopped:
            self._count("failed")
            log.warning("audit_record_not_stored", approval_id=notice.approval_id, reason="stopped")
            return
        if len(self._pending) >= self._pending_max:
            self._count("dropped")
            log.warning("audit_record_not_stored", approval_id=notice.approval_id, reason="too_many_waiting")
            return
        self._pending.append((entry, time.monotonic() + self._retry_for))
        self._wake.set()

    def _as_logged(self, record: dict[str, Any]) -> dict[str, Any]:
        """The record as its log line says it: people named as `logging.user_id` says."""
        mode = self._logging.user_id
        if mode == "plain":
            return record
        line = dict(record)
        requester = line.pop("requester", None)
        approvers = line.pop("approvers", [])
        if mode == "hash":
            key = self._logging.user_id_key.get_secret_value() if self._logging.user_id_key is not None else ""
            if requester is not None:
                line["requester_hash"] = user_id_digest(key, requester)
            line["approvers"] = [{"user_hash": user_id_digest(key, a["user"]), "auth": a["auth"]} for a in approvers]
        else:
            line["approvers"] = [{"auth": a["auth"]} for a in approvers]
        return line

    def _count(self, result: str) -> None:
        self._counted[result].inc()

    # ---- the background appends ------------------------------------------------------------

    def start(self) -> None:
        """Start appending to the store (records made before are appended then)."""
        if self._task is None and not self._stopped:
            self._task = asyncio.create_task(self._appends(), name="audit-appends")

    async def stop(self, timeout: float) -> None:
        """Append what waits, for up to `timeout` seconds (not retried: a store that is down now
        stays down for this process); what is left is counted `failed`. Records made afterwards
        are logged only."""
        self._stopping = True
        self._wake.set()
        self._stop_now.set()
        if self._task is not None:
            done, _ = await asyncio.wait((self._task,), timeout=timeout)
            if not done:
                await cancel_and_wait((self._task,), 1.0, what="audit appends")
        self._stopped = True
        self._give_up(everything=True, reason="stopped")

    async def _appends(self) -> None:
        backoff = Backoff(_BACKOFF_FIRST, _BACKOFF_CAP)
        while True:
            if not self._pending:
                if self._stopping:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            entry, _ = self._pending[0]
            result = await self._append(entry)
            if result is not None:
                self._pending.popleft()
                self._count(result)
                if backoff.succeeded():
                    log.info("audit_store_back", waiting=len(self._pending))
                continue
            if self._stopping:
                self._give_up(everything=True, reason="stopped")
                return
            # What waited past its bound is given up without another try: the store is down now.
            self._give_up(everything=False, reason="store_unavailable")
            if not backoff.failing:
                log.warning("audit_store_unavailable", waiting=len(self._pending))
            # A new record is no reason to try sooner; stopping is.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(backoff.failed()):  # not wait_for: see RedisState._heartbeats
                    await self._stop_now.wait()

    async def _append(self, entry: AuditEntry) -> str | None:
        """`stored` or `duplicate`, or None when the store could not be reached."""
        audit = self._config()
        try:
            async with asyncio.timeout(self._timeout):
                appended = await self._store.audit_append(entry, keep=audit.keep, max_age=audit.max_age)
        except (StoreDown, TimeoutError):
            return None
        except Exception as exc:  # noqa: BLE001 - a bug or a record the store refuses: not retried
            log.error("audit_record_not_stored", approval_id=entry.approval_id, reason=type(exc).__name__)
            return "failed"
        return "stored" if appended else "duplicate"

    def _give_up(self, *, everything: bool, reason: str) -> None:
        now = time.monotonic()
        # Oldest first, so their bounds come in order: stop at the first still within its own.
        while self._pending and (everything or self._pending[0][1] <= now):
            entry, _ = self._pending.popleft()
            self._count("failed")
            log.warning("audit_record_not_stored", approval_id=entry.approval_id, reason=reason)

    # ---- reading ---------------------------------------------------------------------------

    async def read(
        self,
        *,
        since: float | None = None,
        until: float | None = None,
        agent: str | None = None,
        tool: str | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> list[dict[str, Any]]:
        """Records oldest first (store.py AuditQuery says what each argument selects), each
        with its `cursor`: pass the last one as `after` for the next page. Raises InvalidAuditQuery
        (400) for a bad cursor or limit, StoreDown (503) when the store cannot answer in time."""
        if not 1 <= limit <= MAX_PAGE:
            raise InvalidAuditQuery(f"limit must be between 1 and {MAX_PAGE}")
        if after is not None:
            try:
                audit_position(after)
            except ValueError as exc:
                raise InvalidAuditQuery(str(exc)) from None
        query = AuditQuery(since=since, until=until, agent=agent, tool=tool, limit=limit, after=after)
        try:
            async with asyncio.timeout(self._timeout):
                return await self._store.audit_read(query, max_age=self._config().max_age)
        except TimeoutError:
            raise StoreDown("the audit trail's store did not answer in time") from None
