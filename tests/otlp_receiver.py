"""A real OTLP/HTTP trace receiver for the tests: an aiohttp server on 127.0.0.1 (in a thread of its
own, so synchronous tests can use it) that decodes each `ExportTraceServiceRequest` with the
official protobuf messages and keeps the spans, flattened.

Run as a program it is the smallest trace viewer there is, for a look at the demo's traces without
Docker (docs/operations.md, "Tracing"): ``python -m tests.otlp_receiver [PORT]`` (default 4318,
OTLP/HTTP's port) prints one line per span as the exporters send them.
"""

from __future__ import annotations

import asyncio
import gzip
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest, ExportTraceServiceResponse
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from tests.procs import free_port

KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


@dataclass
class Span:
    service: str
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any] = field(default_factory=dict)
    start: int = 0
    end: int = 0


class Receiver:
    """`endpoint` for OTEL_EXPORTER_OTLP_ENDPOINT; `spans` as received; `wait_for(pred)`."""

    def __init__(self, port: int | None = None, on_spans: Callable[[list[Span]], None] | None = None) -> None:
        self.port = port or free_port()
        # Called with each request's spans, in the receiver's thread.
        self.on_spans = on_spans
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.spans: list[Span] = []
        self.requests = 0
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="otlp-receiver", daemon=True)

    def __enter__(self) -> Receiver:
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("the OTLP receiver did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        runner = web.AppRunner(app)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self._started.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())

    async def _traces(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        export = ExportTraceServiceRequest()
        export.ParseFromString(body)
        found = []
        for resource_spans in export.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    found.append(Span(
                        str(resource.get("service.name", "")), span.name, KINDS.get(span.kind, str(span.kind)),
                        span.trace_id.hex(), span.span_id.hex(), span.parent_span_id.hex(),
                        {a.key: _value(a.value) for a in span.attributes}, span.start_time_unix_nano, span.end_time_unix_nano,
                    ))
        with self._lock:
            self.requests += 1
            self.spans.extend(found)
        if self.on_spans is not None:
            self.on_spans(found)
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(), content_type="application/x-protobuf")

    def snapshot(self) -> list[Span]:
        with self._lock:
            return list(self.spans)

    def wait_for(self, predicate: Callable[[list[Span]], bool], timeout: float = 20) -> list[Span]:
        deadline = time.monotonic() + timeout
        while True:
            spans = self.snapshot()
            if predicate(spans) or time.monotonic() > deadline:
                return spans
            time.sleep(0.1)


def span_line(span: Span) -> str:
    """One span, as `python -m tests.otlp_receiver` prints it: the trace's first 8 hex digits group
    a turn's spans; a root span (no parent) is marked."""
    took = (span.end - span.start) / 1e6
    root = "" if span.parent_id else "  (root)"
    return f"trace {span.trace_id[:8]}  {span.service:<12} {span.kind:<8} {took:9.1f} ms  {span.name}{root}"


def main() -> None:
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 4318

    def show(spans: list[Span]) -> None:
        for span in sorted(spans, key=lambda s: s.start):
            print(span_line(span), flush=True)

    with Receiver(port, on_spans=show) as receiver:
        print(f"OTLP/HTTP receiver: OTEL_EXPORTER_OTLP_ENDPOINT={receiver.endpoint} (Ctrl-C stops)", flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
