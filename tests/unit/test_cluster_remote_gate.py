"""Waiting on another replica (gateway/cluster/remote_gate.py, forwarding.py), on the memory
backend with a 10 ms heartbeat: each case takes milliseconds.

Replica "b" holds the plugin's (or the browser's) request; "a" owns the chat. The owner is played
by hand: its inbox, its call records and its heartbeat (present while it is on the hub).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from gateway.core.approvals import REFUSAL_KEY, RUN, Verdict
from gateway.cluster.forwarding import Asker
from gateway.cluster.liveness import Liveness, OwnerLost
from gateway.cluster.memory import MemoryHub, MemoryState
from gateway.cluster.messages import (
    Answer, Decided, Gate, Refused, Relayed, Released, Reply, Resume, Waiting, Work, from_json,
)
from gateway.cluster.remote_gate import Ask, RemoteGate
from gateway.cluster.shared import SharedStateDown
from gateway.cluster.tasks import Tasks
from gateway.config.schema import parse_config
from gateway.core.refusals import HttpError
from gateway.ops.metrics import GatewayMetrics
from tests.support.cluster import never_asked
from tests.support.service import chat_service

CONFIG = """
internal:
  secret: test-secret
# The held engine (the plugin's held request, `gw-` ids): live mode's one way to wait.
upstream:
  mode: live
sessions:
  heartbeat_interval: 10ms
  forward_timeout: 30ms
tools:
  pay:
    approval: true
    timeout: 50ms
"""
# Well past every wait above, well under a test's patience.
BOUND = 2.0
DENIED = Verdict.refuse("The person denied the call.")


@dataclass
class Replicas:
    hub: MemoryHub
    owner: MemoryState
    here: MemoryState
    gates: RemoteGate
    asker: Asker
    metrics: GatewayMetrics
    # A RemoteGate on "b" whose Gate requests `ask` answers (standing in for the owner's replies).
    gates_asking: Callable[[Ask], RemoteGate]
    # What the owner's inbox received, and what it answers each message with (None: nothing).
    received: list[dict[str, Any]]
    answer: Answer | None = None

    def owner_lost(self) -> float:
        return self.metrics.registry.get_sample_value("adk_gateway_owner_lost_total", {"what": "gated_call"}) or 0.0


@pytest.fixture
async def replicas() -> AsyncIterator[Replicas]:
    config = parse_config(CONFIG, env={})
    metrics = GatewayMetrics()
    chats = chat_service(config, metrics=metrics)
    hub = MemoryHub()
    owner, here = MemoryState("a", hub), MemoryState("b", hub)
    tasks = Tasks()
    liveness = Liveness(here, config.sessions.heartbeat_interval)
    asker = Asker(here, liveness, forward_timeout=config.sessions.forward_timeout)

    def make_gates(ask: Ask) -> RemoteGate:
        return RemoteGate(here, chats.gates, metrics, tasks, liveness, ask, forward_timeout=config.sessions.forward_timeout)

    gates = make_gates(never_asked)
    pair = Replicas(hub, owner, here, gates, asker, metrics, make_gates, [])

    def owner_inbox(raw: dict[str, Any]) -> None:
        pair.received.append(raw)
        if pair.answer is not None:
            hub.inboxes["b"](Reply(raw["id"], pair.answer).to_json())

    def here_inbox(raw: dict[str, Any]) -> None:
        message = from_json(raw)
        if isinstance(message, Reply):
            asker.answered(message)
        elif isinstance(message, Released):
            gates.released(message)

    await owner.start(owner_inbox, lambda: [])
    await here.start(here_inbox, lambda: [])
    try:
        yield pair
    finally:
        await tasks.close(1.0)


def _refused(verdict: Verdict) -> bool:
    return not verdict.run and verdict.response is not None and REFUSAL_KEY in verdict.response


async def _within(work: Any) -> Any:
    async with asyncio.timeout(BOUND):
        return await work


# ---- the remote-gate wait --------------------------------------------------------------------


async def test_the_verdict_the_owner_sends_ends_the_wait(replicas: Replicas) -> None:
    waiting = asyncio.create_task(replicas.gates.await_verdict("gw-1", "a", "demo_agent", "pay"))
    await asyncio.sleep(0)
    await replicas.owner.send("b", Released("gw-1", Decided(DENIED, "respond")).to_json())
    assert await _within(waiting) == (DENIED, "respond")


async def test_a_verdict_that_overtook_the_wait_is_kept_for_it(replicas: Replicas) -> None:
    replicas.gates.released(Released("gw-1", Decided(RUN, "run")))
    assert await _within(replicas.gates.await_verdict("gw-1", "a", "demo_agent", "pay")) == (RUN, "run")


async def test_a_lost_verdict_message_is_found_in_the_calls_record(replicas: Replicas) -> None:
    await replicas.owner.put_call("gw-1", {"verdict": orjson.dumps(RUN.as_json()).decode()}, ttl=60)
    assert await _within(replicas.gates.await_verdict("gw-1", "a", "demo_agent", "pay")) == (RUN, "run")


async def test_an_owner_that_dies_before_the_verdict_is_refused_fail_closed(replicas: Replicas) -> None:
    waiting = asyncio.create_task(replicas.gates.await_verdict("gw-1", "a", "demo_agent", "pay"))
    await asyncio.sleep(0.02)
    await replicas.owner.close()  # its heartbeat is gone
    verdict, result = await _within(waiting)
    assert _refused(verdict) and result == "owner_lost"
    assert replicas.owner_lost() == 1


async def test_no_verdict_by_the_deadline_and_its_margin_is_verdict_lost(replicas: Replicas) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    verdict, result = await _within(replicas.gates.await_verdict("gw-1", "a", "demo_agent", "pay"))
    # The tool's timeout (50 ms) and twice forward_timeout (30 ms): the owner would have released it.
    assert _refused(verdict) and result == "verdict_lost"
    assert loop.time() - started >= 0.11
    assert replicas.owner_lost() == 0


@pytest.mark.parametrize(("answer", "expected"), [
    (Decided(RUN, "not_gated"), (RUN, "not_gated")),
    (Decided(DENIED, "no_browser"), (DENIED, "no_browser")),
])
async def test_an_immediate_answer_is_the_verdict(replicas: Replicas, answer: Answer, expected: tuple[Verdict, str]) -> None:
    async def ask(owner: str, work: Work) -> Answer:
        return answer

    assert await _within(replicas.gates_asking(ask).ask_owner("a", Gate("demo_agent", "alice", "c1", "fc-1", "pay", {}))) == expected


async def test_a_waiting_answer_then_its_verdict(replicas: Replicas) -> None:
    async def ask(owner: str, work: Work) -> Answer:
        gates.released(Released("gw-7", Decided(DENIED, "respond")))
        return Waiting("gw-7")

    gates = replicas.gates_asking(ask)

    assert await _within(gates.ask_owner("a", Gate("demo_agent", "alice", "c1", "fc-1", "pay", {}))) == (DENIED, "respond")


@pytest.mark.parametrize(("failure", "label"), [
    (OwnerLost(503, "replica_unavailable", "stopped"), "owner_lost"),
    (HttpError(503, "replica_unavailable", "did not answer"), "replica_unavailable"),
])
async def test_an_owner_that_cannot_be_asked_refuses_the_call(replicas: Replicas, failure: HttpError, label: str) -> None:
    async def ask(owner: str, work: Work) -> Answer:
        raise failure

    verdict, result = await _within(replicas.gates_asking(ask).ask_owner("a", Gate("demo_agent", "alice", "c1", "fc-1", "pay", {})))
    assert _refused(verdict) and result == label


# ---- asking the owner ------------------------------------------------------------------------


async def test_the_owners_answer_comes_back_to_the_asker(replicas: Replicas) -> None:
    replicas.answer = Relayed("k-1")
    assert await _within(replicas.asker.ask("a", Resume("alice", "c1", "demo_agent"))) == Relayed("k-1")
    [sent] = replicas.received
    assert sent["from"] == "b" and sent["op"] == "resume"


async def test_the_owners_refusal_is_raised_as_its_http_error(replicas: Replicas) -> None:
    replicas.answer = Refused(409, "chat_busy", "a response is streaming", {"Retry-After": "1"})
    with pytest.raises(HttpError) as refused:
        await _within(replicas.asker.ask("a", Resume("alice", "c1", "demo_agent")))
    assert (refused.value.status, refused.value.code, refused.value.headers) == (409, "chat_busy", {"Retry-After": "1"})


async def test_a_refusal_from_the_owner_brings_no_header_but_retry_after_to_the_browser(replicas: Replicas) -> None:
    replicas.answer = Refused(503, "draining", "shutting down", {"Retry-After": "5", "Set-Cookie": "sid=forged; Path=/"})
    with pytest.raises(HttpError) as refused:
        await _within(replicas.asker.ask("a", Resume("alice", "c1", "demo_agent")))
    assert refused.value.headers == {"Retry-After": "5"}


async def test_a_silent_owner_is_503_after_forward_timeout(replicas: Replicas) -> None:
    with pytest.raises(HttpError) as refused:
        await _within(replicas.asker.ask("a", Resume("alice", "c1", "demo_agent")))
    assert not isinstance(refused.value, OwnerLost)
    assert (refused.value.status, refused.value.code) == (503, "replica_unavailable")


async def test_a_dead_owner_is_503_owner_lost(replicas: Replicas) -> None:
    await replicas.owner.close()
    with pytest.raises(OwnerLost) as refused:
        await _within(replicas.asker.ask("a", Resume("alice", "c1", "demo_agent")))
    assert (refused.value.status, refused.value.headers) == (503, {"Retry-After": "1"})


async def test_a_store_outage_while_asking_the_owner_is_waited_out_not_refused(replicas: Replicas) -> None:
    """Redis went away while the plugin's request was being forwarded (issue 13's fault suite):
    the call waits for a person on the owner, so the request is asked again once the store is
    back (the owner answers the same call again), instead of refusing it with a 503."""
    asks: list[Gate] = []

    async def ask(owner: str, work: Work) -> Answer:
        assert isinstance(work, Gate)
        asks.append(work)
        if len(asks) == 1:
            raise SharedStateDown("redis went away mid-forward")
        return Decided(RUN, "run")

    verdict, result = await _within(replicas.gates_asking(ask).ask_owner("a", Gate("demo_agent", "alice", "c1", "fc-1", "pay", {})))
    assert (verdict, result) == (RUN, "run")
    assert len(asks) == 2 and asks[0] == asks[1]


async def test_a_store_that_stays_away_refuses_the_call_in_the_end(replicas: Replicas) -> None:
    async def ask(owner: str, work: Work) -> Answer:
        raise SharedStateDown("redis is down")

    verdict, result = await _within(replicas.gates_asking(ask).ask_owner("a", Gate("demo_agent", "alice", "c1", "fc-1", "pay", {})))
    assert _refused(verdict) and result == "sessions_unavailable"
