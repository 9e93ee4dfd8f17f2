"""The support agent's rows of the demo script, and the rule that the scripted model only calls
the tools an agent declared (no server; text mode, live mode and ADK in process)."""

from __future__ import annotations

import asyncio
import importlib
import json
from typing import Any

import pytest
from google.adk.agents import LlmAgent
from google.adk.agents.live_request_queue import LiveRequestQueue
from google.adk.agents.run_config import RunConfig, StreamingMode
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import InMemoryRunner
from google.genai import types

from gateway.demo import AGENTS_DIR
from gateway.demo.live import ScriptedLiveConnection
from gateway.demo.model import ScriptedLlm
from gateway.demo.script import (
    PlannedCall,
    ToolResult,
    declared_tools,
    echo_text,
    plan_calls,
    reply_to,
    summarize_results,
)
from gateway.demo.tools import (
    build_support_tools,
    build_tools,
    issue_refund,
    lookup_order,
)

SUPPORT_TOOLS = frozenset({"lookup_order", "issue_refund"})
DEMO_TOOLS = frozenset({"process_payment", "get_weather", "get_location", "change_bgm"})
REFUND = PlannedCall("issue_refund", {"order_id": "1234", "amount": 20, "currency": "USD"})
LOOKUP = PlannedCall("lookup_order", {"order_id": "1234"})


def user(text: str) -> types.Content:
    return types.Content(role="user", parts=[types.Part(text=text)])


def request_with(tools: list[Any], *contents: types.Content) -> LlmRequest:
    """A request as ADK builds it for an agent with `tools` (tools_dict and declarations)."""
    request = LlmRequest(contents=list(contents))
    request.append_tools(tools)
    return request


def text_of(response: LlmResponse) -> str:
    return "".join(p.text or "" for p in (response.content.parts if response.content else None) or ())


def calls_of(response: LlmResponse) -> list[tuple[str, dict[str, Any]]]:
    parts = (response.content.parts if response.content else None) or ()
    return [(p.function_call.name, dict(p.function_call.args or {})) for p in parts if p.function_call]


async def generate(request: LlmRequest) -> list[LlmResponse]:
    return [r async for r in ScriptedLlm().generate_content_async(request, stream=False)]


# --- the rows ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "refund 20 on order 1234",
        "refund 20 USD for order 1234",
        "Please refund $20 for order #1234.",
        "REFUND 20 usd on order 1234",
    ],
)
def test_refund_rows_plan_issue_refund(text: str) -> None:
    assert plan_calls(text) == [REFUND]


def test_refund_with_another_currency_and_decimals() -> None:
    assert plan_calls("refund 12.5 eur on order A-77") == [
        PlannedCall("issue_refund", {"order_id": "A-77", "amount": 12.5, "currency": "EUR"})
    ]


@pytest.mark.parametrize("text", ["where is order 1234", "Where is my order #1234?", "status of order 1234"])
def test_order_rows_plan_lookup_order(text: str) -> None:
    assert plan_calls(text) == [LOOKUP]


@pytest.mark.parametrize("text", ["where am I", "refund please", "what about order 1234", "play track 2"])
def test_the_new_rows_leave_other_texts_alone(text: str) -> None:
    assert not any(c.name in SUPPORT_TOOLS for c in plan_calls(text))


# --- only declared tools -----------------------------------------------------------------


def test_support_agent_gets_its_calls() -> None:
    assert reply_to("refund 20 on order 1234", SUPPORT_TOOLS).calls == (REFUND,)
    assert reply_to("where is order 1234", SUPPORT_TOOLS).calls == (LOOKUP,)


@pytest.mark.parametrize("text", ["pay 50 to Hanako", "weather in Tokyo", "where am I", "play track 2"])
def test_support_agent_answers_demo_rows_in_text(text: str) -> None:
    reply = reply_to(text, SUPPORT_TOOLS)

    assert reply.kind == "text" and not reply.calls
    assert f'"{text}"' in reply.text
    assert "I have no " in reply.text
    assert '"refund 20 on order 1234" or "where is order 1234"' in reply.text
    assert "Hanako" not in reply.text.split(". I have no")[1]  # suggests only its own rows


@pytest.mark.parametrize("text", ["refund 20 on order 1234", "where is order 1234"])
def test_demo_agent_answers_support_rows_in_text(text: str) -> None:
    reply = reply_to(text, DEMO_TOOLS)

    assert reply.kind == "text" and not reply.calls
    assert f'"{text}". I have no {plan_calls(text)[0].name} tool, so I did nothing.' in reply.text
    assert reply.text.endswith('"where am I" or "play track 2".')


def test_demo_agent_rows_and_echo_are_unchanged_by_the_rule() -> None:
    for text in ("pay 50 to Hanako", "pay 10 to Alice and 20 to Bob", "weather in Tokyo", "where am I", "play track 2"):
        assert reply_to(text, DEMO_TOOLS) == reply_to(text)
    assert echo_text("hello there", DEMO_TOOLS) == echo_text("hello there") == (
        'You said: "hello there". I am the offline demo agent. Try "pay 50 to Hanako", '
        '"pay 10 to Alice and 20 to Bob", "weather in Tokyo", "where am I" or "play track 2".'
    )


def test_errors_and_crashes_do_not_depend_on_tools() -> None:
    assert reply_to("trigger error", SUPPORT_TOOLS).kind == "error"
    assert reply_to("crash", SUPPORT_TOOLS).kind == "crash"


def test_declared_tools_reads_what_adk_puts_in_the_request() -> None:
    assert declared_tools(LlmRequest()) is None
    assert declared_tools(request_with(build_support_tools())) == SUPPORT_TOOLS
    assert declared_tools(request_with(build_tools())) == DEMO_TOOLS
    # A declaration without a tool object (added by a callback, say) counts too.
    bare = LlmRequest()
    bare.config.tools = [types.Tool(function_declarations=[types.FunctionDeclaration(name="lookup_order")])]
    assert declared_tools(bare) == {"lookup_order"}


async def test_scripted_llm_plans_from_the_request_tools() -> None:
    (support,) = await generate(request_with(build_support_tools(), user("pay 50 to Hanako")))
    (refund,) = await generate(request_with(build_support_tools(), user("refund 20 on order 1234")))
    (demo,) = await generate(request_with(build_tools(), user("refund 20 on order 1234")))

    assert calls_of(support) == [] and "no process_payment tool" in text_of(support)
    assert calls_of(refund) == [("issue_refund", {"order_id": "1234", "amount": 20, "currency": "USD"})]
    assert calls_of(demo) == [] and "no issue_refund tool" in text_of(demo)


# --- summaries ---------------------------------------------------------------------------


def test_a_refund_summary_names_amount_order_and_refund_id() -> None:
    result = issue_refund("1234", 20)

    text = summarize_results([ToolResult("issue_refund", dict(REFUND.args), result)])

    assert text == f"Refunded 20 USD on order 1234 (refund id {result['refund_id']})."


@pytest.mark.parametrize(
    "response",
    [
        {"error": "The user rejected this tool call; it was not run."},
        {"error": "Timed out waiting for approval; the call was not run."},
        {"success": False, "reason": "Order 1234 was already refunded."},
    ],
)
def test_a_refused_or_failed_refund_was_not_made(response: dict[str, Any]) -> None:
    text = summarize_results([ToolResult("issue_refund", dict(REFUND.args), response)])

    assert text.startswith("The refund of 20 USD on order 1234 was not made: ")
    assert "Refunded" not in text


def test_a_lookup_summary_says_the_status() -> None:
    order = lookup_order("1234")

    text = summarize_results([ToolResult("lookup_order", {"order_id": "1234"}, order)])

    assert text == (
        f"Order 1234 ({order['items']} items, {order['total']} USD) is {order['status']}."
    )
    assert summarize_results([ToolResult("lookup_order", {"order_id": "9"}, {"error": "boom"})]) == (
        "I could not look up order 9: boom"
    )


def test_two_refunds_share_a_heading() -> None:
    results = [
        ToolResult("issue_refund", dict(REFUND.args), issue_refund("1234", 20)),
        ToolResult("issue_refund", {"order_id": "5", "amount": 5, "currency": "USD"}, {"error": "denied"}),
    ]

    assert summarize_results(results).splitlines()[0] == "Refunds:"


def test_support_tools_are_deterministic() -> None:
    assert lookup_order("1234") == lookup_order("1234")
    assert issue_refund("1234", 20) == issue_refund("1234", 20, "USD")
    assert issue_refund("1234", 20)["refund_id"] != issue_refund("1234", 21)["refund_id"]
    assert issue_refund("1234", 20)["refund_id"].startswith("rf-")


# --- live mode ---------------------------------------------------------------------------


async def test_live_connection_plans_only_declared_tools() -> None:
    async with ScriptedLlm().connect(request_with(build_support_tools())) as connection:
        await connection.send_content(user("refund 20 on order 1234"))
        await connection.send_content(user("pay 50 to Hanako"))
        agen = connection.receive()
        first = await asyncio.wait_for(anext(agen), 2)
        texts = []
        while True:
            response = await asyncio.wait_for(anext(agen), 2)
            if response.turn_complete:
                break
            texts.append(response)

    assert calls_of(first) == [("issue_refund", {"order_id": "1234", "amount": 20, "currency": "USD"})]
    # The turn's last words; its usage report (as Gemini Live sends one per turn) comes after them.
    said = [response for response in texts if response.content is not None]
    assert "no process_payment tool" in text_of(said[-1])


async def test_live_connection_summarises_a_refund() -> None:
    connection = ScriptedLiveConnection(tools=SUPPORT_TOOLS)
    agen = connection.receive()
    try:
        await connection.send_content(user("refund 20 on order 1234"))
        (call,) = [p.function_call for p in (await asyncio.wait_for(anext(agen), 2)).content.parts]
        result = issue_refund("1234", 20)
        await connection.send_content(
            types.UserContent(parts=[types.Part(function_response=types.FunctionResponse(name=call.name, response=result))])
        )
        finals = []
        while not finals or not finals[-1].turn_complete:
            finals.append(await asyncio.wait_for(anext(agen), 2))
    finally:
        await connection.close()
        await agen.aclose()

    said = [response for response in finals if response.content is not None]  # the usage report has none
    assert text_of(said[-1]) == f"Refunded 20 USD on order 1234 (refund id {result['refund_id']})."


# --- the support agent app, in process ---------------------------------------------------


def load_support_agent(monkeypatch: pytest.MonkeyPatch) -> LlmAgent:
    monkeypatch.setenv("DEMO_MODEL", "scripted")
    monkeypatch.delenv("DEMO_NATIVE_CONFIRMATION", raising=False)
    module = importlib.import_module("gateway.demo.agents.support_agent.agent")
    return importlib.reload(module).root_agent


async def run_text(agent: LlmAgent, text: str) -> tuple[str, list[Any]]:
    runner = InMemoryRunner(agent=agent, app_name=agent.name)
    session = await runner.session_service.create_session(app_name=agent.name, user_id="u1")
    events = [
        e
        async for e in runner.run_async(
            user_id="u1", session_id=session.id, new_message=user(text),
            run_config=RunConfig(streaming_mode=StreamingMode.SSE),
        )
    ]
    return session.id, events


def final_texts(events: list[Any]) -> list[str]:
    return [e.content.parts[0].text for e in events if e.content and e.content.parts and e.content.parts[0].text and not e.partial]


def test_support_agent_app_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    agent = load_support_agent(monkeypatch)

    # The stock API server serves every folder of AGENTS_DIR with an agent.py: both apps.
    assert (AGENTS_DIR / "support_agent" / "agent.py").is_file()

    assert agent.name == "support_agent"
    assert isinstance(agent.model, ScriptedLlm)
    assert sorted(t.name for t in agent.tools) == ["issue_refund", "lookup_order"]


async def test_support_agent_runs_a_refund_once_and_reports_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    ledger = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("DEMO_TOOL_LEDGER", str(ledger))
    agent = load_support_agent(monkeypatch)

    session_id, events = await run_text(agent, "refund 20 USD for order 1234")

    (line,) = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert (line["tool"], line["session_id"], line["args"]) == (
        "issue_refund", session_id, {"order_id": "1234", "amount": 20, "currency": "USD"}
    )
    refund_id = issue_refund("1234", 20)["refund_id"]
    assert final_texts(events)[-1] == f"Refunded 20 USD on order 1234 (refund id {refund_id})."


async def test_support_agent_answers_a_payment_in_text(monkeypatch: pytest.MonkeyPatch) -> None:
    agent = load_support_agent(monkeypatch)

    _, events = await run_text(agent, "pay 50 to Hanako")

    assert not [c for e in events for c in e.get_function_calls()]
    assert "no process_payment tool" in final_texts(events)[-1]


async def test_support_agent_live_flow_looks_up_an_order(monkeypatch: pytest.MonkeyPatch) -> None:
    agent = load_support_agent(monkeypatch)
    runner = InMemoryRunner(agent=agent, app_name=agent.name)
    session = await runner.session_service.create_session(app_name=agent.name, user_id="u1")
    queue = LiveRequestQueue()
    queue.send_content(user("where is order 1234"))
    events = []

    async def run() -> None:
        async for event in runner.run_live(
            user_id="u1", session_id=session.id, live_request_queue=queue,
            run_config=RunConfig(response_modalities=[types.Modality.TEXT]),
        ):
            events.append(event)
            if event.turn_complete:
                queue.close()

    await asyncio.wait_for(run(), 10)

    assert [(c.name, c.args) for c in events[0].get_function_calls()] == [("lookup_order", {"order_id": "1234"})]
    assert final_texts(events)[-1].startswith("Order 1234 (")
