"""Several agents behind one gateway, as `make run` serves them: `adk-gateway demo` with the reference
config/gateway.yaml (demo_agent, the default, and support_agent, both apps of the one stock ADK API
server the demo starts, each gated by its own policy through the one plugin and internal listener).

Stock ai 6 and ai 7 Chats run the demo rows that show which agent answered on `/agents/demo_agent/...`
and on the old `/api/chat` routes, and the support agent's rows on its own routes, over SSE and
WebSocket (every demo row with each client and transport: tests/integration/test_confirm_mode.py); a chat id or an
answer used on another agent's routes is refused; the metrics count each agent's approvals apart.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.demo_rows import SCENARIOS, said, tool_states
from tests.jsdriver import assert_clean, run_chats
from tests.procs import PLUGIN, GatewayProcess, adk_server, free_port, gateway_process, make_run, metric_value, request

pytestmark = [pytest.mark.integration, pytest.mark.js]

SUPPORT_ROWS = {
    "refund": [{"send": "refund 20 on order 1234", "approvals": "approve"}],
    "refund_denied": [{"send": "refund 20 on order 1234", "approvals": "deny"}],
    "lookup": [{"send": "where is order 1234"}],
    "not_its_tool": [{"send": "pay 50 to Hanako"}],
}


def check_support_rows(results: dict[str, dict]) -> None:
    for name, result in results.items():
        assert_clean(result)
        assert result["status"] == "ready", name
    assert tool_states(results["refund"]) == ["output-available"]
    assert "Refunded 20 USD on order 1234" in said(results["refund"])
    assert tool_states(results["refund_denied"]) == ["output-denied"]
    assert tool_states(results["lookup"]) == ["output-available"] and "Order 1234" in said(results["lookup"])
    assert tool_states(results["not_its_tool"]) == [] and "no process_payment tool" in said(results["not_its_tool"])


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """What `make run` runs: `adk-gateway demo` with config/gateway.yaml."""
    with make_run(tmp_path_factory.mktemp("agents")) as gateway:
        yield gateway


def _runs(base: str, path: str, rows: dict[str, list[dict]], version: int, transport: str) -> dict[str, dict]:
    def run(name: str) -> dict:
        if transport == "ws":
            ws = base.replace("http://", "ws://") + path + "/ws"
            return {"version": version, "api": base + path, "transport": "ws", "ws_url": ws, "steps": rows[name]}
        return {"version": version, "api": base + path, "steps": rows[name]}

    # Five at a time: every chat is the demo's one anonymous user, who may stream 8 responses at once.
    names, results = list(rows), {}
    for at in range(0, len(names), 5):
        batch = names[at : at + 5]
        results.update(zip(batch, run_chats([run(n) for n in batch], timeout=60)))
    return results


# Every demo row with each client and transport runs once, on confirm mode's stack
# (tests/integration/test_confirm_mode.py); here, what the routes add: the support agent's rows on
# its own routes, and on the demo agent's own routes and the old ones (its default's) the rows that
# show which agent answered (its text, its gated payment), each client on one transport of each
# route (ai 6's WebSocket transport is the gateway's module, ai 7's the SDK's).
ROUTE_ROWS = {name: SCENARIOS[name] for name in ("hello", "approve")}
CLIENTS = [(6, "sse"), (7, "ws"), (7, "sse"), (6, "ws")]


def check_route_rows(results: dict[str, dict]) -> None:
    """tests/demo_rows.py check_rows, for ROUTE_ROWS."""
    for name, result in results.items():
        assert_clean(result)
        assert result["status"] == "ready", name
    assert '"hello there"' in said(results["hello"])
    assert tool_states(results["approve"]) == ["output-available"] and "Hanako" in said(results["approve"])


@pytest.mark.parametrize(("version", "transport"), CLIENTS[:2])
def test_both_agents_pass_their_rows_on_their_own_routes(demo: GatewayProcess, version: int, transport: str) -> None:
    check_route_rows(_runs(demo.base, "/agents/demo_agent/api/chat", ROUTE_ROWS, version, transport))
    check_support_rows(_runs(demo.base, "/agents/support_agent/api/chat", SUPPORT_ROWS, version, transport))


@pytest.mark.parametrize(("version", "transport"), CLIENTS)
def test_the_old_routes_are_the_default_agents(demo: GatewayProcess, version: int, transport: str) -> None:
    check_route_rows(_runs(demo.base, "/api/chat", ROUTE_ROWS, version, transport))


def _message(chat_id: str, text: str) -> dict:
    return {"id": chat_id, "trigger": "submit-message",
            "messages": [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": text}]}]}


def test_a_chat_id_used_on_another_agents_routes_is_not_found(demo: GatewayProcess) -> None:
    started = request(demo.base, "POST", "/agents/support_agent/api/chat", _message("cross-agent-1", "hello there"))
    assert started.status == 200 and started.chunks[-1]["type"] == "finish", started.body
    for path in ("/api/chat", "/agents/demo_agent/api/chat"):
        refused = request(demo.base, "POST", path, _message("cross-agent-1", "hello again"))
        assert refused.status == 404 and refused.json()["error"]["code"] == "chat_not_found", refused.body
        resume = request(demo.base, "GET", path + "/cross-agent-1/stream")
        assert resume.status == 404 and resume.json()["error"]["code"] == "chat_not_found", resume.body
    assert request(demo.base, "GET", "/agents/support_agent/api/chat/cross-agent-1/stream").status == 200
    unknown = request(demo.base, "POST", "/agents/nobody/api/chat", _message("cross-agent-2", "hi"))
    assert unknown.status == 404 and unknown.json()["error"]["code"] == "agent_not_found"


def test_the_agents_are_listed_and_reported(demo: GatewayProcess) -> None:
    listing = request(demo.base, "GET", "/api/agents").json()
    assert listing["default"] == "demo_agent"
    assert [(a["name"], a["api"]) for a in listing["agents"]] == [
        ("demo_agent", "/agents/demo_agent/api/chat"), ("support_agent", "/agents/support_agent/api/chat"),
    ]
    ready = request(demo.base, "GET", "/readyz")
    assert ready.status == 200 and ready.json() == {"status": "ready", "agents": {"demo_agent": "up", "support_agent": "up"}}
    for agent in ("demo_agent", "support_agent"):
        assert metric_value(demo.base, "adk_gateway_upstream_up", {"agent": agent}) == 1


def test_metrics_count_each_agents_approvals_apart(demo: GatewayProcess) -> None:
    def approved(agent: str, tool: str) -> float:
        labels = {"agent": agent, "tool": tool, "outcome": "approved"}
        return metric_value(demo.base, "adk_gateway_approval_wait_seconds_count", labels)

    before = approved("demo_agent", "process_payment"), approved("support_agent", "issue_refund")
    _runs(demo.base, "/agents/support_agent/api/chat", {"refund": SUPPORT_ROWS["refund"]}, 7, "sse")
    assert (approved("demo_agent", "process_payment"), approved("support_agent", "issue_refund")) == (before[0], before[1] + 1)
    _runs(demo.base, "/api/chat", {"approve": SCENARIOS["approve"]}, 7, "sse")
    assert (approved("demo_agent", "process_payment"), approved("support_agent", "issue_refund")) == (before[0] + 1, before[1] + 1)


def test_agents_on_two_adk_servers_behind_one_gateway_and_one_plugin_secret(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Each agent on its own ADK server, each server with the plugin pointed at the one internal
    listener: each plugin gets its own app's policy, and each agent's approval round trip works, as
    ADK's confirmation (`adk-` ids) that the plugin asked from its app's policy."""
    tmp = tmp_path_factory.mktemp("two-servers")
    internal_port, secret = free_port(), "two-servers-" + os.urandom(6).hex()
    plugin_env = {"ADK_GATEWAY_URL": f"http://127.0.0.1:{internal_port}", "ADK_GATEWAY_SECRET": secret}
    with adk_server(tmp, extra_plugins=(PLUGIN,), env=plugin_env) as one, \
            adk_server(tmp, extra_plugins=(PLUGIN,), env=plugin_env) as two:
        config = (
            f"internal:\n  port: {internal_port}\n  secret: {secret}\n  policy_refresh: 1s\n"
            "default_agent: payments\nagents:\n"
            f"  payments:\n    upstream: {{url: '{one}', app_name: demo_agent, health_interval: 200ms}}\n"
            "    tools:\n      process_payment: {approval: true}\n"
            f"  support:\n    upstream: {{url: '{two}', app_name: support_agent, health_interval: 200ms}}\n"
            "    tools:\n      issue_refund: {approval: true, on_timeout: error}\n"
        )
        with gateway_process(tmp, "", config) as gw:
            pay = _runs(gw.base, "/agents/payments/api/chat", {"approve": SCENARIOS["approve"]}, 7, "sse")["approve"]
            assert_clean(pay)
            assert tool_states(pay) == ["output-available"] and "Hanako" in said(pay)
            refund = _runs(gw.base, "/agents/support/api/chat", {"refund": SUPPORT_ROWS["refund"]}, 7, "ws")["refund"]
            assert_clean(refund)
            assert tool_states(refund) == ["output-available"] and "Refunded 20 USD on order 1234" in said(refund)
            # Each plugin reads its own app's policy: support's names issue_refund alone.
            policy = request(f"http://127.0.0.1:{internal_port}", "GET", "/internal/v1/policy?app_name=support_agent",
                             headers={"Authorization": f"Bearer {secret}"}).json()
            assert list(policy["tools"]) == ["issue_refund"]
            for agent, tool in (("payments", "process_payment"), ("support", "issue_refund")):
                labels = {"agent": agent, "tool": tool, "outcome": "approved"}
                assert metric_value(gw.base, "adk_gateway_approval_wait_seconds_count", labels) == 1
            for result in (pay, refund):
                ids = [p["approval"]["id"] for m in result["messages"] for p in m["parts"] if p.get("approval")]
                assert len(ids) == 1 and ids[0].startswith("adk-"), ids
            # Each plugin asked the gateway first (a standing grant could have decided the call:
            # docs/approvals.md), was told to confirm, and asked ADK's confirmation: nothing was held.
            for agent in ("payments", "support"):
                asked = metric_value(gw.base, "adk_gateway_plugin_requests_total", {"agent": agent})
                assert asked == metric_value(gw.base, "adk_gateway_plugin_requests_total", {"agent": agent, "result": "confirm"}) == 1, agent
