"""The gateway's configuration: the YAML schema, its defaults, and loading with clear errors.

One YAML file is the ops interface (DESIGN.md decision 2). Loading is strict: an unknown key, a wrong
type, a bad URL or duration is refused with one line per problem naming the file, the key path and
the reason, so a typo never silently falls back to a default. `${VAR}` and `${VAR:-default}` are
substituted in string values after parsing, so secrets come from the environment and never need to
be written into the file.
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from cryptography.hazmat.primitives import serialization
from pydantic import (
    AnyHttpUrl,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

__all__ = ["ConfigError", "GatewayConfig", "load_config", "parse_config", "parse_duration", "revalidate"]


class ConfigError(Exception):
    """The configuration cannot be used; `problems` holds one human-readable line per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(value: Any) -> float:
    """Seconds from `30s`, `5m`, `250ms`, `1.5h` or a bare number of seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 30s, 5m or 250ms")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ValueError(f"invalid duration {value!r}: use a number with ms, s, m, h or d (e.g. 30s)")
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    return seconds


_SIZE = re.compile(r"^\s*(\d+)\s*(B|KiB|MiB|GiB|KB|MB|GB)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"b": 1, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "kb": 1000, "mb": 1000**2, "gb": 1000**3}


def parse_size(value: Any) -> int:
    """Bytes from `1MiB`, `64KiB`, `500KB` or a bare number of bytes."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as 1MiB")
    if isinstance(value, int):
        return value
    match = _SIZE.match(str(value))
    if not match:
        raise ValueError(f"invalid size {value!r}: use bytes or a unit such as 64KiB, 1MiB")
    return int(match.group(1)) * _SIZE_UNITS[(match.group(2) or "b").lower()]


Duration = Annotated[float, BeforeValidator(parse_duration)]
Size = Annotated[int, BeforeValidator(parse_size)]


class _Section(BaseModel):
    # Strict about keys (a typo must not silently become a default), lax about "8080" vs 8080,
    # because ${PORT:-8080} substitution always produces strings.
    model_config = ConfigDict(extra="forbid", frozen=True)


class ListenConfig(_Section):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    # On SIGTERM: /readyz turns 503, new chats are refused, running responses get this long to
    # finish before they are ended with an error (SSE) or closed with 1001 (WebSocket).
    drain_timeout: Duration = 20.0

    @property
    def loopback(self) -> bool:
        host = self.host.strip("[]")
        if host == "localhost":
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False


class UpstreamConfig(_Section):
    url: AnyHttpUrl = AnyHttpUrl("http://127.0.0.1:8000")
    app_name: str = Field("demo_agent", min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    # sse: one `/run_sse` request per turn. live: one `/run_live` session per chat, kept across turns
    # (Gemini Live models; audio). Approvals and browser tools work in both through the plugin.
    mode: Literal["sse", "live"] = "sse"
    # Response modalities asked of a live session.
    live_modalities: list[Literal["TEXT", "AUDIO"]] = Field(default_factory=lambda: ["TEXT"], min_length=1)
    connect_timeout: Duration = Field(5.0, gt=0)
    # Longest silence tolerated on a running stream. There is deliberately no total timeout:
    # a run may legitimately stream for a long time.
    idle_timeout: Duration = Field(300.0, gt=0)
    # Pooled connections to the upstream; every streaming run holds one for its whole length.
    max_connections: int = Field(1000, ge=1)
    # How often /readyz may probe the upstream; between probes the last answer is reused.
    health_interval: Duration = Field(5.0, gt=0)


class ChatConfig(_Section):
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


class WebSocketConfig(_Section):
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


class ApiKey(_Section):
    """One browser API key: the key itself (from the environment) or its SHA-256 hex digest."""

    # The user id requests with this key act as: chats belong to it.
    id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.@-]+$")
    key: SecretStr | None = None
    sha256: str | None = Field(None, pattern=r"^[0-9a-fA-F]{64}$")


class JwtConfig(_Section):
    """Bearer JWTs whose `sub` is the user id."""

    algorithms: list[Literal["HS256", "RS256", "ES256"]] = Field(default_factory=lambda: ["HS256"], min_length=1)
    # HS256: the shared secret (from the environment).
    secret: SecretStr | None = None
    # RS256 / ES256: a PEM file with the issuer's public key.
    public_key_file: Path | None = None
    audience: str | None = None
    issuer: str | None = None
    # Clock skew tolerated on exp / nbf.
    leeway: Duration = 30.0


class AuthConfig(_Section):
    # none: every caller is `anonymous_user`; only allowed on a loopback listener (demos).
    # api_key: `Authorization: Bearer <key>` (or `x-api-key`). jwt: `Authorization: Bearer <jwt>`.
    # WebSocket upgrades may pass the credential as `?access_token=` (browsers cannot set headers).
    mode: Literal["none", "api_key", "jwt"] = "none"
    anonymous_user: str = Field("anonymous", min_length=1, pattern=r"^[A-Za-z0-9_.@-]+$")
    api_keys: list[ApiKey] = Field(default_factory=list)
    jwt: JwtConfig | None = None
    # Browser origins allowed to open the WebSocket and to call the SSE routes cross-origin (CORS).
    # Empty: same-origin pages and non-browser clients only. "*" allows any origin. A string is a
    # comma-separated list (what `${GATEWAY_ALLOWED_ORIGINS:-}` yields); "" is none.
    allowed_origins: list[str] = Field(default_factory=list)

    @field_validator("allowed_origins", mode="before")
    @classmethod
    def _origins_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.split(",")
        if isinstance(value, list):
            # Blank items (an unset `${VAR:-}`, a trailing comma) are no origin at all.
            return [item.strip() if isinstance(item, str) else item for item in value
                    if not (isinstance(item, str) and not item.strip())]
        return value

    @field_validator("allowed_origins")
    @classmethod
    def _origins_as_browsers_send_them(cls, origins: list[str]) -> list[str]:
        return [cls._origin(value) for value in origins]

    @staticmethod
    def _origin(value: str) -> str:
        """An entry as a browser's `Origin` header spells it: scheme://host[:port], lower case, without a
        default port or a trailing `/`. An entry that could never match is refused rather than ignored."""
        if value == "*":
            return value
        example = "an origin is scheme://host[:port] as the browser sends it, e.g. http://localhost:3000"
        if value.lower() == "null":
            raise ValueError(
                "'null' is refused: it is the Origin of sandboxed iframes and file: pages, which any site can produce"
            )
        try:
            parts = urlsplit(value)
            port = parts.port
        except ValueError:
            raise ValueError(f"{value!r} is not an origin: {example}") from None
        scheme = parts.scheme.lower()
        if not scheme or not parts.netloc or not parts.hostname:
            raise ValueError(f"{value!r} is not an origin: {example}")
        if scheme in ("ws", "wss"):
            raise ValueError(f"{value!r}: list the page's origin (http:// or https://), not a WebSocket URL; {example}")
        if parts.username is not None or parts.password is not None:
            raise ValueError(f"{value!r} holds a user name or password; {example}")
        if parts.path not in ("", "/") or parts.query or parts.fragment or value.endswith(("?", "#")):
            raise ValueError(f"{value!r} has a path, query or fragment; {example}")
        if "*" in parts.netloc:
            raise ValueError(f"{value!r}: no wildcards within an origin; list each one, or \"*\" alone for any")
        netloc = parts.netloc.lower().removesuffix(":")
        if port is not None and port == {"http": 80, "https": 443}.get(scheme):
            netloc = netloc.rsplit(":", 1)[0]
        return f"{scheme}://{netloc}"

    @model_validator(mode="after")
    def _credentials_for_mode(self) -> AuthConfig:
        if self.mode == "api_key":
            usable = [k for k in self.api_keys if (k.key and k.key.get_secret_value()) or k.sha256]
            if not usable:
                raise ValueError("auth.mode api_key needs at least one entry in auth.api_keys with a key or sha256")
            for entry in self.api_keys:
                if entry.key is not None and entry.sha256 is not None:
                    raise ValueError(f"auth.api_keys[{entry.id}]: give key or sha256, not both")
        if self.mode == "jwt":
            jwt = self.jwt
            if jwt is None:
                raise ValueError("auth.mode jwt needs an auth.jwt section")
            if "HS256" in jwt.algorithms and not (jwt.secret and jwt.secret.get_secret_value()):
                raise ValueError("auth.jwt.secret is required for HS256")
            if {"RS256", "ES256"} & set(jwt.algorithms):
                if "HS256" in jwt.algorithms:
                    # One key for both would let a public key be used as an HMAC secret.
                    raise ValueError("auth.jwt.algorithms: HS256 cannot be combined with RS256/ES256")
                if jwt.public_key_file is None:
                    raise ValueError("auth.jwt.public_key_file is required for RS256/ES256")
                if not jwt.public_key_file.is_file():
                    raise ValueError(f"auth.jwt.public_key_file {jwt.public_key_file} does not exist")
                try:
                    serialization.load_pem_public_key(jwt.public_key_file.read_bytes())
                except ValueError:
                    raise ValueError(f"auth.jwt.public_key_file {jwt.public_key_file} is not a PEM public key") from None
        return self


class LimitsConfig(_Section):
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


class ToolPolicy(_Section):
    """What the gateway does with calls to one tool (enforced by the ADK plugin in the agent)."""

    # A person must approve each call before it runs.
    approval: bool = False
    # `browser`: the call is answered by the browser (the AI SDK's onToolCall + addToolOutput).
    runs_in: Literal["server", "browser"] = "server"
    # How long to wait for the person (approval) or the browser (output).
    timeout: Duration = Field(300.0, gt=0)
    # What a timeout means for the call: `deny` (the tool does not run, the model is told it was
    # rejected; the browser sees tool-output-denied) or `error` (tool-output-error).
    on_timeout: Literal["deny", "error"] = "deny"
    # Shown to the person next to the approval request.
    hint: str | None = None
    # Live mode only: declare the tool NON_BLOCKING to the model (ADK `types.Behavior`), so the
    # conversation goes on while the call waits for a person; the result reaches the model later.
    # Default (blocking): the model's output stalls until the decision, though input keeps flowing.
    non_blocking: bool = False

    @property
    def gated(self) -> bool:
        """The plugin must ask the gateway before the call may proceed."""
        return self.approval or self.runs_in == "browser"


class InternalConfig(_Section):
    """The listener the gateway's ADK plugin calls; never exposed to browsers."""

    host: str = "127.0.0.1"
    port: int = Field(8081, ge=0, le=65535)
    # Shared with the plugin (ADK_GATEWAY_SECRET). Required as soon as a tool policy gates a tool.
    secret: SecretStr | None = None
    # How often the plugin re-reads the tool policy.
    policy_refresh: Duration = Field(30.0, gt=0)


class SessionsConfig(_Section):
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

    @model_validator(mode="after")
    def _redis_needs_url(self) -> SessionsConfig:
        if self.backend == "redis" and (self.redis_url is None or not self.redis_url.get_secret_value()):
            raise ValueError("sessions.redis_url is required with backend redis")
        if self.owner_timeout < 2 * self.heartbeat_interval:
            raise ValueError("sessions.owner_timeout must be at least twice sessions.heartbeat_interval")
        return self


class DemoConfig(_Section):
    # Serve the demo chat page at `/` (gateway/static/demo). Off in production configs;
    # `adk-gateway demo` turns it on.
    page: bool = False


# `logging.user_id_key`: a short key could be guessed along with the user ids.
_MIN_LOG_KEY = 16


class LoggingConfig(_Section):
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


class MetricsConfig(_Section):
    enabled: bool = True
    path: str = Field("/metrics", pattern=r"^/")


class GatewayConfig(_Section):
    listen: ListenConfig = ListenConfig()
    upstream: UpstreamConfig = UpstreamConfig()
    chat: ChatConfig = ChatConfig()
    websocket: WebSocketConfig = WebSocketConfig()
    auth: AuthConfig = AuthConfig()
    limits: LimitsConfig = LimitsConfig()
    logging: LoggingConfig = LoggingConfig()
    metrics: MetricsConfig = MetricsConfig()
    internal: InternalConfig = InternalConfig()
    demo: DemoConfig = DemoConfig()
    sessions: SessionsConfig = SessionsConfig()
    # Per-tool policy; the key `default` applies to every tool not listed.
    tools: dict[str, ToolPolicy] = Field(default_factory=dict)

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
        if any(p.gated for p in self.tools.values()) and not secret:
            raise ValueError(
                "internal.secret is required when a tool needs approval or runs in the browser "
                "(the ADK plugin authenticates with it)"
            )
        return self

    def tool_policy(self, name: str) -> ToolPolicy:
        return self.tools.get(name) or self.tools.get("default") or _NO_POLICY

    @property
    def upstream_base(self) -> str:
        return str(self.upstream.url).rstrip("/")


_NO_POLICY = ToolPolicy()

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
        lines = []
        for err in exc.errors():
            reason = err["msg"]
            if err["type"] == "extra_forbidden":
                reason = "unknown key"
            reason = reason.removeprefix("Value error, ")
            lines.append(f"{source}: {_format_loc(err['loc'])}: {reason}")
        raise ConfigError(lines) from None


def load_config(path: str | Path, *, env: dict[str, str] | None = None) -> GatewayConfig:
    """Read and validate a config file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror or exc}"]) from None
    return parse_config(text, source=str(path), env=env)
