"""The ADK plugin's decisions, against a fake gateway (the real pairing runs in tests/integration)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from google.adk.tools.function_tool import FunctionTool
from google.genai import types

from gateway.agent_plugin import GatewayPlugin


def pay(amount: int) -> dict:
    """Pays."""
    return {"paid": amount}


def weather(city: str) -> dict:
    """Weather."""
    return {"city": city}


class FakeGateway:
    def __init__(self) -> None:
        self.verdict: Any = {"verdict": "run"}
        self.status = 200
        self.asked: list[dict] = []

    def app(self) -> web.Application:
        async def policy(request: web.Request) -> web.Response:
            if request.headers.get("Authorization") != "Bearer s3cret":
                return web.json_response({}, status=401)
            return web.json_response({"tools": {
                "pay": {"approval": True, "runs_in": "server", "gated": True, "non_blocking": True},
            }, "refresh": 30})

        async def tool_calls(request: web.Request) -> web.Response:
            self.asked.append(await request.json())
            return web.json_response(self.verdict, status=self.status)

        app = web.Application()
        app.add_routes([web.get("/internal/v1/policy", policy), web.post("/internal/v1/tool-calls", tool_calls)])
        return app


@pytest.fixture
async def gateway(aiohttp_server: Any) -> AsyncIterator[tuple[FakeGateway, str]]:
    fake = FakeGateway()
    server = await aiohttp_server(fake.app())
    yield fake, str(server.make_url("")).rstrip("/")


def context() -> Any:
    return SimpleNamespace(
        session=SimpleNamespace(app_name="app", id="chat-1"), user_id="u1", invocation_id="inv",
        function_call_id="call-1", tool_confirmation=None,
    )


async def test_ungated_tools_run_without_asking(gateway: tuple[FakeGateway, str]) -> None:
    fake, url = gateway
    plugin = GatewayPlugin(url=url, secret="s3cret")
    assert await plugin.before_tool_callback(tool=FunctionTool(weather), tool_args={"city": "x"}, tool_context=context()) is None
    assert fake.asked == []
    await plugin.close()


async def test_run_verdict_confirms_the_call(gateway: tuple[FakeGateway, str]) -> None:
    fake, url = gateway
    plugin = GatewayPlugin(url=url, secret="s3cret")
    ctx = context()
    assert await plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={"amount": 5}, tool_context=ctx) is None
    assert ctx.tool_confirmation.confirmed is True
    assert fake.asked == [{
        "app_name": "app", "user_id": "u1", "session_id": "chat-1", "invocation_id": "inv",
        "function_call_id": "call-1", "tool": "pay", "args": {"amount": 5},
    }]
    await plugin.close()


@pytest.mark.parametrize(
    ("verdict", "status", "needle"),
    [
        ({"verdict": "respond", "response": {"error": "rejected"}}, 200, "rejected"),
        ({"verdict": "maybe"}, 200, "unexpected"),
        ([1, 2], 200, "unexpected"),
        ({}, 500, "refused to decide"),
    ],
)
async def test_everything_but_run_keeps_the_tool_from_running(
    gateway: tuple[FakeGateway, str], verdict: Any, status: int, needle: str
) -> None:
    fake, url = gateway
    fake.verdict, fake.status = verdict, status
    plugin = GatewayPlugin(url=url, secret="s3cret")
    response = await plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={"amount": 5}, tool_context=context())
    assert needle in response["error"]
    await plugin.close()


async def test_fails_closed_without_a_reachable_gateway() -> None:
    plugin = GatewayPlugin(url="http://127.0.0.1:9", secret="s3cret", connect_timeout=1)
    response = await plugin.before_tool_callback(tool=FunctionTool(weather), tool_args={}, tool_context=context())
    assert "policy is unavailable" in response["error"]
    await plugin.close()


async def test_wrong_secret_means_no_policy_and_refusal(gateway: tuple[FakeGateway, str]) -> None:
    _, url = gateway
    plugin = GatewayPlugin(url=url, secret="wrong")
    response = await plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={}, tool_context=context())
    assert "policy is unavailable" in response["error"]
    await plugin.close()


async def test_non_blocking_policy_marks_the_tool_for_live_mode(gateway: tuple[FakeGateway, str]) -> None:
    _, url = gateway
    plugin = GatewayPlugin(url=url, secret="s3cret")
    paying, asking = FunctionTool(pay), FunctionTool(weather)
    await plugin.before_agent_callback(agent=SimpleNamespace(tools=[paying, asking]), callback_context=None)
    assert paying.behavior is types.Behavior.NON_BLOCKING and asking.behavior is None
    await plugin.close()
