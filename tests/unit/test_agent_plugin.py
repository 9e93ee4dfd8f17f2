"""The ADK plugin's decisions, against a fake gateway (the real pairing runs in tests/integration)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from google.adk.tools.function_tool import FunctionTool
from google.genai import types

from gateway import approvals
from gateway.agent_plugin import REFUSAL_KEY, GatewayPlugin


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
        # "hang": hold the request open (a person who never answers); "drop": cut the connection.
        self.behaviour = ""

    def app(self) -> web.Application:
        async def policy(request: web.Request) -> web.Response:
            if request.headers.get("Authorization") != "Bearer s3cret":
                return web.json_response({}, status=401)
            return web.json_response({"tools": {
                "pay": {"approval": True, "runs_in": "server", "gated": True, "non_blocking": True},
            }, "refresh": 30})

        async def tool_calls(request: web.Request) -> web.Response:
            self.asked.append(await request.json())
            if self.behaviour == "hang":
                await asyncio.sleep(30)
            if self.behaviour == "drop":
                assert request.transport is not None
                request.transport.close()
                await asyncio.sleep(1)
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
    ("verdict", "status", "needle", "code"),
    [
        ({"verdict": "respond", "response": {"error": "rejected", REFUSAL_KEY: "denied"}}, 200, "rejected", "denied"),
        ({"verdict": "maybe"}, 200, "unexpected", "unexpected_answer"),
        ([1, 2], 200, "unexpected", "unexpected_answer"),
        ({}, 500, "refused to decide", "gateway_refused"),
    ],
)
async def test_everything_but_run_keeps_the_tool_from_running(
    gateway: tuple[FakeGateway, str], verdict: Any, status: int, needle: str, code: str
) -> None:
    fake, url = gateway
    fake.verdict, fake.status = verdict, status
    plugin = GatewayPlugin(url=url, secret="s3cret")
    response = await plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={"amount": 5}, tool_context=context())
    assert needle in response["error"]
    # Marked, so the gateway never takes the refusal for a tool result (adk_gateway_policy_bypassed_total).
    assert response[REFUSAL_KEY] == code
    await plugin.close()


def test_the_plugin_and_the_gateway_agree_on_the_refusal_marker() -> None:
    # The plugin is installed in the agent's process without the gateway's modules: it has its own copy.
    assert REFUSAL_KEY == approvals.REFUSAL_KEY


async def test_a_wait_past_max_wait_is_refused_and_says_so(gateway: tuple[FakeGateway, str]) -> None:
    fake, url = gateway
    fake.behaviour = "hang"
    plugin = GatewayPlugin(url=url, secret="s3cret", max_wait=0.5)
    response = await plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={"amount": 5}, tool_context=context())
    assert response[REFUSAL_KEY] == "max_wait"
    assert "ADK_GATEWAY_MAX_WAIT" in response["error"] and "not run" in response["error"]
    await plugin.close()


async def test_a_gateway_that_drops_the_wait_is_refused(gateway: tuple[FakeGateway, str]) -> None:
    fake, url = gateway
    fake.behaviour = "drop"
    plugin = GatewayPlugin(url=url, secret="s3cret")
    response = await plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={"amount": 5}, tool_context=context())
    assert response[REFUSAL_KEY] == "gateway_unreachable" and "not run" in response["error"]
    await plugin.close()


async def test_fails_closed_without_a_reachable_gateway() -> None:
    plugin = GatewayPlugin(url="http://127.0.0.1:9", secret="s3cret", connect_timeout=1)
    response = await plugin.before_tool_callback(tool=FunctionTool(weather), tool_args={}, tool_context=context())
    assert "policy is unavailable" in response["error"]
    assert response[REFUSAL_KEY] == "policy_unavailable"
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


async def test_a_bug_in_the_plugin_is_a_marked_refusal(gateway: tuple[FakeGateway, str]) -> None:
    _, url = gateway
    plugin = GatewayPlugin(url=url, secret="s3cret")

    async def broken(*_: Any) -> dict:
        raise RuntimeError("bug")

    plugin._ask = broken  # type: ignore[method-assign]
    response = await plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={}, tool_context=context())
    assert response[REFUSAL_KEY] == "plugin_failed" and "not run" in response["error"]
    await plugin.close()
