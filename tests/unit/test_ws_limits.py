"""WebSocket frames spend the user's request rate as requests do (issue 24): `resume` as `send`.

Through the real app (aiohttp's test server, the memory backend); no agent is needed, since a resume of a
chat with nothing to replay is answered `no-active` by the gateway itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gateway.edge.app import create_app
from gateway.config.schema import parse_config
from gateway.edge.state import GATEWAY

# A bucket of three with no refill worth speaking of: the handshake takes one, two frames the rest.
CONFIG = """
auth:
  mode: api_key
  api_keys: [{id: alice, key: k-alice}]
limits:
  rate_per_user: 0.001
  burst_per_user: 3
"""


@pytest.fixture
async def client() -> AsyncIterator[TestClient]:
    client = TestClient(TestServer(create_app(parse_config(CONFIG, env={}))))
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()


def limited(client: TestClient, reason: str) -> float:
    registry = client.app[GATEWAY].metrics.registry  # type: ignore[index]
    return registry.get_sample_value("adk_gateway_limited_total", {"reason": reason}) or 0.0


async def test_resume_frames_spend_the_users_request_rate(client: TestClient) -> None:
    async with client.ws_connect("/api/chat/ws", headers={"Authorization": "Bearer k-alice"}) as ws:
        answers: list[dict[str, Any]] = []
        for n in range(3):
            await ws.send_json({"type": "resume", "requestId": f"r{n}", "id": "chat-1"})
            answers.append(await ws.receive_json(timeout=5))
    assert [a["type"] for a in answers] == ["no-active", "no-active", "error"]
    assert answers[2]["requestId"] == "r2" and answers[2]["errorText"] == "too many requests"
    assert limited(client, "rate_limited") == 1


async def test_a_refused_resume_is_refused_like_a_refused_send(client: TestClient) -> None:
    async with client.ws_connect("/api/chat/ws", headers={"Authorization": "Bearer k-alice"}) as ws:
        for n in range(2):
            await ws.send_json({"type": "resume", "requestId": f"r{n}", "id": "chat-1"})
            await ws.receive_json(timeout=5)
        await ws.send_json({"type": "send", "requestId": "s", "id": "chat-1", "messages": []})
        refused_send = await ws.receive_json(timeout=5)
        await ws.send_json({"type": "resume", "requestId": "r", "id": "chat-1"})
        refused_resume = await ws.receive_json(timeout=5)
    assert refused_send["type"] == refused_resume["type"] == "error"
    assert refused_send["errorText"] == refused_resume["errorText"]
    assert limited(client, "rate_limited") == 2
