"""Standing grants end to end: a grant given through the grants API decides the next matching call
of the stock ADK API server with the plugin (confirm mode, its default) without asking anyone, as
a rule's approve does (ai 7 sees the AI SDK's automatic approval naming the grant), and stops once
its uses are spent; a supervisor's grant for their group decides what the group is asked."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.chatflow import assistant_from, new_chat, user
from tests.integration.conftest import SharedAgents, plugin_agent
from tests.integration.test_approvers import APPROVERS, KEY, _four_eyes_tools
from tests.procs import PluginStack, Reply, metric_value, plugin_stack, request

pytestmark = pytest.mark.integration

V7 = {"x-ai-sdk-version": "7"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, shared_agents: SharedAgents) -> Iterator[PluginStack]:
    agent = plugin_agent(shared_agents)
    with plugin_stack(tmp_path_factory.mktemp("grants"), tools=_four_eyes_tools(), extra=APPROVERS, agent=agent) as s:
        yield s


def _agent(stack: PluginStack) -> str:
    agents = request(stack.gateway.base, "GET", "/api/agents").json()["agents"]
    return next(a["name"] for a in agents if a.get("default"))


def _grant(stack: PluginStack, key: str | None = None, **body: Any) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    reply = request(stack.gateway.base, "POST", "/api/grants",
                    {"agent": _agent(stack), "tool": "process_payment", "ttl": 600, **body}, headers=headers)
    assert reply.status == 201, reply.body
    return reply.json()  # type: ignore[no-any-return]


def _chat(stack: PluginStack, chat: str, messages: list[dict[str, Any]]) -> Reply:
    return request(stack.gateway.base, "POST", "/api/chat",
                   {"id": chat, "messages": messages, "trigger": "submit-message"}, headers=V7)


def _approval(reply: Reply) -> dict[str, Any]:
    assert reply.status == 200, reply.body
    return next(c for c in reply.chunks if c["type"] == "tool-approval-request")


def _decided(stack: PluginStack) -> float:
    return metric_value(stack.gateway.base, "adk_gateway_grant_decisions_total")


def test_a_users_grant_decides_their_next_call_in_the_chat_until_its_uses_are_spent(stack: PluginStack) -> None:
    before = _decided(stack)
    chat = new_chat()
    grant = _grant(stack, chat_id=chat, uses=1, condition="args.amount < 1000")
    assert grant["user_id"] == "anonymous" and grant["authority"] == "user"
    first_message = user("pay 50 to Hanako")
    first = _chat(stack, chat, [first_message])
    automatic = _approval(first)
    assert automatic.get("isAutomatic") is True and automatic["approvalDescriptor"] == {"rule": f"grant:{grant['id']}"}
    assert any(c["type"] == "tool-output-available" for c in first.chunks), [c["type"] for c in first.chunks]
    assert _decided(stack) == before + 1
    # Its one use spent: the next payment is asked of the person again.
    second = _chat(stack, chat, [first_message, assistant_from(first), user("pay 20 to Alice")])
    asked = _approval(second)
    assert not asked.get("isAutomatic"), asked
    listed = request(stack.gateway.base, "GET", "/api/grants").json()["grants"]
    assert [g["uses_left"] for g in listed if g["id"] == grant["id"]] == [0]
    assert _decided(stack) == before + 1


def test_a_users_grant_stands_in_its_chat_only(stack: PluginStack) -> None:
    _grant(stack, chat_id=new_chat())
    asked = _approval(_chat(stack, new_chat(), [user("pay 50 to Hanako")]))
    assert not asked.get("isAutomatic")


def test_a_supervisors_grant_decides_what_the_supervisors_are_asked(stack: PluginStack) -> None:
    before = _decided(stack)
    grant = _grant(stack, KEY, group="supervisors", uses=1, condition="args.amount <= 5000")
    automatic = _approval(_chat(stack, new_chat(), [user("pay 2000 to Hanako")]))
    assert automatic.get("isAutomatic") is True and automatic["approvalDescriptor"] == {"rule": f"grant:{grant['id']}"}
    assert _decided(stack) == before + 1
    # The audit trail names the grant as the rule that decided (the supervisor audits in this stack).
    deadline = time.monotonic() + 10
    while True:
        trail = request(stack.gateway.base, "GET", "/api/approvals?state=decided&limit=1000",
                        headers={"Authorization": f"Bearer {KEY}"}).json()["approvals"]
        ours = [r for r in trail if r.get("rule") == f"grant:{grant['id']}"]
        if ours or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert [(r["source"], r["outcome"], r["tool"]) for r in ours] == [("rule", "approved", "process_payment")], trail
    revoked = request(stack.gateway.base, "DELETE", f"/api/grants/{grant['id']}", headers={"Authorization": f"Bearer {KEY}"})
    assert revoked.status == 200
