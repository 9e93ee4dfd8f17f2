"""Prometheus metrics: every series the gateway exports, in one registry per application.

The registry hangs off the application rather than prometheus_client's global default, so two
gateways in one process (the tests run several) never share counters. Names and labels here are
the contract with dashboards and alerts; docs/metrics.md documents each one. So are the label
values they are counted with (ops/metric_labels.py): every one is exported at 0 from the start.
"""

from __future__ import annotations

import gc
import time
import collections
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

from .redis_pool_metrics import RedisPoolMetrics
from .webhook_metrics import WebhookMetrics

# Re-exported: the series and the label values they are counted with are read from here.
from .exemplars import NO_EXEMPLARS, Exemplars, WithExemplars
from .counts_collector import TOKENS_HELP, CountsCollector
from .metric_labels import (
    APPROVAL_BUCKETS, FIRST_EVENT_BUCKETS, FIRST_TOKEN_BUCKETS, GC_PAUSE_BUCKETS, REQUEST_BUCKETS,
    AGENT_LABELLED, HTTP_METHODS, KNOWN_LABEL_VALUES, OTHER_MODEL, SHADOW_AGREEMENTS, STATUS_CLASSES, TOKEN_KINDS,
    TOOL_OUTCOMES, WEBHOOK_ATTEMPTS, WEBHOOK_EVENTS, WEBHOOK_RESULTS,
)

if TYPE_CHECKING:
    from ..config.agent import ToolPolicy
    from ..config.schema import GatewayConfig

__all__ = ["AGENT_LABELLED", "KNOWN_LABEL_VALUES", "OTHER_MODEL", "TOKEN_KINDS", "TOOL_OUTCOMES",
           "WEBHOOK_ATTEMPTS", "WEBHOOK_EVENTS", "WEBHOOK_RESULTS", "GatewayMetrics"]

# (usage field, count key) for each token kind a usage of one shape counts.
_TokenPlan = tuple[tuple[str, tuple[str, str, str]], ...]
# Shapes remembered at most: an upstream that varies its usage's fields only misses the memo.
_TOKEN_PLANS: Final = 256


def _token_plan(agent: str, model: str, usage: Mapping[str, Any]) -> _TokenPlan:
    """Each kind's first field the usage has (whatever its value) and the count it adds to."""
    plan = []
    for kind, fields in TOKEN_KINDS:
        for field in fields:
            if field in usage:
                plan.append((field, (agent, model, kind)))
                break
    return tuple(plan)


class GatewayMetrics(WithExemplars):
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._browser_series(self.registry)
        self._upstream_series(self.registry)
        self._approval_series(self.registry)
        self._policy_series(self.registry)
        self._gateway_series(self.registry)
        self._gc_series(self.registry)
        # The approval webhooks' (approvals/webhooks.py).
        self.webhooks = WebhookMetrics(self.registry)
        # The Redis connection pool's waits (cluster/redis_pool.py).
        self.redis_pool = RedisPoolMetrics(self.registry)
        self._export_known_at_zero()
        # The latency histograms' exemplars, the sampled trace's id: the tracer, when traces are on.
        self._exemplars: Exemplars = NO_EXEMPLARS

    def _browser_series(self, r: CollectorRegistry) -> None:
        """What browsers asked and were answered: requests, streams, chunks, WebSocket frames, refusals."""
        self.http_requests = Counter(
            "adk_gateway_http_requests_total", "HTTP requests answered, by route, method and status.",
            ["route", "method", "status"], registry=r,
        )
        # Its children by (route, method, status): every request counts one, and prometheus_client's
        # labels() validates and locks per call (~1.5% of a short turn's CPU, bench turns phase).
        self._http_children: dict[tuple[str, str, str], Any] = {}
        self.request_duration = Histogram(
            "adk_gateway_request_duration_seconds",
            "From a request's arrival to the end of its answer (a streamed turn: its last chunk), by route "
            "template and status class (2xx, 3xx, 4xx, 5xx); WebSocket upgrades are not timed.",
            ["route", "status_class"], buckets=REQUEST_BUCKETS, registry=r,
        )
        # Its children by (route, status), as the counter's above.
        self._duration_children: dict[tuple[str, str], Any] = {}
        self.active_streams = Gauge(
            "adk_gateway_active_streams", "Browser responses being streamed right now, by transport.",
            ["transport"], registry=r,
        )
        # Counted in a plain dict and exported by a collector: a labelled Counter takes a lock per
        # inc(), a measurable share of an event's cost on the hot path.
        # UI chunks emitted by type: a collections.Counter (a dict) that the chats (chat/carry_out.py) add a
        # write's chunk types to with its C-coded update (a Counter child per chunk cost more than
        # the chunk's encoding), turned into a counter at scrape time.
        self.chunk_counts: collections.Counter[str] = collections.Counter()
        r.register(CountsCollector("adk_gateway_chunks", "UI message chunks emitted, by chunk type.", ["type"], self.chunk_counts))
        self.ws_connections = Gauge("adk_gateway_ws_connections", "Open browser WebSocket connections.", registry=r)
        self.ws_frames = Counter(
            "adk_gateway_ws_frames_total", "WebSocket frames, by direction (in, out) and frame type.",
            ["direction", "type"], registry=r,
        )
        self.audio_bytes = Counter(
            "adk_gateway_audio_bytes_total", "Audio bytes relayed, by direction (in: browser to agent, out).",
            ["direction"], registry=r,
        )
        self.limited = Counter(
            "adk_gateway_limited_total", "Requests refused by a limit, by reason (rate_limited, too_many_streams, "
            "gateway_busy, too_many_chats, too_many_messages, body_too_large, body_timeout, header_timeout, draining, "
            "unauthorized, origin_not_allowed, ...).",
            ["reason"], registry=r,
        )
        self.shared_limits = Counter(
            "adk_gateway_shared_limit_checks_total",
            "Per-user limit checks shared by the replicas (sessions.backend redis), by check (rate, stream) and "
            "result: admitted or limited (one Redis round trip each), local or refused (Redis unreachable: "
            "limits.shared_fallback applied).",
            ["check", "result"], registry=r,
        )

    def _upstream_series(self, r: CollectorRegistry) -> None:
        """Each agent's upstream: its health, its errors, its runs and live sessions."""
        self.upstream_errors = Counter(
            "adk_gateway_upstream_errors_total",
            "Failed upstream interactions, by agent and kind (connect, timeout, reset, http, protocol, session_missing, run_error).",
            ["agent", "kind"], registry=r,
        )
        self.upstream_first_event = Histogram(
            "adk_gateway_upstream_first_event_seconds", "From sending a run upstream to its first event, by agent.",
            ["agent"], buckets=FIRST_EVENT_BUCKETS, registry=r,
        )
        self.upstream_up = Gauge(
            "adk_gateway_upstream_up", "1 when the last health probe of the agent's upstream succeeded, by agent.",
            ["agent"], registry=r,
        )
        self.browser_runs = Counter(
            "adk_gateway_browser_runs_total",
            "Browser responses ended, by agent, protocol (ai_sdk, ag_ui) and outcome (docs/metrics.md).", ["agent", "protocol", "outcome"], registry=r,
        )
        self.runs = Counter(
            "adk_gateway_runs_total", "Upstream runs finished, by agent and outcome (completed, waiting, error, cancelled).",
            ["agent", "outcome"], registry=r,
        )
        self.live_sessions = Gauge("adk_gateway_live_sessions", "Open ADK live (run_live) sessions, by agent.", ["agent"], registry=r)
        # Tokens are counted on every LLM call's final event (on a tool-heavy stream, most events):
        # plain counts read at scrape time, as chunks are, not a Counter child's lock per kind
        # (~7% of the gateway's CPU on bench's tool-heavy stream, docs/performance.md).
        self._token_counts: dict[tuple[str, str, str], int] = {}
        r.register(CountsCollector("adk_gateway_tokens", TOKENS_HELP, ["agent", "model", "kind"], self._token_counts))
        # The models kept as `model` label values (metrics.models); know_agents sets them.
        self._token_models: frozenset[str] = frozenset()
        # What a usage of one shape (agent, model label, its field names) counts: a stream's usages
        # mostly share theirs, and finding each kind's field was most of the work (issue 29).
        self._token_plans: dict[tuple[str, str, tuple[str, ...]], _TokenPlan] = {}
        self.first_token = Histogram(
            "adk_gateway_first_token_seconds",
            "From a run's start to the first words (text, reasoning or audio) written for the browser, by agent.",
            ["agent"], buckets=FIRST_TOKEN_BUCKETS, registry=r,
        )

    def _approval_series(self, r: CollectorRegistry) -> None:
        """Tool calls that wait for a person, and what the ADK plugin asked."""
        self.approvals_pending = Gauge(
            "adk_gateway_approvals_pending", "Tool calls waiting for a person's decision, by agent.", ["agent"], registry=r
        )
        self.approvals_over_user_cap = Counter(
            "adk_gateway_approvals_over_user_cap_total",
            "Gated calls refused because their user had max_pending_approvals_per_user approvals listed, by agent.", ["agent"], registry=r)
        self.approval_wait = Histogram(
            "adk_gateway_approval_wait_seconds",
            "From an approval request reaching the browser to the decision, by agent, tool and outcome "
            "(approved, denied, timeout, cancelled, abandoned).",
            ["agent", "tool", "outcome"], buckets=APPROVAL_BUCKETS, registry=r,
        )
        self.approval_decisions = Counter(
            "adk_gateway_approval_decisions_total",
            "Approvals decided, by agent, source (person, approver, rule, timeout, cancel, give_up) and outcome.",
            ["agent", "source", "outcome"], registry=r,
        )
        self.approval_decision_wait = Histogram(
            "adk_gateway_approval_decision_wait_seconds",
            "From an approval's start to its decision, by agent and source (a rule's is 0).",
            ["agent", "source"], buckets=APPROVAL_BUCKETS, registry=r,
        )
        self.approval_timeouts = Counter("adk_gateway_approval_timeouts_total",
                                         "Approvals that reached their deadline unanswered, by agent and tool.", ["agent", "tool"], registry=r)
        self.browser_tool_wait = Histogram(
            "adk_gateway_browser_tool_wait_seconds",
            "From a browser tool call being handed to the browser to its output, by agent, tool and outcome "
            "(output, error, timeout, cancelled, abandoned).",
            ["agent", "tool", "outcome"], buckets=APPROVAL_BUCKETS, registry=r,
        )
        self.plugin_requests = Counter(
            "adk_gateway_plugin_requests_total",
            "Decision requests from the ADK plugin, by agent (\"\" when the request names no agent's app) and "
            "result (run, respond, not_gated, no_browser, too_many_pending, unknown_agent, unauthorized, invalid, "
            "retry_elsewhere, ...).",
            ["agent", "result"], registry=r,
        )
        self.policy_bypassed = Counter(
            "adk_gateway_policy_bypassed_total",
            "Gated tools that returned a result without the plugin asking first (plugin not installed?), by agent and tool.",
            ["agent", "tool"], registry=r,
        )

    def _policy_series(self, r: CollectorRegistry) -> None:
        """What the policy decided besides a person (shadow rules, standing grants), and the audit trail."""
        self.grant_decisions = Counter("adk_gateway_grant_decisions_total", "Gated calls a standing grant decided, by agent.", ["agent"], registry=r)
        self.policy_shadow = Counter(
            "adk_gateway_policy_shadow_total", "Calls a shadow rule was evaluated for (never enforced), by agent, tool, rule "
            "and how what it would decide compares with what was decided (agree, stricter, looser, different).",
            ["agent", "tool", "rule", "agreement"], registry=r,
        )
        self.audit_records = Counter(
            "adk_gateway_audit_records_total",
            "Audit records of decided approvals, by what became of them in the shared store: stored, duplicate "
            "(that approval was recorded already), failed (not stored within the retry bound, or at shutdown: the "
            "log line has it), dropped (too many waiting for the store).",
            ["result"], registry=r,
        )

    def _gateway_series(self, r: CollectorRegistry) -> None:
        """The gateway's own state: reloads, readiness, drain, identity keys, replicas."""
        self.config_reloads = Counter("adk_gateway_config_reloads_total", "Configuration reloads, by result (success, failure).",
                                      ["result"], registry=r)
        self.config_last_reload = Gauge(
            "adk_gateway_config_last_reload_success_timestamp_seconds",
            "Unix time of the last successful configuration load.", registry=r,
        )
        self.draining = Gauge("adk_gateway_draining", "1 while the gateway drains before stopping.", registry=r)
        self.jwks_fetches = Counter(
            "adk_gateway_jwks_fetches_total",
            "Fetches of the identity provider's signing keys (auth.jwt.jwks_url or discovery), by result.",
            ["result"], registry=r,
        )
        self.jwks_up = Gauge(
            "adk_gateway_jwks_up",
            "1 when the last fetch of the identity provider's keys succeeded; 0 while it fails (the keys held "
            "keep working). Absent without provider keys.", registry=r,
        )
        self.ws_tickets = Counter(
            "adk_gateway_ws_tickets_total",
            "WebSocket tickets (POST .../api/chat/ws-ticket), by outcome: issued, redeemed by a handshake, "
            "refused (unknown, used, expired, or issued for another agent, origin or auth settings).",
            ["outcome"], registry=r,
        )
        self.ready = Gauge(
            "adk_gateway_ready", "1 when /readyz answers 200 (the default agent's upstream and the session store up, "
            "not draining), else 0.", registry=r,
        )
        self.sessions_up = Gauge(
            "adk_gateway_sessions_backend_up",
            "1 when the shared session store (sessions.backend) is reachable; always 1 for memory.", registry=r,
        )
        self.forwarded = Counter(
            "adk_gateway_forwarded_total",
            "Requests forwarded between replicas, by direction (out: sent to the chat's owner, in: served for another replica).",
            ["direction"], registry=r,
        )
        self.owner_lost = Counter(
            "adk_gateway_owner_lost_total",
            "Work lost with a dead replica, by what (run: a chat taken over mid-run, approval: an answer to one "
            "of its calls, gated_call: a plugin request released fail-closed, stream: a relayed response cut).",
            ["what"], registry=r,
        )

    def _gc_series(self, r: CollectorRegistry) -> None:
        """The garbage collector's pauses (watch_gc)."""
        self.gc_pause = Histogram(
            "adk_gateway_gc_pause_seconds",
            "Python garbage collector pauses (the event loop, and so every stream, stands still), by generation.",
            ["generation"], buckets=GC_PAUSE_BUCKETS, registry=r,
        )
        self._gc_started = 0.0
        self._gc_pause_by_generation = [self.gc_pause.labels(str(g)) for g in range(3)]

    def _export_known_at_zero(self) -> None:
        """Every known label value at 0 from the start (KNOWN_LABEL_VALUES says why)."""
        for attribute, label_sets in KNOWN_LABEL_VALUES.items():
            if attribute in AGENT_LABELLED:
                continue  # per agent: know_agents
            metric = getattr(self, attribute)
            for values in label_sets:
                metric.labels(*values)
        # Plugin requests that name no agent's app (unauthorized, invalid, an unknown app).
        for values in KNOWN_LABEL_VALUES["plugin_requests"]:
            self.plugin_requests.labels("", *values)

    def count_request(
        self, route: str, method: str, status: str, duration: float | None = None, exemplar: dict[str, str] | None = None,
    ) -> None:
        """Count one answered request, and time it (`duration` seconds; `exemplar`: its sampled
        trace). `route` is a route template or "unmatched", never the path; a method outside the
        standard ones counts as "other" (aiohttp's pure-Python parser takes any token as a method:
        each would otherwise be a new series)."""
        if method not in HTTP_METHODS:
            method = "other"
        key = (route, method, status)
        child = self._http_children.get(key)
        if child is None:
            child = self._http_children[key] = self.http_requests.labels(route, method, status)
        child.inc()
        if duration is None:
            return
        timed = self._duration_children.get((route, status))
        if timed is None:
            status_class = f"{status[:1]}xx"
            if status_class not in STATUS_CLASSES:
                return  # a 101: the WebSocket's whole life, not a request's
            timed = self._duration_children[(route, status)] = self.request_duration.labels(route, status_class)
        timed.observe(duration, exemplar)

    def jwks_fetched(self, ok: bool) -> None:
        self.jwks_fetches.labels("success" if ok else "failure").inc()
        self.jwks_up.set(1 if ok else 0)

    def upstream_health(self, agent: str, up: bool) -> None:
        self.upstream_up.labels(agent).set(1 if up else 0)

    def count_tokens(self, agent: str, model: str, usage: Mapping[str, Any]) -> None:
        """Count one LLM call's usage (ADK's usageMetadata). A model `metrics.models` does not list
        counts as "other": the label's values are the config's, whatever the upstream reports."""
        if model not in self._token_models:
            model = OTHER_MODEL
        plans = self._token_plans
        shape = (agent, model, tuple(usage)) if type(usage) is dict else None
        plan = plans.get(shape) if shape is not None else None
        if plan is None:
            plan = _token_plan(agent, model, usage)
            if shape is not None and len(plans) < _TOKEN_PLANS:
                plans[shape] = plan
        counts = self._token_counts
        for field, key in plan:
            value = usage[field]
            if type(value) is int and value > 0:
                counts[key] = counts.get(key, 0) + value

    def know_agents(self, config: GatewayConfig) -> None:
        """Export each agent's series at 0 until counted, its tools' too. Idempotent: a reload calls
        it again for the agents and tools it adds; series of agents it removes stay (at their last value)."""
        self._token_models = frozenset(config.metrics.models)
        models = (*config.metrics.models, OTHER_MODEL)
        for name, agent in config.agents.items():
            for attribute in ("upstream_up", "approvals_pending", "approvals_over_user_cap", "live_sessions",
                              "upstream_first_event", "first_token", "grant_decisions"):
                getattr(self, attribute).labels(name)
            for model in models:
                for kind, _ in TOKEN_KINDS:
                    self._token_counts.setdefault((name, model, kind), 0)
            for attribute in AGENT_LABELLED & KNOWN_LABEL_VALUES.keys():
                metric = getattr(self, attribute)
                for values in KNOWN_LABEL_VALUES[attribute]:
                    metric.labels(name, *values)
            self.know_tools(name, agent.tools)

    def know_tools(self, agent: str, tools: Mapping[str, ToolPolicy]) -> None:
        """Export the per-tool series of each tool the policy names, at 0 until counted.

        Only the series a tool's policy can move: a tool without approval never times out waiting
        for a person. `default` names no tool (the tools it covers show up when first counted).
        Idempotent, so a reload calls it again for the tools it adds; series of tools it drops stay.
        """
        for name, policy in tools.items():
            if name == "default":
                continue
            if policy.gated:
                self.policy_bypassed.labels(agent, name)
            if policy.approval:
                self.approval_timeouts.labels(agent, name)
                for outcome in TOOL_OUTCOMES["approval_wait"]:
                    self.approval_wait.labels(agent, name, outcome)
            if policy.runs_in == "browser":
                for outcome in TOOL_OUTCOMES["browser_tool_wait"]:
                    self.browser_tool_wait.labels(agent, name, outcome)
            for rule, agreement in ((rule.name, a) for rule in policy.rules if rule.shadow for a in SHADOW_AGREEMENTS):
                self.policy_shadow.labels(agent, name, rule, agreement)

    def watch_gc(self) -> None:
        """Time the collector's pauses into `adk_gateway_gc_pause_seconds` until `unwatch_gc`."""
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)

    def unwatch_gc(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self._gc_pause_by_generation[info["generation"]].observe(time.perf_counter() - self._gc_started)

    def render(self, openmetrics: bool = False) -> bytes:
        """The Prometheus text format; `openmetrics`: OpenMetrics, the one with exemplars."""
        return (openmetrics_latest if openmetrics else generate_latest)(self.registry)
