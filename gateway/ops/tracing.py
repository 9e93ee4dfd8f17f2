"""OpenTelemetry traces: the gateway's spans, their export over OTLP/HTTP, and the no-op path when off.

`Tracing` is made once per application (edge/app.py) from the `telemetry:` section and handed to
what makes spans: the request middleware and the WebSocket `send` (a SERVER span each, continuing
an incoming W3C `traceparent`), the chat (chat/record.py: one INTERNAL span per turn, from RunStarts to the
run's end, under the request that started it), the ADK client (a CLIENT span per upstream call,
whose `traceparent` goes out in the request's headers so ADK's own spans join the trace) and the
approval notices (one span per approval, from its start to its decision). Never a span per chunk
or per upstream event.

Off (the default without an OTLP endpoint), nothing of OpenTelemetry is imported and every helper
answers from a shared no-op at once (`Tracing.off()`): the hot paths only test `enabled` or get
None. On, the SDK is imported lazily (the `otel` extra); it reads the standard variables for where
to export (OTEL_EXPORTER_OTLP_*) and what to sample (OTEL_TRACES_SAMPLER, _ARG; unset: one trace in
ten that starts here, and every one a sampled `traceparent` continues). The spans follow
the OpenTelemetry semantic conventions 1.37.0: HTTP (stable) for the request and upstream spans,
GenAI (development) attribute names where they apply (docs/operations.md#tracing).
User ids reach a span only as `logging.user_id` writes them in the logs (`user_shown`).
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Callable, Mapping
from typing import Any, Final

from ..config.telemetry import TelemetryConfig
from .trace_export import TracingUnavailable, exporting_provider, flush_and_stop, follows_parent

__all__ = ["ClientCall", "Tracing", "TracingUnavailable"]

SEMCONV_VERSION: Final = "1.37.0"
# Approvals waiting at once whose spans are kept open; beyond it a new one gets no span (a leak's bound).
_MAX_OPEN_WAITS: Final = 10_000
# A user id the logs omit, in `url.full` (the semantic conventions' word for a redacted part).
REDACTED: Final = "REDACTED"


class ClientCall:
    """One upstream call's span, a context manager: `headers` to send (the base ones and
    `traceparent`; None from the no-op one, tracing off: the caller sends its own), `answered`
    with the status; leaving it ends the span, with the error that left it if one did."""

    __slots__ = ("_failed", "_span", "headers")

    def __init__(self, span: Any = None, headers: dict[str, str] | None = None) -> None:
        # A recording span, or None: an unsampled call's span records nothing, so it is not kept.
        self._span = span
        self.headers = headers
        self._failed = False

    def __enter__(self) -> ClientCall:
        return self

    def answered(self, status: int) -> None:
        if self._span is not None:
            self._span.set_attribute("http.response.status_code", status)
            if status >= 400:
                self._failed = True
                self._span.set_attribute("error.type", str(status))

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> None:
        span = self._span
        if span is None:
            return
        self._span = None
        if error is not None and not isinstance(error, GeneratorExit):
            # An UpstreamError's kind (connect, timeout, reset, ...), as the metrics count it.
            span.set_attribute("error.type", getattr(error, "kind", None) or type(error).__name__)
            self._failed = True
        if self._failed:
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR))
        span.end()


_NO_CALL: Final = ClientCall()


class Tracing:
    """The gateway's tracer. `Tracing.off()` is the shared no-op; `Tracing.from_config` the one the
    configuration asks for (raising TracingUnavailable when it is on and the extra is missing)."""

    def __init__(
        self, provider: Any = None, service: str = "", replica: str = "", shutdown_timeout: float = 2.0,
        users: Callable[[str], str | None] = str,
    ) -> None:
        self._provider = provider
        # A user id as the logs write it (ops/logs.py user_id_as_logged; None: not at all).
        self._users = users
        # Tested by every caller before any span work: False makes each helper a no-op.
        self.enabled = provider is not None
        self.service = service
        self.replica = replica
        self._shutdown_timeout = shutdown_timeout
        self._tracer: Any = provider.get_tracer("adk_gateway", schema_url=f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}") if provider else None
        self._propagator: Any = None
        # The API's modules, imported once (an import statement per call costs a lookup each).
        self._trace: Any = None
        self._context: Any = None
        # Whether the sampler follows an unsampled parent (every parent-based one does): then a
        # child of an unsampled span is never started (`_unsampled`).
        self._follows_parent = False
        # Each approval waiting for a decision, by approval id: its span (sampled ones only).
        self._waits: dict[str, Any] = {}
        if provider is not None:
            from opentelemetry import context, trace
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

            self._propagator = TraceContextTextMapPropagator()
            self._trace, self._context = trace, context
            self._follows_parent = follows_parent(getattr(provider, "sampler", None))

    @staticmethod
    def off() -> Tracing:
        """The no-op tracer (tracing off), one per process: nothing to allocate per caller."""
        return _OFF

    @classmethod
    def from_config(
        cls, config: TelemetryConfig, replica: str = "", env: Mapping[str, str] | None = None,
        users: Callable[[str], str | None] = str,
    ) -> Tracing:
        env = os.environ if env is None else env
        if not config.enabled_in(env):
            return cls.off()
        provider, service = exporting_provider(config, replica, env)
        return cls(provider, service, replica, config.shutdown_timeout, users)

    def user_shown(self, user_id: str) -> str:
        """`user_id` as the logs write it (a hash leads from a trace to the user's lines), or REDACTED."""
        return self._users(user_id) or REDACTED

    async def stop(self) -> None:
        """Export what is queued and stop, waiting `shutdown_timeout` at most."""
        provider = self._provider
        if provider is None:
            return
        for span in self._waits.values():
            span.end()
        self._waits.clear()
        await flush_and_stop(provider, self._shutdown_timeout)

    # ---- the browser's requests ------------------------------------------------------------

    def server_span(self, headers: Mapping[str, str], method: str, route: str, path: str, **attributes: Any) -> Any:
        """Start a SERVER span continuing the `traceparent` in `headers`, current until `end_server`
        is given the token this returns; None when off."""
        if not self.enabled:
            return None
        trace = self._trace
        parent = self._propagator.extract(headers)
        span = self._unsampled(parent)
        if span is None:
            span = self._tracer.start_span(
                f"{method} {route}", context=parent, kind=trace.SpanKind.SERVER,
                attributes={"http.request.method": method, "http.route": route, "url.path": path, **self._replica(), **_prefixed(attributes)},
            )
        return span, self._context.attach(trace.set_span_in_context(span, parent))

    def end_server(self, started: Any, status: int) -> None:
        if started is None:
            return
        span, token = started
        if span.is_recording():
            span.set_attribute("http.response.status_code", status)
            if status >= 500:
                from opentelemetry.trace import Status, StatusCode

                span.set_attribute("error.type", str(status))
                span.set_status(Status(StatusCode.ERROR))
            span.end()
        self._context.detach(token)

    @staticmethod
    def server_exemplar(started: Any) -> dict[str, str] | None:
        """The exemplar of a request's duration: its SERVER span's trace (`server_span`'s result), if sampled."""
        return _exemplar_of(started[0].get_span_context()) if started is not None else None

    def continue_from(self, headers: Mapping[str, str]) -> Any:
        """Make the `traceparent` in `headers` (if any) the current context, without a span of
        the gateway's; the token for `leave`, or None."""
        if not self.enabled or "traceparent" not in headers:
            return None
        return self._context.attach(self._propagator.extract(headers))

    @staticmethod
    def leave(token: Any) -> None:
        if token is not None:
            from opentelemetry import context

            context.detach(token)

    def annotate(self, **attributes: Any) -> None:
        """Add `adk_gateway.<name>` attributes to the current span (the request's: its agent, its chat)."""
        if not self.enabled:
            return
        span = self._trace.get_current_span()
        if span.is_recording():
            span.set_attributes(_prefixed(attributes))

    # ---- turns -----------------------------------------------------------------------------

    def start_turn(self, agent: str, chat_id: str) -> Any:
        """A turn's INTERNAL span, child of the current span (the request that starts it); None when off."""
        if not self.enabled:
            return None
        unsampled = self._unsampled()
        if unsampled is not None:
            return unsampled
        return self._tracer.start_span(
            f"turn {agent}", kind=self._trace.SpanKind.INTERNAL,
            attributes={
                "adk_gateway.agent": agent, "adk_gateway.chat_id": chat_id, **self._replica(),
                "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent, "gen_ai.conversation.id": chat_id,
            },
        )

    def context_with(self, span: Any) -> contextvars.Context:
        """A copy of the current context in which `span` is current: the run's task runs in it, so
        what the run calls upstream is the turn's child, though the task outlives the request."""
        ctx = contextvars.copy_context()
        ctx.run(self._context.attach, self._trace.set_span_in_context(span))
        return ctx

    @staticmethod
    def end_turn_outcome(span: Any, outcome: str) -> None:
        """The run's end, as the machine tells it (completed, waiting, error, cancelled)."""
        span.set_attribute("adk_gateway.outcome", outcome)
        if outcome == "error":
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR))

    @staticmethod
    def end_turn(span: Any) -> None:
        """The run's task ended: its span with it."""
        span.end()

    # ---- upstream calls --------------------------------------------------------------------

    def client(self, method: str, route: str, url: str, headers: Mapping[str, str] | None = None, **attributes: Any) -> ClientCall:
        """A CLIENT span for one call to ADK (`route` a template: no user or session id in the
        name), child of the current span, its `traceparent` in the returned headers; not current
        (an upstream stream is read across awaits and tasks). The shared no-op when off."""
        if not self.enabled:
            return _NO_CALL
        out = dict(headers or {})
        if self._unsampled() is not None:
            # The traceparent still goes, flagged unsampled: ADK follows the decision.
            self._propagator.inject(out)
            return ClientCall(None, out)
        trace = self._trace
        span = self._tracer.start_span(
            f"{method} {route}", kind=trace.SpanKind.CLIENT,
            attributes={"http.request.method": method, "url.full": _without_query(url), "http.route": route, **_prefixed(attributes)},
        )
        self._propagator.inject(out, context=trace.set_span_in_context(span))
        return ClientCall(span if span.is_recording() else None, out)

    # ---- work forwarded between replicas (cluster/forwarding.py) -----------------------------

    def forward(self, op: str, owner: str) -> ClientCall:
        """A CLIENT span for work sent to the chat's owner, its `traceparent` in `headers` for the
        message; the shared no-op when off or when nothing here is traced (a plugin's ask without
        a `traceparent`: its approval's wait then stays under the owner's turn)."""
        if not self.enabled:
            return _NO_CALL
        trace = self._trace
        if not trace.get_current_span().get_span_context().is_valid:
            return _NO_CALL
        out: dict[str, str] = {}
        if self._unsampled() is not None:
            # Unsampled, the owner is told so: its spans follow the decision.
            self._propagator.inject(out)
            return ClientCall(None, out)
        span = self._tracer.start_span(
            f"forward {op}", kind=trace.SpanKind.CLIENT,
            attributes={"adk_gateway.op": op, "adk_gateway.owner": owner, **self._replica()},
        )
        self._propagator.inject(out, context=trace.set_span_in_context(span))
        return ClientCall(span if span.is_recording() else None, out)

    def serve_forwarded(self, traceparent: str, op: str, sender: str) -> Any:
        """The owner's SERVER span for forwarded work, continuing the sender's `traceparent`, current
        until `end_span`; None when off or when the work carries none."""
        if not self.enabled or not traceparent:
            return None
        trace = self._trace
        parent = self._propagator.extract({"traceparent": traceparent})
        span = self._unsampled(parent)
        if span is None:
            span = self._tracer.start_span(
                f"serve {op}", context=parent, kind=trace.SpanKind.SERVER,
                attributes={"adk_gateway.op": op, "adk_gateway.sender": sender, **self._replica()},
            )
        return span, self._context.attach(trace.set_span_in_context(span, parent))

    @staticmethod
    def end_span(started: Any, error: str | None = None) -> None:
        if started is None:
            return
        from opentelemetry import context
        from opentelemetry.trace import Status, StatusCode

        span, token = started
        if error is not None:
            span.set_attribute("error.type", error)
            span.set_status(Status(StatusCode.ERROR))
        span.end()
        context.detach(token)

    # ---- approvals -------------------------------------------------------------------------

    def approval_waiting(self, approval_id: str, agent: str, tool: str, chat_id: str, parent: Any = None, **attributes: Any) -> None:
        """Start the span of one approval's wait. Its parent: the current span if there is one (the
        plugin's request carrying a `traceparent`), else `parent` (the turn's span)."""
        if not self.enabled or approval_id in self._waits or len(self._waits) >= _MAX_OPEN_WAITS:
            return
        trace = self._trace
        current = trace.get_current_span()
        context = None if current.get_span_context().is_valid or parent is None else trace.set_span_in_context(parent)
        if self._unsampled(context) is not None:
            return  # an unsampled turn's wait: nothing to record, nothing kept
        self._waits[approval_id] = self._tracer.start_span(
            f"approval {tool}", context=context, kind=trace.SpanKind.INTERNAL,
            attributes={
                "adk_gateway.approval_id": approval_id, "adk_gateway.agent": agent, "adk_gateway.tool": tool,
                "adk_gateway.chat_id": chat_id, "gen_ai.tool.name": tool, **self._replica(), **_prefixed(attributes),
            },
        )

    def approval_decided(self, approval_id: str, outcome: str, source: str, approvers: tuple[str, ...] = ()) -> None:
        """End the span of an approval's wait with what was decided and by whom (their user ids as the logs write them)."""
        if not self.enabled:
            return
        span = self._waits.pop(approval_id, None)
        if span is None:
            return
        span.set_attribute("adk_gateway.outcome", outcome)
        span.set_attribute("adk_gateway.source", source)
        shown = [user for user in map(self._users, approvers) if user is not None]
        if shown:
            span.set_attribute("adk_gateway.approvers", shown)
        span.end()

    def approval_exemplar(self, approval_id: str) -> dict[str, str] | None:
        """The exemplar of an approval's wait: its span's trace, if sampled."""
        if not self.enabled:
            return None
        span = self._waits.get(approval_id)
        return _exemplar_of(span.get_span_context()) if span is not None else None

    # ---- exemplars -------------------------------------------------------------------------

    def exemplar(self) -> dict[str, str] | None:
        """The current span's trace id as a histogram exemplar, when it is sampled; else None."""
        if not self.enabled:
            return None
        return _exemplar_of(self._trace.get_current_span().get_span_context())

    def _unsampled(self, context: Any = None) -> Any:
        """The current span (or `context`'s) when it is valid, not sampled, and the sampler follows
        its parent: any child would record nothing, so the helpers hand this span on instead of
        starting one (no ids, no sampler call, no attributes: most turns, at the default
        sampling). None otherwise."""
        if not self._follows_parent:
            return None
        span = self._trace.get_current_span(context)
        parent = span.get_span_context()
        return span if parent.is_valid and not parent.trace_flags.sampled else None

    def _replica(self) -> dict[str, str]:
        return {"adk_gateway.replica": self.replica} if self.replica else {}


# Holds nothing that changes: every helper returns at its `enabled` test.
_OFF: Final = Tracing()


def _exemplar_of(context: Any) -> dict[str, str] | None:
    if not context.is_valid or not context.trace_flags.sampled:
        return None
    return {"trace_id": format(context.trace_id, "032x")}


def _prefixed(attributes: Mapping[str, Any]) -> dict[str, Any]:
    return {f"adk_gateway.{name}": value for name, value in attributes.items() if value is not None and value != ""}


def _without_query(url: str) -> str:
    return url.split("?", 1)[0]
