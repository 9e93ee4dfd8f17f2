"""Who is calling, and from which page: the browser-facing identity every chat is scoped to.

- `none`: every caller is the configured anonymous user (allowed only on a loopback listener).
- `api_key`: `Authorization: Bearer <key>` or `x-api-key: <key>`; keys are held as SHA-256
  digests, so the config may carry digests instead of keys and no key sits in memory in clear.
- `jwt`: `Authorization: Bearer <token>`, checked with PyJWT (signature, exp, nbf, aud, iss, the
  required claims) against a shared secret, a PEM key, or the identity provider's published keys
  (access/jwks.py); its `user_claim` (default `sub`) is the user id.
Browsers cannot set headers on a WebSocket handshake: a page there uses the `auth.cookie_name`
cookie or a ticket (access/tickets.py; admit.py redeems it). `?access_token=` in a URL is read only with
`auth.allow_token_in_url` (the access log records paths without their query string).

Every refusal writes one `auth_refused` line at info (the default level) with a reason code from
`_JWT_REASONS` or the refusals below, and never the credential nor any part of it: an operator
debugging a login sees why. Not sampled: a flood of bad tokens already writes one access line
(`http_request`) per request, so this at most doubles what it logs, and an operator can drop info
lines (`logging.level: warning`) or let the proxy rate-limit unauthenticated traffic.

The returned user id namespaces chats and ADK sessions: one user never reaches another's chats.
`may_use` decides whether an identity may use an agent (its `access:`), `check_origin` guards
WebSocket upgrades and CORS against pages that are not allowed.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import jwt
import structlog
from aiohttp import web

from ..config.agent import AgentAccess
from ..config.auth import AuthConfig
from ..core.refusals import HttpError
from .jwks import Jwks

__all__ = ["Authenticator", "Identity", "claim_holds", "unauthorized", "warn_token_in_url"]

log = structlog.get_logger("adk_gateway.access.auth")

_USER_ID_MAX = 128


# Why PyJWT refused a token, as the reason code logged. Subclasses before their bases
# (InvalidSignatureError is a DecodeError; every one is an InvalidTokenError).
_JWT_REASONS: tuple[tuple[type[jwt.PyJWTError], str], ...] = (
    (jwt.ExpiredSignatureError, "expired"),
    (jwt.ImmatureSignatureError, "not_yet_valid"),
    (jwt.InvalidAudienceError, "audience"),
    (jwt.InvalidIssuerError, "issuer"),
    (jwt.MissingRequiredClaimError, "missing_claim"),
    (jwt.InvalidSignatureError, "bad_signature"),
    (jwt.InvalidAlgorithmError, "algorithm"),
    (jwt.DecodeError, "malformed"),
)


def unauthorized(reason: str, message: str, **detail: str) -> HttpError:
    """The 401 for a refused credential, logged with its reason code (`detail`: config-side names
    only, such as the claim a token lacks; never anything the caller sent)."""
    log.info("auth_refused", reason=reason, **detail)
    return HttpError(401, "unauthorized", message, {"WWW-Authenticate": 'Bearer realm="adk-gateway"'})


def _jwt_reason(exc: jwt.PyJWTError) -> str:
    return next((reason for kind, reason in _JWT_REASONS if isinstance(exc, kind)), "invalid")


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a request acts for: the user id its chats belong to, and (JWT) the token's claims."""

    user_id: str
    claims: Mapping[str, Any] = field(default_factory=dict)
    # The credential came from the `auth.cookie_name` cookie (the browser sent it on its own).
    via_cookie: bool = False


class Authenticator:
    def __init__(self, config: AuthConfig, jwks: Jwks | None = None) -> None:
        self._config = config
        # The identity provider's published keys (auth.jwt.jwks_url or discovery); None otherwise.
        self._jwks = jwks
        self._keys: dict[str, str] = {}
        for entry in config.api_keys:
            if entry.key is not None and entry.key.get_secret_value():
                self._keys[hashlib.sha256(entry.key.get_secret_value().encode()).hexdigest()] = entry.id
            elif entry.sha256:
                self._keys[entry.sha256.lower()] = entry.id
        self._jwt_key: Any = None
        public_key: bytes | None = None
        if config.mode == "jwt" and config.jwt is not None:
            if config.jwt.public_key_file is not None:
                # The key the config was validated (and a reload judged) with, not the file as it is now.
                self._jwt_key = public_key = config.jwt.public_key_pem or config.jwt.public_key_file.read_bytes()
            elif config.jwt.secret is not None:
                self._jwt_key = config.jwt.secret.get_secret_value()
        self._origins = frozenset(o.rstrip("/") for o in config.allowed_origins)
        self.fingerprint = _fingerprint(config, public_key)

    async def user_id(self, request: web.Request) -> str:
        """The caller's user id, or raise HttpError(401)."""
        return (await self.identify(request)).user_id

    async def identify(self, request: web.Request) -> Identity:
        """Who the caller is, or raise HttpError(401)."""
        mode = self._config.mode
        if mode == "none":
            return Identity(self._config.anonymous_user)
        credential = _credential(request, self._config.allow_token_in_url)
        via_cookie = False
        if not credential and self._config.cookie_name:
            credential = request.cookies.get(self._config.cookie_name, "").strip()
            via_cookie = bool(credential)
        if not credential:
            raise unauthorized("no_credential", "credentials required: Authorization: Bearer <token>")
        if mode == "api_key":
            user = self._keys.get(hashlib.sha256(credential.encode()).hexdigest())
            if user is None:
                raise unauthorized("unknown_api_key", "unknown API key")
            return Identity(user, via_cookie=via_cookie)
        identity = self._jwt_identity(credential, await self._signing_key(credential))
        return Identity(identity.user_id, identity.claims, via_cookie) if via_cookie else identity

    async def _signing_key(self, token: str) -> Any:
        """The key that checks the token's signature: configured, or the provider's by the token's `kid`."""
        if self._jwks is None:
            return self._jwt_key
        try:
            kid = jwt.get_unverified_header(token).get("kid")
        except jwt.PyJWTError as exc:
            raise unauthorized("malformed", f"invalid token: {exc}") from None
        if kid is not None and not isinstance(kid, str):
            raise unauthorized("malformed", "invalid token: kid is not a string")
        found = await self._jwks.key(kid)
        if found is None:
            # Fetched again already if allowed (access/jwks.py): a key the provider does not publish.
            raise unauthorized("unknown_kid", "invalid token: signed with a key the identity provider does not publish")
        return found.key

    @staticmethod
    def may_use(identity: Identity, access: AgentAccess) -> bool:
        """Whether `identity` may use an agent with this `access:` (config/schema.py validates that the
        lists fit the auth mode: an API key list under api_key, claims under jwt)."""
        if access.api_keys is not None and identity.user_id not in access.api_keys:
            return False
        return all(claim_holds(identity.claims.get(claim), allowed) for claim, allowed in (access.jwt_claims or {}).items())

    def _jwt_identity(self, token: str, key: Any) -> Identity:
        settings = self._config.jwt
        assert settings is not None
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=list(settings.algorithms),
                audience=settings.audience,
                issuer=settings.issuer,
                leeway=settings.leeway,
                options={"require": [settings.user_claim, "exp"], "verify_aud": settings.audience is not None},
            )
        except jwt.ExpiredSignatureError:
            raise unauthorized("expired", "token expired") from None
        except jwt.MissingRequiredClaimError as exc:
            raise unauthorized("missing_claim", f"invalid token: {exc}", claim=exc.claim) from None
        except jwt.PyJWTError as exc:
            # Every PyJWT failure is the token's fault as far as the caller is concerned (a key that
            # does not fit the token's algorithm included), never a 500.
            raise unauthorized(_jwt_reason(exc), f"invalid token: {exc}") from None
        subject = claims.get(settings.user_claim)
        if not isinstance(subject, str) or not 0 < len(subject) <= _USER_ID_MAX:
            raise unauthorized(
                "bad_user_claim", f"invalid token: {settings.user_claim} must be a non-empty string", claim=settings.user_claim,
            )
        for claim, allowed in settings.required_claims.items():
            if not claim_holds(claims.get(claim), allowed):
                raise unauthorized(
                    "claim_not_allowed", f"invalid token: its {claim} claim is not one this gateway accepts", claim=claim,
                )
        return Identity(subject, claims)

    def origin_allowed(self, origin: str | None, host: str | None, scheme: str = "http", *, any_origin: bool = True) -> bool:
        """An Origin may open a socket or read a response: the gateway's own (the scheme, host and port
        the request reached it on), or listed. `"*"` stands for every origin only where `any_origin`."""
        if origin is None:
            return True  # not a browser, so no page to protect against
        origin = origin.rstrip("/")
        if origin in self._origins or (any_origin and "*" in self._origins):
            return True
        return host is not None and origin.lower() == _own_origin(scheme, host)

    def check_origin(self, request: web.Request, identity: Identity | None = None) -> None:
        """Refuse a page whose origin is not allowed; with a cookie credential, also a request that
        changes state (a POST, a WebSocket handshake) without an `Origin`: browsers always send one
        there, and the cookie would otherwise ride along on a forged cross-site request."""
        origin = request.headers.get("Origin")
        via_cookie = identity is not None and identity.via_cookie
        # A cookie rides along on any site's request: only a page named in the list, or the
        # gateway's own, may use it, never one let in by "*" (the config refuses the pair too).
        if not self.origin_allowed(origin, request.host, request.scheme, any_origin=not via_cookie):
            raise HttpError(403, "origin_not_allowed", "this page's origin may not use the gateway")
        changes_state = request.method not in ("GET", "HEAD") or request.headers.get("Upgrade", "").lower() == "websocket"
        if via_cookie and changes_state and origin is None:
            raise HttpError(403, "origin_required", "a request authenticated by cookie must carry its page's Origin")

    def cors_headers(self, request: web.Request) -> dict[str, str]:
        """CORS headers for a cross-origin browser request from an allowed origin (else none).

        A listed origin is echoed with `Access-Control-Allow-Credentials: true`. One let in by `"*"`
        alone is answered `Access-Control-Allow-Origin: *` as it is, without credentials, so browsers
        keep every credential they would send on their own (cookies, HTTP auth, client certificates)
        out of what any site can read: the gateway's own credentials travel in headers, which a page
        sets itself and `*` allows."""
        origin = request.headers.get("Origin")
        if origin is None or not self._origins:
            return {}
        if origin.rstrip("/") in self._origins:
            allow = {"Access-Control-Allow-Origin": origin, "Access-Control-Allow-Credentials": "true"}
        elif "*" in self._origins:
            allow = {"Access-Control-Allow-Origin": "*"}
        else:
            return {}
        return {
            **allow,
            "Access-Control-Expose-Headers": "x-vercel-ai-ui-message-stream, X-Request-Id, Retry-After",
            # Whether, and what, is answered depends on the Origin: caches must not mix answers.
            "Vary": "Origin",
        }


def warn_token_in_url(config: AuthConfig) -> None:
    """At start, and when a reload turns it on: say that credentials are read from URLs."""
    if config.mode != "none" and config.allow_token_in_url:
        log.warning(
            "token_in_url_allowed",
            detail="auth.allow_token_in_url is on: ?access_token= is accepted on every chat route, where proxies' "
            "logs and browsers' histories keep it; move WebSocket clients to tickets or the cookie and turn it off",
        )


def claim_holds(value: Any, allowed: list[str]) -> bool:
    """A claim holds one of the allowed values: a string equals one, a list (`groups`, `aud`) holds
    one, and `scope`, a space-separated string by RFC 8693, holds one of its words."""
    if isinstance(value, str):
        values = [value, *value.split()] if " " in value else [value]
    elif isinstance(value, list):
        values = value
    else:
        return False
    return any(isinstance(v, str) and v in allowed for v in values)


def _own_origin(scheme: str, host: str) -> str:
    """The origin a page served from this request's scheme and `Host` sends: lower case, without a
    default port (a `Host` may carry one, an `Origin` never does)."""
    scheme, host = scheme.lower(), host.lower()
    default_port = {"http": ":80", "https": ":443"}.get(scheme)
    if default_port and host.endswith(default_port):
        host = host.removesuffix(default_port)
    return f"{scheme}://{host}"


def _credential(request: web.Request, token_in_url: bool) -> str:
    header = request.headers.get("Authorization", "")
    if header[:7].lower() == "bearer ":
        return header[7:].strip()
    credential = request.headers.get("x-api-key", "").strip()
    if credential or "access_token" not in request.query:
        return credential
    if not token_in_url:
        raise unauthorized(
            "token_in_url_off",
            "?access_token= is turned off on this gateway (auth.allow_token_in_url): send the credential in "
            "the Authorization header, or on a WebSocket use a ticket from POST .../api/chat/ws-ticket or the cookie"
        )
    return request.query.get("access_token", "").strip()


def _fingerprint(config: AuthConfig, public_key: bytes | None) -> str:
    """What a WebSocket ticket is issued under: every auth setting (and the contents of the PEM key
    file, which another issuer's key changes under the same path), so a reload that changes who may
    call (a key revoked, another issuer) voids tickets outstanding.

    The ticket's record sits in the shared store, so this is an HMAC keyed with the settings' own
    secrets (API keys or their digests, the JWT secret) over the rest, not a bare hash with the
    secrets inside. Not a per-process random key: every replica with the same settings must reach
    the same value, or a ticket issued by one would not open a socket on another."""
    secrets_ = [entry.key.get_secret_value() if entry.key is not None else entry.sha256 or "" for entry in config.api_keys]
    if config.jwt is not None and config.jwt.secret is not None:
        secrets_.append(config.jwt.secret.get_secret_value())
    key = hashlib.sha256(json.dumps(secrets_).encode()).digest()
    # In JSON mode a SecretStr is written as "**********": the secrets are in the key alone.
    settings = config.model_dump(mode="json")
    settings["public_key_sha256"] = hashlib.sha256(public_key).hexdigest() if public_key is not None else None
    return hmac.new(key, json.dumps(settings, sort_keys=True).encode(), hashlib.sha256).hexdigest()
