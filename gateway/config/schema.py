"""The gateway's configuration: the YAML schema, its defaults, and loading with clear errors.

One YAML file is the ops interface (DESIGN.md decision 2). Loading is strict: an unknown key, a wrong
type, a bad URL or duration is refused with one line per problem naming the file, the key path and
the reason, so a typo never silently falls back to a default. `${VAR}` and `${VAR:-default}` are
substituted in string values after parsing, so secrets come from the environment and never need to
be written into the file. The gateway-wide sections are sections.py's, one agent's agent.py's,
auth's auth.py's; durations and sizes, values.py's.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator

from .agent import (
    AGENT_NAME_PATTERN,
    AgentAccess,
    AgentConfig,
    ToolPolicy,
    UpstreamConfig,
)
from .approvers import ApproversConfig, key_digests
from .audit import AuditConfig
from .grants import GrantsConfig
from .auth import AuthConfig
from .notifications import NotificationsConfig
from .sections import (
    MIN_SESSIONS_SECRET,
    ChatConfig,
    DemoConfig,
    InternalConfig,
    LimitsConfig,
    ListenConfig,
    LoggingConfig,
    MetricsConfig,
    ReloadConfig,
    SessionsConfig,
    WebSocketConfig,
)
from .telemetry import TelemetryConfig
from .values import Section, parse_duration, parse_size

# The sections' and the values' names are re-exported: a config is read from this module.
__all__ = [
    "AgentAccess", "AgentConfig", "ApproversConfig", "AuditConfig", "AuthConfig", "ChatConfig", "ConfigError", "DemoConfig", "GatewayConfig",
    "InternalConfig", "LimitsConfig", "ListenConfig", "LoggingConfig", "MetricsConfig", "NotificationsConfig", "SessionsConfig",
    "TelemetryConfig", "ToolPolicy", "UpstreamConfig",
    "WebSocketConfig", "load_config", "parse_config", "parse_duration", "parse_size", "revalidate", "single_agent_form",
]


class ConfigError(Exception):
    """The configuration cannot be used; `problems` holds one human-readable line per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class GatewayConfig(Section):
    listen: ListenConfig = ListenConfig()
    chat: ChatConfig = ChatConfig()
    websocket: WebSocketConfig = WebSocketConfig()
    auth: AuthConfig = AuthConfig()
    limits: LimitsConfig = LimitsConfig()
    logging: LoggingConfig = LoggingConfig()
    metrics: MetricsConfig = MetricsConfig()
    internal: InternalConfig = InternalConfig()
    demo: DemoConfig = DemoConfig()
    sessions: SessionsConfig = SessionsConfig()
    audit: AuditConfig = AuditConfig()
    notifications: NotificationsConfig = NotificationsConfig()
    # OpenTelemetry traces (docs/operations.md#tracing): off unless the OTLP endpoint is set.
    telemetry: TelemetryConfig = TelemetryConfig()
    # Who may answer approvals besides the chatting user, and who may read decided ones (docs/approvals.md#approvers).
    approvers: ApproversConfig = Field(default_factory=ApproversConfig)
    # Standing grants (docs/approvals.md "Standing grants"): their bounds.
    grants: GrantsConfig = GrantsConfig()
    # Reloading on a change of the file's content, without a SIGHUP (docs/configuration.md#reloading).
    reload: ReloadConfig = ReloadConfig()
    # The agents served, by name (docs/configuration.md#agents). A config without `agents:` has one,
    # made of the top-level `upstream:` and `tools:` keys and named after its app_name.
    agents: dict[str, AgentConfig] = Field(default_factory=lambda: {"demo_agent": AgentConfig()}, min_length=1)
    # The agent `/api/chat` serves (it is also at /agents/<name>/api/chat); default: the first listed.
    default_agent: str = ""

    @model_validator(mode="before")
    @classmethod
    def _single_agent_keys(cls, data: Any) -> Any:
        """The single-agent keys (`upstream:`, `tools:` at the top level) as the one agent of the config."""
        if not isinstance(data, dict) or not ({"upstream", "tools"} & data.keys()):
            return data
        if "agents" in data:
            raise ValueError(
                "upstream and tools at the top level describe the single agent of a config without `agents:`; "
                "with `agents:`, move them under agents.<name> (`adk-gateway check-config` shows the mapping)"
            )
        data = dict(data)
        agent = {key: data.pop(key) for key in ("upstream", "tools") if key in data}
        upstream = agent.get("upstream")
        name = "demo_agent"
        if isinstance(upstream, UpstreamConfig):
            name = upstream.app_name
        elif isinstance(upstream, dict) and isinstance(upstream.get("app_name"), str):
            name = upstream["app_name"]
        data["agents"] = {name: agent}
        return data

    @model_validator(mode="after")
    def _anonymous_only_on_loopback(self) -> GatewayConfig:
        if self.auth.mode == "none" and not self.listen.loopback:
            raise ValueError(
                f"auth.mode none is only allowed on a loopback listener, not {self.listen.host}: "
                "configure api_key or jwt"
            )
        return self

    @model_validator(mode="after")
    def _secret_when_gating(self) -> GatewayConfig:
        secret = self.internal.secret.get_secret_value() if self.internal.secret is not None else ""
        if any(p.gated for agent in self.agents.values() for p in agent.tools.values()) and not secret:
            raise ValueError(
                "internal.secret is required when a tool needs approval, has rules or runs in the browser "
                "(the ADK plugin authenticates with it)"
            )
        return self

    @model_validator(mode="after")
    def _seal_when_shared(self) -> GatewayConfig:
        if self.sessions.backend == "redis" and not self.seal_secrets():
            raise ValueError(
                "sessions.secret is required with backend redis (replicas seal what they exchange through "
                "Redis with it; without it, internal.secret is used, and neither is set): add "
                "`secret: ${SESSIONS_SECRET}` under `sessions:` and set SESSIONS_SECRET to the same random "
                f"string of at least {MIN_SESSIONS_SECRET} characters on every replica, e.g. "
                "`python3 -c 'import secrets; print(secrets.token_hex(32))'` (docs/scaling.md)"
            )
        return self

    def seal_secrets(self) -> list[str]:
        """The secrets of the seal on what replicas exchange through Redis (cluster/sealing.py), the
        first one sealing: `sessions.secret` and its accepted ones; without it, `internal.secret`
        (and `previous_secret`), which every replica shares already because the plugin reaches any of
        them. Empty when neither is set."""
        own = self.sessions.seal_secrets()
        if own:
            return own
        internal = [s.get_secret_value() for s in (self.internal.secret, self.internal.previous_secret) if s is not None]
        return [s for s in internal if s] if internal and internal[0] else []

    def args_digest_secret(self) -> str | None:
        """What the arguments' digest in audit records and webhooks is keyed with
        (approvals/notice.py): `audit.args_digest_key`, else `internal.secret` (which every
        replica shares, so their digests agree); None when neither is set."""
        for secret in (self.audit.args_digest_key, self.internal.secret):
            if secret is not None and secret.get_secret_value():
                return secret.get_secret_value()
        return None

    @model_validator(mode="after")
    def _agents_consistent(self) -> GatewayConfig:
        problems = []
        for name in self.agents:
            if not re.match(AGENT_NAME_PATTERN, name):
                problems.append(f"agents.{name}: an agent name is 1-64 letters, digits, '_', '.' or '-' (it is a URL path segment)")
        if self.default_agent and self.default_agent not in self.agents:
            problems.append(f"default_agent: {self.default_agent!r} is not one of the agents ({', '.join(self.agents)})")
        apps: dict[str, str] = {}
        for name, agent in self.agents.items():
            # The plugin names its agent by the ADK app name alone: two agents with one app name
            # would share (and so widen) each other's tool policy.
            other = apps.setdefault(agent.upstream.app_name, name)
            if other != name:
                problems.append(
                    f"agents.{name}.upstream.app_name: {agent.upstream.app_name!r} is also agents.{other}'s; "
                    "the ADK plugin names its agent by app name, so each agent needs its own"
                )
            problems += self._access_problems(name, agent.access)
        problems += self.notifications.unknown_agents(self.agents)
        problems += self._approvers_problems()
        if self.notifications.slack is not None:  # after the approvers are bound: its users are theirs
            problems += self.notifications.slack.problems(self.approvers, self.agents)
        if self.notifications.email is not None:
            # After the approvers' section is bound: bare recipient ids read as its members' do.
            problems += self.notifications.email.unknown_recipients(lambda e: self.approvers.members([e]), self.agents)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _access_problems(self, name: str, access: AgentAccess) -> list[str]:
        where = f"agents.{name}.access"
        problems = []
        if access.api_keys is not None:
            if self.auth.mode != "api_key":
                problems.append(f"{where}.api_keys needs auth.mode api_key (it is {self.auth.mode})")
            known = {key.id for key in self.auth.api_keys}
            unknown = [key for key in access.api_keys if key not in known]
            if unknown and self.auth.mode == "api_key":
                problems.append(f"{where}.api_keys: {', '.join(unknown)} not among auth.api_keys ids")
        if access.jwt_claims is not None and self.auth.mode != "jwt":
            problems.append(f"{where}.jwt_claims needs auth.mode jwt (it is {self.auth.mode})")
        return problems

    def _approvers_problems(self) -> list[str]:
        """The `approvers:` section against the rest: members name one person each (config/approvers.py
        `member`), the groups tools name exist, claims are read only from JWTs, and a key (or its id)
        means one person across both key lists."""
        section = self.approvers
        # Bare member ids are read by this file's auth.mode: a JWT user is never an approver key's holder.
        problems = section.bind(self.auth.mode, [key.id for key in self.auth.api_keys])
        bound = not problems
        for name, agent in self.agents.items():
            for tool, policy in agent.tools.items():
                where = f"agents.{name}.tools.{tool}"
                askers = [(f"{where}.rules[{r.name}]", r.approvers, r.quorum) for r in policy.rules]
                for where, group, quorum in [*askers, (where, policy.approvers, policy.quorum)]:
                    if group is None:
                        continue
                    found = section.groups.get(group)
                    if found is None:
                        known = ", ".join(section.groups) or "none"
                        problems.append(f"{where}: approvers {group!r} is not a group of approvers.groups ({known})")
                    elif bound and not found.jwt_claims and quorum > (listed := len(section.group_members(group))):
                        # Distinct people: a member listed twice, or by id and by source, is one vote.
                        problems.append(f"{where}: quorum {quorum} needs more approvers than the group {group} lists ({listed})")
        claims = [(f"approvers.groups.{g}", group.jwt_claims) for g, group in section.groups.items()]
        for where, values in [*claims, ("approvers.auditors", section.auditors.jwt_claims)]:
            if values and self.auth.mode != "jwt":
                problems.append(f"{where}.jwt_claims needs auth.mode jwt (it is {self.auth.mode})")
        # Within one list an id may hold two keys (a key being rotated); across them it would be two people.
        if both := sorted({key.id for key in section.api_keys} & {key.id for key in self.auth.api_keys}):
            problems.append(f"approvers.api_keys: an id is either a chat key's (auth.api_keys) or an approver key's, "
                            f"not both ({', '.join(both)})")
        chat_digests = {digest for digest, _ in key_digests(self.auth.api_keys)}
        own = key_digests(section.api_keys)
        if shared := sorted({user for digest, user in own if digest in chat_digests}):
            problems.append(f"approvers.api_keys[{', '.join(shared)}]: the same key as one of auth.api_keys; "
                            "give each person their own key")
        digests = [digest for digest, _ in own]
        if twice := sorted({user for digest, user in own if digests.count(digest) > 1}):
            problems.append(f"approvers.api_keys[{', '.join(twice)}]: the same key under two ids")
        if self.auth.mode == "none" and self.auth.anonymous_user in {key.id for key in section.api_keys}:
            problems.append(f"approvers.api_keys[{self.auth.anonymous_user}]: that id is auth.anonymous_user, "
                            "the chatting user of auth.mode none; an approver needs an id of their own")
        return problems

    @property
    def default(self) -> str:
        """The name of the agent `/api/chat` serves."""
        return self.default_agent or next(iter(self.agents))

    def agent_for_app(self, app_name: str) -> str | None:
        """The agent whose ADK app is `app_name` (the plugin names agents so)."""
        for name, agent in self.agents.items():
            if agent.upstream.app_name == app_name:
                return name
        return None

    def max_messages(self, agent: str) -> int:
        own = self.agents[agent].limits.max_messages if agent in self.agents else None
        return own if own is not None else self.limits.max_messages

    def max_pending_approvals_per_chat(self, agent: str) -> int:
        own = self.agents[agent].limits.max_pending_approvals_per_chat if agent in self.agents else None
        return own if own is not None else self.limits.max_pending_approvals_per_chat

    def max_pending_approvals_per_user(self, agent: str) -> int:
        """The cap on a user's listed approvals that a new call of `agent` is held to."""
        own = self.agents[agent].limits.max_pending_approvals_per_user if agent in self.agents else None
        return own if own is not None else self.limits.max_pending_approvals_per_user


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _substitute(node: Any, path: str, env: dict[str, str], problems: list[str]) -> Any:
    if isinstance(node, dict):
        return {k: _substitute(v, f"{path}.{k}" if path else str(k), env, problems) for k, v in node.items()}
    if isinstance(node, list):
        return [_substitute(v, f"{path}[{i}]", env, problems) for i, v in enumerate(node)]
    if not isinstance(node, str):
        return node

    def replace(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in env:
            return env[name]
        if default is not None:
            return default
        problems.append(f"{path}: environment variable {name} is not set and has no default")
        return ""

    return _VAR.sub(replace, node)


def _format_loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def parse_config(text: str, *, source: str = "<config>", env: dict[str, str] | None = None) -> GatewayConfig:
    """Validate YAML text into a config, raising ConfigError with every problem found."""
    env = dict(os.environ) if env is None else env
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        raise ConfigError([f"{where}: not valid YAML: {getattr(exc, 'problem', exc)}"]) from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError([f"{source}: (top level): expected a mapping of sections, got {type(raw).__name__}"])
    problems: list[str] = []
    raw = _substitute(raw, "", env, problems)
    if problems:
        raise ConfigError([f"{source}: {p}" for p in problems])
    return _validate(raw, source)


def revalidate(config: GatewayConfig, *, source: str) -> GatewayConfig:
    """Run the validators start runs on a config assembled in code (a reload's effective config)."""
    return _validate(config.model_dump(), source)


def _validate(raw: dict[str, Any], source: str) -> GatewayConfig:
    try:
        return GatewayConfig.model_validate(raw)
    except ValidationError as exc:
        single = single_agent_form(raw)
        lines = []
        for err in exc.errors():
            reason = err["msg"]
            if err["type"] == "extra_forbidden":
                reason = "unknown key"
            reason = reason.removeprefix("Value error, ")
            loc = err["loc"]
            if single and len(loc) > 2 and loc[0] == "agents":
                loc = loc[2:]
            lines.append(f"{source}: {_format_loc(loc)}: {reason}")
        raise ConfigError(lines) from None


def single_agent_form(raw: Any) -> bool:
    """The file (parsed YAML) has no `agents:` section: its one agent's problems are named by the
    keys it has (`upstream.url`, `tools.<name>`), not by the agents section they became."""
    return isinstance(raw, dict) and "agents" not in raw


def load_config(path: str | Path, *, env: dict[str, str] | None = None) -> GatewayConfig:
    """Read and validate a config file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror or exc}"]) from None
    return parse_config(text, source=str(path), env=env)
