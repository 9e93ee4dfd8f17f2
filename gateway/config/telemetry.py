"""The `telemetry:` section: whether the gateway exports OpenTelemetry traces, and as which service.

Off unless asked: by `enabled: true`, or (the default) by the standard `OTEL_EXPORTER_OTLP_ENDPOINT`
or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` being set, so one variable switches the gateway and an ADK
server on together. `OTEL_SDK_DISABLED=true` turns it off whatever the file says. Where spans go
(endpoint, headers, timeout, protocol) and which are sampled (`OTEL_TRACES_SAMPLER`, `_ARG`) are the
standard variables' alone: the OpenTelemetry SDK reads them (ops/tracing.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import Field

from .values import Duration, Section

__all__ = ["TelemetryConfig"]

_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
DEFAULT_SERVICE = "adk-gateway"


class TelemetryConfig(Section):
    # null (the default): on when OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set.
    enabled: bool | None = None
    # The spans' `service.name`; null: OTEL_SERVICE_NAME, else "adk-gateway".
    service_name: str | None = Field(None, min_length=1, max_length=128)
    # How long a stop waits for the spans not yet exported (bounded: a collector that hangs cannot hold the exit).
    shutdown_timeout: Duration = Field(2.0, gt=0, le=30)

    def enabled_in(self, env: Mapping[str, str]) -> bool:
        """Whether traces are exported, the environment `env` given."""
        if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            return False
        if self.enabled is not None:
            return self.enabled
        return any(env.get(name, "").strip() for name in _ENDPOINTS)

    def service_in(self, env: Mapping[str, str]) -> str:
        return self.service_name or env.get("OTEL_SERVICE_NAME", "").strip() or DEFAULT_SERVICE
