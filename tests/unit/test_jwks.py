"""Tokens from an identity provider with published, rotating keys (issue 17, JWKS and OIDC discovery).

The provider is a stand-in served by the test: an OIDC discovery document and a JWKS document,
with real RSA, EC and Ed25519 keys, which the test rotates, breaks and takes down. Tokens are signed
with PyJWT as a provider would. The gateway side is the real Authenticator and Jwks, and the real
app for the routes, readiness and metrics.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import jwt
import pytest
import structlog
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer, make_mocked_request
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

from gateway.edge.app import create_app
from gateway.access.auth import Authenticator
from gateway.config.schema import parse_config
from gateway.core.refusals import HttpError
from gateway.access.jwks import Jwks, KeyCache
from gateway.edge.state import GATEWAY
from tests.support.clock import Clock

AUDIENCE = "my-app"


@dataclass
class SigningKey:
    kid: str
    private: Any
    alg: str

    def public_jwk(self) -> dict[str, Any]:
        algorithm = {"RS256": RSAAlgorithm, "ES256": ECAlgorithm, "EdDSA": OKPAlgorithm}[self.alg]
        jwk = json.loads(algorithm.to_jwk(self.private.public_key()))
        return {**jwk, "kid": self.kid, "use": "sig", "alg": self.alg}


def rsa_key(kid: str) -> SigningKey:
    return SigningKey(kid, rsa.generate_private_key(public_exponent=65537, key_size=2048), "RS256")


@dataclass
class Provider:
    """An OIDC provider stand-in: what it publishes, and what it was asked."""

    issuer: str = ""
    keys: list[SigningKey] = field(default_factory=list)
    up: bool = True
    jwks_fetches: int = 0
    discovery_issuer: str | None = None
    discoveries: int = 0
    jwks_path: str = "/keys"
    # Bytes of padding added to the next documents (a member no one reads), sent as a stream of
    # 64 KiB writes without Content-Length; `sent` counts the bytes the stand-in wrote.
    padding: int = 0
    discovery_padding: int = 0
    sent: int = 0
    # What discovery names as jwks_uri instead of its own `jwks_path`, and where /moved redirects.
    jwks_uri: str | None = None
    moved_to: str = ""

    def sign(self, key: SigningKey, **claims: Any) -> str:
        now = int(time.time())
        body = {"iss": self.issuer, "aud": AUDIENCE, "sub": "user-1", "iat": now, "exp": now + 300, **claims}
        return jwt.encode(body, key.private, algorithm=key.alg, headers={"kid": key.kid})

    async def discovery(self, request: web.Request) -> web.Response:
        self.discoveries += 1
        document = {"issuer": self.discovery_issuer or self.issuer, "jwks_uri": self.jwks_uri or self.issuer + self.jwks_path}
        if self.discovery_padding:
            return await self.stream(request, document, self.discovery_padding)
        return web.json_response(document)

    async def jwks(self, request: web.Request) -> web.Response:
        self.jwks_fetches += 1
        if not self.up:
            return web.json_response({"error": "down"}, status=503)
        document = {"keys": [k.public_jwk() for k in self.keys]}
        if self.padding:
            return await self.stream(request, document, self.padding)
        return web.json_response(document)

    async def moved(self, request: web.Request) -> web.Response:
        raise web.HTTPFound(self.moved_to)

    async def stream(self, request: web.Request, document: dict[str, Any], padding: int) -> web.StreamResponse:
        """`document` with `padding` bytes more, valid JSON, written as a provider's huge answer would be."""
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        head = json.dumps(document)[:-1].encode() + b', "padding": "'
        chunk = b"x" * 65536
        try:
            await response.write(head)
            self.sent += len(head)
            for _ in range(padding // len(chunk)):
                await response.write(chunk)
                self.sent += len(chunk)
            await response.write(b'"}')
            await response.write_eof()
        except (ConnectionError, RuntimeError):
            pass  # the gateway hung up: what a stand-in for a huge document expects
        return response


@pytest.fixture
async def provider() -> AsyncIterator[Provider]:
    stand_in = Provider(keys=[rsa_key("key-1")])
    app = web.Application()
    app.router.add_get("/.well-known/openid-configuration", stand_in.discovery)
    app.router.add_get("/keys", stand_in.jwks)
    app.router.add_get("/keys-v2", stand_in.jwks)
    app.router.add_get("/moved", stand_in.moved)
    server = TestServer(app)
    await server.start_server()
    stand_in.issuer = str(server.make_url("")).rstrip("/")
    yield stand_in
    await server.close()


def jwt_config(provider: Provider, extra: str = "", algorithms: str = "[RS256, ES256, EdDSA]") -> str:
    return (
        f"auth:\n  mode: jwt\n  jwt:\n    algorithms: {algorithms}\n    issuer: {provider.issuer}\n"
        f"    discovery: true\n    audience: {AUDIENCE}\n    jwks_min_refetch: 30s\n{extra}"
    )


@dataclass
class Gate:
    auth: Authenticator
    jwks: Jwks
    clock: Clock


@pytest.fixture
async def gate(provider: Provider) -> AsyncIterator[Gate]:
    config = parse_config(jwt_config(provider), env={})
    assert config.auth.jwt is not None
    clock = Clock()
    jwks = Jwks(config.auth.jwt, clock=clock)
    jwks.open()
    await jwks.fetch()
    yield Gate(Authenticator(config.auth, jwks), jwks, clock)
    await jwks.close()


def bearer(token: str) -> web.Request:
    return make_mocked_request("POST", "/api/chat", headers={"Authorization": f"Bearer {token}"})


async def refused(auth: Authenticator, token: str) -> str:
    with pytest.raises(HttpError) as info:
        await auth.identify(bearer(token))
    assert info.value.status == 401
    return info.value.message


# ---- keys from the provider ----------------------------------------------------------------------


async def test_a_token_signed_with_the_providers_key_is_accepted(provider: Provider, gate: Gate) -> None:
    identity = await gate.auth.identify(bearer(provider.sign(provider.keys[0], sub="alice")))
    assert identity.user_id == "alice" and identity.claims["aud"] == AUDIENCE


async def test_a_key_rotation_is_followed_without_restart_or_edit(provider: Provider, gate: Gate) -> None:
    old = provider.keys[0]
    assert (await gate.auth.identify(bearer(provider.sign(old)))).user_id == "user-1"
    # The provider publishes a new key and signs with it, then withdraws the old one.
    new = rsa_key("key-2")
    provider.keys = [old, new]
    gate.clock.now += 1  # a second after the start-up fetch (issue 24, defect 9)
    assert (await gate.auth.identify(bearer(provider.sign(new, sub="bob")))).user_id == "bob"
    provider.keys = [new]
    gate.clock.now += 601  # the scheduled refresh
    await gate.jwks.fetch()
    assert "does not publish" in await refused(gate.auth, provider.sign(old))
    assert (await gate.auth.identify(bearer(provider.sign(new)))).user_id == "user-1"


async def test_a_flood_of_unknown_key_ids_asks_the_provider_once_per_min_refetch(provider: Provider, gate: Gate) -> None:
    fetches = provider.jwks_fetches
    forged = [SigningKey(f"forged-{n}", provider.keys[0].private, "RS256") for n in range(50)]
    gate.clock.now += 31
    for key in forged:
        assert "does not publish" in await refused(gate.auth, provider.sign(key))
    assert provider.jwks_fetches == fetches + 1
    gate.clock.now += 31
    await refused(gate.auth, provider.sign(forged[0]))
    assert provider.jwks_fetches == fetches + 2


async def test_the_keys_held_keep_working_while_the_provider_is_down(provider: Provider, gate: Gate) -> None:
    provider.up = False
    gate.clock.now += 601
    await gate.jwks.fetch()
    assert gate.jwks.cache.status == "stale"
    assert (await gate.auth.identify(bearer(provider.sign(provider.keys[0])))).user_id == "user-1"
    provider.up = True
    gate.clock.now += 61
    await gate.jwks.fetch()
    assert gate.jwks.cache.status == "ok"


async def test_expired_wrong_audience_and_forged_tokens_are_refused(provider: Provider, gate: Gate) -> None:
    key = provider.keys[0]
    assert await refused(gate.auth, provider.sign(key, exp=int(time.time()) - 3600)) == "token expired"
    assert "audience" in (await refused(gate.auth, provider.sign(key, aud="another-app"))).lower()
    assert "issuer" in (await refused(gate.auth, provider.sign(key, iss="https://evil.example"))).lower()
    stranger = SigningKey("key-1", rsa.generate_private_key(public_exponent=65537, key_size=2048), "RS256")
    assert "signature" in (await refused(gate.auth, provider.sign(stranger))).lower()  # the right kid, not its key
    assert "invalid token" in await refused(gate.auth, "not.a.jwt")


async def test_ec_and_ed25519_keys_as_the_provider_signs(provider: Provider, gate: Gate) -> None:
    es = SigningKey("ec-1", ec.generate_private_key(ec.SECP256R1()), "ES256")
    ed = SigningKey("ed-1", ed25519.Ed25519PrivateKey.generate(), "EdDSA")
    provider.keys = [*provider.keys, es, ed]
    gate.clock.now += 31
    assert (await gate.auth.identify(bearer(provider.sign(es, sub="ec-user")))).user_id == "ec-user"
    assert (await gate.auth.identify(bearer(provider.sign(ed, sub="ed-user")))).user_id == "ed-user"


async def test_a_discovery_document_of_another_issuer_yields_no_keys(provider: Provider) -> None:
    provider.discovery_issuer = "https://evil.example"
    jwks = await discovered(provider)
    try:
        assert jwks.cache.status == "unavailable" and "not" in (jwks.cache.last_error or "")
    finally:
        await jwks.close()


def test_the_key_cache_keeps_its_keys_through_bad_documents_and_skips_encryption_keys() -> None:
    cache = KeyCache(refresh=600, min_refetch=30)
    signing, encrypting = rsa_key("s"), rsa_key("e")
    cache.take({"keys": [signing.public_jwk(), {**encrypting.public_jwk(), "use": "enc"}]}, now=0)
    assert list(cache.keys) == ["s"] and cache.status == "ok"
    for bad in ({}, {"keys": []}, {"keys": [{"kty": "nope"}]}, ["not", "a", "document"]):
        with pytest.raises(ValueError):
            cache.take(bad, now=10)
        assert list(cache.keys) == ["s"] and cache.status == "stale"
    assert cache.key(None) is cache.keys["s"]  # one key: a token without kid may use it
    assert not cache.due(now=20) and cache.due(now=70)  # a retry after a failure, not a full period
    assert cache.may_refetch(now=20)  # fetches of its own do not hold back an unknown key id (defect 9)


# ---- claims ----------------------------------------------------------------------------------------


async def test_the_user_claim_and_required_claims(provider: Provider) -> None:
    extra = "    user_claim: email\n    required_claims: {groups: [staff], scope: chat}\n"
    config = parse_config(jwt_config(provider, extra), env={})
    assert config.auth.jwt is not None
    jwks = Jwks(config.auth.jwt)
    jwks.open()
    auth = Authenticator(config.auth, jwks)
    key = provider.keys[0]
    try:
        good = provider.sign(key, email="a@example.com", groups=["staff", "x"], scope="openid chat")
        assert (await auth.identify(bearer(good))).user_id == "a@example.com"
        assert "groups" in await refused(auth, provider.sign(key, email="a@example.com", groups=["x"], scope="chat"))
        assert "scope" in await refused(auth, provider.sign(key, email="a@example.com", groups=["staff"], scope="openid"))
        assert "email" in await refused(auth, provider.sign(key, groups=["staff"], scope="chat"))  # no user claim
    finally:
        await jwks.close()


# ---- through the gateway ----------------------------------------------------------------------------


async def test_tokens_for_another_agent_are_refused_and_readyz_reports_the_keys(provider: Provider) -> None:
    text = jwt_config(provider) + (
        "agents:\n  payments:\n    upstream: {app_name: pay_app}\n    access:\n      jwt_claims: {groups: [finance]}\n"
        "  support:\n    upstream: {app_name: support_app}\n"
    )
    client = TestClient(TestServer(create_app(parse_config(text, env={}))))
    await client.start_server()
    try:
        gateway = client.app[GATEWAY]  # type: ignore[index]
        assert gateway.jwks is not None
        await gateway.jwks.fetch()
        key = provider.keys[0]
        support_only = {"Authorization": f"Bearer {provider.sign(key, groups=['support'])}"}
        refused_there = await client.post("/agents/payments/api/chat", json={"id": "c", "messages": []}, headers=support_only)
        assert refused_there.status == 403 and (await refused_there.json())["error"]["code"] == "agent_not_allowed"
        listed = await (await client.get("/api/agents", headers=support_only)).json()
        assert [a["name"] for a in listed["agents"]] == ["support"]
        ready = await (await client.get("/readyz")).json()
        assert ready["jwks"] == "ok"
        assert gateway.metrics.registry.get_sample_value("adk_gateway_jwks_up") == 1
        assert gateway.metrics.registry.get_sample_value("adk_gateway_jwks_fetches_total", {"result": "success"}) >= 1
        provider.up = False
        gateway.jwks.cache.attempted_at = None  # let the next fetch go now
        await gateway.jwks.fetch()
        assert (await (await client.get("/readyz")).json())["jwks"] == "stale"
        assert gateway.metrics.registry.get_sample_value("adk_gateway_jwks_up") == 0
        finance = {"Authorization": f"Bearer {provider.sign(key, groups=['finance'])}"}
        assert [a["name"] for a in (await (await client.get("/api/agents", headers=finance)).json())["agents"]] == ["payments", "support"]
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("jwt_yaml", "problem"),
    [
        ("algorithms: [RS256]\n    discovery: true\n", "discovery needs auth.jwt.issuer"),
        ("algorithms: [HS256]\n    secret: s\n    jwks_url: https://idp.example/keys\n", "HS256 takes a shared secret"),
        ("algorithms: [RS256]\n    jwks_url: https://idp.example/keys\n    issuer: https://idp.example\n    discovery: true\n", "not both"),
        ("algorithms: [RS256]\n", "public_key_file, jwks_url or discovery is required"),
    ],
)
def test_what_the_jwt_section_refuses(jwt_yaml: str, problem: str) -> None:
    assert_refused(jwt_yaml, problem)


def assert_refused(jwt_yaml: str, problem: str) -> None:
    """A config whose auth.jwt section is `jwt_yaml` is refused, one of its problems saying `problem`."""
    from gateway.config.schema import ConfigError

    with pytest.raises(ConfigError) as info:
        parse_config(f"auth:\n  mode: jwt\n  jwt:\n    {jwt_yaml}", env={})
    assert any(problem in p for p in info.value.problems), info.value.problems


async def test_a_provider_that_moves_its_keys_is_discovered_again(provider: Provider, gate: Gate) -> None:
    assert provider.discoveries == 1  # found once, then the JWKS URL is reused
    gate.clock.now += 601
    await gate.jwks.fetch()
    assert provider.discoveries == 1
    provider.jwks_path = "/keys-v2"
    provider.up = False  # the old URL fails...
    gate.clock.now += 601
    await gate.jwks.fetch()
    provider.up = True
    gate.clock.now += 61
    await gate.jwks.fetch()  # ...so the next fetch asks discovery again and follows the move
    assert provider.discoveries == 2 and gate.jwks.cache.status == "ok"


async def test_a_reload_keeps_the_keys_held_unless_their_source_changed(provider: Provider, tmp_path: Any) -> None:
    from gateway.edge.reload import reload_config

    text = jwt_config(provider)
    client = TestClient(TestServer(create_app(parse_config(text, env={}))))
    await client.start_server()
    try:
        gateway = client.app[GATEWAY]  # type: ignore[index]
        held = gateway.jwks
        assert held is not None
        await held.fetch()
        path = tmp_path / "gateway.yaml"
        path.write_text(text + "    leeway: 5s\n")
        assert reload_config(gateway, path).ok
        assert gateway.jwks is held and held.cache.status == "ok"  # not dropped, not refetched
        # Where the keys come from cannot change by a reload (gateway/config/loosening.py); how they are fetched can.
        path.write_text(text.replace("jwks_min_refetch: 30s", "jwks_min_refetch: 10s") + "    leeway: 5s\n")
        assert reload_config(gateway, path).ok
        assert gateway.jwks is not held and gateway.jwks is not None
        await gateway.jwks.fetch()
        assert (await gateway.auth.identify(bearer(provider.sign(provider.keys[0])))).user_id == "user-1"
    finally:
        await client.close()


# ---- issue 24: what spaces a fetch, and what bounds one ----------------------------------------------


async def test_a_key_published_right_after_the_start_up_fetch_is_fetched_at_once(provider: Provider, gate: Gate) -> None:
    # Defect 9: `jwks_min_refetch` spaces fetches caused by unknown key ids from each other, not
    # from the start-up or scheduled fetch: a rotation one second after either must not be 401.
    fetches = provider.jwks_fetches
    new = rsa_key("key-2")
    provider.keys = [provider.keys[0], new]
    gate.clock.now += 1
    assert (await gate.auth.identify(bearer(provider.sign(new, sub="bob")))).user_id == "bob"
    assert provider.jwks_fetches == fetches + 1
    # A scheduled fetch, then another new key a second later: fetched again too.
    gate.clock.now += 601
    await gate.jwks.fetch()
    newer = rsa_key("key-3")
    provider.keys = [new, newer]
    gate.clock.now += 1
    assert (await gate.auth.identify(bearer(provider.sign(newer, sub="carol")))).user_id == "carol"
    assert provider.jwks_fetches == fetches + 3


async def test_two_fetches_for_unknown_key_ids_are_still_spaced_by_min_refetch(provider: Provider, gate: Gate) -> None:
    fetches = provider.jwks_fetches
    gate.clock.now += 1
    assert "does not publish" in await refused(gate.auth, provider.sign(SigningKey("forged-1", provider.keys[0].private, "RS256")))
    assert provider.jwks_fetches == fetches + 1
    late = rsa_key("key-2")
    provider.keys = [provider.keys[0], late]
    gate.clock.now += 29  # within jwks_min_refetch of the last unknown-kid fetch: not asked again
    with structlog.testing.capture_logs() as logs:
        assert "does not publish" in await refused(gate.auth, provider.sign(late))
    assert [(line["event"], line["reason"]) for line in logs] == [("auth_refused", "unknown_kid")]
    assert provider.jwks_fetches == fetches + 1
    gate.clock.now += 1
    assert (await gate.auth.identify(bearer(provider.sign(late)))).user_id == "user-1"
    assert provider.jwks_fetches == fetches + 2


def test_the_key_cache_spaces_only_unknown_key_id_fetches() -> None:
    cache = KeyCache(refresh=600, min_refetch=30)
    cache.take({"keys": [rsa_key("s").public_jwk()]}, now=0)  # the start-up fetch
    assert cache.may_refetch(now=1)
    cache.refetching(now=1)
    cache.take({"keys": [rsa_key("s").public_jwk()]}, now=1)
    assert not cache.may_refetch(now=30) and cache.may_refetch(now=31)
    cache.failed("down", now=600)  # a scheduled fetch that failed does not hold the next one back
    assert cache.may_refetch(now=601)


async def test_a_huge_keys_document_is_refused_without_being_read_whole(provider: Provider, gate: Gate) -> None:
    """Defect 7: a 64 MiB (valid) JWKS document is refused like a bad one (the keys held stay, the
    fetch counts as failed), and the gateway stops reading it past the cap."""
    from gateway.access.jwks import MAX_DOCUMENT_BYTES

    outcomes: list[bool] = []
    gate.jwks._on_fetch = outcomes.append
    provider.keys = [*provider.keys, rsa_key("key-2")]
    provider.padding = 64 * 1024 * 1024
    gate.clock.now += 601
    await gate.jwks.fetch()
    assert outcomes == [False]
    assert list(gate.jwks.cache.keys) == ["key-1"] and gate.jwks.cache.status == "stale"
    assert "larger than" in (gate.jwks.cache.last_error or "")
    await asyncio.sleep(0.2)
    # Socket buffers hold some megabytes; reading the whole document would have taken all 64.
    assert provider.sent < MAX_DOCUMENT_BYTES + 16 * 1024 * 1024, provider.sent
    assert (await gate.auth.identify(bearer(provider.sign(provider.keys[0])))).user_id == "user-1"
    # A document just under the cap is fine.
    provider.padding = MAX_DOCUMENT_BYTES - 64 * 1024
    gate.clock.now += 61
    await gate.jwks.fetch()
    assert outcomes == [False, True] and sorted(gate.jwks.cache.keys) == ["key-1", "key-2"]


async def test_a_huge_discovery_document_is_refused(provider: Provider) -> None:
    provider.discovery_padding = 64 * 1024 * 1024
    jwks = await discovered(provider)
    try:
        assert jwks.cache.status == "unavailable" and "larger than" in (jwks.cache.last_error or "")
        assert provider.jwks_fetches == 0
    finally:
        await jwks.close()


async def test_a_declared_length_over_the_cap_is_refused_before_reading() -> None:
    from gateway.access.jwks import MAX_DOCUMENT_BYTES

    async def declared(request: web.Request) -> web.Response:
        return web.Response(body=b" " * (MAX_DOCUMENT_BYTES + 1), content_type="application/json")

    app = web.Application()
    app.router.add_get("/keys", declared)
    server = TestServer(app)
    await server.start_server()
    config = parse_config(
        f"auth:\n  mode: jwt\n  jwt:\n    algorithms: [RS256]\n    jwks_url: {server.make_url('/keys')}\n", env={},
    )
    assert config.auth.jwt is not None
    jwks = Jwks(config.auth.jwt)
    jwks.open()
    try:
        await jwks.fetch()
        assert "larger than" in (jwks.cache.last_error or "") and str(MAX_DOCUMENT_BYTES + 1) in (jwks.cache.last_error or "")
    finally:
        await jwks.close()
        await server.close()


# ---- where the keys may come from (issue 24) -----------------------------------------------------------


async def discovered(provider: Provider, extra: str = "") -> Jwks:
    """A key fetcher by discovery from `provider`, after its first fetch (the caller closes it)."""
    config = parse_config(jwt_config(provider, extra), env={})
    assert config.auth.jwt is not None
    jwks = Jwks(config.auth.jwt)
    jwks.open()
    await jwks.fetch()
    return jwks


async def test_discovery_naming_keys_over_plain_http_on_another_machine_yields_no_keys(provider: Provider) -> None:
    provider.jwks_uri = "http://idp.example/keys"
    jwks = await discovered(provider)
    try:
        assert jwks.cache.status == "unavailable" and "https" in (jwks.cache.last_error or "")
        assert provider.jwks_fetches == 0
    finally:
        await jwks.close()


async def test_discovery_naming_keys_on_another_host_needs_that_host_listed(provider: Provider) -> None:
    # The stand-in answers on 127.0.0.1 (the issuer's host) and as localhost: another host name.
    provider.jwks_uri = provider.issuer.replace("127.0.0.1", "localhost") + "/keys"
    jwks = await discovered(provider)
    try:
        assert jwks.cache.status == "unavailable" and "jwks_hosts" in (jwks.cache.last_error or "")
        assert provider.jwks_fetches == 0
    finally:
        await jwks.close()
    jwks = await discovered(provider, "    jwks_hosts: [LocalHost]\n")
    try:
        assert jwks.cache.status == "ok"
    finally:
        await jwks.close()


async def test_a_redirect_is_held_to_the_same_rule_as_the_url_discovery_named(provider: Provider) -> None:
    provider.jwks_uri = provider.issuer + "/moved"
    provider.moved_to = provider.issuer.replace("127.0.0.1", "localhost") + "/keys"
    jwks = await discovered(provider)
    try:
        assert jwks.cache.status == "unavailable" and "jwks_hosts" in (jwks.cache.last_error or "")
    finally:
        await jwks.close()
    provider.moved_to = provider.issuer + "/keys"  # a redirect on the issuer's host is followed
    jwks = await discovered(provider)
    try:
        assert jwks.cache.status == "ok"
    finally:
        await jwks.close()


@pytest.mark.parametrize(
    ("url", "allow_http", "hosts", "refused"),
    [
        ("https://idp.example/keys", False, None, False),
        ("http://idp.example/keys", False, None, True),
        ("http://idp.example/keys", True, None, False),
        ("http://127.0.0.1:8080/keys", False, None, False),
        ("http://[::1]:8080/keys", False, None, False),
        ("http://localhost/keys", False, None, False),
        ("ftp://idp.example/keys", True, None, True),
        ("https://keys.example/keys", False, {"idp.example"}, True),
        ("https://KEYS.example/keys", False, {"idp.example", "keys.example"}, False),
    ],
)
def test_where_the_keys_may_come_from(url: str, allow_http: bool, hosts: set[str] | None, refused: bool) -> None:
    from gateway.config.auth import key_source_problem

    assert (key_source_problem(url, allow_http=allow_http, hosts=hosts) is not None) == refused


@pytest.mark.parametrize(
    ("jwt_yaml", "problem"),
    [
        ("jwks_url: http://idp.example/keys\n", "https"),
        ("issuer: http://idp.example\n    discovery: true\n", "https"),
        ("jwks_url: https://idp.example/keys\n    jwks_hosts: [https://keys.example/]\n", "a host name"),
    ],
)
def test_the_configured_provider_is_reached_over_https(jwt_yaml: str, problem: str) -> None:
    assert_refused(f"algorithms: [RS256]\n    {jwt_yaml}", problem)
    for fine in ("jwks_url: http://127.0.0.1:9/keys\n", "jwks_url: http://idp.internal/keys\n    jwks_allow_http: true\n"):
        parse_config(f"auth:\n  mode: jwt\n  jwt:\n    algorithms: [RS256]\n    {fine}", env={})
