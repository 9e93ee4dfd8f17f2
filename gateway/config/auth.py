"""Who may call the gateway, as configured: the auth mode, API keys, JWT settings and browser origins.

`GatewayConfig.auth` (config/schema.py) is an `AuthConfig`; access/auth.py carries it out per request.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from cryptography.hazmat.primitives import serialization
from pydantic import AnyHttpUrl, Field, PrivateAttr, SecretStr, field_validator, model_validator

from .values import ClaimValues, Duration, Section

__all__ = ["DISCOVERY_PATH", "ApiKey", "AuthConfig", "JwtConfig", "key_source_problem"]

DISCOVERY_PATH = "/.well-known/openid-configuration"


def key_source_problem(url: str, *, allow_http: bool, hosts: Collection[str] | None = None) -> str | None:
    """Why the provider's keys (or its discovery document) may not be read from `url`, or None.

    Whoever answers there chooses which tokens pass, so it is reached over https: plain http only
    on a loopback host (nobody between), or with `auth.jwt.jwks_allow_http`. `hosts` (lower case),
    for a URL that discovery named: the issuer's host and `auth.jwt.jwks_hosts`, so that a
    discovery document cannot send the gateway to keys on a host the operator never named.
    """
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if parts.scheme not in ("http", "https") or not host:
        return f"{url} is not an http(s) URL"
    if parts.scheme == "http" and not allow_http and not _loopback(host):
        return (f"{url} is plain http on a host that is not loopback: the provider's keys decide which tokens "
                "pass, so they come over https (auth.jwt.jwks_allow_http allows http on a private network)")
    if hosts is not None and host not in hosts:
        return (f"{url} is on {host}, not the issuer's host: list {host} in auth.jwt.jwks_hosts if the provider "
                "publishes its keys there")
    return None


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class ApiKey(Section):
    """One browser API key: the key itself (from the environment) or its SHA-256 hex digest."""

    # The user id requests with this key act as: chats belong to it.
    id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.@-]+$")
    key: SecretStr | None = None
    sha256: str | None = Field(None, pattern=r"^[0-9a-fA-F]{64}$")


_ASYMMETRIC = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
Algorithm = Literal["HS256", "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"]


class JwtConfig(Section):
    """Bearer JWTs: how their signature is checked (a shared secret, a PEM key, or the identity
    provider's published keys), which claims they must carry, and which claim is the user id."""

    algorithms: list[Algorithm] = Field(default_factory=lambda: ["HS256"], min_length=1)
    # HS256: the shared secret (from the environment).
    secret: SecretStr | None = None
    # RS*/PS*/ES*/EdDSA with one fixed key: a PEM file with the issuer's public key.
    public_key_file: Path | None = None
    # The provider's signing keys (a JWKS document), refetched as it rotates them. Or leave it out
    # and set `discovery: true`: the JWKS URL is read from `issuer` + /.well-known/openid-configuration.
    jwks_url: AnyHttpUrl | None = None
    discovery: bool = False
    # How often the keys are fetched again (a provider publishes a new key before signing with it).
    jwks_refresh: Duration = Field(600.0, gt=0)
    # A token signed with a key not held yet fetches the keys again at once; two such fetches are at
    # least this far apart (start-up and scheduled fetches do not count): a flood of made-up `kid`s
    # must not turn into a flood of requests to the provider.
    jwks_min_refetch: Duration = Field(30.0, gt=0)
    # Total time for one fetch of the keys (or the discovery document).
    jwks_timeout: Duration = Field(5.0, gt=0)
    # Hosts besides the issuer's that a `jwks_uri` found by discovery may name (Google's ID tokens:
    # issuer accounts.google.com, keys on www.googleapis.com). Others are refused.
    jwks_hosts: list[str] = Field(default_factory=list)
    # Read the keys (jwks_url, discovery) over plain http on a host that is not loopback: whoever
    # sits on the path could then publish keys of their own. Only on a private network.
    jwks_allow_http: bool = False
    audience: str | None = None
    issuer: str | None = None
    # The claim that is the user id (chats belong to it): `sub`, or e.g. `email`, `oid`, a custom one.
    user_claim: str = Field("sub", min_length=1, max_length=128)
    # Claims every token must carry, each with the values allowed (a string claim equals one, a
    # list claim such as `groups` or `scope` words holds one); per agent: agents.<name>.access.
    required_claims: ClaimValues = Field(default_factory=dict)
    # Clock skew tolerated on exp / nbf.
    leeway: Duration = 30.0
    # The PEM `public_key_file` held when the config was validated: the key tokens are checked with,
    # and what a reload compares (another key in the same file is another signer).
    _public_key_pem: bytes | None = PrivateAttr(None)

    @property
    def public_key_pem(self) -> bytes | None:
        return self._public_key_pem

    @field_validator("jwks_hosts")
    @classmethod
    def _host_names(cls, hosts: list[str]) -> list[str]:
        for host in hosts:
            if not host or any(c in host for c in "/:@?#") and not host.startswith("["):
                raise ValueError(f"{host!r}: list a host name as the URL has it (www.googleapis.com), not a URL")
        return [host.strip().lower().strip("[]") for host in hosts]

    @property
    def provider_keys(self) -> bool:
        """The keys come from the provider (a JWKS URL, or discovery), not from this config."""
        return self.jwks_url is not None or self.discovery


class AuthConfig(Section):
    # none: every caller is `anonymous_user`; only allowed on a loopback listener (demos).
    # api_key: `Authorization: Bearer <key>` (or `x-api-key`). jwt: `Authorization: Bearer <jwt>`.
    # Browsers cannot set headers on a WebSocket: see `cookie_name` and `ws_ticket_ttl`.
    mode: Literal["none", "api_key", "jwt"] = "none"
    anonymous_user: str = Field("anonymous", min_length=1, pattern=r"^[A-Za-z0-9_.@-]+$")
    api_keys: list[ApiKey] = Field(default_factory=list)
    jwt: JwtConfig | None = None
    # Browser origins allowed to open the WebSocket and to call the SSE routes cross-origin (CORS).
    # Empty: same-origin pages and non-browser clients only. "*" allows any origin, without
    # credentials (CORS answers `*` itself), and never with `cookie_name`. A string is a
    # comma-separated list (what `${GATEWAY_ALLOWED_ORIGINS:-}` yields); "" is none.
    allowed_origins: list[str] = Field(default_factory=list)
    # A cookie that carries the credential (the JWT or API key) for apps that sign their users in
    # on the same site: browsers send it with every request and with WebSocket handshakes, so no
    # token sits in a URL. A request whose credential came from it must carry an allowed `Origin`
    # when it changes state (a POST, a WebSocket handshake): what a cookie opens to cross-site forgery.
    cookie_name: str | None = Field(None, min_length=1, max_length=128, pattern=r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")

    # A WebSocket ticket's lifetime: a page trades its credential (in a header) for a single-use
    # ticket at `POST .../api/chat/ws-ticket` and opens the socket with `?ticket=` (access/tickets.py).
    ws_ticket_ttl: Duration = Field(30.0, gt=0, le=600)
    # Also accept the credential itself as `?access_token=` in a URL. Off: a long-lived token in a
    # URL is kept by proxies' logs and browsers' histories. Only for clients that cannot move to a
    # ticket or the cookie yet; the gateway warns at start while it is on.
    allow_token_in_url: bool = False

    @field_validator("cookie_name", mode="before")
    @classmethod
    def _blank_is_none(cls, value: Any) -> Any:
        # An unset `${GATEWAY_AUTH_COOKIE:-}` is no cookie at all.
        return None if isinstance(value, str) and not value.strip() else value

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
    def _no_cookie_for_any_origin(self) -> AuthConfig:
        # Browsers send the cookie on their own, with every site's requests and handshakes: "*"
        # would let any page act as whoever is signed in. Refused whatever the mode, so that no
        # later `auth.mode` change can turn the combination on.
        if self.cookie_name and "*" in self.allowed_origins:
            raise ValueError(
                'auth.cookie_name cannot be combined with auth.allowed_origins "*": any site could make requests '
                "that carry the cookie; list the pages' origins instead"
            )
        return self

    @model_validator(mode="after")
    def _jwt_checks_not_blank(self) -> AuthConfig:
        # An empty audience or issuer (an unset `${JWT_AUDIENCE:-}`) is not "unchecked": it would
        # be compared, and every token answered 401 with nothing said at start.
        if self.mode == "jwt" and self.jwt is not None:
            for name in ("audience", "issuer"):
                if getattr(self.jwt, name) is not None and not getattr(self.jwt, name).strip():
                    raise ValueError(f"auth.jwt.{name} is empty: set it (from its environment variable) or leave the key out")
        return self

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
            if jwt.discovery and not jwt.issuer:
                raise ValueError("auth.jwt.discovery needs auth.jwt.issuer (its /.well-known/openid-configuration names the keys)")
            if jwt.jwks_url is not None and jwt.discovery:
                raise ValueError("auth.jwt: give jwks_url or discovery, not both")
            source = str(jwt.jwks_url) if jwt.jwks_url is not None else None
            if jwt.discovery and jwt.issuer:
                source = jwt.issuer.rstrip("/") + DISCOVERY_PATH
            problem = key_source_problem(source, allow_http=jwt.jwks_allow_http) if source else None
            if problem:
                raise ValueError(f"auth.jwt: {problem}")
            if "HS256" in jwt.algorithms and not (jwt.secret and jwt.secret.get_secret_value()):
                raise ValueError("auth.jwt.secret is required for HS256")
            if "HS256" in jwt.algorithms and jwt.provider_keys:
                raise ValueError("auth.jwt: HS256 takes a shared secret; a provider's published keys are public keys (RS256, ES256, ...)")
            if set(_ASYMMETRIC) & set(jwt.algorithms):
                if "HS256" in jwt.algorithms:
                    # One key for both would let a public key be used as an HMAC secret.
                    raise ValueError("auth.jwt.algorithms: HS256 cannot be combined with public-key algorithms")
                if jwt.provider_keys and jwt.public_key_file is not None:
                    raise ValueError("auth.jwt: give public_key_file or the provider's keys (jwks_url / discovery), not both")
                if jwt.provider_keys:
                    return self
                if jwt.public_key_file is None:
                    raise ValueError("auth.jwt.public_key_file, jwks_url or discovery is required for public-key algorithms")
                if not jwt.public_key_file.is_file():
                    raise ValueError(f"auth.jwt.public_key_file {jwt.public_key_file} does not exist")
                pem = jwt.public_key_file.read_bytes()
                try:
                    serialization.load_pem_public_key(pem)
                except ValueError:
                    raise ValueError(f"auth.jwt.public_key_file {jwt.public_key_file} is not a PEM public key") from None
                jwt._public_key_pem = pem
        return self
