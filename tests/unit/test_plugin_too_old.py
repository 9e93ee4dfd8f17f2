"""Plugins older than 0.2 are refused at their first ask; an agent on `/run_sse` is never asked with a
held request.

A plugin from before 0.2 fetches the policy without `features=rules` and asks without `"confirm":
true`. On `/run_sse` every call that waits for a person is ADK's confirmation, so such an ask is
refused at the internal listener (`plugin_too_old`), before anything is recorded; on `/run_live` the
held request is the one engine and goes on to the gate. The real internal Application over HTTP; the
gate records what reaches it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import structlog
from aiohttp.test_utils import TestClient, TestServer

from gateway.config.schema import parse_config
from gateway.core.approvals import REFUSAL_KEY, RUN, Verdict
from gateway.edge.app import create_app
from gateway.edge.internal import create_internal_app
from gateway.edge.state import GATEWAY

CONFIG = """\
internal:
  secret: s3cret-internal
approvers:
  groups:
    leads: {users: [lead]}
agents:
  shop:
    upstream: {url: "http://adk:8000", app_name: shop}
    tools:
      buy:
        approval: true
        rules:
          - {name: small, when: args.amount < 5, decide: approve}
      wire: {approval: true, approvers: leads}
      pay: {approval: true}
      locate: {runs_in: browser}
  talk:
    upstream: {url: "http://adk:8001", app_name: talk, mode: live}
    tools:
      pay: {approval: true}
"""
AUTH = {"Authorization": "Bearer s3cret-internal"}


@dataclass
class Listener:
    client: TestClient
    gated: list[dict[str, Any]]
    app: Any

    async def policy(self, app_name: str, **params: str) -> dict[str, Any]:
        resp = await self.client.get("/internal/v1/policy", params={"app_name": app_name, **params}, headers=AUTH)
        assert resp.status == 200
        return (await resp.json())["tools"]

    async def ask(self, app_name: str, tool: str, **flags: bool) -> dict[str, Any]:
        body = {"app_name": app_name, "user_id": "u", "session_id": "s", "function_call_id": "f", "tool": tool,
                "args": {"amount": 50}, **flags}
        resp = await self.client.post("/internal/v1/tool-calls", json=body, headers=AUTH)
        assert resp.status == 200
        return await resp.json()

    def counted(self, agent: str, result: str) -> float:
        return self.app[GATEWAY].metrics.registry.get_sample_value(
            "adk_gateway_plugin_requests_total", {"agent": agent, "result": result},
        ) or 0.0


@pytest.fixture
async def listener() -> AsyncIterator[Listener]:
    app = create_app(parse_config(CONFIG, env={}))
    gated: list[dict[str, Any]] = []

    async def gate(**call: Any) -> tuple[Verdict, str]:
        gated.append(call)
        return RUN, "run"

    app[GATEWAY].cluster.gate = gate  # type: ignore[method-assign]
    client = TestClient(TestServer(create_internal_app(app)))
    await client.start_server()
    try:
        yield Listener(client, gated, app)
    finally:
        await client.close()


def assert_too_old(verdict: dict[str, Any]) -> None:
    assert verdict["verdict"] == "respond"
    response = verdict["response"]
    assert response[REFUSAL_KEY] == "plugin_too_old"
    assert "adk-gateway-plugin is too old for this gateway" in response["error"]
    assert "0.2 or newer" in response["error"] and "operations.md" in response["error"]
    assert "was not run" in response["error"]


async def test_a_plugin_older_than_0_2_is_served_no_confirm_and_its_first_ask_is_refused(listener: Listener) -> None:
    """A 0.1 plugin confirms a `confirm` tool without asking, so it would skip the rules and the
    approvers: it is served none, asks about every gated call, and each ask is refused."""
    with structlog.testing.capture_logs() as logs:
        tools = await listener.policy("shop")
        assert all(not entry["confirm"] and not entry["confirm_browser"] for entry in tools.values()), tools
        assert tools["buy"]["gated"] and tools["wire"]["gated"] and tools["pay"]["gated"] and tools["locate"]["gated"]
        for tool in ("buy", "wire", "pay", "locate"):
            assert_too_old(await listener.ask("shop", tool))
    assert listener.gated == [], "nothing of a refused ask reaches the chat"
    assert listener.counted("shop", "plugin_too_old") == 4
    warnings = [line for line in logs if line["event"] == "plugin_too_old"]
    assert len(warnings) == 1 and warnings[0]["log_level"] == "warning" and warnings[0]["app_name"] == "shop"
    assert "s3cret" not in repr(logs)


async def test_an_ask_without_confirm_about_an_sse_agent_is_refused_whatever_the_policy_said(listener: Listener) -> None:
    """A current plugin asks so only for a `/run_live` call to the agent's ADK that bypassed the
    gateway: refused the same way, never held."""
    tools = await listener.policy("shop", features="rules")
    assert tools["buy"]["confirm"] and tools["buy"]["rules"] and tools["locate"]["confirm_browser"]
    assert_too_old(await listener.ask("shop", "buy", approvers=True))
    assert listener.gated == []


async def test_an_ask_with_confirm_about_an_sse_agent_reaches_the_gate(listener: Listener) -> None:
    assert await listener.ask("shop", "buy", confirm=True, approvers=True) == {"verdict": "run"}
    assert [(c["tool"], c["confirm"], c["approvers"]) for c in listener.gated] == [("buy", True, True)]
    # A 0.2 plugin (no `approvers`): its flags go to the gate as they are, which decides about approvers.
    await listener.ask("shop", "wire", confirm=True)
    assert [(c["tool"], c["confirm"], c["approvers"]) for c in listener.gated][1:] == [("wire", True, False)]


async def test_an_ask_without_confirm_about_a_live_agent_is_still_held(listener: Listener) -> None:
    """`/run_live` has no confirmation: the held request is its one engine, whichever plugin asks."""
    with structlog.testing.capture_logs() as logs:
        tools = await listener.policy("talk")
        assert tools["pay"]["gated"] and not tools["pay"]["confirm"]
        assert await listener.ask("talk", "pay") == {"verdict": "run"}
    assert [(c["app_name"], c["tool"], c["confirm"]) for c in listener.gated] == [("talk", "pay", False)]
    assert listener.counted("talk", "plugin_too_old") == 0
    assert not [line for line in logs if line["event"] == "plugin_too_old"]
