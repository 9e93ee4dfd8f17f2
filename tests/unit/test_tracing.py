"""ops/tracing.py and the `telemetry:` section: off by default and then free, on with the standard
OTLP variables, the spans' parents and attributes, `traceparent` out to ADK, and exemplars."""

from __future__ import annotations

import sys
import tracemalloc
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from gateway.config.schema import ConfigError, UpstreamConfig, parse_config
from gateway.config.telemetry import TelemetryConfig
from gateway.ops.logs import user_id_as_logged, user_id_digest
from gateway.ops.metrics import GatewayMetrics
from gateway.ops.tracing import Tracing, TracingUnavailable
from gateway.upstream.client import AdkClient
from tests.support.adk_server import adk_server


def traced() -> tuple[Tracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracing(provider, "adk-gateway", "replica-1"), exporter


# ---- config --------------------------------------------------------------------------------


@pytest.mark.parametrize(("env", "on"), [
    ({}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SDK_DISABLED": "true"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": " "}, False),
])
def test_tracing_is_on_when_the_standard_endpoint_is_set(env: dict[str, str], on: bool) -> None:
    assert TelemetryConfig().enabled_in(env) is on


def test_the_file_decides_unless_the_sdk_is_disabled() -> None:
    assert TelemetryConfig(enabled=True).enabled_in({}) is True
    assert TelemetryConfig(enabled=False).enabled_in({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}) is False
    assert TelemetryConfig(enabled=True).enabled_in({"OTEL_SDK_DISABLED": "TRUE"}) is False


def test_service_name_from_the_file_then_the_environment() -> None:
    assert TelemetryConfig().service_in({}) == "adk-gateway"
    assert TelemetryConfig().service_in({"OTEL_SERVICE_NAME": "edge"}) == "edge"
    assert TelemetryConfig(service_name="gw-eu").service_in({"OTEL_SERVICE_NAME": "edge"}) == "gw-eu"


def test_the_section_is_strict() -> None:
    config = parse_config("telemetry:\n  enabled: true\n  service_name: gw\n  shutdown_timeout: 1s\n", env={})
    assert config.telemetry.enabled is True and config.telemetry.shutdown_timeout == 1.0
    with pytest.raises(ConfigError, match=r"telemetry\.endpoint: unknown key"):
        parse_config("telemetry:\n  endpoint: http://c:4318\n", env={})


# ---- off: nothing to do --------------------------------------------------------------------


def test_off_is_one_shared_no_op() -> None:
    off = Tracing.from_config(TelemetryConfig(), env={})
    assert off is Tracing.off() and not off.enabled


def test_off_allocates_nothing_per_call() -> None:
    off = Tracing.off()
    headers = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}

    def calls() -> None:
        off.start_turn("agent", "chat")
        with off.client("POST", "/run_sse", "http://adk/run_sse") as call:
            call.answered(200)
        off.server_span(headers, "POST", "/api/chat", "/api/chat")
        off.annotate(agent="a")
        off.approval_waiting("gw-1", "agent", "tool", "chat")
        off.approval_decided("gw-1", "approved", "person")
        off.exemplar()
        off.approval_exemplar("gw-1")

    calls()  # warm (first-call caches)
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for _ in range(1000):
            calls()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename") if "tracing.py" in str(stat.traceback))
    # Nothing kept per call (1000 calls keeping a byte each would show): the helpers return at `enabled`.
    assert grown < 1000
    assert off.client("GET", "/x", "http://adk/x") is off.client("GET", "/y", "http://adk/y")


def test_off_does_not_import_opentelemetry() -> None:
    import subprocess

    code = (
        "import sys, gateway.edge.app; from gateway.config.schema import parse_config; "
        "gateway.edge.app.create_app(parse_config('', env={})); "
        "print(any(m.startswith('opentelemetry') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={"PATH": "/usr/bin"}, check=True)
    assert out.stdout.strip() == "False"


async def test_off_the_per_event_path_never_touches_the_tracer(monkeypatch: pytest.MonkeyPatch) -> None:
    # Turns of 10 and of 1,000 events through the real app: the tracer (off) is touched the same
    # number of times, per request and per turn, never per event.
    from collections import Counter

    from aiohttp.test_utils import TestClient

    from gateway.edge.app import create_app
    from gateway.edge.state import GATEWAY
    from tests.support.adk import ScriptedAdk
    from tests.unit.test_transport_stop import USER, chat_body, sse_chunks

    class Watched(Tracing):
        def __getattribute__(self, name: str) -> Any:
            if not name.startswith("_"):
                object.__getattribute__(self, "_touched").append(name)
            return object.__getattribute__(self, name)

    watched = Watched()
    watched._touched = []  # type: ignore[attr-defined]
    monkeypatch.setattr(Tracing, "off", staticmethod(lambda: watched))
    app = create_app(parse_config("auth:\n  mode: none\n", env={}))
    assert app[GATEWAY].tracing is watched
    adk = ScriptedAdk()
    for agent in app[GATEWAY].agents:
        agent.client = adk  # type: ignore[assignment]
    touched: dict[int, Counter[str]] = {}
    async with TestClient(TestServer(app)) as client:
        for n in (10, 1000):
            watched._touched.clear()  # type: ignore[attr-defined]
            adk.says(*["word "] * n)
            adk.ends()
            response = await client.post("/api/chat", json=chat_body(USER, chat_id=f"chat-{n}"))
            chunks = sse_chunks(await response.text())
            assert sum(1 for c in chunks if isinstance(c, dict) and c["type"] == "text-delta") >= n
            touched[n] = Counter(watched._touched)  # type: ignore[attr-defined]
    assert touched[10] == touched[1000] and sum(touched[10].values()) <= 12, touched


def test_on_without_the_extra_is_a_clear_start_up_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with pytest.raises(TracingUnavailable, match=r"pip install 'adk-gateway\[otel\]'"):
        Tracing.from_config(TelemetryConfig(enabled=True), env={})


def test_on_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    tracing = Tracing.from_config(TelemetryConfig(), "r1", env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    assert tracing.enabled and tracing.service == "adk-gateway"


def test_the_default_sampler_keeps_one_new_trace_in_ten_and_the_standard_variable_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.sdk.trace.sampling import Decision

    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    monkeypatch.delenv("OTEL_TRACES_SAMPLER", raising=False)
    sampler = Tracing.from_config(TelemetryConfig(), env=endpoint)._provider.sampler
    assert sampler.get_description() == "ParentBased{root:TraceIdRatioBased{0.1},remoteParentSampled:AlwaysOnSampler,"\
        "remoteParentNotSampled:AlwaysOffSampler,localParentSampled:AlwaysOnSampler,localParentNotSampled:AlwaysOffSampler}"
    import random

    ids = random.Random(27)
    kept = sum(sampler.should_sample(None, ids.getrandbits(128), "t").decision is Decision.RECORD_AND_SAMPLE for _ in range(4096))
    assert 0.07 < kept / 4096 < 0.13
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_on")
    tracing = Tracing.from_config(TelemetryConfig(), env={**endpoint, "OTEL_TRACES_SAMPLER": "always_on"})
    assert tracing._provider.sampler.get_description() == "AlwaysOnSampler"


# ---- on: spans -----------------------------------------------------------------------------


def test_a_request_continues_the_incoming_traceparent_and_parents_the_turn() -> None:
    tracing, exporter = traced()
    headers = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    started = tracing.server_span(headers, "POST", "/api/chat", "/api/chat", agent="demo")
    tracing.annotate(chat_id="c1")
    turn = tracing.start_turn("demo", "c1")
    tracing.end_server(started, 200)
    tracing.end_turn_outcome(turn, "completed")
    tracing.end_turn(turn)
    request, run = sorted(exporter.get_finished_spans(), key=lambda s: s.name)
    assert request.name == "POST /api/chat" and format(request.context.trace_id, "032x") == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert request.parent.span_id == 0x00F067AA0BA902B7 and request.parent.is_remote
    assert request.attributes["adk_gateway.chat_id"] == "c1" and request.attributes["adk_gateway.replica"] == "replica-1"
    assert request.attributes["http.response.status_code"] == 200
    assert run.parent.span_id == request.context.span_id and run.attributes["adk_gateway.outcome"] == "completed"


def test_an_approval_wait_under_the_turn_unless_the_plugin_sent_a_traceparent() -> None:
    tracing, exporter = traced()
    turn = tracing.start_turn("demo", "c1")
    tracing.approval_waiting("gw-1", "demo", "pay", "c1", turn)
    exemplar = tracing.approval_exemplar("gw-1")
    tracing.approval_decided("gw-1", "approved", "approver", ("alice",))
    token = tracing.continue_from({"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})
    tracing.approval_waiting("gw-2", "demo", "pay", "c1", turn)
    tracing.leave(token)
    tracing.approval_decided("gw-2", "timeout", "timeout")
    tracing.approval_decided("gw-unknown", "approved", "person")  # never started: nothing
    first, second = exporter.get_finished_spans()
    assert first.parent.span_id == turn.get_span_context().span_id
    assert exemplar == {"trace_id": format(turn.get_span_context().trace_id, "032x")}
    assert first.attributes["adk_gateway.outcome"] == "approved" and first.attributes["adk_gateway.source"] == "approver"
    assert tuple(first.attributes["adk_gateway.approvers"]) == ("alice",)
    assert second.parent.span_id == 0xB7AD6B7169203331 and "adk_gateway.approvers" not in second.attributes


async def test_every_upstream_call_carries_its_span_s_traceparent() -> None:
    seen: list[tuple[str, str | None]] = []

    async def sessions(request: web.Request) -> web.Response:
        seen.append((request.path, request.headers.get("traceparent")))
        return web.json_response({}, status=409)

    async def run_sse(request: web.Request) -> web.StreamResponse:
        seen.append((request.path, request.headers.get("traceparent")))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"id": "e1", "author": "agent"}\n\n')
        return response

    tracing, exporter = traced()
    async with adk_server(app_name="demo", tracing=tracing) as (routes, client):
        routes["POST", "/apps/demo/users/u1/sessions"] = sessions
        routes["POST", "/run_sse"] = run_sse
        await client.ensure_session("u1", "s1")
        events = [e async for batch in client.run_sse_batches(user_id="u1", session_id="s1", new_message={}) for e in batch]
    assert [e.as_dict() for e in events] == [{"author": "agent"}]  # the fields the gateway reads (core/adk_events.py)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"POST /apps/{app_name}/users/{user_id}/sessions", "POST /run_sse"}
    for path, traceparent in seen:
        name = "POST /run_sse" if path == "/run_sse" else "POST /apps/{app_name}/users/{user_id}/sessions"
        context = spans[name].get_span_context()
        assert traceparent is not None and traceparent.startswith(f"00-{context.trace_id:032x}-{context.span_id:016x}-")
    assert spans["POST /run_sse"].attributes["http.response.status_code"] == 200
    assert "u1" not in spans["POST /run_sse"].name


def test_an_unsampled_turn_calls_upstream_untraced_but_says_so_downstream() -> None:
    # The browser (or a proxy) decided "not sampled": the calls under it record nothing, raise
    # nothing, and still send ADK a traceparent that says "not sampled" (ADK follows the decision).
    tracing, exporter = traced()
    started = tracing.server_span({"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"}, "POST", "/api/chat", "/api/chat")
    for status in (200, 502):
        with tracing.client("POST", "/run_sse", "http://adk/run_sse", {"Content-Type": "application/json"}) as call:
            call.answered(status)
        assert call.headers is not None and call.headers["traceparent"].startswith("00-0af7651916cd43dd8448eb211c80319c-")
        assert call.headers["traceparent"].endswith("-00")
    with pytest.raises(ConnectionResetError), tracing.client("POST", "/run_sse", "http://adk/run_sse"):
        raise ConnectionResetError
    tracing.end_server(started, 200)
    assert exporter.get_finished_spans() == ()


def test_no_traceparent_to_adk_when_off() -> None:
    client = AdkClient(UpstreamConfig(url="http://127.0.0.1:9", app_name="demo"))
    assert client._tracing is Tracing.off()


# ---- exemplars -----------------------------------------------------------------------------


def test_openmetrics_on_request_with_the_trace_as_exemplar() -> None:
    tracing, _ = traced()
    metrics = GatewayMetrics()
    metrics.attach_exemplars(tracing)
    started = tracing.server_span({}, "POST", "/api/chat", "/api/chat")
    metrics.upstream_first_event.labels("demo").observe(0.3, metrics.exemplar())
    trace_id = tracing.exemplar()
    tracing.end_server(started, 200)
    text = metrics.render(openmetrics=True).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    exemplars = [s.exemplar for s in families["adk_gateway_upstream_first_event_seconds"].samples if s.exemplar]
    assert exemplars and exemplars[0].labels == trace_id
    assert b"trace_id" not in metrics.render()


async def test_a_request_s_duration_carries_its_trace_as_exemplar_when_sampled() -> None:
    from types import SimpleNamespace

    from aiohttp.test_utils import TestClient

    from gateway.edge.app import request_context
    from gateway.edge.state import GATEWAY

    async def chat(request: web.Request) -> web.Response:
        return web.json_response({})

    async def scrape(tracing: Tracing, traceparent: str) -> dict[str, Any]:
        metrics = GatewayMetrics()
        app = web.Application(middlewares=[request_context])
        app[GATEWAY] = SimpleNamespace(  # type: ignore[assignment]
            metrics=metrics, tracing=tracing, auth=SimpleNamespace(cors_headers=lambda request: {}),
            config=SimpleNamespace(metrics=SimpleNamespace(path="/metrics")),
        )
        app.router.add_post("/api/chat", chat)
        async with TestClient(TestServer(app)) as client:
            async with client.post("/api/chat", headers={"traceparent": traceparent}) as response:
                assert response.status == 200
        families = {f.name: f for f in text_string_to_metric_families(metrics.render(openmetrics=True).decode())}
        [count] = [s for s in families["adk_gateway_request_duration_seconds"].samples if s.name.endswith("_count")]
        assert count.labels == {"route": "/api/chat", "status_class": "2xx"} and count.value == 1
        return {s.labels["le"]: s.exemplar for s in families["adk_gateway_request_duration_seconds"].samples if s.exemplar}

    sampled, unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
    tracing, _ = traced()
    [exemplar] = (await scrape(tracing, sampled)).values()
    assert exemplar.labels == {"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736"}
    # The parent said "not sampled" (parent-based sampling follows it): no exemplar; nor when off.
    assert await scrape(tracing, unsampled) == {}
    assert await scrape(Tracing.off(), sampled) == {}


def test_no_exemplar_when_off_or_unsampled() -> None:
    metrics = GatewayMetrics()
    assert metrics.exemplar() is None and metrics.approval_exemplar("gw-1") is None
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    provider = TracerProvider(sampler=ALWAYS_OFF)
    tracing = Tracing(provider)
    started = tracing.server_span({}, "POST", "/api/chat", "/api/chat")
    assert tracing.exemplar() is None
    tracing.end_server(started, 200)


async def test_stop_is_bounded_when_the_collector_hangs() -> None:
    import asyncio
    import time

    class Hanging:
        def force_flush(self, timeout_millis: int = 0) -> bool:
            time.sleep(5)
            return True

        def shutdown(self) -> None:
            pass

        def get_tracer(self, *args: Any, **kwargs: Any) -> Any:
            return None

    tracing = Tracing(TracerProvider(), shutdown_timeout=0.2)
    tracing._provider = Hanging()
    started = asyncio.get_running_loop().time()
    await tracing.stop()
    assert asyncio.get_running_loop().time() - started < 2


# ---- work forwarded between replicas --------------------------------------------------------


def test_forwarded_work_carries_a_traceparent_and_tolerates_none() -> None:
    from gateway.cluster.messages import Forwarded, Submit, from_json

    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    sent = Forwarded("b", "r1", Submit("alice", "demo", {"id": "c1"}), traceparent)
    assert from_json(sent.to_json()) == sent
    untraced = Forwarded("b", "r1", Submit("alice", "demo", {"id": "c1"}))
    assert "traceparent" not in untraced.to_json() and from_json(untraced.to_json()).trace == ""
    assert from_json({**untraced.to_json(), "traceparent": "not one\n"}).trace == ""
    assert from_json({**untraced.to_json(), "traceparent": traceparent + "\n"}).trace == ""


async def test_a_forward_and_its_service_on_the_owner_are_one_trace() -> None:
    from types import SimpleNamespace

    from gateway.cluster.forwarding import Asker, ForwardedRequests
    from gateway.cluster.liveness import Liveness
    from gateway.cluster.memory import MemoryHub, MemoryState
    from gateway.cluster.messages import Forwarded, Relayed, Reply, Resume, from_json

    tracing, exporter = traced()
    hub = MemoryHub()
    here, owner = MemoryState("b", hub), MemoryState("a", hub)
    asker = Asker(here, Liveness(here, 0.01), forward_timeout=2, tracing=tracing)
    served: list[Any] = []

    async def resume(requests: Any, work: Any, asked: Any) -> Relayed:
        from opentelemetry import trace

        served.append(trace.get_current_span().get_span_context())
        return Relayed(None)

    chats = SimpleNamespace(tracing=tracing)
    metrics = GatewayMetrics()
    requests = ForwardedRequests(owner, chats, metrics, None, None)  # type: ignore[arg-type]
    requests.DISPATCH = {Resume: resume}  # type: ignore[misc]
    received: list[Forwarded] = []

    def inbox(raw: dict[str, Any]) -> None:
        message = from_json(raw)
        assert isinstance(message, Forwarded)
        received.append(message)
        import asyncio

        asyncio.get_running_loop().create_task(requests.serve(message))

    await owner.start(inbox, lambda: [])
    await here.start(lambda raw: asker.answered(from_json(raw)) if "reply" in raw else None, lambda: [])  # type: ignore[arg-type]
    started = tracing.server_span({}, "GET", "/api/chat/{chat_id}/stream", "/api/chat/c1/stream")
    try:
        answer = await asker.ask("a", Resume("alice", "c1", "demo"))
    finally:
        tracing.end_server(started, 200)
    assert answer == Relayed(None)
    untraced = await asker.ask("a", Resume("alice", "c2", "demo"))  # no request span here: nothing to link
    assert untraced == Relayed(None) and received[1].trace == ""
    spans = {s.name: s for s in exporter.get_finished_spans()}
    forward, serve, request = spans["forward resume"], spans["serve resume"], spans["GET /api/chat/{chat_id}/stream"]
    assert forward.parent.span_id == request.context.span_id
    assert received[0].trace.startswith(f"00-{forward.context.trace_id:032x}-{forward.context.span_id:016x}-")
    assert serve.parent.span_id == forward.context.span_id and serve.attributes["adk_gateway.sender"] == "b"
    assert served[0].span_id == serve.context.span_id and not served[1].is_valid
    assert len(exporter.get_finished_spans()) == 3


# ---- user ids as logging.user_id says ------------------------------------------------------

USER_KEY = "k" * 16


async def session_spans(tracing: Tracing, exporter: InMemorySpanExporter, user: str) -> dict[str, Any]:
    """The spans of a session create and a session lookup for `user` against a small ADK."""
    async def sessions(request: web.Request) -> web.Response:
        return web.json_response({}, status=409 if request.method == "POST" else 200)

    async with adk_server(app_name="demo", tracing=tracing) as (routes, client):
        routes["POST", f"/apps/demo/users/{user}/sessions"] = sessions
        routes["GET", f"/apps/demo/users/{user}/sessions/s1"] = sessions
        await client.ensure_session(user, "s1")
        assert await client.session(user, "s1") == {}
    return {s.name: s for s in exporter.get_finished_spans()}


@pytest.mark.parametrize(("mode", "shown"), [("hash", user_id_digest(USER_KEY, "alice@example.com")), ("omit", "REDACTED")])
async def test_no_span_carries_a_user_id_that_logging_hashes_or_omits(mode: str, shown: str) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = Tracing(provider, "adk-gateway", "replica-1", users=user_id_as_logged(mode, USER_KEY))
    spans = await session_spans(tracing, exporter, "alice@example.com")
    tracing.approval_waiting("gw-1", "demo", "pay", "c1")
    tracing.approval_decided("gw-1", "approved", "approver", ("bob@example.com",))
    everything = [dict(s.attributes) for s in exporter.get_finished_spans()] + [s.name for s in exporter.get_finished_spans()]
    assert "alice" not in str(everything) and "bob" not in str(everything)
    created = spans["POST /apps/{app_name}/users/{user_id}/sessions"].attributes["url.full"]
    assert created.endswith(f"/apps/demo/users/{shown}/sessions")
    looked_up = spans["GET /apps/{app_name}/users/{user_id}/sessions/{session_id}"].attributes["url.full"]
    assert looked_up.endswith(f"/apps/demo/users/{shown}/sessions/s1")
    approval = exporter.get_finished_spans()[-1]
    if mode == "hash":
        assert tuple(approval.attributes["adk_gateway.approvers"]) == (user_id_digest(USER_KEY, "bob@example.com"),)
    else:
        assert "adk_gateway.approvers" not in approval.attributes


async def test_plain_user_ids_stay_in_the_spans_as_in_the_logs() -> None:
    tracing, exporter = traced()
    spans = await session_spans(tracing, exporter, "alice@example.com")
    created = spans["POST /apps/{app_name}/users/{user_id}/sessions"].attributes["url.full"]
    assert created.endswith("/apps/demo/users/alice%40example.com/sessions")


@pytest.mark.parametrize(("logging", "shown"), [
    ("", "alice"), (f"logging: {{user_id: hash, user_id_key: {USER_KEY}}}\n", user_id_digest(USER_KEY, "alice")),
    ("logging: {user_id: omit}\n", None),
])
def test_the_app_gives_its_tracer_the_logging_section_s_user_ids(logging: str, shown: str | None) -> None:
    from gateway.edge.app import _users_as_logged

    assert _users_as_logged(parse_config("upstream: {url: 'http://adk:8000'}\n" + logging, env={}))("alice") == shown
