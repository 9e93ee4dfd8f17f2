"""Tests of the scripted model's live connection (gateway.demo.live).

Most drive the `BaseLlmConnection` directly, the way ADK's live flow does: inputs
through ``send_*``, output from one long-lived ``receive()`` generator. One runs
the connection inside ADK's own live flow in process, and one talks to the real
ADK API server over ``/run_live``.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from google.adk.agents import LlmAgent
from google.adk.agents.live_request_queue import LiveRequestQueue
from google.adk.agents.run_config import RunConfig
from google.adk.models.base_llm_connection import BaseLlmConnection
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import InMemoryRunner
from google.genai import types

from gateway.demo import APP_NAME
from gateway.demo.live import OUTPUT_AUDIO_MIME, ScriptedLiveConnection, audio_reply_text, heard_text, tone
from gateway.demo.model import ScriptedLlm
from gateway.demo.script import DEMO_ERROR_CODE, DemoCrash, echo_text
from gateway.demo.tools import build_tools, get_weather, process_payment

WAIT = 2.0  # seconds any expected response may take


class Reader:
    """Pulls from one ``receive()`` generator, as ADK's receive loop does.

    A pull that times out stays pending for the next call: cancelling it would
    throw into the generator and end it, which ADK never does.
    """

    def __init__(self, connection: BaseLlmConnection) -> None:
        self._agen: AsyncGenerator[LlmResponse, None] = connection.receive()
        self._pending: asyncio.Future[LlmResponse] | None = None

    async def next(self, timeout: float = WAIT) -> LlmResponse:
        if self._pending is None:
            self._pending = asyncio.ensure_future(anext(self._agen))
        done, _ = await asyncio.wait({self._pending}, timeout=timeout)
        if not done:
            raise TimeoutError(f"no response within {timeout}s")
        pending, self._pending = self._pending, None
        return pending.result()

    async def turn(self) -> list[LlmResponse]:
        """Responses up to and including the next ``turn_complete``."""
        out = [await self.next()]
        while not out[-1].turn_complete:
            out.append(await self.next())
        return out

    async def nothing(self, within: float = 0.05) -> None:
        with pytest.raises(TimeoutError):
            await self.next(timeout=within)

    async def aclose(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            await asyncio.gather(self._pending, return_exceptions=True)
        await self._agen.aclose()


@asynccontextmanager
async def live(**kwargs: Any) -> AsyncIterator[tuple[ScriptedLiveConnection, Reader]]:
    connection = ScriptedLiveConnection(**kwargs)
    reader = Reader(connection)
    try:
        yield connection, reader
    finally:
        await connection.close()
        await reader.aclose()


def user(text: str) -> types.Content:
    return types.Content(role="user", parts=[types.Part(text=text)])


def responses(*answers: tuple[types.FunctionCall, dict[str, Any]]) -> types.Content:
    return types.Content(
        role="user",
        parts=[
            types.Part(function_response=types.FunctionResponse(id=f"adk-{i}", name=call.name, response=response))
            for i, (call, response) in enumerate(answers)
        ],
    )


def text_of(response: LlmResponse) -> str:
    return "".join(p.text or "" for p in (response.content.parts if response.content else None) or ())


def calls_of(response: LlmResponse) -> list[types.FunctionCall]:
    return [p.function_call for p in (response.content.parts if response.content else None) or () if p.function_call]


def assert_usage(response: LlmResponse) -> None:
    """A usage report as ADK's Gemini live connection yields it: a response of its own, once per model turn."""
    usage = response.usage_metadata
    assert usage is not None and usage.prompt_token_count == 16
    assert usage.total_token_count == 16 + (usage.candidates_token_count or 0)
    assert response.content is None and not response.partial and not response.turn_complete
    assert response.model_version == "demo-scripted"


def assert_text_turn(turn: list[LlmResponse]) -> str:
    """Checks the live text shape (partial chunks, one aggregated final, the turn's usage, a bare
    turn_complete); returns the text."""
    *chunks, final, usage, done = turn
    assert_usage(usage)
    assert len(chunks) >= 3
    assert all(r.partial is True and not r.turn_complete for r in chunks)
    assert final.partial is False and not final.turn_complete
    assert "".join(text_of(c) for c in chunks) == text_of(final)
    assert done.turn_complete is True and done.content is None
    return text_of(final)


# --- text and tool rows -----------------------------------------------------------------


async def test_text_streams_chunks_then_the_whole_text_then_turn_complete() -> None:
    async with live() as (connection, reader):
        await connection.send_content(user("hello there"))

        assert assert_text_turn(await reader.turn()) == echo_text("hello there")
        await reader.nothing()


@pytest.mark.parametrize(
    ("text", "call", "response", "summary"),
    [
        (
            "pay 50 to Hanako",
            ("process_payment", {"amount": 50, "recipient": "Hanako", "currency": "USD"}),
            process_payment(50, "Hanako"),
            f"Done: sent 50 USD to Hanako (transaction {process_payment(50, 'Hanako')['transaction_id']}).",
        ),
        (
            "weather in Tokyo",
            ("get_weather", {"city": "Tokyo"}),
            get_weather("Tokyo"),
            f"The weather in Tokyo is {get_weather('Tokyo')['condition']}, {get_weather('Tokyo')['temperature_c']}°C.",
        ),
        (
            "where am I",
            ("get_location", {}),
            {"latitude": 35.6812, "longitude": 139.7671},
            "You are at latitude 35.6812, longitude 139.7671.",
        ),
        ("play track 2", ("change_bgm", {"track": 2}), {"playing": 2}, "Now playing track 2."),
    ],
)
async def test_tool_rows_call_then_summarise_the_response(
    text: str, call: tuple[str, dict[str, Any]], response: dict[str, Any], summary: str
) -> None:
    async with live() as (connection, reader):
        await connection.send_content(user(text))

        call_response = await reader.next()
        (made,) = calls_of(call_response)
        assert (made.name, made.args) == call
        assert not made.id  # ADK's live flow assigns "adk-" ids
        assert not call_response.partial and not call_response.turn_complete
        assert_usage(await reader.next())
        # The turn stays open until the tool answers.
        await reader.nothing()

        await connection.send_content(responses((made, response)))
        assert assert_text_turn(await reader.turn()) == summary


async def test_two_payments_are_summarised_once_both_answered() -> None:
    async with live() as (connection, reader):
        await connection.send_content(user("pay 10 to Alice and 20 to Bob"))
        alice, bob = calls_of(await reader.next())
        assert [c.args["recipient"] for c in (alice, bob)] == ["Alice", "Bob"]
        assert_usage(await reader.next())

        # One response at a time, as non-blocking tools would answer.
        await connection.send_content(responses((alice, process_payment(10, "Alice"))))
        await reader.nothing()
        await connection.send_content(responses((bob, {"error": "This tool call is rejected."})))

        text = assert_text_turn(await reader.turn())
        assert text.startswith("Payments:")
        assert "sent 10 USD to Alice" in text and "20 USD to Bob was not made" in text


async def test_rounds_are_answered_in_order_when_text_arrives_while_a_tool_waits() -> None:
    async with live() as (connection, reader):
        await connection.send_content(user("pay 50 to Hanako"))
        (payment,) = calls_of(await reader.next())
        assert_usage(await reader.next())
        await connection.send_content(user("where am I"))
        (location,) = calls_of(await reader.next())
        assert_usage(await reader.next())

        await connection.send_content(responses((payment, process_payment(50, "Hanako"))))
        assert assert_text_turn(await reader.turn()).startswith("Done: sent 50 USD to Hanako")
        await connection.send_content(responses((location, {"latitude": 1, "longitude": 2})))
        assert assert_text_turn(await reader.turn()) == "You are at latitude 1, longitude 2."


async def test_trigger_error_is_an_error_response_then_turn_complete() -> None:
    async with live() as (connection, reader):
        await connection.send_content(user("trigger error"))

        error, done = await reader.turn()
        assert error.error_code == DEMO_ERROR_CODE and error.error_message and error.content is None
        assert done.turn_complete is True

        # The session goes on.
        await connection.send_content(user("hello there"))
        assert_text_turn(await reader.turn())


async def test_crash_makes_receive_raise() -> None:
    async with live() as (connection, reader):
        await connection.send_content(user("crash"))

        with pytest.raises(DemoCrash):
            await reader.next()


async def test_interrupt_me_stops_mid_text() -> None:
    async with live() as (connection, reader):
        await connection.send_content(user("interrupt me"))

        *chunks, interrupted, done = await reader.turn()
        assert chunks and all(c.partial is True for c in chunks)
        said = "".join(text_of(c) for c in chunks)
        full = echo_text("interrupt me")
        assert full.startswith(said) and said != full
        assert interrupted.interrupted is True and interrupted.content is None and not interrupted.turn_complete
        assert done.turn_complete is True


async def test_partial_text_waits_for_the_rest_of_the_turn() -> None:
    async with live() as (connection, reader):
        # What ADK's live flow calls for a LiveRequest with partial=True.
        await connection._send_content(user("hello "), partial=True)
        await reader.nothing()
        await connection.send_content(user("there"))

        assert assert_text_turn(await reader.turn()) == echo_text("hello there")


# --- history ------------------------------------------------------------------------------


async def test_history_ending_with_the_user_is_answered() -> None:
    async with live() as (connection, reader):
        await connection.send_history([user("hi"), types.ModelContent("You said hi."), user("weather in Tokyo")])

        (call,) = calls_of(await reader.next())
        assert call.name == "get_weather"


async def test_history_ending_with_the_model_waits() -> None:
    async with live() as (connection, reader):
        await connection.send_history([user("hi"), types.ModelContent("You said hi.")])

        await reader.nothing()


async def test_history_ending_with_pending_calls_summarises_their_responses() -> None:
    call = types.FunctionCall(name="process_payment", args={"amount": 5, "recipient": "Kenji", "currency": "USD"})
    async with live() as (connection, reader):
        await connection.send_history([user("pay 5 to Kenji"), types.ModelContent([types.Part(function_call=call)])])
        await reader.nothing()

        await connection.send_content(responses((call, {"error": "denied by the user"})))
        assert "5 USD to Kenji was not made: denied by the user" in assert_text_turn(await reader.turn())


# --- audio --------------------------------------------------------------------------------


def audio(size: int, mime: str = "audio/pcm;rate=16000") -> types.Blob:
    return types.Blob(mime_type=mime, data=bytes(size))


def assert_audio_turn(turn: list[LlmResponse], heard_bytes: int) -> None:
    heard = [r for r in turn if r.input_transcription]
    assert [r.input_transcription.finished for r in heard][-1] is True
    assert all(r.partial is True for r in heard[:-1]) and heard[-1].partial is False
    assert "".join(r.input_transcription.text or "" for r in heard[:-1]) == heard_text(heard_bytes)
    assert heard[-1].input_transcription.text == heard_text(heard_bytes)

    said = [r for r in turn if r.output_transcription]
    assert said[-1].output_transcription.finished is True and said[-1].partial is False
    assert "".join(r.output_transcription.text or "" for r in said[:-1]) == audio_reply_text(heard_bytes)
    assert said[-1].output_transcription.text == audio_reply_text(heard_bytes)

    blobs = [p.inline_data for r in turn if r.content for p in r.content.parts or () if p.inline_data]
    assert len(blobs) >= 2
    assert {b.mime_type for b in blobs} == {OUTPUT_AUDIO_MIME}
    assert b"".join(b.data or b"" for b in blobs) == tone()
    assert len(tone()) == 9600  # 0.2 s of 24 kHz 16-bit mono
    assert not any(r.content and any(p.text for p in r.content.parts or ()) for r in turn)
    assert turn[-1].turn_complete is True


async def test_audio_is_answered_after_a_pause_with_transcriptions_and_a_tone() -> None:
    async with live(audio_pause=0.05) as (connection, reader):
        for _ in range(3):
            await connection.send_realtime(audio(3200))

        assert_audio_turn(await reader.turn(), heard_bytes=9600)
        await reader.nothing(within=0.2)


async def test_client_activity_signals_bound_the_audio_turn() -> None:
    async with live(audio_pause=0.01) as (connection, reader):
        await connection.send_realtime(types.ActivityStart())
        await connection.send_realtime(audio(3200))
        await reader.nothing(within=0.1)  # no pause detection while the client says the user speaks
        await connection.send_realtime(audio(100))
        await connection.send_realtime(types.ActivityEnd())

        assert_audio_turn(await reader.turn(), heard_bytes=3300)


async def test_audio_stream_end_answers_at_once_and_video_is_ignored() -> None:
    async with live(audio_pause=60) as (connection, reader):
        await connection.send_realtime(audio(5000, mime="image/jpeg"))
        await connection.send_realtime(audio(3200))
        await connection.send_realtime(types.LiveClientRealtimeInput(audio_stream_end=True))

        assert_audio_turn(await reader.turn(), heard_bytes=3200)


# --- closing ------------------------------------------------------------------------------


async def test_close_ends_a_waiting_receive_without_yielding() -> None:
    connection = ScriptedLiveConnection()
    reader = Reader(connection)
    await reader.nothing()

    await connection.close()

    with pytest.raises(StopAsyncIteration):
        await reader.next(timeout=0.5)
    # ADK calls receive() again after a turn; after close it must end at once, empty.
    assert [r async for r in connection.receive()] == []


async def test_a_second_receive_after_close_waits_to_be_cancelled() -> None:
    # ADK 1.x's receive loop calls receive() again after an empty call, forever (a spinning core);
    # its API server cancels the run when the client's socket closes. ADK 2.x stops at the first
    # empty call and never makes this one.
    connection = ScriptedLiveConnection()
    await connection.close()
    assert [r async for r in connection.receive()] == []

    second = asyncio.ensure_future(anext(connection.receive()))
    done, _ = await asyncio.wait({second}, timeout=0.2)
    assert not done
    second.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second


async def test_close_cuts_a_slow_turn_short() -> None:
    async with live(chunk_delay=30) as (connection, reader):
        await connection.send_content(user("hello there"))
        await reader.nothing()  # pacing the first chunk
        started = time.monotonic()

        await connection.close()

        with pytest.raises(StopAsyncIteration):
            await reader.next(timeout=5)
        assert time.monotonic() - started < 0.5


async def test_inputs_after_close_are_ignored() -> None:
    connection = ScriptedLiveConnection(audio_pause=0.01)
    await connection.close()
    await connection.send_content(user("hello there"))
    await connection.send_realtime(audio(3200))
    await asyncio.sleep(0.05)

    assert [r async for r in connection.receive()] == []


async def test_scripted_llm_connect_yields_a_connection_and_closes_it() -> None:
    llm = ScriptedLlm()
    async with llm.connect(LlmRequest()) as connection:
        assert isinstance(connection, BaseLlmConnection)
        await connection.send_content(user("hello there"))
        agen = connection.receive()
        assert (await anext(agen)).partial is True

    assert [r async for r in agen] == []


# --- inside ADK ---------------------------------------------------------------------------


async def test_adk_live_flow_runs_a_tool_round_in_process() -> None:
    agent = LlmAgent(name=APP_NAME, model=ScriptedLlm(), instruction="demo", tools=build_tools())
    runner = InMemoryRunner(agent=agent, app_name=APP_NAME)
    session = await runner.session_service.create_session(app_name=APP_NAME, user_id="u1")
    queue = LiveRequestQueue()
    queue.send_content(user("pay 50 to Hanako"))
    events = []

    async def run() -> None:
        async for event in runner.run_live(
            user_id="u1",
            session_id=session.id,
            live_request_queue=queue,
            run_config=RunConfig(response_modalities=[types.Modality.TEXT]),
        ):
            events.append(event)
            if event.turn_complete:
                queue.close()

    await asyncio.wait_for(run(), 10)

    call = events[0].get_function_calls()[0]
    assert call.id and call.id.startswith("adk-") and call.name == "process_payment"
    (answer,) = events[1].get_function_responses()
    assert answer.id == call.id and answer.response == process_payment(50, "Hanako", "USD")
    finals = [e for e in events if e.content and e.content.parts and e.content.parts[0].text and not e.partial]
    assert finals[-1].content.parts[0].text.startswith("Done: sent 50 USD to Hanako")
    assert events[-1].turn_complete is True


# --- the real ADK API server --------------------------------------------------------------


@pytest.mark.integration
async def test_run_live_on_the_real_adk_server(adk_base: str) -> None:
    session_id = "live-" + uuid.uuid4().hex[:8]
    timeout = aiohttp.ClientTimeout(total=20)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        async with http.post(
            f"{adk_base}/apps/{APP_NAME}/users/u1/sessions", json={"sessionId": session_id}
        ) as response:
            assert response.status == 200
        query = {"app_name": APP_NAME, "user_id": "u1", "session_id": session_id, "modalities": "TEXT"}
        async with http.ws_connect(
            adk_base.replace("http", "ws", 1) + "/run_live",
            params=query,
            timeout=aiohttp.ClientWSTimeout(ws_close=1.0),
        ) as ws:
            await ws.send_str(json.dumps({"content": {"role": "user", "parts": [{"text": "weather in Tokyo"}]}}))
            events: list[dict[str, Any]] = []
            while not (events and events[-1].get("turnComplete")):
                message = await ws.receive(timeout=10)
                assert message.type == aiohttp.WSMsgType.TEXT, message
                events.append(json.loads(message.data))
            await ws.send_str(json.dumps({"close": True}))

    # Each model turn's usage (the call's, the summary's) is an event of its own, without content.
    usage = [e for e in events if "usageMetadata" in e]
    assert len(usage) == 2 and all("content" not in e and e["modelVersion"] == "demo-scripted" for e in usage)
    assert [e["usageMetadata"]["promptTokenCount"] for e in usage] == [16, 16]
    events = [e for e in events if "usageMetadata" not in e]
    call = events[0]["content"]["parts"][0]["functionCall"]
    assert call["name"] == "get_weather" and call["args"] == {"city": "Tokyo"}
    assert events[1]["content"]["parts"][0]["functionResponse"] == {
        "id": call["id"],
        "name": "get_weather",
        "response": get_weather("Tokyo"),
    }
    *chunks, final, done = events[2:]
    assert chunks and all(e["partial"] is True for e in chunks)
    assert final["partial"] is False
    assert final["content"]["parts"][0]["text"] == "".join(e["content"]["parts"][0]["text"] for e in chunks)
    assert final["content"]["parts"][0]["text"].startswith("The weather in Tokyo is ")
    assert done["turnComplete"] is True and "content" not in done
