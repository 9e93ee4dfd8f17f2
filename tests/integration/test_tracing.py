"""Traces end to end: a gateway and a real ADK server (the plugin loaded) export over OTLP/HTTP to a
receiver that decodes the real protocol (tests/otlp_receiver.py); an approval turn's span tree is
checked as a trace viewer would draw it: on `/run_sse` (the approval is ADK's confirmation, its
wait a span of the turn that asked) and on a live upstream (the plugin's held request carries ADK's
tool span, under which the wait sits)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.chatflow import assistant_from, new_chat, post, types, user
from tests.integration.conftest import SharedAgents, plugin_agent
from tests.otlp_receiver import Receiver, Span
from tests.procs import GatewayProcess, PluginStack, plugin_stack, request

pytestmark = pytest.mark.integration


# Every trace kept (the gateway's default keeps one new trace in ten): the checks below look at
# requests that send no traceparent too.
_KEEP_ALL = {"OTEL_TRACES_SAMPLER": "parentbased_always_on"}


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


@contextmanager
def _traced_stack(tmp: Path, receiver: Receiver, upstream_mode: str = "sse") -> Iterator[PluginStack]:
    """The plugin stack, the gateway and ADK (as service `adk-agent`) exporting to `receiver`."""
    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100", **_KEEP_ALL}
    with plugin_stack(
        tmp, upstream_mode=upstream_mode, gateway_env=otel, adk_env={**otel, "OTEL_SERVICE_NAME": "adk-agent"},
    ) as s:
        yield s


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> Iterator[PluginStack]:
    with _traced_stack(tmp_path_factory.mktemp("traced"), receiver) as s:
        yield s


def _approved_payment(gw: GatewayProcess, trace_id: str, parent: str) -> str:
    """A payment the browser asks for in trace `trace_id` (its traceparent's parent span `parent`),
    approved half a second later by a request that sends no traceparent; the chat's id."""
    chat, first_message = new_chat(), user("pay 50 to Hanako")
    first = request(
        gw.base, "POST", "/api/chat", {"id": chat, "messages": [first_message], "trigger": "submit-message"},
        headers={"traceparent": f"00-{trace_id}-{parent}-01"},
    )
    assert types(first)[-1] == "finish" and "tool-approval-request" in types(first)
    time.sleep(0.5)  # the person takes their time
    answer = assistant_from(first, [True])
    second = post(gw, chat, [first_message, answer], messageId=answer["id"])
    assert "tool-output-available" in types(second)
    return chat


def _of(spans: list[Span], trace_id: str) -> list[Span]:
    return [s for s in spans if s.trace_id == trace_id]


def _lineage(span: Span, spans: list[Span]) -> list[tuple[str, str]]:
    """(service, name) of `span` and each of its ancestors in `spans`, child first."""
    by_id = {s.span_id: s for s in spans}
    chain = [(span.service, span.name)]
    while span.parent_id in by_id:
        span = by_id[span.parent_id]
        chain.append((span.service, span.name))
    return chain


def _in_order(expected: list[tuple[str, str]], chain: list[tuple[str, str]]) -> bool:
    """Whether `expected` appears in `chain` in that order (other spans may come between)."""
    rest = iter(chain)
    return all(step in rest for step in expected)


def test_an_approval_turn_is_one_trace(stack: PluginStack, receiver: Receiver) -> None:
    gw = stack.gateway
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    chat = _approved_payment(gw, trace_id, parent)

    def complete(spans: list[Span]) -> bool:
        names = {(s.service, s.name) for s in _of(spans, trace_id)}
        gateway = {("adk-gateway", n) for n in ("POST /api/chat", "turn demo_agent", "POST /run_sse", "approval process_payment")}
        adk = {("adk-agent", n) for n in ("POST /run_sse", "invoke_agent demo_agent", "execute_tool process_payment")}
        # ADK ends its tool span after the wait, its /run_sse server span after the run.
        return gateway | adk <= names
    spans = receiver.wait_for(complete)
    mine = [s for s in _of(spans, trace_id) if s.service == "adk-gateway"]
    by_name = {s.name: s for s in mine}
    assert complete(spans), sorted(by_name)

    # The browser's request continues the traceparent it sent, a SERVER span with HTTP's attributes.
    req = by_name["POST /api/chat"]
    assert req.kind == "SERVER" and req.parent_id == parent
    assert req.attributes["http.request.method"] == "POST" and req.attributes["http.route"] == "/api/chat"
    assert req.attributes["http.response.status_code"] == 200
    assert req.attributes["adk_gateway.chat_id"] == chat and req.attributes["adk_gateway.agent"] == "demo_agent"
    assert "adk_gateway.replica" in req.attributes
    # The turn, under the request that started it, lasts until the run ended with ADK's confirmation.
    turn = by_name["turn demo_agent"]
    assert turn.kind == "INTERNAL" and turn.parent_id == req.span_id
    assert turn.attributes["adk_gateway.outcome"] == "waiting"
    # The upstream call, a CLIENT span under the turn; the session's creation, under the request.
    run_sse = by_name["POST /run_sse"]
    assert run_sse.kind == "CLIENT" and run_sse.parent_id == turn.span_id
    assert run_sse.attributes["http.response.status_code"] == 200
    session = by_name["POST /apps/{app_name}/users/{user_id}/sessions"]
    assert session.kind == "CLIENT" and session.parent_id == req.span_id
    # The person's wait, under the turn that asked (ADK's run ended with its confirmation; nothing of
    # ADK's is open while the person decides), with what was decided and by whom; no argument values.
    # ADK's tool span that asked sits under its run: request -> turn -> upstream call -> ADK's server,
    # agent and tool spans.
    wait = by_name["approval process_payment"]
    adk = {s.name: s for s in _of(spans, trace_id) if s.service == "adk-agent"}
    assert wait.parent_id == turn.span_id
    assert _lineage(wait, _of(spans, trace_id)) == [
        ("adk-gateway", "approval process_payment"), ("adk-gateway", "turn demo_agent"), ("adk-gateway", "POST /api/chat"),
    ]
    assert _in_order([
        ("adk-agent", "execute_tool process_payment"), ("adk-agent", "invoke_agent demo_agent"),
        ("adk-agent", "POST /run_sse"), ("adk-gateway", "POST /run_sse"), ("adk-gateway", "turn demo_agent"),
        ("adk-gateway", "POST /api/chat"),
    ], _lineage(adk["execute_tool process_payment"], _of(spans, trace_id)))
    assert wait.attributes["adk_gateway.outcome"] == "approved" and wait.attributes["adk_gateway.source"] == "person"
    assert wait.attributes["adk_gateway.tool"] == "process_payment" and wait.attributes["adk_gateway.mode"] == "confirm"
    assert wait.attributes["adk_gateway.approval_id"].startswith("adk-")
    assert wait.end - wait.start >= 0.4e9
    assert not any("Hanako" in str(v) for s in mine for v in s.attributes.values())
    # ADK's own spans join the trace: its server span of /run_sse is the child of the gateway's
    # call (the traceparent reached it), its agent and tool spans under that.
    assert adk["POST /run_sse"].kind == "SERVER" and adk["POST /run_sse"].parent_id == run_sse.span_id
    assert adk["POST /apps/{app_name}/users/{user_id}/sessions"].parent_id == session.span_id
    assert adk["execute_tool process_payment"].trace_id == trace_id
    # The latency histograms carry the turn's trace as an exemplar, in OpenMetrics when asked for it.
    scraped = request(gw.base, "GET", "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert scraped.headers["content-type"].startswith("application/openmetrics-text")
    assert f'trace_id="{trace_id}"' in scraped.body.decode()
    assert "trace_id" not in request(gw.base, "GET", "/metrics").body.decode()
    # The answering request is its own trace's root (it sent no traceparent), and the run it starts,
    # where ADK runs the confirmed tool, is in that trace.
    def answering_of(spans: list[Span]) -> list[Span]:
        return [s for s in spans if s.name == "POST /api/chat" and s.trace_id != trace_id and s.attributes.get("adk_gateway.chat_id") == chat]
    answering = answering_of(receiver.wait_for(lambda spans: bool(answering_of(spans))))
    assert answering and answering[0].parent_id == ""
    rerun = receiver.wait_for(lambda spans: any(
        s.service == "adk-agent" and s.name == "execute_tool process_payment" for s in _of(spans, answering[0].trace_id)))
    turns = [s for s in _of(rerun, answering[0].trace_id) if s.name == "turn demo_agent"]
    assert [t.attributes["adk_gateway.outcome"] for t in turns] == ["completed"] and turns[0].parent_id == answering[0].span_id


def test_a_held_approval_waits_under_adk_s_tool_span(tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> None:
    """A live upstream's gated call waits in the plugin's held request, which carries ADK's tool span
    as its `traceparent`: the person's wait is that span's child, in the browser's trace."""
    with _traced_stack(tmp_path_factory.mktemp("traced-held"), receiver, upstream_mode="live") as held:
        trace_id = "5ce0e9a56015fec5aadfa328ae398115"
        _approved_payment(held.gateway, trace_id, "ab42124a3c573678")

        def complete(spans: list[Span]) -> bool:
            names = {(s.service, s.name) for s in _of(spans, trace_id)}
            return {("adk-gateway", "approval process_payment"), ("adk-agent", "execute_tool process_payment"),
                    ("adk-gateway", "turn demo_agent"), ("adk-gateway", "GET /run_live")} <= names
        spans = _of(receiver.wait_for(complete), trace_id)
        assert complete(spans), sorted((s.service, s.name) for s in spans)
    by_name = {(s.service, s.name): s for s in spans}
    wait, tool = by_name["adk-gateway", "approval process_payment"], by_name["adk-agent", "execute_tool process_payment"]
    assert wait.parent_id == tool.span_id
    assert wait.attributes["adk_gateway.mode"] == "hold" and wait.attributes["adk_gateway.approval_id"].startswith("gw-")
    assert wait.attributes["adk_gateway.outcome"] == "approved" and wait.attributes["adk_gateway.source"] == "person"
    assert tool.start <= wait.start and wait.end <= tool.end and wait.end - wait.start >= 0.4e9
    turn = by_name["adk-gateway", "turn demo_agent"]
    assert by_name["adk-gateway", "GET /run_live"].parent_id == turn.span_id
    assert turn.parent_id == by_name["adk-gateway", "POST /api/chat"].span_id


async def test_each_websocket_send_is_a_span_with_its_turn(stack: PluginStack, receiver: Receiver) -> None:
    import aiohttp

    from tests.integration.test_ws_frames import send_frame, until_terminal

    chat = new_chat()
    async with aiohttp.ClientSession() as http, http.ws_connect(stack.gateway.base + "/api/chat/ws") as ws:
        await ws.send_str(send_frame("r1", chat, [user("hello there")]))
        frames = await until_terminal(ws, "r1")
    assert frames[-1]["type"] in ("done", "finish", "end"), frames[-1]

    def sent(spans: list[Span]) -> list[Span]:
        return [s for s in spans if s.name == "WS send" and s.attributes.get("adk_gateway.chat_id") == chat]
    spans = receiver.wait_for(lambda spans: bool(sent(spans)) and any(
        s.name == "turn demo_agent" and s.parent_id == sent(spans)[0].span_id for s in spans))
    [send] = sent(spans)
    assert send.kind == "SERVER" and send.attributes["adk_gateway.agent"] == "demo_agent"
    assert any(s.name == "turn demo_agent" and s.parent_id == send.span_id for s in spans)
    # The upgrade request itself (a socket lives for hours) has no span.
    assert not any(s.name.endswith("/api/chat/ws") for s in spans)


@pytest.fixture(scope="module")
def replicas_traced(tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> Iterator[Any]:
    import os

    from tests.ops.stack import replicas

    """Redis, the agent and replicas A and B (tests/ops/stack.py), all exporting to the receiver:
    their processes take the environment of this one, set for the module."""
    saved = {name: os.environ.get(name) for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_BSP_SCHEDULE_DELAY", *_KEEP_ALL)}
    os.environ.update({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100", **_KEEP_ALL})
    try:
        with replicas(tmp_path_factory.mktemp("traced-replicas"), adk_env={"OTEL_SERVICE_NAME": "adk-agent"}) as r:
            yield r
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def test_a_turn_forwarded_to_its_owner_is_one_trace_across_replicas(replicas_traced: Any, receiver: Receiver) -> None:
    pair = replicas_traced
    chat, first_message = new_chat(), user("hello there")
    first = post(pair.a, chat, [first_message])  # A runs the chat from now on
    assert first.status == 200 and types(first)[-1] == "finish"
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    # The next turn is sent to B, which forwards it to A; its tool call waits for a person, and the
    # plugin (which talks to B) asks B, which forwards the ask to A, where the call is shown.
    history = [first_message, assistant_from(first), user("pay 50 to Hanako")]
    second = request(
        pair.b.base, "POST", "/api/chat", {"id": chat, "messages": history, "trigger": "submit-message"},
        headers={"traceparent": f"00-{trace_id}-b7ad6b7169203331-01"},
    )
    assert second.status == 200 and types(second)[-1] == "finish", second.body
    assert "tool-approval-request" in types(second)
    answer = assistant_from(second, [True])
    third = post(pair.a, chat, [*history, answer], messageId=answer["id"])
    assert "tool-output-available" in types(third)

    names = ("POST /api/chat", "forward submit", "serve submit", "turn demo_agent", "POST /run_sse")
    asked = ("forward gate", "serve gate", "approval process_payment")
    spans = receiver.wait_for(lambda spans: {*names, *asked} <= {s.name for s in _of(spans, trace_id)} and {
        "POST /run_sse", "execute_tool process_payment"} <= {s.name for s in _of(spans, trace_id) if s.service == "adk-agent"})
    mine = {s.name: s for s in _of(spans, trace_id) if s.service == "adk-gateway"}
    assert set(names) <= set(mine), sorted(mine)
    req, forward, serve, turn, run = (mine[n] for n in names)
    assert forward.parent_id == req.span_id and serve.parent_id == forward.span_id
    assert turn.parent_id == serve.span_id and run.parent_id == turn.span_id
    # The request and the forward are B's, the rest A's.
    b, a = req.attributes["adk_gateway.replica"], turn.attributes["adk_gateway.replica"]
    assert forward.attributes["adk_gateway.replica"] == b and serve.attributes["adk_gateway.replica"] == a != b
    adk = {s.name: s for s in _of(spans, trace_id) if s.service == "adk-agent"}
    assert adk["POST /run_sse"].parent_id == run.span_id
    # The plugin's ask (the tool's rules first) went to B with ADK's tool span as its traceparent:
    # B's forward of it sits under the tool span, A's service of it under that. The person's wait,
    # on A, is the span of the turn that ended with ADK's confirmation.
    ask, served, wait = (mine[n] for n in asked)
    assert ask.parent_id == adk["execute_tool process_payment"].span_id and ask.attributes["adk_gateway.replica"] == b
    assert served.parent_id == ask.span_id and served.attributes["adk_gateway.replica"] == a
    assert wait.parent_id == turn.span_id and wait.attributes["adk_gateway.replica"] == a
    assert wait.attributes["adk_gateway.outcome"] == "approved" and wait.attributes["adk_gateway.source"] == "person"
    assert wait.attributes["adk_gateway.mode"] == "confirm"
    lineage = _lineage(served, _of(spans, trace_id))
    assert _in_order([
        ("adk-gateway", "serve gate"), ("adk-gateway", "forward gate"),
        ("adk-agent", "execute_tool process_payment"), ("adk-agent", "invoke_agent demo_agent"),
        ("adk-agent", "POST /run_sse"), ("adk-gateway", "POST /run_sse"), ("adk-gateway", "turn demo_agent"),
        ("adk-gateway", "serve submit"), ("adk-gateway", "forward submit"), ("adk-gateway", "POST /api/chat"),
    ], lineage), lineage
    assert lineage[-1] == ("adk-gateway", "POST /api/chat")
    assert _lineage(wait, _of(spans, trace_id)) == [
        ("adk-gateway", "approval process_payment"), ("adk-gateway", "turn demo_agent"), ("adk-gateway", "serve submit"),
        ("adk-gateway", "forward submit"), ("adk-gateway", "POST /api/chat"),
    ]


def test_a_live_turn_traces_the_socket_s_connect_under_it(
    tmp_path_factory: pytest.TempPathFactory, receiver: Receiver, shared_agents: SharedAgents,
) -> None:
    # The gateway's spans alone: ADK need not export, so the package's shared plugin agent serves.
    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100", **_KEEP_ALL}
    agent = plugin_agent(shared_agents)
    with plugin_stack(tmp_path_factory.mktemp("traced-live"), upstream_mode="live", gateway_env=otel, agent=agent) as stack:
        chat = new_chat()
        reply = post(stack.gateway, chat, [user("hello there")])
        assert reply.status == 200 and types(reply)[-1] == "finish"

        def found(spans: list[Span]) -> tuple[Span, ...] | None:
            turns = [s for s in spans if s.name == "turn demo_agent" and s.attributes.get("adk_gateway.chat_id") == chat]
            connects = [s for s in spans if s.name == "GET /run_live" and turns and s.parent_id == turns[0].span_id]
            return (turns[0], connects[0]) if connects else None
        spans = receiver.wait_for(lambda spans: found(spans) is not None)
        assert found(spans) is not None
        turn, connect = found(spans)  # type: ignore[misc]
        assert connect.kind == "CLIENT" and connect.attributes["http.response.status_code"] == 101
        assert "session_id" not in connect.attributes.get("url.full", "")
        assert turn.attributes["adk_gateway.outcome"] == "completed"
