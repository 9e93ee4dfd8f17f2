"""The label values of the gateway's series (which values each labelled series is counted with), and
the buckets of its histograms.

Every one is exported at 0 from the start (ops/metrics.py `GatewayMetrics`), so that an alert on
`increase()` sees the first event after a restart; tests/unit/test_metrics.py fails when gateway/
counts with a value missing here. Plain data, in a module of its own so the registry's module
stays about the series themselves.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = [
    "APPROVAL_BUCKETS", "FIRST_EVENT_BUCKETS", "FIRST_TOKEN_BUCKETS", "GC_PAUSE_BUCKETS", "REDIS_POOL_WAIT_BUCKETS", "REQUEST_BUCKETS",
    "WEBHOOK_BUCKETS", "AGENT_LABELLED", "HTTP_METHODS", "STATUS_CLASSES", "KNOWN_LABEL_VALUES", "OTHER_MODEL", "TOKEN_KINDS", "TOOL_OUTCOMES",
    "WEBHOOK_ATTEMPTS", "WEBHOOK_EVENTS", "WEBHOOK_RESULTS", "SHADOW_AGREEMENTS", "EMAIL_RESULTS",
]


def _each(*values: str) -> tuple[tuple[str, ...], ...]:
    return tuple((v,) for v in values)


# Every label-value tuple each labelled series is counted with, by GatewayMetrics attribute. All are
# exported at 0 from construction: `increase()` needs a sample from before an event to see it, and a
# series born at its first increment has none, so an alert on it would miss the first event after
# every restart. tests/unit/test_metrics.py fails when gateway/ counts with a value missing here.
# Not listed, so born at first use: http_requests (any status), request_duration (each route
# template answered, by STATUS_CLASSES), chunks (any chunk type), and the per-tool series, which `GatewayMetrics.know_agents` creates from each agent's tool policy.
# Metrics in AGENT_LABELLED carry the agent first; their values here are those after it, and
# `know_agents` creates them for each agent of the config.
KNOWN_LABEL_VALUES: Mapping[str, tuple[tuple[str, ...], ...]] = MappingProxyType({
    "active_streams": _each("sse", "ws", "ag-ui"),
    "browser_runs": tuple(("ai_sdk", o) for o in ("completed", "disconnected", "failed"))
    + tuple(("ag_ui", o) for o in ("success", "interrupt", "error", "cancelled", "refused", "disconnected")),
    "upstream_errors": _each("connect", "timeout", "reset", "http", "protocol", "session_missing", "run_error"),
    "runs": _each("completed", "waiting", "error", "cancelled"),
    "plugin_requests": _each(
        "run", "respond", "not_gated", "rule", "confirm", "no_browser", "too_many_pending", "unauthorized", "invalid",
        "owner_lost", "sessions_unavailable", "replica_unavailable", "verdict_lost", "unknown_agent", "retry_elsewhere",
        "too_many_pending_user", "gateway_overloaded", "plugin_too_old",
    ),
    "ws_frames": tuple(("in", t) for t in ("send", "resume", "abort", "audio", "invalid"))
    + tuple(("out", t) for t in ("start", "chunk", "end", "no-active", "error")),
    "audio_bytes": _each("in", "out"),
    "limited": _each(
        "unauthorized", "origin_not_allowed", "draining", "rate_limited", "too_many_streams", "gateway_busy",
        "too_many_chats", "too_many_messages", "body_too_large", "body_timeout", "agent_not_found",
        "agent_not_allowed", "origin_required", "header_timeout", "limits_unavailable",
    ),
    "shared_limits": tuple((check, result) for check in ("rate", "stream") for result in ("admitted", "limited", "local", "refused")),
    "config_reloads": _each("success", "failure"),
    "jwks_fetches": _each("success", "failure"),
    "ws_tickets": _each("issued", "redeemed", "refused"),
    "forwarded": _each("out", "in"),
    "owner_lost": _each("run", "approval", "gated_call", "stream"),
    "gc_pause": _each("0", "1", "2"),
    # Who decided an approval (ApprovalNotice.source) and how it came out.
    "approval_decisions": (
        ("person", "approved"), ("person", "denied"), ("approver", "approved"), ("approver", "denied"),
        ("rule", "approved"), ("rule", "denied"), ("timeout", "timeout"), ("cancel", "cancelled"), ("give_up", "abandoned"),
    ),
    "approval_decision_wait": _each("person", "approver", "rule", "timeout", "cancel", "give_up"),
    "audit_records": _each("stored", "duplicate", "failed", "dropped"),
})

# The `method` label's values besides "other" (RFC 9110's methods, and PATCH).
HTTP_METHODS: frozenset[str] = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"})

# The request duration's `status_class` label: the first digit of the status (a 1xx, the WebSocket
# upgrade, is a socket's whole life and is not timed).
STATUS_CLASSES: frozenset[str] = frozenset({"2xx", "3xx", "4xx", "5xx"})

# Per-run and per-tool metrics: their first label is the agent (a name from the config's agents).
# adk_gateway_tokens_total has the agent first too, but is plain counts behind a collector
# (GatewayMetrics.count_tokens), with no `.labels()` to check.
AGENT_LABELLED: frozenset[str] = frozenset({
    "upstream_up", "upstream_errors", "upstream_first_event", "runs", "browser_runs", "approvals_pending", "approvals_over_user_cap", "approval_wait",
    "approval_timeouts", "browser_tool_wait", "plugin_requests", "policy_bypassed", "live_sessions",
    "approval_decisions", "approval_decision_wait", "first_token", "policy_shadow", "grant_decisions",
})

# The outcomes of the per-tool histograms, created for each tool of the policy that can have them.
TOOL_OUTCOMES: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "approval_wait": ("approved", "denied", "timeout", "cancelled", "abandoned"),
    "browser_tool_wait": ("output", "error", "timeout", "cancelled", "abandoned"),
})

# How what a shadow rule would decide compares with what was decided (config/shadow_rules.py
# AGREEMENTS, which tests/unit/test_shadow_rules.py checks this against): adk_gateway_policy_shadow_total's
# last label, exported by `know_tools` for each shadow rule of the policy (its tool and rule are open).
SHADOW_AGREEMENTS: tuple[str, ...] = ("agree", "stricter", "looser", "different")


# The webhooks' series (approvals/webhooks.py), exported at 0 for each configured webhook by `WebhookMetrics.know`
# (the webhook's name comes first, like the agent of AGENT_LABELLED): the notice kinds, how a
# delivery ended, and how one attempt did.
WEBHOOK_EVENTS: tuple[str, ...] = ("waiting", "decided", "expired")
WEBHOOK_RESULTS: tuple[str, ...] = ("delivered", "failed", "dropped")
WEBHOOK_ATTEMPTS: tuple[str, ...] = ("2xx", "3xx", "4xx", "429", "5xx", "timeout", "error")
# How an approval mail to one approver ended (approvals/email.py).
EMAIL_RESULTS: tuple[str, ...] = ("sent", "failed", "dropped")


# The token counter's `kind` label: the usageMetadata fields each kind counts, the first present
# (google.genai's GenerateContentResponseUsageMetadata, as ADK serialises it; ADK 1.x passes Gemini
# Live's own UsageMetadata through unmapped, which names the output `responseTokenCount`). Exported
# at 0 by `know_agents` for each agent and each model of `metrics.models` (and OTHER_MODEL, every
# model not listed).
TOKEN_KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("input", ("promptTokenCount",)),
    ("output", ("candidatesTokenCount", "responseTokenCount")),
    ("total", ("totalTokenCount",)),
    ("cached", ("cachedContentTokenCount",)),
    ("thinking", ("thoughtsTokenCount",)),
)
# The `model` label of a model `metrics.models` does not list (or of a call that named none).
OTHER_MODEL = "other"


# Approvals wait for people: from seconds to an hour.
APPROVAL_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600)
# Garbage collector pauses stall every stream at once: from a young collection (~1 ms) to a full one.
GC_PAUSE_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)
# From an approval's notice to its webhook call answered 2xx: one attempt (ms) to a receiver down for an hour.
WEBHOOK_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
# Time to first upstream event: from a scripted model (ms) to a slow model start (tens of s).
FIRST_EVENT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# A request's whole answer: from a probe (ms) to a streamed turn of several minutes.
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# A wait for a free Redis connection, bounded by the command timeout (5 s): from one freed a
# moment later to one that never came.
REDIS_POOL_WAIT_BUCKETS = (0.001, 0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5)
# Time to first token: the first event's range, as a person waiting for words feels it.
FIRST_TOKEN_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 1.5, 2, 3, 5, 7.5, 10, 15, 30, 60)
