"""The cap on a user's approvals listed for approvers (`limits.max_pending_approvals_per_user`,
cluster/remote_gate.py with approval_desk.py): a call past it is refused to the agent as the
per-chat cap's are (the model reads why, the tool does not run), counted by agent, and never listed;
the count is the shared store's, so a second replica on the same store agrees.

The chats run on the scripted ADK (tests/support/adk.py); the store is a MemoryHub.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from gateway.chat.service import ChatService
from gateway.cluster.approval_desk import ApprovalDesk
from gateway.cluster.liveness import Liveness
from gateway.cluster.memory import MemoryHub, MemoryState
from gateway.cluster.messages import Gate
from gateway.cluster.remote_gate import RemoteGate
from gateway.cluster.tasks import Tasks
from gateway.config.schema import parse_config
from gateway.core.approvals import REFUSAL_KEY
from gateway.ops.metrics import GatewayMetrics
from tests.support.adk import ScriptedAdk
from tests.support.cluster import never_asked
from tests.support.service import chat_service
from tests.unit.test_agents import body

CONFIG = """
internal:
  secret: test-secret
upstream:
  app_name: pay_app
limits:
  max_pending_approvals_per_user: 2
tools:
  pay:
    approval: true
    timeout: 30s
"""


@dataclass
class Env:
    chats: ChatService
    gates: RemoteGate
    other: RemoteGate
    hub: MemoryHub
    metrics: GatewayMetrics
    adk: ScriptedAdk


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    config = parse_config(CONFIG, env={})
    adk = ScriptedAdk()
    metrics = GatewayMetrics()
    metrics.know_agents(config)
    chats = chat_service(config, adk=adk, metrics=metrics)
    hub = MemoryHub()
    tasks = Tasks()
    gates = []
    for name in ("a", "b"):
        state = MemoryState(name, hub)
        await state.start(lambda message: None, lambda: [])
        gate = RemoteGate(
            state, chats, metrics, tasks, Liveness(state, 0.01), never_asked, forward_timeout=0.05,
            desk=ApprovalDesk(state, chats, never_asked),
        )
        gates.append(gate)
    yield Env(chats, gates[0], gates[1], hub, metrics, adk)
    for _ in range(4):
        adk.reads.put_nowait(None)
    await tasks.close(1.0)
    await chats.close()


def _ask(chat: str, call: str, user: str = "u") -> Gate:
    return Gate(app="pay_app", user=user, session=chat, tool_call_id=call, tool="pay", args={"amount": 5})


async def test_a_call_past_its_users_cap_is_refused_to_the_agent_and_counted(env: Env) -> None:
    for chat in ("chat-1", "chat-2"):
        await env.chats.submit(env.chats.config.default, "u", body(chat))
    waiting = [
        asyncio.create_task(env.gates.here(_ask("chat-1", "c1"))),
        asyncio.create_task(env.other.here(_ask("chat-2", "c2"))),
    ]
    await asyncio.sleep(0.05)
    assert not any(task.done() for task in waiting)
    # The third, on either replica and in either chat: the store counts two already.
    verdict, result = await asyncio.wait_for(env.other.here(_ask("chat-1", "c3")), 2.0)
    assert result == "too_many_pending_user" and not verdict.run
    assert verdict.response is not None and REFUSAL_KEY in verdict.response
    assert "max_pending_approvals_per_user" in verdict.response["error"]
    assert [a["tool_call_id"] for a in await MemoryState("reader", env.hub).list_approvals()] == ["c1", "c2"]
    assert env.metrics.registry.get_sample_value(
        "adk_gateway_approvals_over_user_cap_total", {"agent": env.chats.config.default}
    ) == 1
    for task in waiting:
        task.cancel()
