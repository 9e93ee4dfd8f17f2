"""Unit tests of the demo agent's scripted model and its wiring into ADK (no server)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import InMemoryRunner
from google.genai import types

from gateway.demo import AGENTS_DIR, APP_NAME, api_server_command
from gateway.demo.model import ScriptedLlm
from gateway.demo.script import DEMO_ERROR_CODE, DemoCrash
from gateway.demo.tools import get_weather, process_payment


def user(text: str) -> types.Content:
    return types.Content(role="user", parts=[types.Part(text=text)])


def model_calls(*calls: tuple[str, dict[str, Any]]) -> types.Content:
    return types.Content(
        role="model",
        parts=[types.Part(function_call=types.FunctionCall(name=n, args=a)) for n, a in calls],
    )


def tool_responses(*responses: tuple[str, dict[str, Any]]) -> types.Content:
    return types.Content(
        role="user",
        parts=[
            types.Part(function_response=types.FunctionResponse(name=n, response=r))
            for n, r in responses
        ],
    )


async def generate(contents: list[types.Content], stream: bool) -> list[LlmResponse]:
    llm = ScriptedLlm()
    return [r async for r in llm.generate_content_async(LlmRequest(contents=contents), stream=stream)]


def text_of(response: LlmResponse) -> str:
    assert response.content is not None
    return "".join(p.text or "" for p in response.content.parts or ())


def calls_of(response: LlmResponse) -> list[types.FunctionCall]:
    assert response.content is not None
    return [p.function_call for p in response.content.parts or () if p.function_call]


def payment(amount: int, recipient: str) -> dict[str, Any]:
    return {"amount": amount, "recipient": recipient, "currency": "USD"}


# --- text rows -------------------------------------------------------------------------


async def test_unrecognised_text_streams_partials_then_one_aggregated_final() -> None:
    responses = await generate([user("hello there")], stream=True)

    *partials, final = responses
    assert len(partials) >= 3
    assert all(r.partial is True for r in partials)
    assert final.partial is False
    assert final.finish_reason == types.FinishReason.STOP
    assert final.usage_metadata is not None
    assert "".join(text_of(p) for p in partials) == text_of(final)
    assert '"hello there"' in text_of(final)


async def test_unrecognised_text_without_streaming_is_one_final_response() -> None:
    responses = await generate([user("Hello  there")], stream=False)

    assert len(responses) == 1
    assert responses[0].partial is False
    assert '"Hello there"' in text_of(responses[0])


async def test_only_the_latest_user_turn_counts() -> None:
    history = [user("pay 50 to Hanako"), types.Content(role="model", parts=[types.Part(text="ok")])]

    responses = await generate([*history, user("thanks")], stream=False)

    assert '"thanks"' in text_of(responses[0])


# --- tool rows --------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["pay 50 to Hanako", "PAY 50 TO Hanako", "Please pay $50 to Hanako."])
async def test_pay_calls_process_payment(text: str) -> None:
    (response,) = await generate([user(text)], stream=False)

    (call,) = calls_of(response)
    assert call.name == "process_payment"
    assert call.args == payment(50, "Hanako")
    # Left empty so that ADK assigns its own "adk-" id, as it does for Gemini.
    assert not call.id


async def test_pay_with_currency_and_decimals() -> None:
    (response,) = await generate([user("pay 12.5 eur to Hanako")], stream=False)

    assert calls_of(response)[0].args == {"amount": 12.5, "recipient": "Hanako", "currency": "EUR"}


async def test_pay_two_makes_two_calls_in_one_response() -> None:
    (response,) = await generate([user("pay 10 to Alice and 20 to Bob")], stream=False)

    assert [(c.name, c.args) for c in calls_of(response)] == [
        ("process_payment", payment(10, "Alice")),
        ("process_payment", payment(20, "Bob")),
    ]


async def test_streamed_calls_share_ids_between_partials_and_final() -> None:
    responses = await generate([user("pay 10 to Alice and 20 to Bob")], stream=True)

    *partials, final = responses
    assert [r.partial for r in partials] == [True, True]
    assert final.partial is False
    partial_ids = [c.id for p in partials for c in calls_of(p)]
    final_ids = [c.id for c in calls_of(final)]
    assert partial_ids == final_ids
    assert len(set(final_ids)) == 2
    assert all(re.fullmatch(r"adk-[0-9a-f-]{36}", i or "") for i in final_ids)


@pytest.mark.parametrize(
    ("text", "city"),
    [
        ("weather in Tokyo", "Tokyo"),
        ("what's the weather in tokyo?", "Tokyo"),
        ("Weather for New York", "New York"),
    ],
)
async def test_weather_calls_get_weather(text: str, city: str) -> None:
    (response,) = await generate([user(text)], stream=False)

    (call,) = calls_of(response)
    assert (call.name, call.args) == ("get_weather", {"city": city})


async def test_browser_tool_rows() -> None:
    (location,) = await generate([user("Where am I?")], stream=False)
    (music,) = await generate([user("play track 2")], stream=False)

    assert [(c.name, c.args) for c in calls_of(location)] == [("get_location", {})]
    assert [(c.name, c.args) for c in calls_of(music)] == [("change_bgm", {"track": 2})]


# --- error rows -------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
async def test_trigger_error_yields_an_error_response(stream: bool) -> None:
    responses = await generate([user("please Trigger an Error")], stream=stream)

    (response,) = responses
    assert response.error_code == DEMO_ERROR_CODE
    assert response.error_message
    assert response.content is None


async def test_crash_raises() -> None:
    with pytest.raises(DemoCrash):
        await generate([user("crash")], stream=True)


# --- continuations after tool responses ------------------------------------------------


async def test_after_a_payment_the_text_names_recipient_and_transaction() -> None:
    result = process_payment(50, "Hanako", "USD")
    contents = [
        user("pay 50 to Hanako"),
        model_calls(("process_payment", payment(50, "Hanako"))),
        tool_responses(("process_payment", result)),
    ]

    responses = await generate(contents, stream=True)

    assert responses[-1].partial is False and len(responses) >= 4
    final = text_of(responses[-1])
    assert final == f"Done: sent 50 USD to Hanako (transaction {result['transaction_id']})."


async def test_after_a_rejection_the_text_says_the_payment_was_not_made() -> None:
    contents = [
        user("pay 50 to Hanako"),
        model_calls(("process_payment", payment(50, "Hanako"))),
        tool_responses(("process_payment", {"error": "This tool call is rejected."})),
    ]

    (response,) = await generate(contents, stream=False)

    assert "Hanako" in text_of(response)
    assert "not made" in text_of(response)
    assert "Done" not in text_of(response)


async def test_after_two_payments_one_text_summarises_each() -> None:
    alice = process_payment(10, "Alice")
    contents = [
        user("pay 10 to Alice and 20 to Bob"),
        model_calls(("process_payment", payment(10, "Alice")), ("process_payment", payment(20, "Bob"))),
        tool_responses(
            ("process_payment", alice),
            ("process_payment", {"error": "This tool call is rejected."}),
        ),
    ]

    (response,) = await generate(contents, stream=False)

    text = text_of(response)
    assert f"sent 10 USD to Alice (transaction {alice['transaction_id']})" in text
    assert "20 USD to Bob was not made" in text


async def test_responses_split_over_several_contents_are_all_reported() -> None:
    contents = [
        user("pay 10 to Alice and 20 to Bob"),
        model_calls(("process_payment", payment(10, "Alice")), ("process_payment", payment(20, "Bob"))),
        tool_responses(("process_payment", process_payment(10, "Alice"))),
        tool_responses(("process_payment", process_payment(20, "Bob"))),
    ]

    (response,) = await generate(contents, stream=False)

    assert "to Alice" in text_of(response) and "to Bob" in text_of(response)


async def test_after_the_weather_tool_the_text_reports_it() -> None:
    weather = get_weather("Tokyo")
    contents = [
        user("weather in Tokyo"),
        model_calls(("get_weather", {"city": "Tokyo"})),
        tool_responses(("get_weather", weather)),
    ]

    (response,) = await generate(contents, stream=False)

    assert text_of(response) == (
        f"The weather in Tokyo is {weather['condition']}, {weather['temperature_c']}°C."
    )


def test_tools_are_deterministic() -> None:
    assert process_payment(50, "Hanako") == process_payment(50, "Hanako")
    assert process_payment(50, "Hanako")["transaction_id"] != process_payment(51, "Hanako")["transaction_id"]
    assert get_weather("Tokyo") == get_weather("tokyo") | {"city": "Tokyo"}


# --- the agent app, in process ----------------------------------------------------------


def load_root_agent(monkeypatch: pytest.MonkeyPatch) -> Any:
    import importlib

    monkeypatch.setenv("DEMO_MODEL", "scripted")
    # This test drives ADK's native confirmation flow, which the demo only declares on request.
    monkeypatch.setenv("DEMO_NATIVE_CONFIRMATION", "1")
    module = importlib.import_module("gateway.demo.agents.demo_agent.agent")
    return importlib.reload(module).root_agent


def test_agent_uses_gemini_only_with_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.demo.agents.demo_agent.agent import choose_model

    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    monkeypatch.setenv("DEMO_MODEL", "gemini-2.5-pro")
    assert isinstance(choose_model(), ScriptedLlm)
    monkeypatch.setenv("GOOGLE_API_KEY", "k")
    assert choose_model() == "gemini-2.5-pro"
    monkeypatch.delenv("DEMO_MODEL")
    assert choose_model() == "gemini-2.5-flash"
    monkeypatch.setenv("DEMO_MODEL", "scripted")
    assert isinstance(choose_model(), ScriptedLlm)


async def test_confirmation_round_trip_through_adk(monkeypatch: pytest.MonkeyPatch) -> None:
    from google.adk.agents.run_config import RunConfig, StreamingMode

    agent = load_root_agent(monkeypatch)
    runner = InMemoryRunner(agent=agent, app_name=APP_NAME)
    session = await runner.session_service.create_session(app_name=APP_NAME, user_id="u1")
    config = RunConfig(streaming_mode=StreamingMode.SSE)

    async def run(message: types.Content) -> list[Any]:
        return [
            e
            async for e in runner.run_async(
                user_id="u1", session_id=session.id, new_message=message, run_config=config
            )
        ]

    first = await run(user("pay 50 to Hanako"))
    confirmation = next(
        c for e in first if not e.partial for c in e.get_function_calls() if c.name == "adk_request_confirmation"
    )
    assert confirmation.args["originalFunctionCall"]["args"] == payment(50, "Hanako")

    answer = types.Content(
        role="user",
        parts=[
            types.Part(
                function_response=types.FunctionResponse(
                    id=confirmation.id, name="adk_request_confirmation", response={"confirmed": True}
                )
            )
        ],
    )
    second = await run(answer)

    tool_result = second[0].get_function_responses()[0].response
    assert tool_result == process_payment(50, "Hanako", "USD")
    finals = [e for e in second if e.content and e.content.parts and e.content.parts[0].text and not e.partial]
    assert finals[-1].content.parts[0].text.startswith("Done: sent 50 USD to Hanako (transaction txn-")


def test_api_server_command_shape() -> None:
    argv = api_server_command(8123, extra_plugins=["a.B", "c.D"])

    assert argv[-1] == str(AGENTS_DIR)
    assert (AGENTS_DIR / APP_NAME / "agent.py").is_file()
    assert argv[argv.index("--port") + 1] == "8123"
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--session_service_uri") + 1] == "memory://"
    assert "--no-reload" in argv
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--extra_plugins"] == ["a.B", "c.D"]


# --- the tool ledger (DEMO_TOOL_LEDGER), read by the operations fault suite ---------------------


async def test_each_real_payment_appends_one_ledger_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    import importlib
    import json

    from google.adk.agents.run_config import RunConfig, StreamingMode

    ledger = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("DEMO_TOOL_LEDGER", str(ledger))
    monkeypatch.setenv("DEMO_MODEL", "scripted")
    # Without the gateway's plugin or ADK's confirmation the tool runs at once: a real execution.
    monkeypatch.delenv("DEMO_NATIVE_CONFIRMATION", raising=False)
    agent = importlib.reload(importlib.import_module("gateway.demo.agents.demo_agent.agent")).root_agent
    runner = InMemoryRunner(agent=agent, app_name=APP_NAME)
    session = await runner.session_service.create_session(app_name=APP_NAME, user_id="u1")
    events = [
        e async for e in runner.run_async(
            user_id="u1", session_id=session.id, new_message=user("pay 10 to Alice and 20 to Bob"),
            run_config=RunConfig(streaming_mode=StreamingMode.SSE),
        )
    ]
    call_ids = {c.id for e in events if not e.partial for c in e.get_function_calls()}

    lines = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert sorted((line["args"]["recipient"], line["args"]["amount"]) for line in lines) == [("Alice", 10), ("Bob", 20)]
    assert {line["function_call_id"] for line in lines} == call_ids and len(call_ids) == 2
    assert {(line["tool"], line["session_id"], line["args"]["currency"]) for line in lines} == {
        ("process_payment", session.id, "USD")
    }
    assert all(isinstance(line["at"], float) for line in lines)


def test_without_the_variable_no_ledger_is_written(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.delenv("DEMO_TOOL_LEDGER", raising=False)
    monkeypatch.chdir(tmp_path)
    assert process_payment(50, "Hanako")["success"] is True
    assert list(tmp_path.iterdir()) == []
