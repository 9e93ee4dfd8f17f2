"""The audit trail (approvals/audit_trail.py): one JSON log line and one stored record per decided approval.

- The log line: every field of the record, the arguments only with `audit.include_args` (their
  digest always); nothing for a notice that does not end an approval.
- The store append runs in the background: `record()` returns at once even when Redis is down, the
  append is retried once it is back, or counted `failed` past its bound; too many waiting are
  `dropped`; a stop is bounded. Counted in adk_gateway_audit_records_total{result}, at 0 from start.
- Reading: bad cursors and limits are refused (400); the app builds the trail on its shared store.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from gateway.cluster.memory import MemoryState
from gateway.cluster.redis import RedisState
from gateway.cluster.shared import SharedStateDown
from gateway.config.audit import AuditConfig
from gateway.config.schema import LoggingConfig, parse_config
from gateway.approvals.notice import Approver, ApprovalNotice, args_digest, args_digest_key
from gateway.edge.app import create_app
from gateway.edge.state import GATEWAY
from gateway.approvals import audit_trail as audit_module
from gateway.approvals.audit_trail import AuditTrail, InvalidAuditQuery
from gateway.ops.logs import configure_logging, user_id_digest
from gateway.ops.metrics import GatewayMetrics
from tests.support.waiting import until
from tests.support.shared_state import HEARTBEAT, OWNER_TIMEOUT, redis_state
from tests.procs import RedisServer, redis_server
from tests.support.logs import RecordingLog
from tests.unit.test_logs import restore_logging  # noqa: F401 - a fixture

CARD = "4111111111111111"
DIGEST_KEY = args_digest_key("an-args-digest-key-0123")


def notice(approval_id: str = "ap-1", *, kind: str = "decided", **changes: Any) -> ApprovalNotice:
    fields: dict[str, Any] = {
        "kind": kind, "approval_id": approval_id, "agent": "support_agent", "app_name": "support_app",
        "tool": "issue_refund", "tool_call_id": "call-1", "chat_id": "chat-1", "requester": "bob",
        "args": {"order": "A-17", "amount": 250, "card": CARD}, "at": time.time(),
        "args_digest": args_digest(DIGEST_KEY, {"order": "A-17", "amount": 250, "card": CARD}),
        "source": "approver", "outcome": "approved", "approvers": (Approver("carol", "api_key"),),
        "rule": "large_refunds", "reason": "checked with the customer", "policy_version": "sha256:abc",
        "waited": 42.5, "trace_id": "0af7651916cd43dd8448eb211c80319c",
    }
    if kind == "waiting":
        fields.update(source=None, outcome=None, approvers=(), waited=None, asks=("group:supervisors",))
    fields.update(changes)
    return ApprovalNotice(**fields)


def counted(metrics: GatewayMetrics, result: str) -> float:
    value = metrics.registry.get_sample_value("adk_gateway_audit_records_total", {"result": result})
    assert value is not None, "exported at 0 from the start"
    return value


def trail(store: Any, metrics: GatewayMetrics, config: AuditConfig | None = None, **bounds: Any) -> AuditTrail:
    kept = config or AuditConfig()
    return AuditTrail(store, metrics, lambda: kept, timeout=1.0, **bounds)


# ---- the log line ----------------------------------------------------------------------------------


@pytest.mark.parametrize("include_args", [False, True])
async def test_the_log_line_holds_every_field_and_the_arguments_only_when_allowed(
    include_args: bool, restore_logging: None, capsys: pytest.CaptureFixture[str],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    configure_logging("info", "json")
    # The module's logger as the process would have it (one cached by an earlier test writes to
    # that test's captured stderr).
    monkeypatch.setattr(audit_module, "log", structlog.get_logger("adk_gateway.cluster.audit_trail"))
    audit = trail(MemoryState("a"), GatewayMetrics(), AuditConfig(include_args=include_args))
    decided = notice()
    audit.record(decided)
    (line,) = [json.loads(text) for text in capsys.readouterr().err.splitlines()]
    assert line["event"] == "approval_audit" and line["level"] == "info"
    expected = {
        "kind": "decided", "approval_id": "ap-1", "agent": "support_agent", "app_name": "support_app",
        "tool": "issue_refund", "tool_call_id": "call-1", "chat_id": "chat-1", "requester": "bob",
        "at": decided.at, "source": "approver", "outcome": "approved",
        "approvers": [{"user": "carol", "auth": "api_key"}], "rule": "large_refunds",
        "reason": "checked with the customer", "policy_version": "sha256:abc", "waited": 42.5,
        "trace_id": "0af7651916cd43dd8448eb211c80319c", "asks": [],
        "args_digest": args_digest(DIGEST_KEY, {"order": "A-17", "amount": 250, "card": CARD}),
    }
    assert {key: line[key] for key in expected} == expected
    if include_args:
        assert line["args"] == {"order": "A-17", "amount": 250, "card": CARD}
    else:
        assert "args" not in line and CARD not in json.dumps(line)
    await audit.stop(1.0)


@pytest.mark.parametrize("mode", ["hash", "omit"])
async def test_the_log_line_names_people_as_logging_user_id_says_and_the_store_as_they_are(
    mode: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = RecordingLog()
    monkeypatch.setattr(audit_module, "log", log)
    key = "log-key-0123456789abcdef"
    settings = LoggingConfig(user_id=mode, user_id_key=key if mode == "hash" else None)
    metrics = GatewayMetrics()
    audit = AuditTrail(MemoryState("a"), metrics, AuditConfig, logging=settings)
    audit.start()
    audit.record(notice())
    (line,) = log.named("approval_audit")
    assert "requester" not in line and "bob" not in json.dumps(line) and "carol" not in json.dumps(line)
    if mode == "hash":
        assert line["requester_hash"] == user_id_digest(key, "bob")
        assert line["approvers"] == [{"user_hash": user_id_digest(key, "carol"), "auth": "api_key"}]
    else:
        assert "requester_hash" not in line and line["approvers"] == [{"auth": "api_key"}]
    await until(lambda: counted(metrics, "stored") == 1)
    (stored,) = await audit.read()
    assert stored["requester"] == "bob" and stored["approvers"] == [{"user": "carol", "auth": "api_key"}]
    await audit.stop(1.0)


async def test_a_notice_that_does_not_end_an_approval_is_not_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    log = RecordingLog()
    monkeypatch.setattr(audit_module, "log", log)
    store, metrics = MemoryState("a"), GatewayMetrics()
    audit = trail(store, metrics)
    audit.start()
    audit.record(notice(kind="waiting"))
    audit.record(notice("ap-2", kind="expired", source="timeout", outcome="timeout", approvers=()))
    await until(lambda: counted(metrics, "stored") == 1)
    assert [fields["approval_id"] for fields in log.named("approval_audit")] == ["ap-2"]
    assert [r["approval_id"] for r in await audit.read()] == ["ap-2"]
    await audit.stop(1.0)


# ---- the store, in the background ------------------------------------------------------------------


async def test_records_are_stored_once_per_approval_and_read_back() -> None:
    store, metrics = MemoryState("a"), GatewayMetrics()
    audit = trail(store, metrics)
    assert [counted(metrics, r) for r in ("stored", "duplicate", "failed", "dropped")] == [0, 0, 0, 0]
    audit.start()
    audit.record(notice("ap-1"))
    audit.record(notice("ap-1"))  # impossible by construction; harmless if it happened
    audit.record(notice("ap-2", outcome="denied"))
    await until(lambda: counted(metrics, "stored") + counted(metrics, "duplicate") == 3)
    assert (counted(metrics, "stored"), counted(metrics, "duplicate")) == (2, 1)
    records = await audit.read(agent="support_agent", tool="issue_refund")
    assert [(r["approval_id"], r["outcome"]) for r in records] == [("ap-1", "approved"), ("ap-2", "denied")]
    assert "args" not in records[0] and records[0]["args_digest"].startswith("hmac-sha256:")
    assert [r["approval_id"] for r in await audit.read(limit=1, after=records[0]["cursor"])] == ["ap-2"]
    await audit.stop(1.0)


async def test_a_read_with_a_bad_cursor_or_limit_is_refused() -> None:
    audit = trail(MemoryState("a"), GatewayMetrics())
    for bad in ("", "x", "12", "1-2-3", "-1-0", "1" * 16 + "-0"):
        with pytest.raises(InvalidAuditQuery) as refused:
            await audit.read(after=bad)
        assert refused.value.status == 400
    for limit in (0, -1, 1001):
        with pytest.raises(InvalidAuditQuery):
            await audit.read(limit=limit)
    assert await audit.read(after="0-0", limit=1000) == []


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    with redis_server(tmp_path) as running:
        yield running


@pytest.fixture
async def redis_store(server: RedisServer) -> AsyncIterator[RedisState]:
    state = redis_state(server, "a", "audit" + secrets.token_hex(3))
    await state.start(lambda message: None, lambda: [])
    try:
        yield state
    finally:
        await state.close()


async def test_with_redis_down_a_record_is_logged_at_once_and_stored_once_redis_is_back(
    server: RedisServer, redis_store: RedisState, monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = RecordingLog()
    monkeypatch.setattr(audit_module, "log", log)
    metrics = GatewayMetrics()
    audit = trail(redis_store, metrics)
    audit.start()
    await asyncio.to_thread(server.stop)
    await until(lambda: not redis_store.available)
    started = time.perf_counter()
    audit.record(notice("ap-1"))
    assert time.perf_counter() - started < 0.05  # never waits for the store
    assert [f["approval_id"] for f in log.named("approval_audit")] == ["ap-1"]
    await asyncio.sleep(1.0)  # a few tries while Redis is down
    assert counted(metrics, "stored") == 0 and counted(metrics, "failed") == 0
    assert len(log.named("audit_store_unavailable")) == 1  # once per outage, not per try
    with pytest.raises(SharedStateDown):
        await audit.read()
    await asyncio.to_thread(server.start)  # back, empty
    await until(lambda: counted(metrics, "stored") == 1)
    assert [r["approval_id"] for r in await audit.read()] == ["ap-1"]
    assert len(log.named("audit_store_back")) == 1
    await audit.stop(1.0)


async def test_with_redis_down_past_the_bound_a_record_is_counted_failed(
    server: RedisServer, redis_store: RedisState, monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = RecordingLog()
    monkeypatch.setattr(audit_module, "log", log)
    metrics = GatewayMetrics()
    audit = trail(redis_store, metrics, retry_for=0.5, pending_max=2)
    audit.start()
    await asyncio.to_thread(server.stop)
    await until(lambda: not redis_store.available)
    for approval_id in ("ap-1", "ap-2", "ap-3"):
        audit.record(notice(approval_id))
    # The third found two waiting already.
    assert counted(metrics, "dropped") == 1
    await until(lambda: counted(metrics, "failed") == 2)
    assert sorted(f["approval_id"] for f in log.named("audit_record_not_stored")) == ["ap-1", "ap-2", "ap-3"]
    assert len(log.named("approval_audit")) == 3  # every one in the log
    await asyncio.to_thread(server.start)
    await until(lambda: redis_store.available)
    assert await audit.read() == []
    await audit.stop(1.0)
    assert counted(metrics, "stored") == 0


async def test_a_stop_with_redis_down_is_bounded_and_counts_what_waited_as_failed(
    server: RedisServer, redis_store: RedisState,
) -> None:
    metrics = GatewayMetrics()
    audit = trail(redis_store, metrics)
    audit.start()
    await asyncio.to_thread(server.stop)
    await until(lambda: not redis_store.available)
    audit.record(notice("ap-1"))
    audit.record(notice("ap-2"))
    await asyncio.sleep(0.2)
    started = time.perf_counter()
    await audit.stop(2.0)
    assert time.perf_counter() - started < 1.0  # the store is down: no point waiting for it
    assert counted(metrics, "failed") == 2
    audit.record(notice("ap-3"))  # after the stop: logged, counted, never raises
    assert counted(metrics, "failed") == 3


async def test_a_stop_appends_what_waits_when_the_store_is_up(redis_store: RedisState) -> None:
    metrics = GatewayMetrics()
    audit = trail(redis_store, metrics)
    for approval_id in ("ap-1", "ap-2"):  # before start: kept until the appends run
        audit.record(notice(approval_id))
    audit.start()
    await audit.stop(2.0)
    assert counted(metrics, "stored") == 2
    assert [r["approval_id"] for r in await audit.read()] == ["ap-1", "ap-2"]


# ---- in the app ------------------------------------------------------------------------------------


async def test_the_app_records_to_the_shared_store_under_its_audit_settings(server: RedisServer) -> None:
    config = parse_config(
        "sessions:\n  backend: redis\n"
        f"  redis_url: {server.url}\n  key_prefix: audit{secrets.token_hex(3)}\n  secret: test-sessions-secret-0123456789\n"
        f"  heartbeat_interval: {HEARTBEAT}s\n  owner_timeout: {OWNER_TIMEOUT}s\n"
        "audit:\n  include_args: true\n  keep: 2\n  max_age: 7d\n",
        env={},
    )
    assert (config.audit.include_args, config.audit.keep, config.audit.max_age) == (True, 2, 7 * 86400.0)
    app = create_app(config)
    gateway = app[GATEWAY]
    await gateway.cluster.start()
    gateway.audit.start()
    try:
        for approval_id in ("ap-1", "ap-2", "ap-3"):
            gateway.audit.record(notice(approval_id))
        await until(lambda: counted(gateway.metrics, "stored") == 3)
        records = await gateway.audit.read()
        assert [r["approval_id"] for r in records] == ["ap-2", "ap-3"]  # keep: 2
        assert records[0]["args"]["card"] == CARD  # include_args: the operator's choice
    finally:
        await gateway.audit.stop(1.0)
        await gateway.cluster.close()


def test_the_audit_section_is_strict_and_defaults_to_no_arguments_and_a_bounded_store() -> None:
    default = parse_config("", env={}).audit
    assert (default.include_args, default.keep, default.max_age) == (False, 100_000, 30 * 86400.0)
    for bad in ("keep: 0", "max_age: 0s", "max_age: soon", "include_arguments: true"):
        with pytest.raises(Exception):
            parse_config(f"audit:\n  {bad}\n", env={})


async def test_record_never_raises_even_when_the_log_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken:
        def _fail(self, *args: Any, **kwargs: Any) -> None:
            raise OSError("stderr is gone")

        info = warning = error = _fail

    monkeypatch.setattr(audit_module, "log", Broken())
    metrics = GatewayMetrics()
    audit = trail(MemoryState("a"), metrics)
    audit.start()
    audit.record(notice())  # nothing raised: the decision it records goes on
    await until(lambda: counted(metrics, "stored") == 1)  # and the store still gets the record
    await audit.stop(1.0)
