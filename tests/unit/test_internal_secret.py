"""The internal listener's secret, and rotating it without refusing a gated call (issue 24).

`internal.previous_secret` is accepted alongside `internal.secret` while a rotation overlaps: the
gateway is reloaded with both, the agents move to the new secret at their own pace, then a reload
drops the old one (docs/operations.md, "Rotating the internal secret"). The gateway side is the
real internal Application over HTTP; the plugin side is the real GatewayPlugin.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import structlog
from aiohttp.test_utils import TestClient, TestServer

from adk_gateway_plugin import GatewayPlugin
from gateway.edge import internal
from gateway.edge.app import create_app
from gateway.config.schema import parse_config
from gateway.edge.internal import create_internal_app
from gateway.edge.reload import reload_config
from gateway.edge.state import GATEWAY

CONFIG = """\
upstream:
  url: http://adk:8000
  app_name: shop
tools:
  buy:
    approval: true
internal:
  secret: %s
"""


@pytest.fixture
async def listener(tmp_path: Path) -> AsyncIterator[tuple[TestClient, Path]]:
    """The internal listener of a gateway started with secret `old`, and its config file."""
    path = tmp_path / "gateway.yaml"
    path.write_text(CONFIG % "old-secret-1")
    app = create_app(parse_config(path.read_text(), env={}))
    app[GATEWAY].config_path = path
    client = TestClient(TestServer(create_internal_app(app)))
    await client.start_server()
    yield client, path
    await client.close()


async def status(client: TestClient, secret: str) -> int:
    resp = await client.get("/internal/v1/policy", params={"app_name": "shop"}, headers={"Authorization": f"Bearer {secret}"})
    return resp.status


def reload(client: TestClient, path: Path, text: str) -> None:
    path.write_text(text)
    result = reload_config(client.app[GATEWAY], path)  # type: ignore[index]
    assert result.ok, result.problems


async def test_both_secrets_open_the_listener_while_the_rotation_overlaps(listener: tuple[TestClient, Path]) -> None:
    client, path = listener
    assert await status(client, "old-secret-1") == 200 and await status(client, "new-secret-2") == 401
    with structlog.testing.capture_logs() as logs:
        reload(client, path, CONFIG % "new-secret-2" + "  previous_secret: old-secret-1\n")
    assert "internal_previous_secret_set" in [line["event"] for line in logs]  # while it is set, at each reload
    with structlog.testing.capture_logs() as logs:
        assert await status(client, "old-secret-1") == 200
        assert await status(client, "new-secret-2") == 200
    # The old secret still in use says so (which agents have not moved yet), without the secret.
    assert [line["event"] for line in logs if line["log_level"] == "warning"] == ["internal_previous_secret_used"]
    assert "old-secret-1" not in str(logs)
    for wrong in ("", "new-secret", "old-secret-", "old-secret-12", "wrong"):
        assert await status(client, wrong) == 401
    reload(client, path, CONFIG % "new-secret-2")
    assert await status(client, "old-secret-1") == 401 and await status(client, "new-secret-2") == 200


async def test_an_empty_previous_secret_authenticates_nobody(listener: tuple[TestClient, Path]) -> None:
    client, path = listener
    reload(client, path, CONFIG % "old-secret-1" + "  previous_secret: ${OLD_ADK_GATEWAY_SECRET:-}\n")
    resp = await client.get("/internal/v1/policy", headers={"Authorization": "Bearer "})
    assert resp.status == 401
    assert (await client.get("/internal/v1/policy")).status == 401
    assert await status(client, "old-secret-1") == 200


async def test_every_secret_is_compared_in_constant_time_whichever_matches(
    listener: tuple[TestClient, Path], monkeypatch: pytest.MonkeyPatch,
) -> None:
    client, path = listener
    reload(client, path, CONFIG % "new-secret-2" + "  previous_secret: old-secret-1\n")
    compared: list[bytes] = []

    def compare_digest(a: bytes, b: bytes) -> bool:
        compared.append(b)
        return a == b

    monkeypatch.setattr(internal.hmac, "compare_digest", compare_digest)
    for given in ("new-secret-2", "old-secret-1", "wrong"):
        compared.clear()
        await status(client, given)
        assert sorted(compared) == [b"new-secret-2", b"old-secret-1"], given  # both, never short-circuited


async def test_the_rotation_procedure_never_refuses_a_plugin(listener: tuple[TestClient, Path]) -> None:
    """The steps of docs/operations.md, with plugins as the agents run them before and after their
    restart: at every step, each plugin that may be running reads the policy."""
    client, path = listener
    url = str(client.make_url("")).rstrip("/")

    async def reads_policy(secret: str) -> bool:
        plugin = GatewayPlugin(url=url, secret=secret, connect_timeout=2)
        try:
            return await plugin._tool_policy("buy", "shop") is not None
        finally:
            await plugin.close()

    assert await reads_policy("old-secret-1")
    # 1. The gateway takes the new secret, and the old one as previous_secret.
    reload(client, path, CONFIG % "new-secret-2" + "  previous_secret: old-secret-1\n")
    assert await reads_policy("old-secret-1")  # agents not restarted yet
    # 2. The agents restart with ADK_GATEWAY_SECRET set to the new secret, one by one.
    assert await reads_policy("new-secret-2")
    # 3. No `internal_previous_secret_used` any more: the gateway drops the old secret.
    reload(client, path, CONFIG % "new-secret-2")
    assert await reads_policy("new-secret-2")
    assert not await reads_policy("old-secret-1")
