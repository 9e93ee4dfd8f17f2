"""The cap on a user's approvals listed for approvers (`limits.max_pending_approvals_per_user`),
carried out by the shell: cluster/remote_gate.py reads the user's count from the store before the
chat's machine decides the ask (approvals/decision.py refuses past the cap), and approval_desk.py's
capped put guards against a count gone stale. A call past it is refused to the agent as the
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
from gateway.cluster.shared import SharedStateDown
from gateway.cluster.messages import Gate
from gateway.cluster.remote_gate import RemoteGate
from gateway.cluster.tasks import Tasks
from gateway.config.schema import parse_config
from gateway.core.approvals import REFUSAL_KEY, Verdict
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


class CountingState(MemoryState):
    """The memory backend, whose count of a user's listed approvals the test can see read, make
    stale (`stale`: what it says instead) or make fail (the store unreachable)."""

    reads = 0
    stale: int | None = None
    down = False

    async def pending_approvals(self, requester: str) -> int:
        self.reads += 1
        if self.down:
            raise SharedStateDown("the shared store is unreachable")
        return self.stale if self.stale is not None else await super().pending_approvals(requester)


@dataclass
class Env:
    chats: ChatService
    gates: RemoteGate
    other: RemoteGate
    hub: MemoryHub
    metrics: GatewayMetrics
    adk: ScriptedAdk
    states: list[CountingState]

    def over_cap(self) -> float:
        return self.metrics.registry.get_sample_value(
            "adk_gateway_approvals_over_user_cap_total", {"agent": self.chats.config.default}
        ) or 0.0


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    config = parse_config(CONFIG, env={})
    adk = ScriptedAdk()
    metrics = GatewayMetrics()
    metrics.know_agents(config)
    chats = chat_service(config, adk=adk, metrics=metrics)
    hub = MemoryHub()
    tasks = Tasks()
    gates, states = [], []
    for name in ("a", "b"):
        state = CountingState(name, hub)
        states.append(state)
        await state.start(lambda message: None, lambda: [])
        gate = RemoteGate(
            state, chats.gates, metrics, tasks, Liveness(state, 0.01), never_asked, forward_timeout=0.05,
            desk=ApprovalDesk(state, chats.desk_view, never_asked),
        )
        gates.append(gate)
    yield Env(chats, gates[0], gates[1], hub, metrics, adk, states)
    for _ in range(4):
        adk.reads.put_nowait(None)
    await tasks.close(1.0)
    await chats.close()


def _ask(chat: str, call: str, user: str = "u", *, confirm: bool = False) -> Gate:
    return Gate(app="pay_app", user=user, session=chat, tool_call_id=call, tool="pay", args={"amount": 5}, confirm=confirm)


def _refused_past_cap(verdict: object) -> bool:
    response = getattr(verdict, "response", None) or {}
    return not getattr(verdict, "run", True) and REFUSAL_KEY in response and "max_pending_approvals_per_user" in response["error"]


async def _two_waiting(env: Env) -> list[asyncio.Task[tuple[Verdict, str]]]:
    """The user's cap (2) filled: a call waits in each of two chats, asked of either replica."""
    for chat in ("chat-1", "chat-2"):
        await env.chats.submit(env.chats.config.default, "u", body(chat))
    waiting = [
        asyncio.create_task(env.gates.here(_ask("chat-1", "c1"))),
        asyncio.create_task(env.other.here(_ask("chat-2", "c2"))),
    ]
    await asyncio.sleep(0.05)
    assert not any(task.done() for task in waiting)
    return waiting


async def test_a_call_past_its_users_cap_is_refused_to_the_agent_and_counted(env: Env) -> None:
    waiting = await _two_waiting(env)
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


async def test_a_count_gone_stale_is_caught_by_the_stores_capped_put(env: Env) -> None:
    """The machine decides by the count read before it asked; an ask of the same user listed since
    (a parallel one) is not in it, and the store's atomic put refuses the call instead."""
    waiting = await _two_waiting(env)
    env.states[1].stale = 0  # what a read taken before those two were listed said
    verdict, result = await asyncio.wait_for(env.other.here(_ask("chat-1", "c3")), 2.0)
    assert result == "too_many_pending_user" and _refused_past_cap(verdict), verdict
    assert verdict.response is not None and verdict.response[REFUSAL_KEY] == "cancelled"  # released by the shell
    assert [a["tool_call_id"] for a in await MemoryState("reader", env.hub).list_approvals()] == ["c1", "c2"]
    assert env.over_cap() == 1
    for task in waiting:
        task.cancel()


async def test_a_store_that_cannot_count_refuses_nothing(env: Env) -> None:
    await env.chats.submit(env.chats.config.default, "u", body("chat-1"))
    env.states[0].down = True
    waiting = asyncio.create_task(env.gates.here(_ask("chat-1", "c1")))
    await asyncio.sleep(0.05)
    assert env.states[0].reads == 1 and not waiting.done(), "read, failed, and the call waits"
    assert env.over_cap() == 0
    waiting.cancel()


async def test_the_count_is_read_only_for_an_ask_that_may_be_listed(env: Env) -> None:
    """`pay` names no approvers: on `/run_sse` its ADK confirmation is the chatting user's, never
    listed, so its ask costs no store round trip; held (a plugin that holds) it is listed."""
    await env.chats.submit(env.chats.config.default, "u", body("chat-1"))
    env.states[0].stale = 99  # a count that would refuse anything it is read for
    verdict, result = await asyncio.wait_for(env.gates.here(_ask("chat-1", "c1", confirm=True)), 2.0)
    assert verdict.confirm and result == "confirm" and env.states[0].reads == 0
    verdict, result = await asyncio.wait_for(env.gates.here(_ask("chat-1", "c2")), 2.0)
    assert result == "too_many_pending_user" and _refused_past_cap(verdict) and env.states[0].reads == 1
    assert verdict.response is not None and verdict.response[REFUSAL_KEY] == "too_many_pending_user"  # by the machine
    # Refused before anything was opened or listed: nothing is left waiting for it.
    assert await MemoryState("reader", env.hub).list_approvals() == []
    assert env.chats.local_chats()[0].ledger.call("c2") is None
