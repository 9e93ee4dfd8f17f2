"""A replica that stops hands back the plugin requests it holds for other replicas' chats, and the
owner takes the plugin's repeated ask as the same call (issue 25, item 3: live mode's blocking path).

Two replicas on one in-process hub (the memory backend's shared state), ADK scripted: "a" owns the
chat; the plugin's request lands on "b" (the balancer's choice), which forwards it to "a" and holds
it. Then "b" drains: the request is answered `HandedOver` (503 `retry_elsewhere`), and the plugin
asks again, this time of "a", which re-attaches the ask to the call the browser already shows.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gateway.edge.app import create_app
from gateway.core.approvals import RUN, GatedCall, Verdict
from gateway.cluster.memory import MemoryHub, MemoryState
from gateway.cluster.remote_gate import HandedOver
from gateway.cluster.router import Cluster
from gateway.cluster.shared import SharedStateDown
from gateway.config.schema import parse_config
from gateway.edge.internal import create_internal_app
from gateway.ops.metrics import GatewayMetrics
from gateway.edge.state import GATEWAY
from tests.support.adk import ScriptedAdk
from tests.support.chat import CALL, USER, answered, call_event, request, response_event
from tests.support.service import chat_service
from tests.unit.test_cluster_stop import read_all

AGENT = "demo_agent"
TOOL = "process_payment"
ARGS = {"amount": 50, "recipient": "Hanako", "currency": "USD"}
CONFIG = """
internal:
  secret: s3cret
# The held engine (the plugin's held request, `gw-` ids), live mode's, driven through the scripted
# /run_sse upstream: the chat's gate takes a held ask (no `confirm`) alike in either mode; the
# internal listener refuses one for an sse agent before it gets here (tests/unit/test_plugin_too_old.py).
sessions:
  heartbeat_interval: 50ms
  owner_timeout: 1s
  forward_timeout: 2s
tools:
  process_payment:
    approval: true
    timeout: 5m
"""
BOUND = 5.0


class FlakyState(MemoryState):
    """The memory backend, noting the calls it records as opened (not their verdicts); `down` makes
    every write of a call's record fail as Redis would."""

    def __init__(self, replica_id: str, hub: MemoryHub) -> None:
        super().__init__(replica_id, hub)
        self.records: list[str] = []
        self.down = False

    async def put_call(self, call_id: str, record: dict[str, str], *, ttl: float) -> None:
        if self.down:
            raise SharedStateDown("redis went away")
        if "owner" in record:
            self.records.append(call_id)
        await super().put_call(call_id, record, ttl=ttl)


@dataclass
class Pair:
    adk: ScriptedAdk
    owner: Cluster
    here: Cluster
    owner_state: FlakyState

    def ask(self, replica: Cluster) -> asyncio.Task[tuple[Verdict, str]]:
        """The plugin's ask about the payment call, as the internal listener of `replica` takes it."""
        return asyncio.create_task(replica.gate(
            app_name=AGENT, user_id="u", session_id="chat-1", tool_call_id=CALL, tool=TOOL, args=ARGS,
        ))

    def call(self) -> GatedCall | None:
        return self.owner.chats.gates.find(app_name=AGENT, user_id="u", session_id="chat-1", tool_call_id=CALL)

    def sample(self, name: str, **labels: str) -> float:
        return self.owner.metrics.registry.get_sample_value(name, {"agent": AGENT, **labels}) or 0.0


@pytest.fixture
async def pair() -> AsyncIterator[Pair]:
    adk = ScriptedAdk()
    hub = MemoryHub()
    clusters = []
    states = []
    for name in ("a", "b"):
        config = parse_config(CONFIG, env={})
        metrics = GatewayMetrics()
        chats = chat_service(config, adk=adk, metrics=metrics, new_id="msg-1")
        state = FlakyState(name, hub)
        cluster = Cluster(state, chats, metrics)
        await cluster.start()
        clusters.append(cluster)
        states.append(state)
    owner, here = clusters
    try:
        yield Pair(adk, owner, here, states[0])
    finally:
        adk.reads.put_nowait(None)
        for cluster in clusters:
            await cluster.chats.close()
            await cluster.close()


async def waiting_for_the_person(pair: Pair, via: Cluster) -> tuple[list[dict[str, Any]], asyncio.Task[tuple[Verdict, str]]]:
    """A payment in a chat "a" owns, the plugin's ask landing on `via`: the first response (ended
    waiting for the person) and the ask, held."""
    first = await pair.owner.submit(AGENT, "u", request(USER))
    pair.adk.reads.put_nowait([call_event(TOOL)])
    await asyncio.sleep(0.02)
    ask = pair.ask(via)
    chunks = await read_all(first)
    assert [c["type"] for c in chunks][-3:] == ["tool-approval-request", "finish-step", "finish"], chunks
    assert not ask.done()
    return chunks, ask


async def test_a_draining_replica_hands_back_the_ask_it_holds_and_the_owner_takes_the_retry_as_the_same_call(
    pair: Pair,
) -> None:
    first, held = await waiting_for_the_person(pair, via=pair.here)
    call = pair.call()
    assert call is not None and not call.released

    pair.here.draining = True
    with pytest.raises(HandedOver) as handed:
        await asyncio.wait_for(held, BOUND)
    refusal = handed.value.http()
    assert (refusal.status, refusal.code, refusal.headers) == (503, "retry_elsewhere", {"Retry-After": "1"})
    # A new ask to the draining replica is handed back at once, without bothering the owner.
    with pytest.raises(HandedOver):
        await asyncio.wait_for(pair.ask(pair.here), BOUND)
    assert not call.released, "handing the request back decides nothing"

    # The plugin asks again, and the balancer sends it to the owner: the same call, shown once.
    retry = pair.ask(pair.owner)
    await asyncio.sleep(0.05)
    assert not retry.done()
    assert pair.call() is call and len(pair.owner.chats.gates._waiters[call.id]) >= 1  # noqa: SLF001
    assert pair.sample("adk_gateway_approvals_pending") == 1
    assert pair.owner_state.records == [call.id]

    await pair.owner.submit(AGENT, "u", request(USER, answered(first, TOOL, True), message_id="msg-1"))
    assert await asyncio.wait_for(retry, BOUND) == (RUN, "run")
    assert pair.sample("adk_gateway_approval_wait_seconds_count", tool=TOOL, outcome="approved") == 1
    assert pair.sample("adk_gateway_approvals_pending") == 0
    # Asked again after the release (its answer was lost too): the same verdict, at once.
    assert await asyncio.wait_for(pair.ask(pair.owner), BOUND) == (RUN, "run")
    assert pair.owner_state.records == [call.id]


async def test_the_verdict_given_as_the_drain_starts_is_still_delivered(pair: Pair) -> None:
    first, held = await waiting_for_the_person(pair, via=pair.here)
    await pair.owner.submit(AGENT, "u", request(USER, answered(first, TOOL, False), message_id="msg-1"))
    verdict, result = await asyncio.wait_for(held, BOUND)
    pair.here.draining = True
    assert not verdict.run and result == "respond"


async def test_a_repeated_ask_while_the_store_is_down_leaves_the_waiting_call_alone(pair: Pair) -> None:
    """The plugin asks again (its connection was cut) during a Redis outage: the call is already
    recorded and shown, so the repeated ask records nothing, and the approval still waits."""
    first, held = await waiting_for_the_person(pair, via=pair.owner)
    call = pair.call()
    assert call is not None
    pair.owner_state.down = True
    again = pair.ask(pair.owner)
    await asyncio.sleep(0.05)
    assert not call.released, call.verdict
    assert not held.done() and not again.done()
    pair.owner_state.down = False

    await pair.owner.submit(AGENT, "u", request(USER, answered(first, TOOL, True), message_id="msg-1"))
    assert await asyncio.wait_for(asyncio.gather(held, again), BOUND) == [(RUN, "run"), (RUN, "run")]
    assert pair.sample("adk_gateway_approval_wait_seconds_count", tool=TOOL, outcome="approved") == 1


async def test_a_repeated_ask_through_another_replica_waits_for_the_same_verdict(pair: Pair) -> None:
    """The plugin's first request was cut on its way (kill -9 of the replica holding it); its retry
    lands on "b", which forwards it: the owner answers Waiting for the same call, then its verdict."""
    first, held = await waiting_for_the_person(pair, via=pair.owner)
    again = pair.ask(pair.here)
    await asyncio.sleep(0.05)
    assert not again.done()
    await pair.owner.submit(AGENT, "u", request(USER, answered(first, TOOL, True), message_id="msg-1"))
    assert await asyncio.wait_for(asyncio.gather(held, again), BOUND) == [(RUN, "run"), (RUN, "run")]
    assert pair.owner_state.records == [pair.call().id]  # type: ignore[union-attr]
    # The tool ran once: ADK answers the call once, and the run goes on.
    pair.adk.reads.put_nowait([response_event(TOOL, {"success": True})])
    assert pair.sample("adk_gateway_approval_wait_seconds_count", tool=TOOL, outcome="approved") == 1


async def test_the_internal_listener_answers_a_handed_back_ask_with_a_503_on_a_closed_connection() -> None:
    """What the plugin reads: a JSON 503 `retry_elsewhere` with Retry-After, on a connection the
    replica closes (a balancer would send the next ask down the same one), counted by result."""
    app = create_app(parse_config(CONFIG, env={}))
    gateway = app[GATEWAY]

    async def handed_over(**_: Any) -> tuple[Verdict, str]:
        raise HandedOver()

    gateway.cluster.gate = handed_over  # type: ignore[method-assign]
    client = TestClient(TestServer(create_internal_app(app)))
    await client.start_server()
    try:
        body = {"app_name": AGENT, "user_id": "u", "session_id": "chat-1", "function_call_id": CALL, "tool": TOOL, "confirm": True}
        resp = await client.post("/internal/v1/tool-calls", json=body, headers={"Authorization": "Bearer s3cret"})
        assert resp.status == 503
        assert (await resp.json())["error"]["code"] == "retry_elsewhere"
        assert resp.headers["Retry-After"] == "1" and resp.headers.get("Connection", "").lower() == "close"
    finally:
        await client.close()
    sample = gateway.metrics.registry.get_sample_value(
        "adk_gateway_plugin_requests_total", {"agent": AGENT, "result": "retry_elsewhere"}
    )
    assert sample == 1
