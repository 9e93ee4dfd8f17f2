"""Several agents behind one gateway, below HTTP: the `agents:` section and its single-agent form,
which chat belongs to which agent, each agent's policy and upstream, the plugin naming its agent by
ADK app name, who may use an agent, and what a reload may do to agents.

ADK is scripted in process, one per agent (tests/support/adk.py); nothing sleeps.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.upstream.agents import Agents, UnknownAgent
from gateway.edge.app import create_app
from gateway.core.approvals import REFUSAL_KEY, GatedCall, Verdict
from gateway.access.auth import Authenticator, Identity
from gateway.chat.service import ChatService
from gateway.cli import _with_overrides, describe_agents
from gateway.config.schema import ConfigError, GatewayConfig, parse_config
from gateway.edge.internal import create_internal_app, merged_policy
from gateway.chat.registry import ChatNotFound
from gateway.edge.reload import plan_reload, reload_config
from gateway.edge.state import GATEWAY
from tests.support.adk import ScriptedAdk
from tests.support.adk_server import adk_server
from tests.support.chat import USER, call_event, read, text_events
from tests.support.fake_gateway import FakeGateway
from tests.support.service import chat_service

TWO_AGENTS = """\
internal:
  secret: s3cret
default_agent: payments
agents:
  payments:
    upstream:
      url: http://adk-a:8000
      app_name: pay_app
    tools:
      process_payment:
        approval: true
        timeout: 2s
  support:
    upstream:
      url: http://adk-b:8000
      app_name: support_app
      mode: live
    tools:
      issue_refund:
        approval: true
        timeout: 30s
        on_timeout: error
    limits:
      max_messages: 3
"""


def two_agents(text: str = TWO_AGENTS) -> GatewayConfig:
    return parse_config(text, source="gateway.yaml", env={})


# ---- the config --------------------------------------------------------------------------------


def test_the_agents_section_names_each_agent_its_upstream_policy_and_limits() -> None:
    config = two_agents()
    assert list(config.agents) == ["payments", "support"] and config.default == "payments"
    payments, support = config.agents["payments"], config.agents["support"]
    assert payments.upstream_base == "http://adk-a:8000" and payments.tool_policy("process_payment").approval
    assert not payments.tool_policy("issue_refund").gated  # each agent's policy is its own
    assert support.upstream.mode == "live" and support.tool_policy("issue_refund").on_timeout == "error"
    assert config.max_messages("support") == 3 and config.max_messages("payments") == 500  # the gateway-wide value
    assert config.agent_for_app("support_app") == "support" and config.agent_for_app("nope") is None


def test_without_default_agent_the_first_listed_is_the_default() -> None:
    config = two_agents(TWO_AGENTS.replace("default_agent: payments\n", "").replace("  payments:", "  aaa:"))
    assert config.default == "aaa"


def test_the_single_agent_keys_are_one_agent_named_after_its_app() -> None:
    config = parse_config(
        "upstream:\n  url: http://agent:8000\n  app_name: shop\ntools:\n  buy:\n    approval: true\ninternal:\n  secret: s\n",
        env={},
    )
    assert list(config.agents) == ["shop"] and config.default == "shop"
    assert config.agents["shop"].upstream_base == "http://agent:8000" and config.agents["shop"].tool_policy("buy").approval
    assert list(parse_config("", env={}).agents) == ["demo_agent"]  # no keys at all: the defaults' agent


def test_a_single_agent_files_problems_name_its_own_keys() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config("upstream:\n  url: nope\ntools:\n  x:\n    timeout: soon\n", source="g.yaml", env={})
    assert any(p.startswith("g.yaml: upstream.url:") for p in info.value.problems), info.value.problems
    assert any(p.startswith("g.yaml: tools.x.timeout:") for p in info.value.problems), info.value.problems


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda t: "upstream:\n  url: http://x:1\n" + t, "with `agents:`, move them under agents.<name>"),
        (lambda t: t.replace("app_name: support_app", "app_name: pay_app"), "agents.support.upstream.app_name: 'pay_app' is also agents.payments's"),
        (lambda t: t.replace("default_agent: payments", "default_agent: billing"), "default_agent: 'billing' is not one of the agents"),
        (lambda t: t.replace("  support:\n", "  sup port:\n"), "agents.sup port: an agent name is"),
        (lambda t: t.replace("    limits:\n", "    access:\n      api_keys: [web]\n    limits:\n"), "api_keys needs auth.mode api_key"),
        (lambda t: t.replace("    limits:\n", "    access:\n      jwt_claims: {groups: support}\n    limits:\n"), "jwt_claims needs auth.mode jwt"),
        (lambda t: t.replace("  secret: s3cret\n", "  secret: ''\n"), "internal.secret is required"),
        (lambda t: t.replace("agents:\n", "agents: {}\nx:\n"), "agents"),
    ],
)
def test_what_the_agents_section_refuses(edit: Any, problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        two_agents(edit(TWO_AGENTS))
    assert any(problem in p for p in info.value.problems), info.value.problems


def test_an_access_list_must_name_configured_keys() -> None:
    text = TWO_AGENTS + "auth:\n  mode: api_key\n  api_keys:\n    - id: web\n      key: k1\n"
    text = text.replace("    limits:\n", "    access:\n      api_keys: [web, typo]\n    limits:\n")
    with pytest.raises(ConfigError) as info:
        two_agents(text)
    assert any("agents.support.access.api_keys: typo not among auth.api_keys ids" in p for p in info.value.problems)


def test_check_config_explains_the_single_agent_keys() -> None:
    config = parse_config("upstream:\n  url: http://agent:8000\n  app_name: shop\n", env={})
    lines = describe_agents(config, single_agent_keys=True)
    assert lines[0].startswith("agent shop (default: also /api/chat): /agents/shop/api/chat -> http://agent:8000 app shop (sse, approvals confirm)")
    assert "the top-level upstream: and tools: keys are the single agent 'shop'" in lines[1]
    mapped = "\n".join(line[2:] for line in lines[2:])
    assert parse_config(mapped, env={}).agents["shop"].upstream_base == "http://agent:8000"  # the mapping loads


# ---- who may use an agent ---------------------------------------------------------------------


def test_access_by_key_id_and_by_jwt_claims() -> None:
    config = parse_config(TWO_AGENTS.replace("    limits:\n", "    access:\n      api_keys: [staff]\n    limits:\n")
                          + "auth:\n  mode: api_key\n  api_keys:\n    - {id: staff, key: k1}\n    - {id: web, key: k2}\n", env={})
    access = config.agents["support"].access
    assert Authenticator.may_use(Identity("staff"), access) and not Authenticator.may_use(Identity("web"), access)
    assert Authenticator.may_use(Identity("web"), config.agents["payments"].access)  # no list: everyone

    claims = parse_config(
        TWO_AGENTS.replace("    limits:\n", "    access:\n      jwt_claims: {groups: [support], aud: desk}\n    limits:\n")
        + "auth:\n  mode: jwt\n  jwt:\n    secret: x\n", env={},
    ).agents["support"].access
    assert Authenticator.may_use(Identity("u", {"groups": ["staff", "support"], "aud": "desk"}), claims)
    assert Authenticator.may_use(Identity("u", {"groups": "support", "aud": ["desk", "other"]}), claims)
    assert not Authenticator.may_use(Identity("u", {"groups": ["staff"], "aud": "desk"}), claims)
    assert not Authenticator.may_use(Identity("u", {"aud": "desk"}), claims)  # a claim missing is no match


# ---- chats belong to one agent ----------------------------------------------------------------


@dataclass
class Env:
    service: ChatService
    adks: dict[str, ScriptedAdk]


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    config = two_agents(TWO_AGENTS.replace("mode: live", "mode: sse"))
    adks = {"pay_app": ScriptedAdk(), "support_app": ScriptedAdk()}
    service = chat_service(config, clients=lambda agent: adks[agent.upstream.app_name])
    yield Env(service, adks)
    await service.close()


def body(chat_id: str = "chat-1", *messages: dict[str, Any]) -> Any:
    from gateway.core.chat_request import parse_chat_body

    return parse_chat_body(
        {"id": chat_id, "messages": list(messages) or [USER], "trigger": "submit-message"}, version_header=None, default_version=6
    )


async def test_a_chat_belongs_to_the_agent_it_started_on(env: Env) -> None:
    await env.service.submit("support", "u", body())
    with pytest.raises(ChatNotFound) as info:
        await env.service.submit("payments", "u", body())
    assert info.value.http().status == 404
    with pytest.raises(ChatNotFound):
        env.service.resume("payments", "u", "chat-1")
    assert env.service.abort("payments", "u", "chat-1") is False  # not this agent's chat: nothing stops
    assert env.service.resume("support", "u", "chat-1") is not None
    with pytest.raises(UnknownAgent):
        await env.service.submit("billing", "u", body("chat-2"))
    env.adks["support_app"].reads.put_nowait(None)


async def test_each_agent_runs_on_its_own_upstream_with_its_own_limits(env: Env) -> None:
    pay = await env.service.submit("payments", "u", body("p-1"))
    env.adks["pay_app"].says = None  # type: ignore[attr-defined]
    env.adks["pay_app"].reads.put_nowait(None)
    assert [c["type"] for c in await read(pay)][0] == "start"
    assert env.adks["support_app"].reads.empty()
    many = [{**USER, "id": f"u{n}"} for n in range(4)]
    with pytest.raises(Exception) as info:
        await env.service.submit("support", "u", body("s-1", *many))
    assert getattr(info.value, "status", None) == 413  # support's own max_messages: 3
    await env.service.submit("payments", "u", body("p-2", *many))  # payments keeps the gateway-wide 500
    env.adks["pay_app"].reads.put_nowait(None)


async def test_the_plugin_names_its_agent_by_app_and_gets_that_agents_policy(env: Env) -> None:
    await env.service.submit("support", "u", body())
    env.adks["support_app"].reads.put_nowait([call_event("issue_refund")])
    gates = env.service.gates
    # The payments app's plugin asking about a session id that is the support agent's chat: not its session.
    refused = gates.open(app_name="pay_app", user_id="u", session_id="chat-1", tool_call_id="c1", tool="process_payment", args={})
    assert isinstance(refused, Verdict) and refused.response is not None and refused.response[REFUSAL_KEY] == "no_browser"
    # process_payment is not gated for support; issue_refund is not gated for payments.
    assert gates.open(app_name="support_app", user_id="u", session_id="chat-1", tool_call_id="c2", tool="process_payment", args={}) == Verdict(run=True)
    assert gates.open(app_name="pay_app", user_id="u", session_id="x", tool_call_id="c3", tool="issue_refund", args={}) == Verdict(run=True)
    unknown = gates.open(app_name="other_app", user_id="u", session_id="chat-1", tool_call_id="c4", tool="issue_refund", args={})
    assert isinstance(unknown, Verdict) and unknown.response is not None and unknown.response[REFUSAL_KEY] == "unknown_agent"
    call = gates.open(app_name="support_app", user_id="u", session_id="chat-1", tool_call_id="call-1", tool="issue_refund", args={})
    assert isinstance(call, GatedCall) and call.policy.on_timeout == "error"
    env.adks["support_app"].reads.put_nowait(None)


def test_a_plugin_that_names_no_app_gets_every_agents_gated_tools() -> None:
    merged = merged_policy(two_agents())
    assert merged["process_payment"]["gated"] and merged["issue_refund"]["gated"]
    assert merged["issue_refund"]["timeout"] == 30 and not merged["default"]["gated"]


async def test_the_internal_policy_is_the_asking_apps() -> None:
    app = create_app(two_agents())
    client = TestClient(TestServer(create_internal_app(app)))
    await client.start_server()
    try:
        auth = {"Authorization": "Bearer s3cret"}
        support = await (await client.get("/internal/v1/policy", params={"app_name": "support_app"}, headers=auth)).json()
        assert set(support["tools"]) == {"issue_refund"}
        unknown = await client.get("/internal/v1/policy", params={"app_name": "nope"}, headers=auth)
        assert unknown.status == 404 and (await unknown.json())["error"]["code"] == "agent_not_found"
        both = await (await client.get("/internal/v1/policy", headers=auth)).json()
        assert {"process_payment", "issue_refund"} <= set(both["tools"])
    finally:
        await client.close()


# ---- the routes ---------------------------------------------------------------------------------


@pytest.fixture
async def gateway_client() -> AsyncIterator[TestClient]:
    text = TWO_AGENTS.replace("    limits:\n", "    access:\n      api_keys: [staff]\n    limits:\n")
    text += "auth:\n  mode: api_key\n  api_keys:\n    - {id: staff, key: k-staff}\n    - {id: web, key: k-web}\n"
    client = TestClient(TestServer(create_app(two_agents(text))))
    await client.start_server()
    yield client
    await client.close()


async def test_a_caller_not_allowed_on_an_agent_is_refused_there_only(gateway_client: TestClient) -> None:
    web_key = {"Authorization": "Bearer k-web"}
    refused = await gateway_client.post("/agents/support/api/chat", json={"id": "c", "messages": []}, headers=web_key)
    assert refused.status == 403 and (await refused.json())["error"]["code"] == "agent_not_allowed"
    ws = await gateway_client.get("/agents/support/api/chat/ws", headers=web_key)
    assert ws.status == 403
    resume = await gateway_client.get("/agents/support/api/chat/c/stream", headers=web_key)
    assert resume.status == 403
    unknown = await gateway_client.post("/agents/nobody/api/chat", json={}, headers=web_key)
    assert unknown.status == 404 and (await unknown.json())["error"]["code"] == "agent_not_found"
    anonymous = await gateway_client.post("/agents/nobody/api/chat", json={})
    assert anonymous.status == 401  # no agent names are confirmed to a caller without a key
    listed = await (await gateway_client.get("/api/agents", headers=web_key)).json()
    assert [a["name"] for a in listed["agents"]] == ["payments"]
    staff = await (await gateway_client.get("/api/agents", headers={"Authorization": "Bearer k-staff"})).json()
    assert [a["name"] for a in staff["agents"]] == ["payments", "support"]


async def test_readyz_reports_each_agents_upstream_and_follows_the_default(gateway_client: TestClient) -> None:
    gateway = gateway_client.app[GATEWAY]  # type: ignore[index]
    for agent in gateway.agents:
        agent.probe.cancel()  # the hosts do not exist: the test sets what the probes would have seen
    gateway.agents.get("payments").up = True
    ready = await gateway_client.get("/readyz")
    assert ready.status == 200 and await ready.json() == {"status": "ready", "agents": {"payments": "up", "support": "unreachable"}}
    assert gateway.metrics.registry.get_sample_value("adk_gateway_ready") == 1
    gateway.agents.get("payments").up = False
    gateway.agents.get("support").up = True
    assert (await gateway_client.get("/readyz")).status == 503
    assert gateway.metrics.registry.get_sample_value("adk_gateway_ready") == 0


# ---- reload --------------------------------------------------------------------------------------


def test_a_reload_may_add_remove_and_change_agents_but_not_open_one_wider() -> None:
    running = two_agents(TWO_AGENTS + "auth:\n  mode: api_key\n  api_keys:\n    - {id: staff, key: k1}\n    - {id: web, key: k2}\n")
    text = TWO_AGENTS.replace("  support:\n", "  billing:\n    upstream:\n      app_name: bill_app\n  support:\n")
    text = text.replace("url: http://adk-b:8000", "url: http://adk-c:8000")
    text += "auth:\n  mode: api_key\n  api_keys:\n    - {id: staff, key: k1}\n    - {id: web, key: k2}\n"
    plan = plan_reload(text, source="g.yaml", running=running, env={})
    assert plan.problems == [] and plan.config is not None and list(plan.config.agents) == ["payments", "billing", "support"]

    gated = running.model_copy(update={"agents": {
        **running.agents,
        "support": running.agents["support"].model_copy(update={"access": running.agents["support"].access.model_copy(update={"api_keys": ["staff"]})}),
    }})
    widened = plan_reload(text, source="g.yaml", running=gated, env={})
    assert widened.config is None
    assert any("agents.support.access.api_keys: a reload cannot let more keys use this agent" in p for p in widened.problems)

    ungated = plan_reload(TWO_AGENTS.replace("        approval: true\n        timeout: 30s", "        timeout: 30s"), source="g.yaml",
                          running=two_agents(), env={})
    assert ungated.config is None
    assert any("agents.support.tools.issue_refund: a reload cannot stop requiring approval" in p for p in ungated.problems)


async def test_a_removed_agents_running_response_ends_and_its_routes_are_gone(tmp_path: Path) -> None:
    config = two_agents(TWO_AGENTS.replace("mode: live", "mode: sse"))
    adks = {"pay_app": ScriptedAdk(), "support_app": ScriptedAdk()}
    app = create_app(config)
    gateway = app[GATEWAY]
    gateway.agents = Agents(config, client=lambda agent: adks[agent.upstream.app_name])  # type: ignore[arg-type, return-value]
    gateway.chats.agents = gateway.agents
    gateway.chats.runs._agents = gateway.agents  # noqa: SLF001 - the scripted upstreams
    gateway.chats.gates._agents = gateway.agents  # noqa: SLF001
    # One chat waits for a person to approve a refund; another streams an answer.
    await gateway.chats.submit("support", "u", body("chat-1"))
    adks["support_app"].reads.put_nowait([call_event("issue_refund")])
    call = None
    for _ in range(100):
        await asyncio.sleep(0)
        call = gateway.chats.gates.open(app_name="support_app", user_id="u", session_id="chat-1", tool_call_id="call-1", tool="issue_refund", args={})
        if isinstance(call, GatedCall):
            break
    assert isinstance(call, GatedCall)
    waiting = asyncio.create_task(gateway.chats.gates.wait(call))
    streaming = await gateway.chats.submit("support", "u", body("chat-2"))
    adks["support_app"].reads.put_nowait(text_events("Let me ")[:1])

    path = tmp_path / "gateway.yaml"
    path.write_text(TWO_AGENTS.replace("mode: live", "mode: sse").split("  support:\n")[0])
    result = reload_config(gateway, path)
    assert result.ok, result.problems
    assert gateway.agents.get("support") is None and list(gateway.config.agents) == ["payments"]
    verdict = await asyncio.wait_for(waiting, 2)
    assert not verdict.run  # its waiting call is refused to the agent: the refund does not run
    chunks = await read(streaming)
    assert chunks[-1]["type"] == "finish" and any(
        c["type"] == "error" and "support was removed" in c["errorText"] for c in chunks
    ), chunks
    with pytest.raises(UnknownAgent):
        await gateway.chats.submit("support", "u", body("chat-9"))
    await gateway.chats.close()


async def test_the_plugin_asks_each_app_for_its_own_policy() -> None:
    from adk_gateway_plugin import GatewayPlugin

    fake = FakeGateway()
    fake.tools_of = lambda app: {"process_payment": {"gated": True}} if app == "pay_app" else {}
    server = TestServer(fake.app())
    await server.start_server()
    plugin = GatewayPlugin(url=str(server.make_url("")), secret="s3cret")
    try:
        assert (await plugin._tool_policy("process_payment", "pay_app"))["gated"]  # noqa: SLF001
        assert await plugin._tool_policy("process_payment", "support_app") == {}  # noqa: SLF001
        assert await plugin._tool_policy("process_payment", "pay_app") is not None  # noqa: SLF001 - cached
        assert fake.apps == ["pay_app", "support_app"]
    finally:
        await plugin.close()
        await server.close()


def test_a_reload_keeps_the_upstream_mode_the_command_line_set() -> None:
    running = two_agents(TWO_AGENTS.replace("mode: live", "mode: sse"))
    plan = plan_reload(TWO_AGENTS, source="g.yaml", running=running, env={}, upstream_mode="sse")
    assert plan.config is not None and {a.upstream.mode for a in plan.config.agents.values()} == {"sse"}
    plan = plan_reload(TWO_AGENTS, source="g.yaml", running=running, env={})  # the file's own modes
    assert plan.config is not None and plan.config.agents["support"].upstream.mode == "live"


def test_a_reload_under_upstream_mode_live_holds_what_the_file_leaves_unset() -> None:
    """Approvals left unset follow the command line's mode (hold on live); an explicit confirm is
    refused there with the reason, as at start."""
    running = two_agents()
    plan = plan_reload(TWO_AGENTS, source="g.yaml", running=running, env={}, upstream_mode="live")
    assert plan.config is not None
    assert {a.upstream.approvals for a in plan.config.agents.values()} == {"hold"}
    assert plan_reload(TWO_AGENTS, source="g.yaml", running=running, env={}).config.agents["payments"].upstream.approvals == "confirm"
    explicit = TWO_AGENTS.replace("      app_name: pay_app\n", "      app_name: pay_app\n      approvals: confirm\n")
    plan = plan_reload(explicit, source="g.yaml", running=running, env={}, upstream_mode="live")
    assert plan.config is None and any("live flow has no tool confirmations" in p for p in plan.problems), plan.problems


def test_the_command_lines_upstream_mode_takes_its_own_default_approvals() -> None:
    args = argparse.Namespace(host=None, port=8080, upstream_mode="live")
    config = _with_overrides(two_agents(), args)
    assert {a.upstream.approvals for a in config.agents.values()} == {"hold"}
    explicit = two_agents(TWO_AGENTS.replace("      app_name: pay_app\n", "      app_name: pay_app\n      approvals: confirm\n"))
    with pytest.raises(ConfigError, match="live flow has no tool confirmations"):
        _with_overrides(explicit, args)


async def test_an_open_socket_is_held_to_its_agents_access_at_every_request(gateway_client: TestClient) -> None:
    """Access is checked per request frame, not at the handshake alone: a reload that narrows it,
    or removes the agent, reaches sockets already open."""
    gateway = gateway_client.app[GATEWAY]  # type: ignore[index]
    ws = await gateway_client.ws_connect("/agents/support/api/chat/ws", headers={"Authorization": "Bearer k-staff"})
    try:
        narrowed = gateway.config.agents["support"].model_copy(update={
            "access": gateway.config.agents["support"].access.model_copy(update={"api_keys": ["nobody"]}),
        })
        gateway.config = gateway.config.model_copy(update={"agents": {**gateway.config.agents, "support": narrowed}})
        await ws.send_json({"type": "send", "requestId": "r1", "id": "c1", "messages": []})
        frame = await ws.receive_json(timeout=5)
        assert frame["type"] == "error" and "may not use this agent" in frame["errorText"], frame
        gateway.config = gateway.config.model_copy(update={"agents": {"payments": gateway.config.agents["payments"]}})
        await ws.send_json({"type": "resume", "requestId": "r2", "id": "c1"})
        frame = await ws.receive_json(timeout=5)
        assert frame["type"] == "error" and "not served here any more" in frame["errorText"], frame
    finally:
        await ws.close()


async def test_the_agent_list_answers_a_cross_origin_preflight() -> None:
    config = two_agents(TWO_AGENTS + "auth:\n  allowed_origins: [http://localhost:3000]\n")
    client = TestClient(TestServer(create_app(config)))
    await client.start_server()
    try:
        preflight = await client.options("/api/agents", headers={
            "Origin": "http://localhost:3000", "Access-Control-Request-Method": "GET",
            "Access-Control-Request-Headers": "authorization",
        })
        assert preflight.status == 204 and preflight.headers["Access-Control-Allow-Origin"] == "http://localhost:3000"
        refused = await client.options("/api/agents", headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "GET"})
        assert refused.status == 403
    finally:
        await client.close()


async def test_the_agent_list_names_each_agents_browser_tools() -> None:
    # A page's onToolCall is called for every call; it must answer only these (the rest run on the server).
    browser = "      get_location: {runs_in: browser, approval: true}\n      change_bgm: {runs_in: browser}\n"
    text = TWO_AGENTS.replace("        timeout: 2s\n", "        timeout: 2s\n" + browser, 1)
    text = text.replace("    limits:\n", "      default: {runs_in: browser}\n    limits:\n")
    client = TestClient(TestServer(create_app(two_agents(text))))
    await client.start_server()
    try:
        listed = await (await client.get("/api/agents")).json()
        tools = {agent["name"]: agent["browser_tools"] for agent in listed["agents"]}
        # `default` is not a tool's name: a page cannot run a tool it does not know by name.
        assert tools == {"payments": ["change_bgm", "get_location"], "support": []}
    finally:
        await client.close()


async def test_the_probe_calls_an_agent_down_when_its_server_does_not_serve_its_app() -> None:
    listing: list[Any] = ["other_app"]

    async def list_apps(request: web.Request) -> web.Response:
        return web.json_response(listing)

    async with adk_server(two_agents().agents["support"].upstream) as (routes, client):
        routes["GET", "/list-apps"] = list_apps
        assert await client.ping() is False
        listing.append("support_app")
        assert await client.ping() is True
