"""The gateway-wide sections of the configuration: listeners, chats, WebSockets, limits, the internal
listener, the session store, the demo, logging and metrics.

`GatewayConfig` (schema.py) holds one of each; the rules across sections are its. An agent's
sections are agent.py's, auth's auth.py's.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit
from typing import Annotated, Literal

from pydantic import Field, SecretStr, StringConstraints, model_validator

from .values import Duration, Section, Size

__all__ = [
    "MIN_SESSIONS_SECRET", "ChatConfig", "DemoConfig", "InternalConfig", "LimitsConfig", "ListenConfig", "LoggingConfig",
    "MetricsConfig", "ReloadConfig", "SessionsConfig", "WebSocketConfig",
]

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
    # The asyncio event loop: uvloop where it is installed (4-6% fewer instructions per streamed
    # event, docs/performance.md), else the standard one; $ADK_GATEWAY_LOOP overrides. Read at start only.
    event_loop: Literal["auto", "uvloop", "asyncio"] = "auto"

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
    # Approvals one user's calls may have listed for approvers at once, every chat and agent
    # together (counted in the shared store); more are refused to the agent, so that no user's
    # calls crowd out another's in the approvers' inbox.
    max_pending_approvals_per_user: int = Field(64, ge=1)
    # Requests per second per user (token bucket; 429 with Retry-After), and the burst allowed.
    rate_per_user: float = Field(20.0, gt=0)
    burst_per_user: int = Field(40, ge=1)
    # With sessions.backend redis the replicas share the per-user rate and stream caps in Redis;
    # while Redis cannot be reached: local (each replica applies them alone, as with one replica)
    # or refuse (503 limits_unavailable with Retry-After). Never unlimited (docs/security.md).
    shared_fallback: Literal["local", "refuse"] = "local"


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
MIN_SESSIONS_SECRET = 16


def _host_port(entry: str) -> tuple[str, int]:
    """"host:port" or "[v6]:port" to its parts; ValueError without both."""
    host, sep, port = entry.strip().rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(entry)
    return host, int(port)


def _check_sentinels(sentinels: list[str], service: str | None, url: str) -> None:
    """Sentinel settings that are whole and do not contradict redis_url (which, with them, names no host)."""
    if not sentinels:
        raise ValueError("sessions.redis_sentinel_service without sessions.redis_sentinels: list the sentinels (host:port)")
    if not service:
        raise ValueError("sessions.redis_sentinels without sessions.redis_sentinel_service: name the primary the "
                         "sentinels monitor (`sentinel monitor <name> ...` in their configuration)")
    for i, entry in enumerate(sentinels):
        try:
            _host_port(entry)
        except ValueError:
            raise ValueError(f"sessions.redis_sentinels[{i}]: {entry!r} is not host:port") from None
    if url:
        # The URL is a secret: said what is wrong with it, never quoted.
        parsed = urlsplit(url)
        if parsed.scheme not in ("redis", "rediss"):
            raise ValueError("sessions.redis_url with sessions.redis_sentinels: the scheme is redis:// or rediss://")
        try:
            named_host = bool(parsed.hostname or parsed.port)
        except ValueError:
            named_host = True
        if named_host:
            raise ValueError(
                "sessions.redis_url names a host and sessions.redis_sentinels are set: with sentinels the primary's "
                "address comes from them; keep only the credentials and db in redis_url (redis://:password@/0)"
            )


class SessionsConfig(Section):
    """Where chat state that several replicas must share lives (docs/scaling.md)."""

    # memory: this process only (one replica). redis: replicas behind one load balancer share
    # the chat directory, replica heartbeats, gated-call records and relays in Redis.
    backend: Literal["memory", "redis"] = "memory"
    # redis://[:password@]host:port/db; a secret, because it may carry the password. With
    # `redis_sentinels`, no host: only the scheme, credentials and db (`redis://:password@/0`).
    redis_url: SecretStr | None = None
    # Redis Sentinel (docs/scaling.md "Redis that fails over"): the sentinels, as host:port. The
    # primary's address is asked of them, so a promotion is followed without a restart.
    redis_sentinels: list[str] = Field(default_factory=list)
    # The primary's name in the sentinels' configuration (`sentinel monitor <name> ...`).
    redis_sentinel_service: str | None = Field(None, min_length=1)
    # The sentinels' own credentials and TLS, when they have any (the data nodes' are redis_url's).
    redis_sentinel_username: str | None = None
    redis_sentinel_password: SecretStr | None = None
    redis_sentinel_tls: bool = False
    # Connections to Redis this replica's commands may hold at once (the heartbeat and the inbox
    # have two more of their own). A command that finds them all in use waits for one, up to
    # the command timeout (5 s), then is answered 503 `gateway_overloaded`. Most commands hold one
    # for a round trip; a browser following a response that runs on another replica holds one
    # while its relay read waits (up to heartbeat_interval). 500 covers several hundred such
    # streams per replica, and ten replicas stay at half of Redis's default `maxclients` (10,000).
    redis_max_connections: int = Field(500, ge=8, le=100_000)
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
        url = self.redis_url.get_secret_value() if self.redis_url is not None else ""
        if self.redis_sentinels or self.redis_sentinel_service:
            _check_sentinels(self.redis_sentinels, self.redis_sentinel_service, url)
        elif self.backend == "redis" and not url:
            raise ValueError("sessions.redis_url is required with backend redis (or sessions.redis_sentinels and "
                             "sessions.redis_sentinel_service)")
        if self.accepted_secrets and not self.seal_secrets() and any(s.get_secret_value() for s in self.accepted_secrets):
            raise ValueError("sessions.accepted_secrets without sessions.secret: accepted keys alone seal nothing")
        short = [name for name, value in self._secrets() if value and len(value) < MIN_SESSIONS_SECRET]
        if short:
            raise ValueError(
                f"{', '.join(short)}: a sessions secret is at least {MIN_SESSIONS_SECRET} characters (a random string)"
            )
        if self.owner_timeout < 2 * self.heartbeat_interval:
            raise ValueError("sessions.owner_timeout must be at least twice sessions.heartbeat_interval")
        return self

    def sentinel_addresses(self) -> list[tuple[str, int]]:
        """`redis_sentinels` as (host, port) pairs (the validator has checked them)."""
        return [_host_port(entry) for entry in self.redis_sentinels]

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
    # Model ids (ADK's modelVersion, exactly) kept as the `model` label of adk_gateway_tokens_total;
    # every other model counts as "other", so the label's values are bounded by this list.
    models: list[Annotated[str, StringConstraints(min_length=1, max_length=128)]] = Field(default_factory=list, max_length=64)

    @model_validator(mode="after")
    def _path_clear_of_the_plugin_routes(self) -> MetricsConfig:
        if self.listener == "internal" and self.path.startswith("/internal/"):
            raise ValueError("metrics.path: on the internal listener, /internal/ is the plugin's")
        return self


class ReloadConfig(Section):
    # Reload when the config file's content changes, without a SIGHUP (edge/config_watch.py): a
    # Kubernetes ConfigMap volume swaps a `..data` symlink, which only a look at the content sees.
    # The change runs the SIGHUP path, so it fails closed as SIGHUP does.
    watch: bool = True
    # How often the content is looked at. A change is acted on once it has stayed the same for one
    # look (a file still being written is not read half-way), so within twice this.
    watch_interval: Duration = Field(5.0, ge=0.05, le=3600)
