"""The identity provider's signing keys, as the gateway holds them: fetched, cached, rotated with it.

Providers (Google, Auth0, Okta, Keycloak, Entra ID, Cognito...) publish their public keys as a JWKS
document and rotate them without notice: a new key is published, then tokens are signed with it,
then the old one goes. So the keys are fetched from `auth.jwt.jwks_url` (or the `jwks_uri` of the
issuer's OIDC discovery document) at start, again every `jwks_refresh`, and at once when a token
names a key id not held yet. Those unknown-key-id fetches are spaced from each other by
`jwks_min_refetch`, so a flood of made-up key ids cannot become a flood of requests to the provider;
they are not spaced from the start-up or scheduled fetches, so a key the provider publishes and
signs with a second after one of those is fetched at once rather than refused for a while. While
the provider is down, the keys held keep working. Whoever answers these fetches decides which
tokens pass, so where they go is held to config/auth.py's `key_source_problem` (https, the operator's
hosts; a redirect too) and what they read to `MAX_DOCUMENT_BYTES`; a document that fails either is
refused and the keys held stay. Parsing a JWK into a key is PyJWT's (`PyJWKSet`); nothing here
handles key material.

`KeyCache` decides (which keys are held, whether a fetch is due or allowed) without I/O; `Jwks`
fetches with aiohttp and owns the refresh task.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import structlog
from jwt import PyJWK, PyJWKSet
from jwt.exceptions import PyJWKSetError, PyJWTError

from ..config.auth import DISCOVERY_PATH, AuthConfig, JwtConfig, key_source_problem
from ..ops.stopping import cancel_and_wait

__all__ = ["MAX_DOCUMENT_BYTES", "Jwks", "KeyCache", "provider_keys"]

log = structlog.get_logger("adk_gateway.access.jwks")

# A failed scheduled fetch is retried this much sooner than `jwks_refresh`, bounded below by
# `jwks_min_refetch`: the provider gets no more than that, and keys come back soon after it does.
_RETRY_FRACTION = 0.1
# The largest JWKS or discovery document read. Providers publish a few keys in a few KB (Google,
# Entra ID, Okta: 1-10 KB); a larger answer is refused like any bad document, and the body is
# read in pieces so that this, not the provider, bounds the memory a fetch takes.
MAX_DOCUMENT_BYTES = 1024 * 1024


def provider_keys(auth: AuthConfig, on_fetch: Callable[[bool], None] | None = None) -> Jwks | None:
    """The provider's keys when `auth` takes them from it (a JWKS URL or discovery), not yet open."""
    if auth.mode != "jwt" or auth.jwt is None or not auth.jwt.provider_keys:
        return None
    return Jwks(auth.jwt, on_fetch=on_fetch)


class KeyCache:
    """The keys held, by key id, and when the provider may be asked again (no I/O, no clock)."""

    def __init__(self, refresh: float, min_refetch: float) -> None:
        self.refresh = refresh
        self.min_refetch = min_refetch
        self.keys: dict[str, PyJWK] = {}
        self.fetched_at: float | None = None
        self.attempted_at: float | None = None
        # When a token's unknown key id last caused a fetch: only those are rate-limited.
        self.refetched_at: float | None = None
        self.last_error: str | None = None

    def key(self, kid: str | None) -> PyJWK | None:
        """The key a token names; a token without `kid` may use the only key held."""
        if kid is None:
            return next(iter(self.keys.values())) if len(self.keys) == 1 else None
        return self.keys.get(kid)

    def take(self, document: Any, now: float) -> None:
        """A JWKS document fetched at `now`; raises ValueError when it holds no usable key (the
        keys held stay: a provider answering garbage must not log everyone out)."""
        self.attempted_at = now
        try:
            keys = PyJWKSet.from_dict(document if isinstance(document, dict) else {}).keys
        except (PyJWKSetError, PyJWTError) as exc:
            self.last_error = str(exc)
            raise ValueError(str(exc)) from None
        # Keys meant for encryption (`use: enc`) never verify a signature.
        usable = {k.key_id or "": k for k in keys if k.public_key_use in (None, "sig")}
        if not usable:
            self.last_error = "the JWKS document holds no signing key"
            raise ValueError(self.last_error)
        self.keys = usable
        self.fetched_at = now
        self.last_error = None

    def failed(self, error: str, now: float) -> None:
        self.attempted_at = now
        self.last_error = error

    def due(self, now: float) -> bool:
        """A scheduled fetch is due: never fetched, the refresh period passed, or a retry after a failure."""
        if self.fetched_at is None or (self.last_error is not None and self.attempted_at is not None):
            retry = max(self.min_refetch, self.refresh * _RETRY_FRACTION)
            return self.attempted_at is None or now - self.attempted_at >= retry
        return now - self.fetched_at >= self.refresh

    def may_refetch(self, now: float) -> bool:
        """An unknown key id may fetch the keys again now: no other unknown key id did within
        `min_refetch` (the start-up and scheduled fetches do not count)."""
        return self.refetched_at is None or now - self.refetched_at >= self.min_refetch

    def refetching(self, now: float) -> None:
        """An unknown key id causes a fetch at `now`."""
        self.refetched_at = now

    @property
    def status(self) -> str:
        """`ok`, `stale` (keys held, the last fetch failed) or `unavailable` (no keys)."""
        if not self.keys:
            return "unavailable"
        return "stale" if self.last_error is not None else "ok"


class Jwks:
    """The provider's keys for `auth.jwt`, kept current in the background once `open()`ed."""

    def __init__(
        self, settings: JwtConfig, *, on_fetch: Callable[[bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.cache = KeyCache(settings.jwks_refresh, settings.jwks_min_refetch)
        self._on_fetch = on_fetch
        self._clock = clock
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._fetching: asyncio.Task[None] | None = None
        self._jwks_url: str | None = str(settings.jwks_url) if settings.jwks_url is not None else None

    def open(self) -> None:
        """Start fetching (inside the event loop): the first fetch at once, then on schedule."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.settings.jwks_timeout), cookie_jar=aiohttp.DummyCookieJar(),
            )
            self._task = asyncio.create_task(self._refresh_loop(), name="jwks-refresh")

    async def close(self) -> None:
        tasks = [t for t in (self._task, self._fetching) if t is not None]
        await cancel_and_wait(tasks, 2.0, what="jwks")
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def key(self, kid: str | None) -> PyJWK | None:
        """The key a token names, fetching the keys again if it is new to us (rate-limited)."""
        found = self.cache.key(kid)
        now = self._clock()
        if found is None and self.cache.may_refetch(now):
            self.cache.refetching(now)
            await self.fetch()
            found = self.cache.key(kid)
        return found

    async def fetch(self) -> None:
        """Fetch the keys now; concurrent callers share one request."""
        if self._fetching is None or self._fetching.done():
            self._fetching = asyncio.create_task(self._fetch_once(), name="jwks-fetch")
        await asyncio.shield(self._fetching)

    async def _refresh_loop(self) -> None:
        while True:
            if self.cache.due(self._clock()):
                await self.fetch()
            await asyncio.sleep(min(self.settings.jwks_min_refetch, self.settings.jwks_refresh))

    async def _fetch_once(self) -> None:
        now = self._clock()
        try:
            url = self._jwks_url or await self._discover()
            document = await self._get_json(url, hosts=self._hosts())
            self.cache.take(document, now)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            reason = str(exc) or type(exc).__name__
            self.cache.failed(reason, now)
            if self.settings.discovery:
                self._jwks_url = None  # the provider may have moved its keys: discover again next time
            log.warning("jwks_fetch_failed", reason=reason, keys_held=len(self.cache.keys))
            if self._on_fetch is not None:
                self._on_fetch(False)
            return
        log.info("jwks_fetched", keys=sorted(self.cache.keys))
        if self._on_fetch is not None:
            self._on_fetch(True)

    async def _discover(self) -> str:
        """The JWKS URL the issuer's OIDC discovery document names (kept once found)."""
        issuer = (self.settings.issuer or "").rstrip("/")
        document = await self._get_json(issuer + DISCOVERY_PATH, hosts=None)
        if not isinstance(document, dict) or not isinstance(document.get("jwks_uri"), str):
            raise ValueError("the discovery document names no jwks_uri")
        # A document naming another issuer is not this provider's (OpenID Connect Discovery 4.3).
        if str(document.get("issuer", "")).rstrip("/") != issuer:
            raise ValueError(f"the discovery document is issuer {document.get('issuer')!r}, not {issuer!r}")
        problem = key_source_problem(document["jwks_uri"], allow_http=self.settings.jwks_allow_http, hosts=self._hosts())
        if problem:
            raise ValueError(f"the discovery document's jwks_uri: {problem}")
        self._jwks_url = document["jwks_uri"]
        return self._jwks_url

    def _hosts(self) -> set[str] | None:
        """The hosts a URL that discovery named may be on (None: the operator named the URL)."""
        if not self.settings.discovery:
            return None
        issuer_host = (urlsplit(self.settings.issuer or "").hostname or "").lower()
        return {issuer_host, *self.settings.jwks_hosts}

    async def _get_json(self, url: str, *, hosts: set[str] | None) -> Any:
        """The JSON document at `url`; a redirect's target is held to the rule `url` met (`hosts`)."""
        if self._session is None:
            raise ValueError("the key fetcher is not open")
        async with self._session.get(url, headers={"Accept": "application/json"}) as resp:
            if str(resp.url) != url:
                problem = key_source_problem(str(resp.url), allow_http=self.settings.jwks_allow_http, hosts=hosts)
                if problem:
                    raise ValueError(f"{url} redirected: {problem}")
            if resp.status != 200:
                raise ValueError(f"{url} answered HTTP {resp.status}")
            too_large = f"{url} answered a document larger than {MAX_DOCUMENT_BYTES} bytes"
            if resp.content_length is not None and resp.content_length > MAX_DOCUMENT_BYTES:
                raise ValueError(f"{too_large} ({resp.content_length})")
            # In pieces, stopping past the cap: `resp.json()` would hold any size the provider sends.
            body = bytearray()
            async for piece in resp.content.iter_chunked(64 * 1024):
                body += piece
                if len(body) > MAX_DOCUMENT_BYTES:
                    raise ValueError(too_large)
        return json.loads(body)  # a ValueError when not JSON, like any bad document
