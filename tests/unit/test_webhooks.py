"""Approval webhooks (issue 26, item 4): the `notifications:` section, the signature, the body, and
deliveries to a real local receiver that fails, throttles, hangs and refuses.

The receiver is an aiohttp test server scripted per test; the sender is the real `Webhooks` with
its own HTTP client, with backoffs of milliseconds so the suite stays fast. The signature is
checked against the Standard Webhooks spec's published vector and recomputed with hmac here.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
import structlog
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.config.notifications import NotificationsConfig, WebhookConfig, secret_bytes
from gateway.config.schema import ConfigError, parse_config
from gateway.approvals.notice import NOTICE_KINDS, ApprovalNotice, Approver, args_digest, args_digest_key
from gateway.edge.app import create_app
from gateway.edge.state import GATEWAY
from gateway.ops.metrics import WEBHOOK_ATTEMPTS, WEBHOOK_EVENTS, WEBHOOK_RESULTS, GatewayMetrics
from gateway.approvals.webhooks import Webhooks, _retry_after, notice_body, sign
from tests.support.waiting import until

SECRET = "a-webhook-secret-of-some-length"
ARGS = {"amount": 750, "payee": "Hanako", "iban": "DE-secret-iban-0001"}
DIGEST_KEY = args_digest_key("an-args-digest-key-0123")


def notice(kind: str = "waiting", **changes: Any) -> ApprovalNotice:
    base = ApprovalNotice(
        kind=kind, approval_id="gw-appr/1", agent="support_agent", app_name="support", tool="issue_refund",
        tool_call_id="call-1", chat_id="chat-1", requester="alice", args=ARGS, at=1_700_000_000.25,
        rule="big_refund", asks=("group:supervisors",), args_digest=args_digest(DIGEST_KEY, ARGS),
    )
    if kind != "waiting":
        base = replace(base, source="approver", outcome="approved", approvers=(Approver("bob", "jwt"),), waited=12.5)
    return replace(base, **changes)


def notifications(url: str, **changes: Any) -> NotificationsConfig:
    hook = {"name": "approvals", "url": url, "secret": SECRET, "timeout": "300ms", **changes.pop("hook", {})}
    raw = {"webhooks": [hook], "max_attempts": 6, "backoff": "10ms", "backoff_max": "50ms", **changes}
    return NotificationsConfig.model_validate(raw)


def verify(secret: str, headers: Any, body: bytes) -> bool:
    """What a receiver does (docs/approvals.md#webhooks), written apart from the sender's code."""
    key = base64.b64decode(secret.removeprefix("whsec_")) if secret.startswith("whsec_") else secret.encode()
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return any(hmac.compare_digest(expected, s.split(",", 1)[1]) for s in headers["webhook-signature"].split())


def sample(metrics: GatewayMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


# ---- signature, body, config --------------------------------------------------------------------


def test_the_signature_matches_the_standard_webhooks_vector() -> None:
    # The Standard Webhooks spec's (and Svix's) published example.
    key = secret_bytes("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    body = b'{"test": 2432232314}'
    assert sign(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body) == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_a_plain_secret_is_its_utf8_bytes() -> None:
    body = b'{"type":"approval.waiting"}'
    expected = base64.b64encode(hmac.new(SECRET.encode(), b"msg_1.1700000000." + body, hashlib.sha256).digest()).decode()
    assert sign(secret_bytes(SECRET), "msg_1", 1700000000, body) == f"v1,{expected}"
    assert verify(SECRET, {"webhook-id": "msg_1", "webhook-timestamp": "1700000000",
                           "webhook-signature": f"v1,{expected}"}, body)


def test_the_body_carries_the_notice_its_type_time_and_link_but_the_arguments_only_when_asked() -> None:
    body = json.loads(notice_body(notice("decided"), include_args=False, public_url="https://gw.example.com"))
    assert body["type"] == "approval.decided"
    assert body["timestamp"] == "2023-11-14T22:13:20.250Z"
    data = body["data"]
    assert data["links"] == {"approval": "https://gw.example.com/api/approvals/gw-appr%2F1"}
    assert "args" not in data and data["args_digest"] == args_digest(DIGEST_KEY, ARGS)
    assert data["approvers"] == [{"user": "bob", "auth": "jwt"}] and data["source"] == "approver"
    assert data["rule"] == "big_refund" and data["agent"] == "support_agent" and data["tool"] == "issue_refund"
    with_args = json.loads(notice_body(notice(), include_args=True, public_url=""))
    assert with_args["data"]["args"] == ARGS and with_args["type"] == "approval.waiting"
    assert with_args["data"]["links"]["approval"] == "/api/approvals/gw-appr%2F1"


def test_a_webhook_gets_only_the_events_agents_tools_and_rules_it_names() -> None:
    hook = notifications("https://h.example.com").webhooks[0]
    assert hook.events == ["waiting", "decided", "expired"] and not hook.include_args
    assert all(hook.wants(kind, "any", "any", None) for kind in NOTICE_KINDS)
    hook = notifications("https://h.example.com", hook={
        "events": ["decided"], "agents": ["support_agent"], "tools": ["issue_refund"], "rules": ["big_refund"],
    }).webhooks[0]
    assert hook.wants("decided", "support_agent", "issue_refund", "big_refund")
    assert not hook.wants("waiting", "support_agent", "issue_refund", "big_refund")
    assert not hook.wants("decided", "demo_agent", "issue_refund", "big_refund")
    assert not hook.wants("decided", "support_agent", "process_payment", "big_refund")
    assert not hook.wants("decided", "support_agent", "issue_refund", "small_refund")
    assert not hook.wants("decided", "support_agent", "issue_refund", None)


GATEWAY_YAML = """
internal: {{secret: internal-secret-123}}
notifications:
  webhooks:
{hooks}
"""


@pytest.mark.parametrize(("hook", "problem"), [
    ("    - {name: a, url: 'https://h', secret: short}", "at least 16 characters"),
    ("    - {name: a, url: 'https://h', secret: 'whsec_!!notbase64!!'}", "whsec_"),
    ("    - {name: a, url: 'https://h', secret: 'whsec_c2hvcnQ='}", "at least 16 bytes"),
    (f"    - {{name: a, url: 'ftp://h/x', secret: {SECRET}}}", "http(s)"),
    (f"    - {{name: 'a b', url: 'https://h', secret: {SECRET}}}", "notifications.webhooks[0].name"),
    (f"    - {{name: a, url: 'https://h', secret: {SECRET}, agents: [nobody]}}", "nobody not among the agents"),
    (f"    - {{name: a, url: 'https://h', secret: {SECRET}, events: [started]}}", "notifications.webhooks[0].events"),
    (f"    - {{name: a, url: 'https://h', secret: {SECRET}}}\n    - {{name: a, url: 'https://i', secret: {SECRET}}}",
     "a more than once"),
    ("    - {name: a, url: 'https://h'}", "notifications.webhooks[0].secret"),
])
def test_a_webhook_config_that_cannot_work_is_refused(hook: str, problem: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(GATEWAY_YAML.format(hooks=hook))
    assert problem in str(refused.value)
    assert SECRET not in str(refused.value)  # a problem names the key, never the secret


def test_a_valid_webhook_config_loads_with_its_defaults() -> None:
    config = parse_config(
        GATEWAY_YAML.format(hooks="    - {name: approvals-channel, url: 'https://h.example.com/adk', secret: '${S}', agents: [demo_agent]}")
        + "  public_url: https://gw.example.com/\n",
        env={"S": SECRET},
    ).notifications
    assert config.public_url == "https://gw.example.com"
    assert (config.max_attempts, config.backoff, config.backoff_max, config.queue) == (6, 1.0, 60.0, 1000)
    (hook,) = config.webhooks
    assert (hook.timeout, hook.concurrency, hook.tools, hook.rules) == (5.0, 4, [], [])
    assert SECRET not in repr(config)
    assert parse_config("").notifications.webhooks == []


def test_retry_after_reads_seconds_and_dates() -> None:
    assert _retry_after("3", 0.0) == 3.0
    assert _retry_after("Wed, 21 Oct 2015 07:28:00 GMT", 1445412470.0) == 10.0
    assert _retry_after("soon", 0.0) is None and _retry_after(None, 0.0) is None


# ---- deliveries to a real receiver --------------------------------------------------------------


@dataclass
class Receiver:
    """A webhook receiver: answers each call with the next of `script` (a status, `(status, headers)`,
    "hang" or "hang500": 200 or 500 once `hang` is set), then 200; keeps what it got."""

    script: list[Any] = field(default_factory=list)
    calls: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    hang: asyncio.Event = field(default_factory=asyncio.Event)
    url: str = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.calls.append((dict(request.headers), await request.read()))
        step = self.script.pop(0) if self.script else 200
        if step in ("hang", "hang500"):
            await self.hang.wait()
            step = 200 if step == "hang" else 500
        status, headers = step if isinstance(step, tuple) else (step, {})
        return web.Response(status=status, headers=headers)


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    rec = Receiver()
    app = web.Application()
    app.router.add_post("/hook", rec.handle)
    async with TestServer(app, host="127.0.0.1") as server:
        rec.url = str(server.make_url("/hook"))
        yield rec
        rec.hang.set()


def webhooks(config: NotificationsConfig | Callable[[], NotificationsConfig]) -> tuple[Webhooks, GatewayMetrics]:
    metrics = GatewayMetrics()
    read = config if callable(config) else (lambda: config)
    metrics.webhooks.know(read())
    sender = Webhooks(read, metrics)
    sender.start()
    return sender, metrics


async def test_a_failing_receiver_gets_the_notice_once_it_recovers_with_one_id_and_valid_signatures(receiver: Receiver) -> None:
    receiver.script = [500, (429, {"Retry-After": "30"}), "hang", 503]
    sender, metrics = webhooks(notifications(receiver.url, hook={"include_args": True}))
    started = time.monotonic()
    with structlog.testing.capture_logs() as logs:
        sender.notify(notice())
        await until(lambda: sender.pending == 0)
    # Retry-After 30 s was honoured only up to backoff_max (50 ms); the hang cost its 300 ms timeout.
    assert time.monotonic() - started < 3.0
    assert len(receiver.calls) == 5
    ids = {headers["webhook-id"] for headers, _ in receiver.calls}
    assert len(ids) == 1 and ids.pop().startswith("msg_")
    for headers, body in receiver.calls:
        assert verify(SECRET, headers, body)
        assert abs(int(headers["webhook-timestamp"]) - time.time()) < 5
        assert headers["Content-Type"] == "application/json"
    assert {body for _, body in receiver.calls} == {receiver.calls[0][1]}
    assert json.loads(receiver.calls[0][1])["data"]["args"] == ARGS
    assert sample(metrics, "adk_gateway_webhook_deliveries_total", webhook="approvals", event="waiting", result="delivered") == 1
    for outcome in ("5xx", "429", "timeout", "2xx"):
        expected = 2 if outcome == "5xx" else 1
        assert sample(metrics, "adk_gateway_webhook_attempts_total", webhook="approvals", outcome=outcome) == expected
    assert sample(metrics, "adk_gateway_webhook_delivery_seconds_count", webhook="approvals") == 1
    assert sample(metrics, "adk_gateway_webhook_pending", webhook="approvals") == 0
    (line,) = [entry for entry in logs if entry["event"] == "webhook_delivered"]
    assert line["attempts"] == 5 and line["webhook"] == "approvals" and line["approval_id"] == "gw-appr/1"
    text = repr(logs)
    assert SECRET not in text and "DE-secret-iban" not in text and receiver.url not in text
    await sender.stop(1.0)


async def test_a_4xx_is_final_and_counted_as_failed(receiver: Receiver) -> None:
    receiver.script = [400]
    sender, metrics = webhooks(notifications(receiver.url))
    with structlog.testing.capture_logs() as logs:
        sender.notify(notice("expired"))
        await until(lambda: sender.pending == 0)
        await asyncio.sleep(0.1)  # more than a backoff: a retry would have come
    assert len(receiver.calls) == 1
    assert sample(metrics, "adk_gateway_webhook_deliveries_total", webhook="approvals", event="expired", result="failed") == 1
    assert sample(metrics, "adk_gateway_webhook_attempts_total", webhook="approvals", outcome="4xx") == 1
    (line,) = [entry for entry in logs if entry["event"] == "webhook_failed"]
    assert (line["status"], line["reason"]) == (400, "refused")
    await sender.stop(1.0)


async def test_a_redirect_is_not_followed(receiver: Receiver) -> None:
    receiver.script = [(307, {"Location": "/elsewhere"})]
    sender, metrics = webhooks(notifications(receiver.url))
    sender.notify(notice())
    await until(lambda: sender.pending == 0)
    assert len(receiver.calls) == 1
    assert sample(metrics, "adk_gateway_webhook_attempts_total", webhook="approvals", outcome="3xx") == 1
    assert sample(metrics, "adk_gateway_webhook_deliveries_total", webhook="approvals", event="waiting", result="failed") == 1
    await sender.stop(1.0)


async def test_a_receiver_that_keeps_failing_is_given_up_after_max_attempts(receiver: Receiver) -> None:
    receiver.script = [502] * 10
    sender, metrics = webhooks(notifications(receiver.url, max_attempts=3))
    sender.notify(notice("decided"))
    await until(lambda: sender.pending == 0)
    assert len(receiver.calls) == 3
    assert sample(metrics, "adk_gateway_webhook_deliveries_total", webhook="approvals", event="decided", result="failed") == 1
    await sender.stop(1.0)


async def test_a_refused_connection_is_retried(receiver: Receiver) -> None:
    # Nothing listens on the first URL's port: every attempt is an `error`, none blocks the other webhook.
    config = notifications(receiver.url, max_attempts=2)
    dead = config.webhooks[0].model_copy(update={"name": "dead", "url": "http://127.0.0.1:9/hook"})
    sender, metrics = webhooks(config.model_copy(update={"webhooks": [dead, config.webhooks[0]]}))
    sender.notify(notice())
    await until(lambda: sender.pending == 0)
    assert sample(metrics, "adk_gateway_webhook_attempts_total", webhook="dead", outcome="error") == 2
    assert sample(metrics, "adk_gateway_webhook_deliveries_total", webhook="dead", event="waiting", result="failed") == 1
    assert sample(metrics, "adk_gateway_webhook_deliveries_total", webhook="approvals", event="waiting", result="delivered") == 1
    await sender.stop(1.0)


async def test_notices_go_only_to_the_webhooks_that_want_them(receiver: Receiver) -> None:
    config = notifications(receiver.url, hook={"events": ["decided", "expired"], "tools": ["issue_refund"]})
    sender, metrics = webhooks(config)
    sender.notify(notice("waiting"))
    sender.notify(notice("decided", tool="process_payment"))
    sender.notify(notice("decided"))
    await until(lambda: sender.pending == 0)
    assert [json.loads(body)["type"] for _, body in receiver.calls] == ["approval.decided"]
    await sender.stop(1.0)


async def test_one_hanging_receiver_does_not_delay_another(receiver: Receiver) -> None:
    slow = Receiver(script=["hang"] * 10)
    app = web.Application()
    app.router.add_post("/hook", slow.handle)
    async with TestServer(app, host="127.0.0.1") as server:
        config = notifications(receiver.url, max_attempts=1)
        hooks = [config.webhooks[0].model_copy(update={"name": "slow", "url": str(server.make_url("/hook")),
                                                       "timeout": 30.0, "concurrency": 1}), config.webhooks[0]]
        sender, metrics = webhooks(config.model_copy(update={"webhooks": hooks}))
        for n in range(3):
            sender.notify(notice(approval_id=f"gw-{n}"))
        await until(lambda: len(receiver.calls) == 3, timeout=2.0)
        assert len(slow.calls) == 1  # one at a time (concurrency 1), and still hanging
        assert sample(metrics, "adk_gateway_webhook_pending", webhook="slow") == 3
        started = time.monotonic()
        await sender.stop(0.5)
        assert time.monotonic() - started < 1.5
        slow.hang.set()
    assert sample(metrics, "adk_gateway_webhook_deliveries_total", webhook="slow", event="waiting", result="dropped") == 3
    assert sample(metrics, "adk_gateway_webhook_deliveries_total", webhook="approvals", event="waiting", result="delivered") == 3


async def test_a_full_queue_drops_and_counts(receiver: Receiver) -> None:
    receiver.script = ["hang"] * 10
    sender, metrics = webhooks(notifications(receiver.url, queue=2, hook={"concurrency": 1, "timeout": "30s"}))
    with structlog.testing.capture_logs() as logs:
        for n in range(5):
            sender.notify(notice(approval_id=f"gw-{n}"))
    assert sender.pending == 2
    assert sample(metrics, "adk_gateway_webhook_deliveries_total", webhook="approvals", event="waiting", result="dropped") == 3
    assert [entry["reason"] for entry in logs if entry["event"] == "webhook_dropped"] == ["queue_full"] * 3
    receiver.hang.set()
    await until(lambda: sender.pending == 0)
    assert sample(metrics, "adk_gateway_webhook_deliveries_total", webhook="approvals", event="waiting", result="delivered") == 2
    await sender.stop(1.0)


async def test_stop_is_bounded_by_its_timeout_and_drops_what_is_left(receiver: Receiver) -> None:
    receiver.script = ["hang"] * 10
    sender, metrics = webhooks(notifications(receiver.url, hook={"timeout": "30s"}))
    sender.notify(notice())
    sender.notify(notice("decided"))
    await until(lambda: len(receiver.calls) == 2)
    started = time.monotonic()
    with structlog.testing.capture_logs() as logs:
        await sender.stop(0.3)
    assert time.monotonic() - started < 1.0  # its bound, and room for a busy machine; the receiver hangs 30 s
    assert sender.pending == 0
    assert sample(metrics, "adk_gateway_webhook_deliveries_total", webhook="approvals", event="waiting", result="dropped") == 1
    assert sample(metrics, "adk_gateway_webhook_deliveries_total", webhook="approvals", event="decided", result="dropped") == 1
    assert {entry["reason"] for entry in logs if entry["event"] == "webhook_dropped"} == {"stopped"}
    # After a stop, notices are dropped at once.
    sender.notify(notice("expired"))
    assert sample(metrics, "adk_gateway_webhook_deliveries_total", webhook="approvals", event="expired", result="dropped") == 1


async def test_stop_gives_a_delivery_between_attempts_its_last_attempt_now(receiver: Receiver) -> None:
    receiver.script = [500]
    sender, metrics = webhooks(notifications(receiver.url, backoff="30s", backoff_max="60s"))
    sender.notify(notice())
    await until(lambda: len(receiver.calls) == 1)
    started = time.monotonic()
    await sender.stop(2.0)
    assert time.monotonic() - started < 1.0
    assert len(receiver.calls) == 2
    assert sample(metrics, "adk_gateway_webhook_deliveries_total", webhook="approvals", event="waiting", result="delivered") == 1


async def test_a_call_that_fails_while_the_stop_waits_gets_one_more_attempt(receiver: Receiver) -> None:
    receiver.script = ["hang500", 500]
    sender, metrics = webhooks(notifications(receiver.url, backoff="30s", backoff_max="60s", hook={"timeout": "30s"}))
    sender.notify(notice())
    await until(lambda: len(receiver.calls) == 1)
    stopping = asyncio.ensure_future(sender.stop(2.0))
    await asyncio.sleep(0.05)
    receiver.hang.set()  # the call under way when the stop began fails: it gets its last attempt now
    await stopping
    assert len(receiver.calls) == 2
    assert sample(metrics, "adk_gateway_webhook_deliveries_total", webhook="approvals", event="waiting", result="dropped") == 1
    assert sample(metrics, "adk_gateway_webhook_attempts_total", webhook="approvals", outcome="5xx") == 2


async def test_notify_never_raises_nor_sends_before_start(receiver: Receiver) -> None:
    config = notifications(receiver.url)
    metrics = GatewayMetrics()
    sender = Webhooks(lambda: config, metrics)
    sender.notify(notice())  # not started: dropped, counted
    assert sample(metrics, "adk_gateway_webhook_deliveries_total", webhook="approvals", event="waiting", result="dropped") == 1

    def broken() -> NotificationsConfig:
        raise RuntimeError("config unreadable")

    Webhooks(broken, metrics).notify(notice())  # logged, not raised
    assert receiver.calls == []


async def test_a_reload_applies_to_the_notices_after_it(receiver: Receiver) -> None:
    current = {"config": notifications(receiver.url, hook={"events": ["decided"]})}
    sender, metrics = webhooks(lambda: current["config"])
    sender.notify(notice("waiting"))
    current["config"] = notifications(receiver.url, hook={"events": ["waiting"], "name": "renamed"})
    sender.notify(notice("waiting"))
    await until(lambda: sender.pending == 0)
    assert len(receiver.calls) == 1
    assert sample(metrics, "adk_gateway_webhook_deliveries_total", webhook="renamed", event="waiting", result="delivered") == 1
    await sender.stop(1.0)


def test_every_webhook_series_is_exported_at_zero_for_each_configured_webhook() -> None:
    metrics = GatewayMetrics()
    metrics.webhooks.know(notifications("https://h.example.com"))
    for event in WEBHOOK_EVENTS:
        for result in WEBHOOK_RESULTS:
            assert metrics.registry.get_sample_value(
                "adk_gateway_webhook_deliveries_total", {"webhook": "approvals", "event": event, "result": result}) == 0
    for outcome in WEBHOOK_ATTEMPTS:
        assert metrics.registry.get_sample_value(
            "adk_gateway_webhook_attempts_total", {"webhook": "approvals", "outcome": outcome}) == 0
    assert metrics.registry.get_sample_value("adk_gateway_webhook_delivery_seconds_count", {"webhook": "approvals"}) == 0
    assert set(WEBHOOK_EVENTS) == set(NOTICE_KINDS)


async def test_the_app_starts_the_sender_exports_its_series_and_delivers(receiver: Receiver) -> None:
    config = parse_config(
        "internal: {secret: internal-secret-123}\n"
        f"notifications:\n  webhooks:\n    - {{name: approvals, url: '{receiver.url}', secret: {SECRET}}}\n"
        "  public_url: https://gw.example.com\n"
    )
    async with TestClient(TestServer(create_app(config))) as client:
        gateway = client.app[GATEWAY]
        text = await (await client.get("/metrics")).text()
        assert 'adk_gateway_webhook_deliveries_total{event="decided",result="failed",webhook="approvals"} 0.0' in text
        gateway.webhooks.notify(notice("decided"))
        await until(lambda: gateway.webhooks.pending == 0)
    (headers, body) = receiver.calls[0]
    assert verify(SECRET, headers, body)
    assert json.loads(body)["data"]["links"]["approval"] == "https://gw.example.com/api/approvals/gw-appr%2F1"


async def test_a_reload_that_adds_a_webhook_exports_its_series_and_sends_it_the_notices_after_it(
    receiver: Receiver, tmp_path: Any,
) -> None:
    from gateway.edge.reload import reload_config

    base = "internal: {secret: internal-secret-123}\n"
    async with TestClient(TestServer(create_app(parse_config(base)))) as client:
        gateway = client.app[GATEWAY]
        gateway.webhooks.notify(notice())  # no webhook yet: nothing to send
        path = tmp_path / "gateway.yaml"
        path.write_text(base + f"notifications:\n  webhooks:\n    - {{name: added, url: '{receiver.url}', secret: {SECRET}}}\n")
        assert reload_config(gateway, path).ok
        assert sample(gateway.metrics, "adk_gateway_webhook_deliveries_total", webhook="added", event="expired",
                      result="dropped") == 0
        assert gateway.metrics.registry.get_sample_value(
            "adk_gateway_webhook_attempts_total", {"webhook": "added", "outcome": "timeout"}) == 0
        gateway.webhooks.notify(notice("expired"))
        await until(lambda: gateway.webhooks.pending == 0)
    assert [json.loads(body)["type"] for _, body in receiver.calls] == ["approval.expired"]


def test_the_reference_config_example_is_valid_and_its_secret_is_masked_in_logs() -> None:
    from pathlib import Path

    from gateway.ops.logs import secret_values

    lines = (Path(__file__).resolve().parents[2] / "config" / "gateway.yaml").read_text().splitlines()
    start = lines.index("# notifications:")
    block = []
    for line in lines[start:]:
        if not line.startswith("#"):
            break
        block.append(line.removeprefix("# ").removeprefix("#"))
    config = parse_config(
        "internal: {secret: internal-secret-123}\n" + "\n".join(block) + "\n", env={"APPROVALS_WEBHOOK_SECRET": SECRET}
    )
    (hook,) = config.notifications.webhooks
    assert hook.name == "approvals-channel" and hook.events == ["waiting", "decided", "expired"]
    # The values it shows are the defaults, as its comment says.
    assert config.notifications.model_copy(update={"webhooks": []}) == NotificationsConfig()
    fixed = {"name", "url", "secret"}
    assert hook.model_dump(exclude=fixed) == WebhookConfig(name="x", url="https://h", secret=SECRET).model_dump(exclude=fixed)
    assert SECRET in secret_values(config)
