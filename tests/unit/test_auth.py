"""Browser identity: API keys, JWTs (HS256, RS256, ES256), origins."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from pathlib import Path

import jwt
import pytest
from aiohttp.test_utils import make_mocked_request
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from gateway.access.auth import Authenticator
from gateway.config.schema import AuthConfig, parse_config
from gateway.core.refusals import HttpError


def req(headers: dict[str, str] | None = None, path: str = "/api/chat"):
    return make_mocked_request("GET", path, headers=headers or {})


async def test_none_mode_is_the_anonymous_user_and_only_on_loopback() -> None:
    assert await Authenticator(AuthConfig()).user_id(req()) == "anonymous"
    with pytest.raises(Exception, match="loopback"):
        parse_config("listen:\n  host: 0.0.0.0\n", env={})
    parse_config("listen:\n  host: ::1\n", env={})


async def test_api_keys_by_value_or_digest() -> None:
    config = AuthConfig.model_validate({
        "mode": "api_key",
        "api_keys": [{"id": "alice", "key": "k-alice"}, {"id": "bob", "sha256": hashlib.sha256(b"k-bob").hexdigest()}],
    })
    auth = Authenticator(config)
    assert await auth.user_id(req({"Authorization": "Bearer k-alice"})) == "alice"
    assert await auth.user_id(req({"x-api-key": "k-bob"})) == "bob"
    # `?access_token=` only with auth.allow_token_in_url (tests/unit/test_ws_tickets.py).
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic k-alice"}):
        with pytest.raises(HttpError) as info:
            await auth.user_id(req(headers))
        assert info.value.status == 401


def test_api_key_mode_needs_a_key() -> None:
    with pytest.raises(ValueError):
        AuthConfig.model_validate({"mode": "api_key", "api_keys": [{"id": "x", "key": ""}]})


async def test_hs256_tokens() -> None:
    auth = Authenticator(AuthConfig.model_validate({"mode": "jwt", "jwt": {"secret": "s" * 32, "audience": "app"}}))
    good = jwt.encode({"sub": "carol", "exp": time.time() + 60, "aud": "app"}, "s" * 32, algorithm="HS256")
    assert await auth.user_id(req({"Authorization": f"Bearer {good}"})) == "carol"
    bad = [
        jwt.encode({"sub": "carol", "exp": time.time() - 120, "aud": "app"}, "s" * 32, algorithm="HS256"),  # expired
        jwt.encode({"sub": "carol", "exp": time.time() + 60, "aud": "other"}, "s" * 32, algorithm="HS256"),  # audience
        jwt.encode({"sub": "carol", "exp": time.time() + 60, "aud": "app"}, "x" * 32, algorithm="HS256"),  # signature
        jwt.encode({"exp": time.time() + 60, "aud": "app"}, "s" * 32, algorithm="HS256"),  # no sub
        jwt.encode({"sub": "carol", "aud": "app"}, "s" * 32, algorithm="HS256"),  # no exp
        "not-a-jwt",
    ]
    for token in bad:
        with pytest.raises(HttpError) as info:
            await auth.user_id(req({"Authorization": f"Bearer {token}"}))
        assert info.value.status == 401


@pytest.mark.parametrize("algorithm", ["RS256", "ES256"])
async def test_public_key_tokens(tmp_path: Path, algorithm: str) -> None:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048) if algorithm == "RS256" else ec.generate_private_key(ec.SECP256R1())
    pem = private.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    (tmp_path / "key.pem").write_bytes(pem)
    auth = Authenticator(AuthConfig.model_validate(
        {"mode": "jwt", "jwt": {"algorithms": [algorithm], "public_key_file": str(tmp_path / "key.pem")}}
    ))
    token = jwt.encode({"sub": "dave", "exp": time.time() + 60}, private, algorithm=algorithm)
    assert await auth.user_id(req({"Authorization": f"Bearer {token}"})) == "dave"
    # An HS256 token "signed" with the public key as HMAC secret must not pass (algorithm confusion).
    def b64(data: bytes) -> bytes:
        return base64.urlsafe_b64encode(data).rstrip(b"=")

    signing_input = b64(b'{"alg":"HS256","typ":"JWT"}') + b"." + b64(b'{"sub":"eve","exp":9999999999}')
    forged = (signing_input + b"." + b64(hmac.new(pem, signing_input, hashlib.sha256).digest())).decode()
    with pytest.raises(HttpError):
        await auth.user_id(req({"Authorization": f"Bearer {forged}"}))


def test_origins() -> None:
    open_config = Authenticator(AuthConfig())
    assert open_config.origin_allowed(None, "gw:8080")  # not a browser
    assert open_config.origin_allowed("http://gw:8080", "gw:8080")  # same origin
    assert not open_config.origin_allowed("https://evil.example", "gw:8080")
    listed = Authenticator(AuthConfig(allowed_origins=["https://app.example"]))
    assert listed.origin_allowed("https://app.example", "gw:8080")
    assert listed.cors_headers(req({"Origin": "https://app.example"}))["Access-Control-Allow-Origin"] == "https://app.example"
    assert listed.cors_headers(req({"Origin": "https://evil.example"})) == {}


async def test_a_cookie_credential_needs_the_pages_origin_where_state_changes() -> None:
    from gateway.core.refusals import HttpError

    auth = Authenticator(AuthConfig(mode="api_key", api_keys=[{"id": "u", "key": "k1"}], cookie_name="gw"))
    handshake = make_mocked_request("GET", "/api/chat/ws", headers={"Cookie": "gw=k1", "Upgrade": "websocket", "Connection": "Upgrade"})
    identity = await auth.identify(handshake)
    assert identity.user_id == "u" and identity.via_cookie
    with pytest.raises(HttpError) as info:
        auth.check_origin(handshake, identity)
    assert info.value.code == "origin_required"
    same_site = make_mocked_request("GET", "/api/chat/ws", headers={
        "Cookie": "gw=k1", "Upgrade": "websocket", "Connection": "Upgrade", "Origin": "http://gw:8080", "Host": "gw:8080",
    })
    auth.check_origin(same_site, await auth.identify(same_site))  # the page's own origin: fine
    header = make_mocked_request("POST", "/api/chat", headers={"Authorization": "Bearer k1", "Cookie": "gw=other"})
    assert not (await auth.identify(header)).via_cookie  # the header wins, and needs no Origin
    auth.check_origin(header, await auth.identify(header))
    assert (await Authenticator(AuthConfig(mode="api_key", api_keys=[{"id": "u", "key": "k1"}])).identify(
        make_mocked_request("GET", "/api/agents", headers={"Authorization": "Bearer k1"})
    )).user_id == "u"


# ---- origins and credentials (issue 24) -----------------------------------------------------------------------


def test_any_origin_gets_cors_without_credentials_and_a_listed_one_with_them() -> None:
    """"*" answers `Access-Control-Allow-Origin: *` as it is, which browsers never combine with
    credentials: no site the operator did not name can make a credentialed (cookie) request and read it."""
    auth = Authenticator(AuthConfig(allowed_origins=["*", "https://app.example"]))
    anyone = auth.cors_headers(req({"Origin": "https://evil.example"}))
    assert anyone["Access-Control-Allow-Origin"] == "*"
    assert "Access-Control-Allow-Credentials" not in anyone
    listed = auth.cors_headers(req({"Origin": "https://app.example"}))
    assert listed["Access-Control-Allow-Origin"] == "https://app.example"
    assert listed["Access-Control-Allow-Credentials"] == "true" and listed["Vary"] == "Origin"
    only_any = Authenticator(AuthConfig(allowed_origins=["*"])).cors_headers(req({"Origin": "https://app.example"}))
    assert only_any["Access-Control-Allow-Origin"] == "*" and "Access-Control-Allow-Credentials" not in only_any
    assert auth.cors_headers(req()) == {}  # not a browser


async def test_a_cookie_credential_is_never_let_in_through_any_origin() -> None:
    """The config refuses cookie_name with "*" (tests/unit/test_config.py); should an Authenticator be
    built without that check, a cross-site handshake riding on the cookie is still refused."""
    from gateway.config.auth import ApiKey

    config = AuthConfig.model_construct(
        mode="api_key", api_keys=[ApiKey(id="u", key="k1")], cookie_name="gw", allowed_origins=["*"],
    )
    auth = Authenticator(config)
    cross_site = make_mocked_request("GET", "/api/chat/ws", headers={
        "Cookie": "gw=k1", "Upgrade": "websocket", "Connection": "Upgrade", "Origin": "https://evil.example", "Host": "gw:8080",
    })
    identity = await auth.identify(cross_site)
    assert identity.via_cookie
    with pytest.raises(HttpError) as info:
        auth.check_origin(cross_site, identity)
    assert info.value.status == 403 and info.value.code == "origin_not_allowed"
    # A header credential from any page is let in by "*" (it cannot ride along on its own).
    header = make_mocked_request("POST", "/api/chat", headers={"Authorization": "Bearer k1", "Origin": "https://evil.example"})
    auth.check_origin(header, await auth.identify(header))


def test_the_same_origin_check_compares_the_scheme() -> None:
    """An `https://` page is not the origin of a gateway seen over plain HTTP (and the other way round):
    behind a TLS-terminating proxy the page's origin is listed in auth.allowed_origins."""
    auth = Authenticator(AuthConfig())
    same_host_other_scheme = make_mocked_request("POST", "/api/chat", headers={"Origin": "https://gw:8080", "Host": "gw:8080"})
    with pytest.raises(HttpError) as info:
        auth.check_origin(same_host_other_scheme)
    assert info.value.code == "origin_not_allowed"
    auth.check_origin(make_mocked_request("POST", "/api/chat", headers={"Origin": "http://gw:8080", "Host": "gw:8080"}))
    listed = Authenticator(AuthConfig(allowed_origins=["https://gw:8080"]))
    listed.check_origin(same_host_other_scheme)  # the operator behind TLS lists the public origin
    assert auth.origin_allowed("http://gw:8080", "gw:8080", "http")
    assert not auth.origin_allowed("https://gw:8080", "gw:8080", "http")
    assert not auth.origin_allowed("http://gw:8080", "gw:8080", "https")
    assert auth.origin_allowed("https://gw", "gw", "https")
    assert auth.origin_allowed("https://gw", "gw:443", "https")  # a default port is not in an Origin
    assert auth.origin_allowed("http://GW:8080", "gw:8080", "http")  # nor does case matter in a host
    assert not auth.origin_allowed("ftp://gw:8080", "gw:8080", "http")


async def test_every_refused_token_is_logged_once_with_a_reason_and_without_the_token() -> None:
    """Issue 24, defect 9: an operator debugging a login sees why a token was refused, at info (the
    default level), one line per refusal with a reason code, and no part of the token."""
    import structlog

    secret = "s" * 32
    auth = Authenticator(AuthConfig.model_validate({"mode": "jwt", "jwt": {
        "secret": secret, "audience": "app", "issuer": "https://idp.example", "required_claims": {"scope": ["chat"]},
    }}))
    now = time.time()
    good = {"sub": "carol", "exp": now + 60, "aud": "app", "iss": "https://idp.example", "scope": "chat"}
    cases = {
        "expired": jwt.encode({**good, "exp": now - 120}, secret, algorithm="HS256"),
        "not_yet_valid": jwt.encode({**good, "nbf": now + 3600}, secret, algorithm="HS256"),
        "audience": jwt.encode({**good, "aud": "other"}, secret, algorithm="HS256"),
        "issuer": jwt.encode({**good, "iss": "https://evil.example"}, secret, algorithm="HS256"),
        "bad_signature": jwt.encode(good, "x" * 32, algorithm="HS256"),
        "missing_claim": jwt.encode({k: v for k, v in good.items() if k != "exp"}, secret, algorithm="HS256"),
        "claim_not_allowed": jwt.encode({**good, "scope": "openid"}, secret, algorithm="HS256"),
        "bad_user_claim": jwt.encode({**good, "sub": ""}, secret, algorithm="HS256"),
        "algorithm": jwt.encode(good, secret * 2, algorithm="HS384"),
        "malformed": "not-a-jwt",
    }
    for reason, token in cases.items():
        with structlog.testing.capture_logs() as logs:
            with pytest.raises(HttpError):
                await auth.user_id(req({"Authorization": f"Bearer {token}"}))
        refusals = [line for line in logs if line["event"] == "auth_refused"]
        assert len(refusals) == 1, (reason, logs)
        assert refusals[0]["reason"] == reason and refusals[0]["log_level"] == "info", (reason, refusals)
        for part in token.split("."):
            assert part not in str(logs), reason
    with structlog.testing.capture_logs() as logs:
        assert await auth.user_id(req({"Authorization": f"Bearer {jwt.encode(good, secret, algorithm='HS256')}"})) == "carol"
    assert not [line for line in logs if line["event"] == "auth_refused"]


async def test_refused_api_keys_and_missing_credentials_are_logged_with_a_reason() -> None:
    import structlog

    auth = Authenticator(AuthConfig.model_validate({"mode": "api_key", "api_keys": [{"id": "alice", "key": "k-alice"}]}))
    for headers, reason in (({}, "no_credential"), ({"Authorization": "Bearer k-wrong-key"}, "unknown_api_key")):
        with structlog.testing.capture_logs() as logs:
            with pytest.raises(HttpError):
                await auth.user_id(req(headers))
        assert [(line["event"], line["reason"]) for line in logs] == [("auth_refused", reason)]
        assert "k-wrong-key" not in str(logs)
