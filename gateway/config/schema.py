"""The gateway's configuration: the YAML schema, its defaults, and loading with clear errors.

One YAML file is the ops interface (DESIGN.md decision 2). Loading is strict: an unknown key, a wrong
type, a bad URL or duration is refused with one line per problem naming the file, the key path and
the reason, so a typo never silently falls back to a default. `${VAR}` and `${VAR:-default}` are
substituted in string values after parsing, so secrets come from the environment and never need to
be written into the file. One agent's sections are agent_config.py's; durations and sizes,
config_values.py's.
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, SecretStr, ValidationError, model_validator

from .agent import (
    AGENT_NAME_PATTERN,
    AgentAccess,
    AgentConfig,
    ToolPolicy,
    UpstreamConfig,
)
from .auth import AuthConfig
from .values import Duration, Section, Size, parse_duration, parse_size

# The agent's and the values' names are re-exported: a config is read from this module.
__all__ = [
    "AgentAccess", "AgentConfig", "AuthConfig", "ConfigError", "GatewayConfig", "ToolPolicy", "UpstreamConfig", "load_config",
    "parse_config", "parse_duration", "parse_size", "revalidate", "single_agent_form",
]


class ConfigError(Exception):
    """The configuration cannot be used; `problems` holds one human-readable line per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class ListenConfig(Section):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    # On SIGTERM: /readyz turns 503, new chats are refused, running responses get this long to
    # finish before they are ended with an error (SSE) or closed with 1001 (WebSocket).
    drain_timeout: Duration = 20.0
    # The longest a request's line and headers may take to arrive, counted from the connection's
    # start or from the first byte of a later request on it (408, then closed; a connection that
    # sent nothing is just closed). Both listeners. Bodies have chat.body_timeout; a keep-alive
    # connection idle between requests is not timed by it.
    header_timeout: Duration = Field(10.0, gt=0)

    @property
    def loopback(self) -> bool:
        host = self.host.strip("[]")
        if host == "localhost":
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False


class ChatConfig(Section):
    # The AI SDK major version assumed when a client does not say (ai 7 extras only on request).
    default_protocol: Literal[6, 7] = 6
    max_body_bytes: Size = Field(4 * 1024 * 1024, ge=1024)
    # The longest a request body may take to arrive (408 after): a slow body holds a connection.
    body_timeout: Duration = Field(30.0, gt=0)
    # Chunks kept per response for resume; past this the oldest half is dropped, and a resume of
    # that response answers 204 (a follower that fell that far behind gets an error chunk).
    run_buffer_chunks: int = Field(10_000, ge=100)
    # How long a finished response can still be replayed by a resume (`GET /api/chat/{id}/stream`,
    # WebSocket `resume`): a browser that lost its connection cannot say what reached it.
    run_retention: Duration = 60.0
    # Idle SSE responses get a `: keep-alive` comment line this often, so proxies with idle
    # timeouts (often 60 s) do not cut a response that waits on a slow model.
    keepalive_interval: Duration = Field(15.0, gt=0)
    # When the browser drops mid-response: `continue` (the run goes on; resume replays it) or
    # `cancel` (the agent run is cancelled too). Pending approvals stay answerable either way.
    on_disconnect: Literal["continue", "cancel"] = "continue"
    # A chat untouched this long is forgotten (its ADK session stays in ADK); approvals it still
    # waited on count as cancelled.
    idle_chat_ttl: Duration = Field(3600.0, gt=0)


class WebSocketConfig(Section):
    """`/api/chat/ws`: the AI SDK WebSocket transport."""

    # Ping interval; a peer that does not answer a ping within half of it is closed.
    heartbeat: Duration = Field(30.0, gt=0)
    # Larger frames close the socket with 1009 (message too big).
    max_frame_bytes: Size = Field(4 * 1024 * 1024, ge=1024)
    # A socket with no request in flight and no frame from the browser for this long is closed.
    idle_timeout: Duration = Field(600.0, gt=0)
    # Requests one socket may have in flight at once.
    max_requests: int = Field(16, ge=1)
    # permessage-deflate, which browsers offer by default. Off: chunks are 60-150 bytes, where
    # compressing costs more CPU per chunk (~8-10 us, bench/) than the bytes it saves are worth.
    compress: bool = False


class LimitsConfig(Section):
    """Per-user and global caps; each is answered with a JSON reason and the fitting status."""

    # Messages in one request's history (413 beyond).
    max_messages: int = Field(500, ge=1)
    # Responses one user may be streaming at once (429), and all users together (503).
    max_streams_per_user: int = Field(8, ge=1)
    max_streams_total: int = Field(2000, ge=1)
    # Chats one user may have in the gateway's memory at once (429).
    max_chats_per_user: int = Field(200, ge=1)
    # Tool calls of one chat waiting for a person at once; more are refused to the agent.
    max_pending_approvals_per_chat: int = Field(16, ge=1)
    # Requests per second per user (token bucket; 429 with Retry-After), and the burst allowed.
    rate_per_user: float = Field(20.0, gt=0)
    burst_per_user: int = Field(40, ge=1)


class InternalConfig(Section):
    """The listener the gateway's ADK plugin calls; never exposed to browsers."""

    host: str = "127.0.0.1"
    port: int = Field(8081, ge=0, le=65535)
    # Shared with the plugin (ADK_GATEWAY_SECRET). Required as soon as a tool policy gates a tool.
    secret: SecretStr | None = None
    # Also accepted while a rotation overlaps: the secret the agents still use, until they all
    # restart with the new one (docs/operations.md). Empty or unset: nothing more is accepted.
    previous_secret: SecretStr | None = None
    # How often the plugin re-reads the tool policy.
    policy_refresh: Duration = Field(30.0, gt=0)


# `sessions.secret`: as `logging.user_id_key`, short enough to guess is refused.
_MIN_SESSIONS_SECRET = 16


class SessionsConfig(Section):
    """Where chat state that several replicas must share lives (docs/scaling.md)."""

    # memory: this process only (one replica). redis: replicas behind one load balancer share
    # the chat directory, replica heartbeats, gated-call records and relays in Redis.
    backend: Literal["memory", "redis"] = "memory"
    # redis://[:password@]host:port/db; a secret, because it may carry the password.
    redis_url: SecretStr | None = None
    # Every Redis key starts with this, so several gateways can share one Redis.
    key_prefix: str = Field("adk-gateway", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")
    # How often a replica tells Redis it is alive; a replica silent for `owner_timeout` is dead
    # and other replicas take over its chats (its runs are lost with it).
    heartbeat_interval: Duration = Field(1.0, gt=0)
    owner_timeout: Duration = Field(3.0, gt=0)
    # How long a replica waits for another to take a forwarded request (not the run itself).
    forward_timeout: Duration = Field(10.0, gt=0)
    # With backend redis, replicas seal what they exchange through Redis (forwarded work and its
    # replies, gated-call records, relays, WebSocket tickets) with an HMAC under this secret, and
    # drop what does not carry it: writing to Redis is not enough to forge them (docs/security.md).
    # The same random string on every replica; required with backend redis.
    secret: SecretStr | None = None
    # Also accepted, never used to seal: a key being rotated in or out (docs/scaling.md). Empty
    # entries are ignored, so one can come from an unset environment variable.
    accepted_secrets: list[SecretStr] = Field(default_factory=list)

    @model_validator(mode="after")
    def _redis_needs_url(self) -> SessionsConfig:
        if self.backend == "redis" and (self.redis_url is None or not self.redis_url.get_secret_value()):
            raise ValueError("sessions.redis_url is required with backend redis")
        if self.accepted_secrets and not self.seal_secrets() and any(s.get_secret_value() for s in self.accepted_secrets):
            raise ValueError("sessions.accepted_secrets without sessions.secret: accepted keys alone seal nothing")
        short = [name for name, value in self._secrets() if value and len(value) < _MIN_SESSIONS_SECRET]
        if short:
            raise ValueError(
                f"{', '.join(short)}: a sessions secret is at least {_MIN_SESSIONS_SECRET} characters (a random string)"
            )
        if self.owner_timeout < 2 * self.heartbeat_interval:
            raise ValueError("sessions.owner_timeout must be at least twice sessions.heartbeat_interval")
        return self

    def _secrets(self) -> list[tuple[str, str]]:
        named = [("sessions.secret", self.secret.get_secret_value() if self.secret is not None else "")]
        named += [(f"sessions.accepted_secrets[{i}]", s.get_secret_value()) for i, s in enumerate(self.accepted_secrets)]
        return named

    def seal_secrets(self) -> list[str]:
        """The secrets of the seal (cluster/sealing.py): `secret` first, the one that seals; none
        without `secret`. Empty entries dropped."""
        named = self._secrets()
        if not named[0][1]:
            return []
        return [value for _, value in named if value]


class DemoConfig(Section):
    # Serve the demo chat page at `/` (gateway/static/demo). Off in production configs;
    # `adk-gateway demo` turns it on.
    page: bool = False


# `logging.user_id_key`: a short key could be guessed along with the user ids.
_MIN_LOG_KEY = 16


class LoggingConfig(Section):
    level: Literal["debug", "info", "warning", "error"] = "info"
    # auto: JSON when stderr is not a terminal (containers, CI), console renderer on a TTY.
    format: Literal["auto", "json", "console"] = "auto"
    # What lines say of the caller's user id, which may be personal data (an email as JWT `sub`).
    # plain: `user_id` as is (the default: following one user's trouble needs it). hash:
    # `user_id_hash`, an HMAC-SHA256 under `user_id_key`, so one user's lines still correlate
    # across requests, restarts and replicas sharing the key; keyed, because a bare hash of an
    # email is reversed by hashing a list of emails. omit: nothing.
    user_id: Literal["plain", "hash", "omit"] = "plain"
    user_id_key: SecretStr | None = None

    @model_validator(mode="after")
    def _key_for_hash(self) -> LoggingConfig:
        key = self.user_id_key.get_secret_value() if self.user_id_key is not None else ""
        if self.user_id == "hash" and len(key) < _MIN_LOG_KEY:
            raise ValueError(
                f"logging.user_id hash needs logging.user_id_key, at least {_MIN_LOG_KEY} characters "
                "(a random string, from the environment)"
            )
        return self


class MetricsConfig(Section):
    enabled: bool = True
    path: str = Field("/metrics", pattern=r"^/")
    # Where `path` is served, without credentials either way. public: on the browser-facing
    # listener (block it at the ingress). internal: on the internal listener only, which then runs
    # even without internal.secret (its plugin routes refuse every call until one is set).
    listener: Literal["public", "internal"] = "public"

    @model_validator(mode="after")
    def _path_clear_of_the_plugin_routes(self) -> MetricsConfig:
        if self.listener == "internal" and self.path.startswith("/internal/"):
            raise ValueError("metrics.path: on the internal listener, /internal/ is the plugin's")
        return self


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
                "internal.secret is required when a tool needs approval or runs in the browser "
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
                f"string of at least {_MIN_SESSIONS_SECRET} characters on every replica, e.g. "
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
