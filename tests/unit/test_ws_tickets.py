"""WebSocket tickets (gateway/access/tickets.py) and `?access_token=` behind `auth.allow_token_in_url` (issue 17).

Through the real app (aiohttp's test server, the memory backend; tests/unit/test_cluster_state.py
holds Redis to the same store contract): a ticket opens one socket of its agent, as its user, from
its page's origin, for its lifetime, under the auth settings it was issued under.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import structlog
from aiohttp.test_utils import TestClient, TestServer

from gateway.edge.app import create_app
from gateway.access.auth import Identity, warn_token_in_url
from gateway.cluster.memory import MemoryState
from gateway.config.schema import AuthConfig, parse_config
from gateway.core.refusals import HttpError
from gateway.edge.reload import reload_config
from gateway.edge.state import GATEWAY
from gateway.access.tickets import Tickets

CONFIG = """
auth:
  mode: api_key
  api_keys:
    - {id: alice, key: k-alice}
    - {id: bob, key: k-bob}
  allowed_origins: [https://app.example, https://other.example]
  ws_ticket_ttl: %s
agents:
  demo_agent: {}
  support_agent:
    upstream: {app_name: support_agent}
    access: {api_keys: [alice]}
"""
ALICE = {"Authorization": "Bearer k-alice"}
BOB = {"Authorization": "Bearer k-bob"}


@pytest.fixture
async def client(request: pytest.FixtureRequest) -> AsyncIterator[TestClient]:
    ttl = getattr(request, "param", "30s")
    client = TestClient(TestServer(create_app(parse_config(CONFIG % ttl, env={}))))
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()


async def ticket(client: TestClient, headers: dict[str, str], path: str = "/api/chat/ws-ticket") -> str:
    answer = await client.post(path, headers=headers)
    assert answer.status == 200, await answer.text()
    assert answer.headers["Cache-Control"] == "no-store"
    body = await answer.json()
    assert body["expires_in"] > 0 and body["ticket"].startswith("wst_")
    return str(body["ticket"])


async def handshake(client: TestClient, path: str, **kwargs: Any) -> int:
    """The handshake's status: 101 when the socket opened."""
    try:
        async with client.ws_connect(path, **kwargs):
            return 101
    except aiohttp.WSServerHandshakeError as exc:
        return exc.status


def count(client: TestClient, outcome: str) -> float:
    value = client.app[GATEWAY].metrics.registry.get_sample_value("adk_gateway_ws_tickets_total", {"outcome": outcome})  # type: ignore[index]
    return value or 0.0


async def test_a_ticket_opens_one_socket_and_needs_a_credential_to_get(client: TestClient) -> None:
    refused = await client.post("/api/chat/ws-ticket")
    assert refused.status == 401 and (await refused.json())["error"]["code"] == "unauthorized"
    value = await ticket(client, ALICE)
    assert await handshake(client, f"/api/chat/ws?ticket={value}") == 101
    assert await handshake(client, f"/api/chat/ws?ticket={value}") == 401  # spent
    assert await handshake(client, "/api/chat/ws?ticket=wst_made-up") == 401
    assert await handshake(client, "/api/chat/ws?ticket=") == 401
    assert (count(client, "issued"), count(client, "redeemed"), count(client, "refused")) == (1, 1, 3)


async def test_the_socket_acts_as_the_tickets_user() -> None:
    tickets = Tickets(MemoryState("a"))
    claims = {"sub": "carol", "groups": ["staff"], "exp": time.time() + 600}
    issued = await tickets.issue(Identity("carol", claims), agent="demo_agent", origin=None, fingerprint="f", ttl=30)
    identity = await tickets.redeem(issued.value, agent="demo_agent", origin="https://app.example", fingerprint="f")
    assert identity.user_id == "carol" and identity.claims == claims and not identity.via_cookie


async def test_a_ticket_never_outlives_its_token() -> None:
    tickets = Tickets(MemoryState("a"))
    soon = await tickets.issue(Identity("carol", {"exp": time.time() + 5}), agent="a", origin=None, fingerprint="f", ttl=30)
    assert soon.expires_in <= 5


@pytest.mark.parametrize("client", ["200ms"], indirect=True)
async def test_an_expired_ticket_is_refused(client: TestClient) -> None:
    value = await ticket(client, ALICE)
    await asyncio.sleep(0.4)
    assert await handshake(client, f"/api/chat/ws?ticket={value}") == 401


async def test_a_ticket_is_for_its_agents_socket_only(client: TestClient) -> None:
    support = await ticket(client, ALICE, "/agents/support_agent/api/chat/ws-ticket")
    assert await handshake(client, f"/api/chat/ws?ticket={support}") == 401  # the default agent's socket
    support = await ticket(client, ALICE, "/agents/support_agent/api/chat/ws-ticket")
    assert await handshake(client, f"/agents/support_agent/api/chat/ws?ticket={support}") == 101
    # Bob may not use the support agent: no ticket for it either.
    denied = await client.post("/agents/support_agent/api/chat/ws-ticket", headers=BOB)
    assert denied.status == 403 and (await denied.json())["error"]["code"] == "agent_not_allowed"


async def test_a_ticket_asked_for_by_a_page_opens_a_socket_from_that_page_only(client: TestClient) -> None:
    value = await ticket(client, {**ALICE, "Origin": "https://app.example"})
    assert await handshake(client, f"/api/chat/ws?ticket={value}", origin="https://other.example") == 401
    value = await ticket(client, {**ALICE, "Origin": "https://app.example"})
    assert await handshake(client, f"/api/chat/ws?ticket={value}", origin="https://app.example") == 101
    # A page's origin that may not use the gateway is refused before any ticket is issued.
    evil = await client.post("/api/chat/ws-ticket", headers={**ALICE, "Origin": "https://evil.example"})
    assert evil.status == 403
    # Issued without an Origin (a server-side app asking for its browser): any allowed page may use it.
    value = await ticket(client, ALICE)
    assert await handshake(client, f"/api/chat/ws?ticket={value}", origin="https://other.example") == 101


async def test_the_ticket_endpoint_answers_a_cross_origin_preflight(client: TestClient) -> None:
    preflight = await client.options("/agents/support_agent/api/chat/ws-ticket", headers={
        "Origin": "https://app.example", "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization",
    })
    assert preflight.status == 204 and preflight.headers["Access-Control-Allow-Origin"] == "https://app.example"


async def test_a_reload_that_changes_the_auth_settings_voids_outstanding_tickets(client: TestClient, tmp_path: Path) -> None:
    gateway = client.app[GATEWAY]  # type: ignore[index]
    before = await ticket(client, ALICE)
    path = tmp_path / "gateway.yaml"
    # Bob's key revoked (a reload may only narrow who gets in: gateway/config/loosening.py).
    path.write_text((CONFIG % "30s").replace("    - {id: bob, key: k-bob}\n", ""))
    assert reload_config(gateway, path).ok
    assert await handshake(client, f"/api/chat/ws?ticket={before}") == 401
    # An unrelated change keeps them.
    kept = await ticket(client, ALICE)
    path.write_text(path.read_text() + "limits:\n  max_messages: 99\n")
    assert reload_config(gateway, path).ok
    assert await handshake(client, f"/api/chat/ws?ticket={kept}") == 101


async def test_the_token_in_a_url_is_refused_unless_switched_on() -> None:
    keys = {"mode": "api_key", "api_keys": [{"id": "bob", "key": "k-bob"}]}
    from aiohttp.test_utils import make_mocked_request

    from gateway.access.auth import Authenticator

    request = make_mocked_request("GET", "/api/chat/ws?access_token=k-bob")
    with pytest.raises(HttpError) as off:
        await Authenticator(AuthConfig.model_validate(keys)).identify(request)
    assert off.value.status == 401 and "auth.allow_token_in_url" in off.value.message
    on = Authenticator(AuthConfig.model_validate({**keys, "allow_token_in_url": True}))
    assert (await on.identify(request)).user_id == "bob"
    # A header credential is read first either way.
    header = make_mocked_request("GET", "/api/chat/ws?access_token=nope", headers={"x-api-key": "k-bob"})
    assert (await Authenticator(AuthConfig.model_validate(keys)).identify(header)).user_id == "bob"


def test_the_gateway_warns_while_tokens_in_urls_are_accepted() -> None:
    keys = {"mode": "api_key", "api_keys": [{"id": "bob", "key": "k-bob"}]}
    with structlog.testing.capture_logs() as logs:
        warn_token_in_url(AuthConfig.model_validate(keys))
        warn_token_in_url(AuthConfig.model_validate({**keys, "allow_token_in_url": True}))
    assert [line["event"] for line in logs] == ["token_in_url_allowed"]
    assert logs[0]["log_level"] == "warning" and "k-bob" not in str(logs)


async def test_without_the_shared_store_tickets_are_refused_with_503_not_issued_or_opened() -> None:
    """Redis down: no ticket is issued and none opens a socket (503, retry), nothing crashes."""
    from tests.procs import free_port

    text = (CONFIG % "30s") + (
        f"sessions:\n  backend: redis\n  redis_url: redis://127.0.0.1:{free_port()}\n  secret: test-sessions-secret-0123456789\n"
    )
    client = TestClient(TestServer(create_app(parse_config(text, env={}))))
    await client.start_server()
    try:
        issued = await client.post("/api/chat/ws-ticket", headers=ALICE)
        assert issued.status == 503 and (await issued.json())["error"]["code"] == "sessions_unavailable"
        assert await handshake(client, "/api/chat/ws?ticket=wst_" + "x" * 43) == 503
    finally:
        await client.close()


# ---- a ticket is a credential on a socket's handshake only (issue 24, defect 4) -----------------------------------

HANDSHAKE = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}


async def test_a_ticket_never_buys_a_ticket(client: TestClient) -> None:
    """In api_key mode a ticket carries no `exp`: a chain of tickets, each bought with the last,
    would be a credential that never expires."""
    value = await ticket(client, ALICE)
    for headers in ({}, {"Upgrade": "websocket"}, HANDSHAKE):
        chained = await client.post(f"/api/chat/ws-ticket?ticket={value}", headers=headers)
        assert chained.status == 401, await chained.text()
        error = (await chained.json())["error"]
        assert error["code"] == "unauthorized" and "ticket" in error["message"]
    assert count(client, "issued") == 1


@pytest.mark.parametrize(
    ("method", "path", "headers"),
    [
        ("GET", "/api/agents", {"Upgrade": "websocket"}),  # no `Connection: Upgrade`: no handshake
        ("GET", "/api/agents", HANDSHAKE),  # a handshake, but of no socket route
        ("POST", "/api/chat", HANDSHAKE),
        ("GET", "/api/chat/ws", {"Upgrade": "websocket"}),  # the socket route, but no handshake
        ("GET", "/api/chat/ws", {"Upgrade": "websocket", "Connection": "keep-alive"}),
    ],
)
async def test_a_ticket_is_no_credential_outside_a_sockets_handshake(
    client: TestClient, method: str, path: str, headers: dict[str, str]
) -> None:
    value = await ticket(client, ALICE)
    answer = await client.request(method, f"{path}?ticket={value}", headers=headers)
    assert answer.status == 401, await answer.text()
    error = (await answer.json())["error"]
    assert error["code"] == "unauthorized" and "ticket" in error["message"]
    # The real handshake still opens with it: refusing it elsewhere did not spend it.
    assert await handshake(client, f"/api/chat/ws?ticket={value}") == 101


async def test_a_ticket_opens_a_handshake_whose_connection_header_lists_upgrade_among_others(client: TestClient) -> None:
    value = await ticket(client, ALICE)
    answer = await client.get(f"/api/chat/ws?ticket={value}", headers={**HANDSHAKE, "Connection": "keep-alive, Upgrade"})
    assert answer.status == 101


# ---- the auth settings a ticket is issued under: a keyed digest (issue 24) ---------------------------------------


def test_the_auth_settings_digest_is_keyed_with_their_secrets_and_agreed_by_every_replica() -> None:
    """The record in the shared store names the auth settings by an HMAC keyed with their own secrets,
    not a bare hash of them: replicas with one config agree on it (a ticket opens a socket on any),
    and it is no plain digest that a guess at a secret could be checked against."""
    import hashlib
    import json

    from pydantic import SecretStr

    from gateway.access.auth import Authenticator

    config = parse_config(CONFIG % "30s", env={}).auth
    digest = Authenticator(config).fingerprint
    assert digest == Authenticator(parse_config(CONFIG % "30s", env={}).auth).fingerprint  # another replica
    # Not a bare SHA-256 of the settings, with the secrets revealed (as before) or masked.
    revealed = json.dumps(config.model_dump(mode="python"), sort_keys=True,
                          default=lambda v: v.get_secret_value() if isinstance(v, SecretStr) else str(v))
    masked = json.dumps(config.model_dump(mode="json"), sort_keys=True)
    assert digest not in {hashlib.sha256(text.encode()).hexdigest() for text in (revealed, masked)}
    rotated = parse_config((CONFIG % "30s").replace("k-bob", "k-bob-2"), env={}).auth
    assert Authenticator(rotated).fingerprint != digest
    assert "k-alice" not in digest and len(digest) == 64


def test_the_auth_settings_digest_covers_the_public_keys_contents(tmp_path: Path) -> None:
    """Another key in the same `public_key_file` is another issuer: a reload that reads it voids tickets."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from gateway.access.auth import Authenticator

    def pem() -> bytes:
        return ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    path = tmp_path / "key.pem"
    settings = {"mode": "jwt", "jwt": {"algorithms": ["ES256"], "public_key_file": str(path)}}
    path.write_bytes(pem())
    before = Authenticator(AuthConfig.model_validate(settings)).fingerprint
    assert Authenticator(AuthConfig.model_validate(settings)).fingerprint == before
    path.write_bytes(pem())
    assert Authenticator(AuthConfig.model_validate(settings)).fingerprint != before
