"""Where the gateway's spans go: the OpenTelemetry SDK's provider, exporting over OTLP/HTTP with the
gateway's default sampler, and its bounded flush at stop. Imported only when tracing is on (the
`otel` extra); tracing.py owns the spans themselves.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from typing import Any, Final

import structlog

from ..config.telemetry import TelemetryConfig

__all__ = ["DEFAULT_SAMPLE_RATIO", "TracingUnavailable", "exporting_provider", "flush_and_stop", "follows_parent"]

log = structlog.get_logger("adk_gateway.ops.trace_export")

# Without OTEL_TRACES_SAMPLER: parent-based, keeping this share of the traces that start here. Every
# trace kept costs its spans' recording and export, a fifth to a third of a short turn's CPU (bench
# `--only tracing`, docs/operations.md#tracing); one in ten keeps that near 3%.
DEFAULT_SAMPLE_RATIO: Final = 0.1


class TracingUnavailable(Exception):
    """Tracing is on but the OpenTelemetry SDK or its OTLP exporter is not installed."""


def exporting_provider(config: TelemetryConfig, replica: str, env: Mapping[str, str]) -> tuple[Any, str]:
    """The SDK's tracer provider exporting over OTLP/HTTP, and the service name it reports."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise TracingUnavailable(
            f"telemetry is enabled (telemetry.enabled or OTEL_EXPORTER_OTLP_ENDPOINT) but OpenTelemetry is not "
            f"installed ({exc.name}): pip install 'adk-gateway[otel]', or unset the endpoint / set telemetry.enabled: false"
        ) from None
    service = config.service_in(env)
    attributes = {"service.name": service}
    if replica:
        attributes["service.instance.id"] = replica
    # OTEL_TRACES_SAMPLER / _ARG, when set, are the SDK's to read (sampler None); unset, the
    # gateway's default, not the SDK's (which keeps every trace). The exporter reads the
    # endpoint, headers, timeout and compression.
    sampler = None
    if not env.get("OTEL_TRACES_SAMPLER", "").strip():
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        sampler = ParentBased(TraceIdRatioBased(DEFAULT_SAMPLE_RATIO))
    # No exit hook: a collector that hangs must not hold the process (flush_and_stop bounds the flush).
    provider = TracerProvider(resource=Resource.create(attributes), sampler=sampler, shutdown_on_exit=False)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    log.info("tracing_enabled", service=service, sampler=provider.sampler.get_description())
    return provider, service


async def flush_and_stop(provider: Any, timeout: float) -> None:
    """Export what is queued and shut the provider down, waiting `timeout` at most (a thread of its
    own: the exporter's HTTP call blocks, and a collector that hangs must not hold the exit)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def flush() -> None:
        try:
            provider.force_flush(int(timeout * 1000))
            provider.shutdown()
        except Exception:  # noqa: BLE001 - an exporter's failure must not break the stop
            log.warning("tracing_flush_failed", exc_info=True)
        try:
            loop.call_soon_threadsafe(lambda: done.done() or done.set_result(None))
        except RuntimeError:
            pass  # the loop is gone: nobody waits any more

    threading.Thread(target=flush, name="otel-flush", daemon=True).start()
    try:
        await asyncio.wait_for(asyncio.shield(done), timeout + 0.5)
    except TimeoutError:
        log.warning("tracing_flush_timed_out", timeout_s=timeout)


def follows_parent(sampler: Any) -> bool:
    """Whether `sampler` drops every child of an unsampled parent, local or remote (the SDK's
    parent-based samplers as the OTEL_TRACES_SAMPLER values build them, and the gateway's default)."""
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased

    return isinstance(sampler, ParentBased) and all(
        getattr(sampler, name, None) is ALWAYS_OFF for name in ("_remote_parent_not_sampled", "_local_parent_not_sampled")
    )
