"""Telling the world about approvals: each one that starts waiting, is decided or expires, once.

The chat's machine decides; this module only reports, after the fact. For each approval it makes an
`ApprovalNotice` (approvals/notice.py), counts the decision in the metrics (by who decided it),
and hands the notice to the sinks the application gave it (the audit trail, the webhooks). A sink
that raises is logged and skipped: reporting never changes or blocks what was decided.

Two kinds of approval report here: a gated call the plugin holds (`GatedCall`, hold mode and every
rule's decision) and an ADK confirmation (`NativeConfirmation`, confirm mode and native tools).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import orjson
import structlog

from ..config.schema import GatewayConfig
from .notice import ApprovalNotice, Approver, NoticeKind, args_digest, args_digest_key
from ..core.approvals import GatedCall
from ..core.ledger import NativeConfirmation
from ..ops.metrics import GatewayMetrics
from ..ops.tracing import Tracing

__all__ = ["Notices", "Sink"]

log = structlog.get_logger("adk_gateway.approvals.reports")

Sink = Callable[[ApprovalNotice], None]

# A native confirmation's outcome as the browser or the gateway gave it -> who decided.
_NATIVE_SOURCE = {"approved": "person", "denied": "person", "timeout": "timeout", "cancelled": "cancel"}
# The same, answered by the gateway for approvers (a deadline or a cancel is nobody's decision).
_APPROVERS_SOURCE = {**_NATIVE_SOURCE, "approved": "approver", "denied": "approver"}


def _deciders(call: GatedCall, source: str | None) -> tuple[Approver, ...]:
    if call.deciders:
        return tuple(Approver(d["user"], d["auth"]) for d in call.deciders)
    # The chatting person answered in their own chat, as their chat requests authenticate.
    return (Approver(call.user_id, "chat"),) if source == "person" else ()


def _asked(confirmation: NativeConfirmation) -> dict[str, Any] | None:
    mark = confirmation.mark
    if mark is None or not confirmation.approval:
        return None
    return {"approvers": mark.approvers, "self_approval": mark.self_approval, "quorum": mark.quorum}


class Notices:
    def __init__(
        self, metrics: GatewayMetrics, config: Callable[[], GatewayConfig], wall: Callable[[], float] = time.time,
        tracing: Tracing | None = None,
    ) -> None:
        self._metrics = metrics
        # Each approval's wait as a span, from its start to its decision (ops/tracing.py).
        self._tracing = tracing or Tracing.off()
        self._config = config
        self._wall = wall
        self._sinks: list[Sink] = []
        # The policy's digest, computed once per loaded configuration (not per notice).
        self._versioned: tuple[GatewayConfig, str] | None = None
        # The arguments' digest key, derived once per loaded configuration (None: no key set).
        self._keyed: tuple[GatewayConfig, bytes | None] | None = None

    def add_sink(self, sink: Sink) -> None:
        self._sinks.append(sink)

    # ---- gated calls (hold mode, rules) ----------------------------------------------------

    def call_waiting(self, agent: str, call: GatedCall, turn: Any = None) -> None:
        """A gated call waits for a person; `turn`: the span of the chat's turn (its wait's parent)."""
        self._tracing.approval_waiting(call.id, agent, call.tool, call.chat_id, turn, mode="hold", rule=call.rule)
        self._tell(self._of_call("waiting", agent, call))

    def call_released(self, agent: str, call: GatedCall, waited: float) -> None:
        """A call that waited for a person was released (by anyone, a rule included)."""
        if call.source is None or call.outcome is None:
            source, outcome = "person", "approved"  # a browser tool's approval: its output is awaited now
        else:
            source, outcome = call.source, call.outcome.value
        self._count(agent, source, outcome, waited)
        kind: NoticeKind = "expired" if source == "timeout" else "decided"
        notice = self._of_call(kind, agent, call, source=source, outcome=outcome, waited=waited)
        self._tracing.approval_decided(call.id, outcome, source, tuple(a.user for a in notice.approvers))
        self._tell(notice)

    def _of_call(self, kind: NoticeKind, agent: str, call: GatedCall, **decided: Any) -> ApprovalNotice:
        return ApprovalNotice(
            kind, call.id, agent, self._app(agent), call.tool, call.tool_call_id, call.chat_id, call.user_id,
            call.args, self._wall(), rule=call.rule, reason=call.reason, policy_version=self._version(),
            args_digest=self._digest(call.args),
            approvers=_deciders(call, decided.get("source")),
            asks=() if kind != "waiting" else (call.approvers or "the chatting user",), shadow=tuple(call.shadow),
            asked=None if call.approvers is None else
            {"approvers": call.approvers, "self_approval": call.self_approval, "quorum": call.quorum},
            **decided,
        )

    # ---- ADK confirmations (confirm mode, native tools) -----------------------------------

    def native_waiting(self, agent: str, chat_id: str, user: str, confirmation: NativeConfirmation, turn: Any = None) -> None:
        self._tracing.approval_waiting(confirmation.approval_id, agent, confirmation.tool, chat_id, turn, mode="confirm")
        self._tell(self._of_native("waiting", agent, chat_id, user, confirmation))

    def native_decided(
        self, agent: str, chat_id: str, user: str, confirmation: NativeConfirmation, outcome: str, waited: float,
        reason: str | None = None, deciders: tuple[tuple[str, str], ...] = (),
    ) -> None:
        source = (_APPROVERS_SOURCE if deciders else _NATIVE_SOURCE).get(outcome, "person")
        self._count(agent, source, outcome, waited)
        kind: NoticeKind = "expired" if source == "timeout" else "decided"
        notice = self._of_native(kind, agent, chat_id, user, confirmation, source=source, outcome=outcome,
                                 waited=waited, reason=reason)
        if deciders:
            notice = replace(notice, approvers=tuple(Approver(who, auth) for who, auth in deciders))
        self._tracing.approval_decided(confirmation.approval_id, outcome, source, tuple(a.user for a in notice.approvers))
        self._tell(notice)

    def _of_native(
        self, kind: NoticeKind, agent: str, chat_id: str, user: str, confirmation: NativeConfirmation, **decided: Any
    ) -> ApprovalNotice:
        return ApprovalNotice(
            kind, confirmation.approval_id, agent, self._app(agent), confirmation.tool, confirmation.tool_call_id,
            chat_id, user, dict(confirmation.args or {}), self._wall(), policy_version=self._version(),
            args_digest=self._digest(confirmation.args or {}),
            approvers=(Approver(user, "chat"),) if decided.get("source") == "person" else (),
            asks=() if kind != "waiting" else (confirmation.mark.approvers if confirmation.mark else "the chatting user",),
            asked=_asked(confirmation), shadow=tuple(confirmation.shadow), **decided,
        )

    # ---- internals -------------------------------------------------------------------------

    def _count(self, agent: str, source: str, outcome: str, waited: float) -> None:
        self._metrics.approval_decisions.labels(agent, source, outcome).inc()
        self._metrics.approval_decision_wait.labels(agent, source).observe(max(waited, 0.0))

    def _tell(self, notice: ApprovalNotice) -> None:
        for sink in self._sinks:
            try:
                sink(notice)
            except Exception:  # noqa: BLE001 - a sink's failure must not reach the decision
                log.exception("approval_notice_failed", approval_id=notice.approval_id, kind=notice.kind)

    def _app(self, agent: str) -> str:
        settings = self._config().agents.get(agent)
        return settings.upstream.app_name if settings is not None else ""

    def _version(self) -> str:
        config = self._config()
        if self._versioned is None or self._versioned[0] is not config:
            tools = {name: agent.model_dump(mode="json", include={"tools"}) for name, agent in config.agents.items()}
            digest = hashlib.sha256(orjson.dumps(tools, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]
            self._versioned = (config, digest)
        return self._versioned[1]

    def _digest(self, args: dict[str, Any]) -> str | None:
        config = self._config()
        if self._keyed is None or self._keyed[0] is not config:
            secret = config.args_digest_secret()
            self._keyed = (config, args_digest_key(secret) if secret is not None else None)
        key = self._keyed[1]
        return args_digest(key, args) if key is not None else None
