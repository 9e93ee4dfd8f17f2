"""The application's state: one `Gateway` object hung off the aiohttp Application.

Everything that lives longer than a request (config, metrics, the registry, the agents and their
upstream clients, the chat service) is reached through `request.app[GATEWAY]`; nothing is module-global.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from ..upstream.agents import Agents
from ..access.approvers import ApproverAuth
from ..access.auth import Authenticator
from ..config.approvers import ApproversConfig
from ..chat.service import ChatService
from ..cluster.router import Cluster
from ..config.schema import GatewayConfig
from ..access.jwks import Jwks
from ..approvals.audit_trail import AuditTrail
from ..ops.coarse_timers import CoarseTimers
from ..ops.metrics import GatewayMetrics
from ..ops.tracing import Tracing
from ..approvals.webhooks import Webhooks
from ..approvals.slack import SlackChannel
from ..approvals.email import EmailNotices
from ..chat.registry import Registry
from ..access.tickets import Tickets
from .limiter import Limiter

__all__ = ["GATEWAY", "Gateway"]


@dataclass(eq=False)
class Gateway:
    config: GatewayConfig
    metrics: GatewayMetrics
    registry: Registry
    auth: Authenticator
    # The agents served, each with its upstream client and health (upstream/agents.py).
    agents: Agents
    chats: ChatService
    # Where each chat runs; browser and plugin requests go through it (docs/scaling.md).
    cluster: Cluster
    # The per-user limits, this replica's or shared by the replicas (edge/limiter.py), and the total stream cap.
    admission: Limiter
    # WebSocket tickets, kept where every replica can redeem them (access/tickets.py).
    tickets: Tickets
    # The audit trail of decided approvals: `audit.record(notice)` where an approval ends,
    # `await audit.read(...)` for the approvals API (approvals/audit_trail.py).
    audit: AuditTrail
    # Approval notices to the configured webhooks (approvals/webhooks.py): `webhooks.notify(notice)`.
    webhooks: Webhooks
    # Approvals its approvers decide, posted to Slack with buttons (approvals/slack.py; edge/slack.py takes the presses).
    slack: SlackChannel
    # Approval mails to approvers with a one-time decision link (approvals/email.py; edge/decision_page.py
    # takes the votes); read `notifications.email` at each notice, so a reload turns them on or off.
    email: EmailNotices
    clock: Callable[[], float] = time.monotonic
    draining: bool = False
    # Open browser WebSockets, so a drain can close them with 1001.
    sockets: set[web.WebSocketResponse] = field(default_factory=set)
    # The file the config came from, for reloads (None: built in code, nothing to reload), and
    # that file as it was at start (reloads compare against it to say what needs a restart).
    config_path: Path | None = None
    started_from: GatewayConfig | None = None
    # The digest of the config content the last reload (or the start) read: the config watcher
    # reloads only a content no reload has read yet (edge/config_watch.py).
    config_seen: str | None = None
    # `--upstream-mode`, which a reload keeps applying to every agent.
    upstream_mode: str | None = None
    # The identity provider's keys, when auth.jwt takes them from it (access/jwks.py).
    jwks: Jwks | None = None
    # OpenTelemetry spans (ops/tracing.py): the shared no-op unless `telemetry:` turns them on.
    tracing: Tracing = field(default_factory=Tracing.off)
    # The long timers of held streams (keep-alives, upstream idle timeouts) on one loop timer.
    timers: CoarseTimers = field(default_factory=CoarseTimers)
    # Short clean-ups started where nothing can await them (a reload closing what it replaced).
    background: set[asyncio.Task[None]] = field(default_factory=set)
    # The approvals API's authentication, made for the running `auth` and `approvers` (approver_auth).
    _approvers: tuple[Authenticator, ApproversConfig, ApproverAuth] | None = field(default=None, repr=False)

    def approver_auth(self) -> ApproverAuth:
        """Who calls the approvals API and what they may decide, as the running config says: made
        again after a reload changed the authenticator or the `approvers` section."""
        made = self._approvers
        if made is None or made[0] is not self.auth or made[1] is not self.config.approvers:
            auth = ApproverAuth(self.auth, self.config.approvers, auth_mode=self.config.auth.mode)
            made = self._approvers = (self.auth, self.config.approvers, auth)
        return made[2]

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self.background.add(task)
        task.add_done_callback(self.background.discard)


GATEWAY = web.AppKey("gateway", Gateway)
