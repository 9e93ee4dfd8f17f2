"""Configuration reload: deciding whether a new file may replace the running configuration, and applying it.

A reload (SIGHUP, or `POST /internal/v1/reload`) must fail closed (DESIGN.md decision 11): a file
that start would refuse, an empty or truncated file, or one that would loosen the gateway's
security posture is refused, the running configuration is kept, and the refusal is logged and
counted. `plan_reload` makes that decision without I/O; `reload_config` reads the file and carries
the decision out on a running `Gateway`.

What a reload may not do, on top of what start refuses (docs/configuration.md#reloading):
- fall back to defaults because the file is empty: an empty file is refused outright;
- let in anyone, or any tool call, that the running configuration keeps out: config/loosening.py holds
  the one table of the settings that decide it (auth: the mode, keys, JWT checks, origins, cookie,
  tickets, tokens in URLs; per agent: `access:` and the tools' gates), each with its direction.
  An agent is judged against the agent that takes its place by name, by ADK app (the plugin's
  policy is keyed by app, so a rename keeps the gates) and on `/api/chat`. A truncated `tools:`
  section must never let payments run without approval; loosening takes a restart.
A reload may add agents, remove them (their running responses end with an error chunk saying so,
their waiting calls are refused to the agent) and change them (a new upstream is taken by each
chat at its next turn). A refusal names keys as the file has them: a single-agent file's
`tools.<name>`, not the `agents.<name>.tools.<name>` it becomes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import structlog
import yaml
from pydantic import ValidationError

from ..access.auth import Authenticator, warn_token_in_url
from ..config.schema import ConfigError, GatewayConfig, InternalConfig, parse_config, revalidate, single_agent_form
from ..access.jwks import provider_keys
from ..config.loosening import loosened
from .config_watch import config_digest, files_read
from .state import Gateway

__all__ = ["ReloadPlan", "ReloadResult", "plan_reload", "reload_config", "warn_previous_secret"]

log = structlog.get_logger("adk_gateway.edge.reload")

# Sections whose running values stay until a restart: the listeners, the metrics endpoint, logging,
# the shared session store and the tracer are built once, at start.
_RESTART_ONLY = ("listen", "metrics", "logging", "sessions", "telemetry")


@dataclass(frozen=True)
class ReloadPlan:
    """What a reload would do: the configuration to run (None when refused), why it was refused,
    and what in the file waits for a restart."""

    config: GatewayConfig | None
    problems: list[str] = field(default_factory=list)
    restart_required: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ReloadResult:
    ok: bool
    problems: list[str]
    restart_required: list[str]

    def as_json(self) -> dict[str, object]:
        return {"result": "success" if self.ok else "failure", "problems": self.problems,
                "restart_required": self.restart_required}


def plan_reload(
    text: str, *, source: str, running: GatewayConfig, started: GatewayConfig | None = None,
    env: dict[str, str] | None = None, upstream_mode: str | None = None,
) -> ReloadPlan:
    """Decide whether the file `text` may replace `running`.

    `upstream_mode` is the `--upstream-mode` the process was started with, which stays every
    agent's mode (a reload must not move running agents from live to sse behind the operator's back).

    `started` is the file the process started from: what needs a restart is judged against it
    (the running config may differ from any file by command-line overrides).
    """
    if _empty(text):
        return ReloadPlan(None, [f"{source}: the file is empty; a reload never falls back to defaults"])
    try:
        new = parse_config(text, source=source, env=env)
    except ConfigError as exc:
        return ReloadPlan(None, exc.problems)
    if upstream_mode is not None:
        try:
            new = new.model_copy(update={"agents": {
                name: agent.model_copy(update={"upstream": agent.upstream.with_mode(upstream_mode)})
                for name, agent in new.agents.items()
            }})
        except ValidationError as exc:
            # An explicit `approvals: confirm` under `--upstream-mode live` (or `hold` under sse): refused as at start.
            return ReloadPlan(None, [
                f"{source} with --upstream-mode {upstream_mode}: {e['msg'].removeprefix('Value error, ')}" for e in exc.errors()
            ])
    started = started or running
    restart = [key for key in _RESTART_ONLY if getattr(new, key) != getattr(started, key)]
    if (new.internal.host, new.internal.port) != (started.internal.host, started.internal.port):
        restart.append("internal.host/port")
    if bool(new.internal.secret) != bool(started.internal.secret):
        restart.append("internal.secret (the listener starts or stops only at start)")
    if new.chat.max_body_bytes != started.chat.max_body_bytes:
        restart.append("chat.max_body_bytes")
    if new.demo != started.demo:
        restart.append("demo")
    try:
        # The configuration that would run: the file, with what needs a restart kept as it runs.
        # It passes the validator start uses, so (for one) `auth.mode: none` is judged against the
        # listener that really runs, not the file's `listen.host`.
        effective = revalidate(_effective(new, running), source=f"{source} (with the running listen, "
                               "sessions and internal listener)")
    except ConfigError as exc:
        return ReloadPlan(None, exc.problems, restart)
    # Named as the file names them: a single-agent file's agent by the keys it has (`tools.<name>`).
    problems = loosened(running, effective, single_agent=single_agent_form(yaml.safe_load(text)))
    if problems:
        return ReloadPlan(None, [f"{source}: {why}" for why in problems], restart)
    return ReloadPlan(effective, [], restart)


def _empty(text: str) -> bool:
    try:
        return yaml.safe_load(text) is None
    except yaml.YAMLError:
        return False  # not empty: parse_config says what is wrong with it


def _effective(new: GatewayConfig, running: GatewayConfig) -> GatewayConfig:
    kept: dict[str, object] = {key: getattr(running, key) for key in _RESTART_ONLY}
    kept["internal"] = new.internal.model_copy(update={
        "host": running.internal.host,
        "port": running.internal.port,
        # A listener that runs keeps a secret; one that does not run has none to check.
        "secret": new.internal.secret if bool(new.internal.secret) == bool(running.internal.secret) else running.internal.secret,
    })
    kept["chat"] = new.chat.model_copy(update={"max_body_bytes": running.chat.max_body_bytes})
    kept["demo"] = running.demo
    return new.model_copy(update=kept)


def _provider_settings(config: GatewayConfig) -> object:
    jwt = config.auth.jwt
    if config.auth.mode != "jwt" or jwt is None or not jwt.provider_keys:
        return None
    return (jwt.jwks_url, jwt.discovery, jwt.issuer, jwt.jwks_refresh, jwt.jwks_min_refetch, jwt.jwks_timeout,
            tuple(jwt.jwks_hosts), jwt.jwks_allow_http)


def _take_provider_keys(gateway: Gateway, running: GatewayConfig, applied: GatewayConfig) -> None:
    """Keep the provider's keys held when where they come from did not change (a reload must not
    drop the keys it holds while the provider is down); else fetch from the new place."""
    if _provider_settings(applied) == _provider_settings(running):
        return
    old, gateway.jwks = gateway.jwks, provider_keys(applied.auth, gateway.metrics.jwks_fetched)
    if gateway.jwks is not None:
        gateway.jwks.open()
    if old is not None:
        gateway.spawn(old.close())


def reload_config(gateway: Gateway, path: Path) -> ReloadResult:
    """Re-read `path` and, if the plan allows it, apply it to new requests; else keep what runs."""
    # What this reload read, for the config watcher (edge/config_watch.py): a content reloaded by
    # any path is not reloaded again by it. The files the config reads are taken first, so one that
    # changes during the reload is seen as changed at the watcher's next look, never missed.
    also = files_read(gateway.config)
    data: bytes | None = None
    try:
        data = path.read_bytes()
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        plan = ReloadPlan(None, [f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}"])
    else:
        plan = plan_reload(
            text, source=str(path), running=gateway.config, started=gateway.started_from,
            upstream_mode=gateway.upstream_mode,
        )
    gateway.config_seen = config_digest(data, also)
    if plan.config is None:
        gateway.metrics.config_reloads.labels("failure").inc()
        log.error("config_reload_failed", path=str(path), problems=plan.problems)
        return ReloadResult(False, plan.problems, plan.restart_required)
    applied = plan.config
    _take_provider_keys(gateway, gateway.config, applied)
    if not gateway.config.auth.allow_token_in_url:
        warn_token_in_url(applied.auth)
    warn_previous_secret(applied.internal)
    gateway.config = applied
    gateway.auth = Authenticator(applied.auth, gateway.jwks)
    gateway.admission.config = applied.limits
    gateway.chats.reconfigure(applied)
    changes = gateway.agents.apply(applied)
    for name in changes.removed:
        ended = gateway.chats.end_agent_runs(name, f"The agent {name} was removed from the gateway; this response was ended.")
        log.warning("agent_removed", agent=name, runs_ended=ended)
    gateway.metrics.know_agents(applied)  # new agents' and tools' series exist from now, at 0
    gateway.metrics.webhooks.know(applied.notifications)  # so do new webhooks' (approvals/webhooks.py reads the config per notice)
    gateway.metrics.config_reloads.labels("success").inc()
    gateway.metrics.config_last_reload.set(time.time())
    log.info(
        "config_reloaded", path=str(path), restart_required=plan.restart_required,
        agents_added=changes.added, agents_removed=changes.removed, agents_changed=changes.changed,
    )
    return ReloadResult(True, [], plan.restart_required)


def warn_previous_secret(internal: InternalConfig) -> None:
    """At start and at each reload while a rotation of the internal secret overlaps: the old secret
    still opens the internal listener until `previous_secret` is dropped."""
    if internal.previous_secret is not None and internal.previous_secret.get_secret_value():
        log.warning(
            "internal_previous_secret_set",
            detail="internal.previous_secret is accepted alongside internal.secret: once no "
            "internal_previous_secret_used line appears, remove it and reload",
        )
