"""The W3C trace context the plugin sends with its calls to the gateway.

ADK runs a tool's callbacks inside its `execute_tool` span; a decision request that carries that
span as `traceparent` (and `tracestate`) lets the gateway put the approval's wait under it, so a
trace viewer draws the person's wait inside ADK's tool call. Only the trace context is sent (never
baggage: it may hold what the agent's operator does not mean to hand the gateway).

opentelemetry-api is what ADK itself traces with, so it is there wherever ADK is; the import is
guarded all the same, and the SDK is never needed: without a configured tracer the current span is
invalid and nothing is sent. Fails open: a propagation error costs the header, never the call.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["trace_headers"]

logger = logging.getLogger("adk_gateway.plugin")

_propagator: Any
try:
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # an agent environment without opentelemetry-api: no trace context to send
    _propagator = None
else:
    # Stateless (it only reads and writes carriers): one for the process.
    _propagator = TraceContextTextMapPropagator()


def trace_headers() -> dict[str, str]:
    """`traceparent` (and `tracestate`) of the current OpenTelemetry span; {} when there is none."""
    if _propagator is None:
        return {}
    carrier: dict[str, str] = {}
    try:
        _propagator.inject(carrier)
    except Exception:  # noqa: BLE001 - a tracing fault must never refuse a tool call
        logger.debug("could not read the trace context", exc_info=True)
        return {}
    return carrier
