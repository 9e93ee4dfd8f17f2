"""`python -m tests.otlp_receiver`, the trace viewer docs/operations.md offers for a look at the
demo's traces without Docker: a real OTLP/HTTP export, by the SDK's own exporter as the gateway and
ADK use it, comes out as one line per span."""

from __future__ import annotations

import subprocess
import sys

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from tests.procs import ROOT, free_port, stop_process


def test_the_viewer_prints_each_exported_span() -> None:
    port = free_port()
    viewer = subprocess.Popen(
        [sys.executable, "-m", "tests.otlp_receiver", str(port)], cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert viewer.stdout is not None
        assert f"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:{port}" in viewer.stdout.readline()
        provider = TracerProvider(resource=Resource.create({"service.name": "adk-gateway"}))
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces")))
        with provider.get_tracer("test").start_as_current_span("POST /api/chat"):
            pass
        provider.shutdown()
        line = viewer.stdout.readline()
        assert "adk-gateway" in line and "POST /api/chat" in line and "(root)" in line, line
    finally:
        stop_process(viewer)
