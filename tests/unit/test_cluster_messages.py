"""The messages replicas send each other (gateway/cluster/messages.py), without a network.

Every message survives its trip through JSON; what is not a message is refused whole, and a replica
logs and drops it; every kind of forwarded work has a handler on the owner.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from gateway.core.approvals import RUN, Verdict
from gateway.cluster import router as router_module
from gateway.cluster.forwarding import ForwardedRequests
from gateway.cluster.memory import MemoryHub, MemoryState
from gateway.cluster.messages import (
    WORK, Abort, Audio, Decide, Decided, Forwarded, Gate, MalformedMessage, Message, Refused, Relayed, Released, Reply,
    Resume, SocketClosed, Submit, Unfollow, Waiting, from_json, Expire,
)
from gateway.core.refusals import HttpError
from tests.support.logs import RecordingLog
from tests.unit.test_cluster_close import cluster_on

BODY = {"id": "c1", "trigger": "submit-message", "aiSdkVersion": 7, "messages": [{"id": "m1", "role": "user", "parts": []}]}
REFUSED = Verdict.refuse("The call was denied.")

MESSAGES: list[Message] = [
    Forwarded("b", "r1", Submit("alice", "demo_agent", BODY)),
    Forwarded("b", "r2", Resume("alice", "c1", "demo_agent")),
    Forwarded("b", "r3", Audio("alice", "c1", "support_agent", "audio/pcm;rate=16000", "AAAA", 6)),
    Forwarded("b", "r4", Abort("alice", "c1", "demo_agent")),
    Forwarded("b", "r5", SocketClosed("alice", "c1", "demo_agent")),
    Forwarded("b", "r7", Unfollow("alice", "relay-key")),
    Forwarded("b", "r8", Expire("alice", '{"agent":"demo_agent"}')),
    Forwarded("b", "r6", Gate("demo_agent", "alice", "c1", "fc-1", "process_payment", {"amount": 5, "to": ["x"]})),
    Forwarded("b", "r6", Gate("demo_agent", "alice", "c1", "fc-1", "process_payment", {"amount": 5}, True)),
    Forwarded("b", "r1", Submit("alice", "demo_agent", BODY, {"groups": ["staff"]})),
    Forwarded("b", "r9", Decide("alice", "c1", "gw-abc", True, "checked", {"deciders": [{"user": "sup", "auth": "jwt"}]})),
    Reply("r1", Relayed("k-123")),
    Reply("r2", Relayed(None)),
    Reply("r3", Refused(409, "chat_busy", "a response is streaming", {"Retry-After": "1"})),
    Reply("r4", Refused(404, "chat_not_found", "no such chat", {})),
    Reply("r6", Decided(RUN, "not_gated")),
    Reply("r6", Decided(REFUSED, "no_browser")),
    Reply("r6", Waiting("gw-abc")),
    Released("gw-abc", Decided(RUN, "run")),
    Released("gw-abc", Decided(REFUSED, "respond")),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(getattr(m, "work", getattr(m, "answer", m))).__name__)
def test_every_message_survives_its_trip_through_json(message: Message) -> None:
    assert from_json(orjson.loads(orjson.dumps(message.to_json()))) == message


def test_the_samples_cover_every_kind_of_work_and_answer() -> None:
    works = {type(m.work) for m in MESSAGES if isinstance(m, Forwarded)}
    answers = {type(m.answer) for m in MESSAGES if isinstance(m, Reply)}
    assert works == set(WORK)
    assert answers == {Relayed, Refused, Decided, Waiting}


def test_a_refusal_travels_as_the_http_error_it_was() -> None:
    error = Refused.of(HttpError(429, "rate_limited", "slow down", {"Retry-After": "3"})).error()
    assert (error.status, error.code, error.message, error.headers) == (429, "rate_limited", "slow down", {"Retry-After": "3"})


def test_a_forwarded_refusal_carries_no_header_but_retry_after() -> None:
    """The asker copies a refusal's headers into its browser's response: a Set-Cookie (or any header
    but Retry-After) written by whoever can publish into the inbox must not get there."""
    raw = {"reply": "r1", "error": {"status": 503, "code": "x", "message": "y", "headers": {
        "Set-Cookie": "session=attacker; Path=/", "Location": "https://evil.example", "retry-after": "2",
        "Access-Control-Allow-Origin": "*",
    }}}
    message = from_json(raw)
    assert isinstance(message, Reply) and isinstance(message.answer, Refused)
    assert message.answer.error().headers == {"Retry-After": "2"}


@pytest.mark.parametrize("value", ["soon", "1\r\nSet-Cookie: a=b", "-1", "", "9" * 12])
def test_a_forwarded_retry_after_that_is_not_a_number_of_seconds_is_dropped(value: str) -> None:
    message = from_json({"reply": "r1", "error": {"status": 503, "code": "x", "message": "y", "headers": {"Retry-After": value}}})
    assert isinstance(message, Reply) and isinstance(message.answer, Refused)
    assert message.answer.headers == {}


def _work(op: str, **fields: Any) -> dict[str, Any]:
    return {"op": op, "from": "b", "id": "r1", **fields}


MALFORMED: list[Any] = [
    [1, 2],
    "submit",
    {},
    _work("explode", user="alice"),
    _work("submit", user="alice", agent="demo_agent"),  # no body
    _work("submit", user="alice", agent="demo_agent", body="{}"),
    _work("resume", user=7, chat="c1"),
    _work("resume", user="alice"),
    {"op": "resume", "id": "r1", "user": "alice", "chat": "c1"},  # from whom?
    {"op": "resume", "from": "b", "user": "alice", "chat": "c1"},  # no id
    _work("audio", user="alice", chat="c1", mime="audio/pcm", data="AA", version=8),
    _work("audio", user="alice", chat="c1", mime="audio/pcm", data="AA", version="7"),
    _work("audio", user="alice", chat="c1", mime="audio/pcm", data="AA", version=True),
    _work("gate", user="alice", session="c1", tool_call_id="fc", tool="pay", args=[1]),
    {"reply": "r1"},
    {"reply": 5, "relay": "k"},
    {"reply": "r1", "relay": 5},
    {"reply": "r1", "error": {"status": 200, "code": "ok", "message": "fine"}},
    {"reply": "r1", "error": {"status": "503", "code": "x", "message": "y"}},
    {"reply": "r1", "error": {"status": 503, "code": "x", "message": "y", "headers": {"Retry-After": 1}}},
    {"reply": "r1", "call": None},
    {"reply": "r1", "verdict": "run", "result": "run"},
    {"op": "verdict", "call": "gw-1", "result": "run"},
    {"op": "verdict", "verdict": {"verdict": "run"}, "result": "run"},
]


@pytest.mark.parametrize("raw", MALFORMED)
def test_what_is_not_a_message_is_refused(raw: Any) -> None:
    with pytest.raises(MalformedMessage):
        from_json(raw)


def test_every_kind_of_work_has_a_handler_on_the_owner() -> None:
    assert set(ForwardedRequests.DISPATCH) == set(WORK)
    assert len({kind.op for kind in WORK} | {Released.op}) == len(WORK) + 1


async def test_a_replica_logs_and_drops_a_malformed_message(monkeypatch: pytest.MonkeyPatch) -> None:
    log = RecordingLog()
    monkeypatch.setattr(router_module, "log", log)
    hub = MemoryHub()
    cluster = cluster_on(MemoryState("a", hub))
    await cluster.start()
    sent: list[dict[str, Any]] = []
    await MemoryState("b", hub).start(sent.append, lambda: [])
    try:
        # A submit without its body: nothing may act on it, and the sender gets no reply.
        await MemoryState("b", hub).send("a", _work("submit", user="alice", agent="demo_agent"))
        await asyncio.sleep(0.05)
        [dropped] = log.named("inbox_message_malformed")
        assert dropped["reason"] == "`body` is not an object"
        assert sent == []
        assert cluster.metrics.registry.get_sample_value("adk_gateway_forwarded_total", {"direction": "in"}) == 0
    finally:
        await cluster.close()
