"""The offline, deterministic scripted model behind the demo agents.

`ScriptedLlm` is an ADK `BaseLlm` that needs no network and no API key. It reads
the latest turn of the request (the user's text, or function responses coming
back from tools) and answers from a fixed script (`gateway.demo.script`,
DESIGN.md section 4):

==================================  ==========================================
user says                           model answers
==================================  ==========================================
``pay 50 to Hanako``                ``process_payment(amount=50, recipient="Hanako", currency="USD")``
``pay 10 to Alice and 20 to Bob``   two ``process_payment`` calls in one response
``weather in Tokyo``                ``get_weather(city="Tokyo")``
``where am I``                      ``get_location()``
``play track 2``                    ``change_bgm(track=2)``
``refund 20 on order 1234``         ``issue_refund(order_id="1234", amount=20, currency="USD")``
``where is order 1234``             ``lookup_order(order_id="1234")``
``trigger error``                   an ``LlmResponse`` with ``error_code="DEMO_ERROR"``
``crash``                           raises `DemoCrash` inside the model call
anything else                       streamed text quoting the user
==================================  ==========================================

After the tools answer, the model writes one text that reports each result
(names the recipient and the transaction, says a refused payment was not made).

One model serves every demo agent: it plans only calls to the functions the
request declares (`gateway.demo.script.declared_tools`, which ADK fills from the
agent's tools), so ``pay 50 to Hanako`` sent to support_agent, or ``refund ...``
sent to demo_agent, is answered in text. A request that declares no function
(hand-built, as in unit tests) leaves every row in play.

Streaming mirrors what Gemini looks like through ADK 2.13 with progressive SSE
(the default): every chunk is ``partial=True``, then one aggregated
``partial=False`` response carries all parts plus ``finish_reason=STOP`` and
usage metadata. Function calls streamed that way get their ids from ADK's own
id generator, so the partial and the final response name the same call.

Live mode (``/run_live``) plays the same script over a `BaseLlmConnection`
opened by `ScriptedLlm.connect`; the connection, its audio rows and its
live-only ``interrupt me`` row live in `gateway.demo.live`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncGenerator, AsyncIterator, Sequence

from google.adk.flows.llm_flows import functions as adk_functions
from google.adk.models.base_llm import BaseLlm
from google.adk.models.base_llm_connection import BaseLlmConnection
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.genai import types

from gateway.demo.live import ScriptedLiveConnection
from gateway.demo.script import (
    CRASH_MESSAGE,
    DEMO_ERROR_CODE,
    DEMO_ERROR_MESSAGE,
    DemoCrash,
    PlannedCall,
    chunk_text,
    content_text,
    declared_tools,
    latest_results,
    reply_to,
    summarize_results,
)


class ScriptedLlm(BaseLlm):
    """A deterministic offline model for the demo agents and the tests.

    ``chunk_delay`` spaces streamed chunks out (seconds); even at 0 the model
    yields control between chunks, as a network stream would.
    """

    model: str = "demo-scripted"
    chunk_delay: float = 0.0

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        contents = list(llm_request.contents or ())
        results = latest_results(contents)
        if results is not None:
            async for response in self._text(summarize_results(results), stream):
                yield response
            return

        user_text = next(
            (content_text(c) for c in reversed(contents) if c.role == "user" and content_text(c)),
            "",
        )
        reply = reply_to(user_text, declared_tools(llm_request))
        if reply.kind == "error":
            yield LlmResponse(
                error_code=DEMO_ERROR_CODE,
                error_message=DEMO_ERROR_MESSAGE,
                model_version=self.model,
            )
            return
        if reply.kind == "crash":
            raise DemoCrash(CRASH_MESSAGE)
        if reply.kind == "calls":
            async for response in self._calls(reply.calls, stream):
                yield response
            return
        async for response in self._text(reply.text, stream):
            yield response

    @contextlib.asynccontextmanager
    async def connect(self, llm_request: LlmRequest) -> AsyncIterator[BaseLlmConnection]:
        """Opens a live connection that plays the script (see `gateway.demo.live`).

        ADK's live flow enters this once per ``/run_live`` session (and again after
        an agent transfer); leaving it closes the connection, so ``receive()`` ends.
        The request's response modalities do not change the script: typed text is
        answered in text and audio in audio, whatever the session asked for. Of the
        request, only its declared tools count: history arrives through send_history.
        """
        connection = ScriptedLiveConnection(
            model=self.model, chunk_delay=self.chunk_delay, tools=declared_tools(llm_request)
        )
        try:
            yield connection
        finally:
            await connection.close()

    async def _text(self, text: str, stream: bool) -> AsyncGenerator[LlmResponse, None]:
        if stream:
            for chunk in chunk_text(text):
                await asyncio.sleep(self.chunk_delay)
                yield LlmResponse(
                    content=types.ModelContent(parts=[types.Part.from_text(text=chunk)]),
                    partial=True,
                    model_version=self.model,
                )
        await asyncio.sleep(self.chunk_delay)
        yield self._final([types.Part.from_text(text=text)], output_words=len(text.split()))

    async def _calls(self, calls: Sequence[PlannedCall], stream: bool) -> AsyncGenerator[LlmResponse, None]:
        def part(call: PlannedCall, call_id: str | None) -> types.Part:
            return types.Part(
                function_call=types.FunctionCall(id=call_id, name=call.name, args=dict(call.args))
            )

        if not stream:
            # Empty ids: ADK assigns "adk-<uuid>" ids itself when it builds the event.
            yield self._final([part(c, None) for c in calls], output_words=len(calls) * 8)
            return
        # Gemini's streaming aggregator names each call once, from ADK's generator
        # (looked up through the module so tests can patch it), and reuses that id
        # in the aggregated response; two separately built responses would
        # otherwise each get a fresh id.
        ids = [adk_functions.generate_client_function_call_id() for _ in calls]
        for call, call_id in zip(calls, ids):
            await asyncio.sleep(self.chunk_delay)
            yield LlmResponse(
                content=types.ModelContent(parts=[part(call, call_id)]),
                partial=True,
                model_version=self.model,
            )
        await asyncio.sleep(self.chunk_delay)
        yield self._final([part(c, i) for c, i in zip(calls, ids)], output_words=len(calls) * 8)

    def _final(self, parts: list[types.Part], output_words: int) -> LlmResponse:
        return LlmResponse(
            content=types.ModelContent(parts=parts),
            partial=False,
            finish_reason=types.FinishReason.STOP,
            # Fake but plausible counts, so consumers see the field as Gemini sends it.
            usage_metadata=types.GenerateContentResponseUsageMetadata(
                prompt_token_count=16,
                candidates_token_count=output_words,
                total_token_count=16 + output_words,
            ),
            model_version=self.model,
        )


SCRIPTED = "scripted"
DEFAULT_GEMINI_MODEL = "gemini-2.5-flash"


def choose_model() -> BaseLlm | str:
    """The model of each demo agent: the scripted one, or a Gemini model's name when an API key is
    configured (``DEMO_MODEL``, default gemini-2.5-flash; ``DEMO_MODEL=scripted`` forces the script)."""
    name = os.environ.get("DEMO_MODEL", "").strip()
    if name.lower() == SCRIPTED or not os.environ.get("GOOGLE_API_KEY"):
        # DEMO_CHUNK_DELAY (seconds between streamed chunks) lets tests catch a stream mid-way.
        return ScriptedLlm(chunk_delay=float(os.environ.get("DEMO_CHUNK_DELAY", "0")))
    return name or DEFAULT_GEMINI_MODEL
