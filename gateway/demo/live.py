"""The scripted model's live connection: what ADK's ``/run_live`` talks to offline.

`ScriptedLiveConnection` is the `BaseLlmConnection` that `ScriptedLlm.connect`
yields. It answers typed text from the same script as text mode
(`gateway.demo.script.reply_to`, limited to the tools the agent declared), answers
audio with a transcription and a short tone, and owns the one live-only row:

==================================  ==========================================
input                               the connection answers
==================================  ==========================================
text, a script row                  what text mode does, as live responses
``interrupt me`` (typed)            a few text chunks, ``interrupted``, ``turn_complete``
function responses                  the text summarising them, then ``turn_complete``
audio blobs, then a pause           input transcription "(heard N bytes of audio)",
                                    output transcription + 24 kHz PCM tone, ``turn_complete``
==================================  ==========================================

Turn shapes follow ADK 2.13's Gemini live connection (`GeminiLlmConnection.receive`):

- text: ``partial=True`` chunks, one aggregated ``partial=False`` text, then a
  bare ``turn_complete=True`` response;
- tool calls: one response holding every function call part, without ids (ADK
  gives them ``adk-`` ids) and without ``turn_complete``: as with Gemini 3.x
  Live, the turn goes on when ADK sends the function responses back through
  ``send_content`` and ends after the summary text;
- usage: each model turn (text, calls, audio) reports its token usage in a
  response of its own, as ADK's connection remaps Gemini Live's per-turn
  ``usage_metadata``;
- ``trigger error``: a response with ``error_code``, then ``turn_complete``;
  ``crash`` makes ``receive()`` raise, which ends ADK's whole live run.

ADK 2.x calls ``receive()`` again each time it returns after yielding something,
and stops when a call yields nothing; so ``receive()`` streams until `close`, then
returns promptly without yielding. ADK 1.x (1.22 to 1.39) calls ``receive()`` in
an endless loop: an empty call only spins it (a core at 100 %), and an exception
ends the whole run with an error (1.39) or makes it reconnect (1.22). Its API
server cancels the run when the client's socket closes. So a second call that
starts after `close` (ADK 2.x never makes one) waits for that cancellation.
"""

from __future__ import annotations

import asyncio
import math
import re
import struct
from collections import deque
from collections.abc import AsyncGenerator, Collection, Sequence
from typing import TYPE_CHECKING

from google.adk.models.base_llm_connection import BaseLlmConnection
from google.adk.models.llm_response import LlmResponse
from google.genai import types

from gateway.demo.script import (
    CRASH_MESSAGE,
    DEMO_ERROR_CODE,
    DEMO_ERROR_MESSAGE,
    DemoCrash,
    chunk_text,
    content_text,
    echo_text,
    latest_results,
    reply_to,
    summarize_results,
)

if TYPE_CHECKING:
    # ADK 2.x names what `send_realtime` receives; ADK 1.x has no such alias (it passes a Blob,
    # or an activity marker), and the demo must import on every supported ADK.
    from google.adk.models.base_llm_connection import RealtimeInput

__all__ = [
    "AUDIO_PAUSE",
    "OUTPUT_AUDIO_MIME",
    "ScriptedLiveConnection",
    "audio_reply_text",
    "heard_text",
    "tone",
]

OUTPUT_AUDIO_RATE = 24_000
OUTPUT_AUDIO_MIME = f"audio/pcm;rate={OUTPUT_AUDIO_RATE}"
# The reply tone: short, so recorded fixtures stay small.
TONE_SECONDS = 0.2
TONE_HZ = 440.0
TONE_CHUNKS = 2
# Seconds of no audio after which the connection treats the user as done
# speaking: a stand-in for the server-side voice activity detection of Gemini.
AUDIO_PAUSE = 0.3

_INTERRUPT_RE = re.compile(r"\binterrupt\s+me\b", re.IGNORECASE)

# A queued turn: responses to yield, or an exception for receive() to raise.
_Turn = list[LlmResponse | BaseException]


def tone(seconds: float = TONE_SECONDS, rate: int = OUTPUT_AUDIO_RATE, hz: float = TONE_HZ) -> bytes:
    """A sine tone as 16-bit little-endian mono PCM, faded in and out so it does not click."""
    count = int(seconds * rate)
    fade = max(1, count // 10)
    samples = []
    for i in range(count):
        envelope = min(1.0, i / fade, (count - 1 - i) / fade)
        samples.append(int(8000 * envelope * math.sin(2 * math.pi * hz * i / rate)))
    return struct.pack(f"<{count}h", *samples)


def heard_text(byte_count: int) -> str:
    """The input transcription of `byte_count` bytes of user audio."""
    return f"(heard {byte_count} bytes of audio)"


def audio_reply_text(byte_count: int) -> str:
    """What the model "says" (the output transcription) after hearing audio."""
    return f"I heard {byte_count} bytes of audio, but I only understand typed text."


class ScriptedLiveConnection(BaseLlmConnection):
    """One live session of the scripted model.

    Inputs (ADK's send task) queue whole turns; `receive` (ADK's receive loop)
    plays them in order, ``chunk_delay`` seconds apart. Both run on ADK's loop.
    """

    def __init__(
        self,
        *,
        model: str = "demo-scripted",
        chunk_delay: float = 0.0,
        audio_pause: float = AUDIO_PAUSE,
        tools: Collection[str] | None = None,
    ) -> None:
        self._model = model
        # The agent's tools (names), as `ScriptedLlm.connect` read them from the request: the
        # script plans no call to any other. None: every row is in play.
        self._tools = None if tools is None else frozenset(tools)
        self._chunk_delay = chunk_delay
        self._audio_pause = audio_pause
        # None, queued by close(), wakes a receive() that waits for the next turn.
        self._turns: asyncio.Queue[_Turn | None] = asyncio.Queue()
        self._closed = False
        # receive() calls that started after close(): the second one waits (module docstring).
        self._calls_after_close = 0
        # Set by close(): ends a receive() that is pacing chunks at once.
        self._closing = asyncio.Event()
        # Rounds of function calls still unanswered, oldest first, and the responses
        # received so far for the oldest. ADK answers rounds in order (a blocked tool
        # holds back the next round's calls) and a round in one content, except that a
        # non-blocking tool answers on its own: a summary waits for the whole round.
        self._rounds: deque[list[types.FunctionCall]] = deque()
        self._responses: list[types.FunctionResponse] = []
        # Text sent as partial turn updates (LiveRequest.partial), prepended to the next full turn.
        self._partial_text: list[str] = []
        self._audio_bytes = 0
        self._in_activity = False
        self._audio_timer: asyncio.Task[None] | None = None

    # ---- BaseLlmConnection ------------------------------------------------------------------

    async def send_history(self, history: list[types.Content]) -> None:
        """Takes the session so far; answers its last turn if that is the user's, as Gemini does."""
        if not history or self._closed:
            return
        last = history[-1]
        if last.role == "model":
            # Calls still running when the previous connection ended: their responses come next.
            if calls := [p.function_call for p in last.parts or () if p.function_call]:
                self._rounds.append(calls)
            return
        results = latest_results(history)
        if results is not None:
            self._queue(self._text_turn(summarize_results(results)))
        elif text := content_text(last):
            self._answer(text)

    async def send_content(self, content: types.Content) -> None:
        await self._send_content(content)

    async def _send_content(self, content: types.Content, *, partial: bool = False) -> None:
        # Overridden (ADK's hook for LiveRequest.partial) so a partial text update
        # waits for the rest of its turn instead of being answered on its own.
        if self._closed:
            return
        responses = [p.function_response for p in content.parts or () if p.function_response]
        if responses:
            if not partial:  # a streaming tool's interim output: the model waits for the end
                self._on_function_responses(responses)
            return
        text = content_text(content)
        if partial:
            self._partial_text.append(text)
            return
        text, self._partial_text = "".join(self._partial_text) + text, []
        self._answer(text)

    async def send_realtime(self, input: RealtimeInput) -> None:  # noqa: A002 - ADK's name
        if self._closed:
            return
        if isinstance(input, types.Blob):
            if not (input.mime_type or "").startswith("audio/"):
                return  # video frames: the script does not look at them
            self._audio_bytes += len(input.data or b"")
            if not self._in_activity:
                self._restart_audio_timer()
        elif isinstance(input, types.ActivityStart):
            # The client does its own voice detection: wait for its ActivityEnd.
            self._in_activity = True
            self._cancel_audio_timer()
        elif isinstance(input, types.ActivityEnd) or (
            isinstance(input, types.LiveClientRealtimeInput) and input.audio_stream_end
        ):
            self._in_activity = False
            self._cancel_audio_timer()
            self._flush_audio()

    async def receive(self) -> AsyncGenerator[LlmResponse, None]:
        if self._closed:
            self._calls_after_close += 1
            if self._calls_after_close > 1:
                # Only ADK 1.x's loop gets here: park until its server cancels the run.
                await asyncio.get_running_loop().create_future()
            return
        while not self._closed:
            turn = await self._turns.get()
            if turn is None:
                return
            for item in turn:
                await self._pause()
                if self._closed:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._closing.set()
        self._cancel_audio_timer()
        self._turns.put_nowait(None)

    # ---- the script ---------------------------------------------------------------------------

    def _answer(self, user_text: str) -> None:
        if _INTERRUPT_RE.search(user_text):
            self._queue(self._interrupted_turn(echo_text(user_text, self._tools)))
            return
        reply = reply_to(user_text, self._tools)
        if reply.kind == "error":
            error = LlmResponse(error_code=DEMO_ERROR_CODE, error_message=DEMO_ERROR_MESSAGE, model_version=self._model)
            self._queue([error, self._turn_complete()])
        elif reply.kind == "crash":
            self._queue([DemoCrash(CRASH_MESSAGE)])
        elif reply.kind == "calls":
            # No ids: ADK's live flow gives each call an "adk-" id, as it does for Gemini's.
            calls = [types.FunctionCall(name=c.name, args=dict(c.args)) for c in reply.calls]
            self._rounds.append(calls)
            parts = [types.Part(function_call=call) for call in calls]
            self._queue([
                LlmResponse(content=types.ModelContent(parts=parts), model_version=self._model),
                self._usage(len(calls) * 8),
            ])
        else:
            self._queue(self._text_turn(reply.text))

    def _on_function_responses(self, responses: Sequence[types.FunctionResponse]) -> None:
        self._responses.extend(responses)
        calls = self._rounds[0] if self._rounds else []
        if len(self._responses) < len(calls):
            return
        if self._rounds:
            self._rounds.popleft()
        history = [
            types.ModelContent(parts=[types.Part(function_call=c) for c in calls]),
            types.UserContent(parts=[types.Part(function_response=r) for r in self._responses]),
        ]
        self._responses = []
        self._queue(self._text_turn(summarize_results(latest_results(history) or [])))

    def _text_turn(self, text: str) -> _Turn:
        chunks: _Turn = [self._text(chunk, partial=True) for chunk in chunk_text(text)]
        return [*chunks, self._text(text, partial=False), self._usage(len(text.split())), self._turn_complete()]

    def _interrupted_turn(self, text: str) -> _Turn:
        chunks = chunk_text(text)
        spoken: _Turn = [self._text(chunk, partial=True) for chunk in chunks[: max(1, len(chunks) // 2)]]
        return [*spoken, LlmResponse(interrupted=True, model_version=self._model), self._turn_complete()]

    def _audio_turn(self, byte_count: int) -> _Turn:
        heard, said = heard_text(byte_count), audio_reply_text(byte_count)
        pcm = tone()
        size = -(-len(pcm) // TONE_CHUNKS)
        # Even-sized slices, so no chunk splits a 16-bit sample.
        size += size % 2
        audio: _Turn = [
            LlmResponse(
                content=types.ModelContent(
                    parts=[types.Part(inline_data=types.Blob(mime_type=OUTPUT_AUDIO_MIME, data=pcm[i : i + size]))]
                ),
                model_version=self._model,
            )
            for i in range(0, len(pcm), size)
        ]
        said_chunks = chunk_text(said)
        # Gemini interleaves transcription pieces with the audio they describe.
        interleaved: _Turn = []
        for i in range(max(len(audio), len(said_chunks))):
            if i < len(said_chunks):
                interleaved.append(self._transcription(said_chunks[i], output=True, finished=False))
            if i < len(audio):
                interleaved.append(audio[i])
        return [
            *(self._transcription(piece, output=False, finished=False) for piece in chunk_text(heard)),
            self._transcription(heard, output=False, finished=True),
            *interleaved,
            self._transcription(said, output=True, finished=True),
            self._usage(len(said.split())),
            self._turn_complete(),
        ]

    # ---- helpers -----------------------------------------------------------------------------

    async def _pause(self) -> None:
        """Waits ``chunk_delay`` between chunks, or less if the connection closes."""
        if self._chunk_delay <= 0:
            await asyncio.sleep(0)  # still yield control, as a network stream would
            return
        try:
            await asyncio.wait_for(self._closing.wait(), self._chunk_delay)
        except TimeoutError:
            pass

    def _queue(self, turn: _Turn) -> None:
        if not self._closed:
            self._turns.put_nowait(turn)

    def _text(self, text: str, *, partial: bool) -> LlmResponse:
        return LlmResponse(
            content=types.ModelContent(parts=[types.Part.from_text(text=text)]),
            partial=partial,
            model_version=self._model,
        )

    def _transcription(self, text: str, *, output: bool, finished: bool) -> LlmResponse:
        transcription = types.Transcription(text=text, finished=finished)
        # As Gemini's connection does: pieces are partial, the finished whole is not.
        if output:
            return LlmResponse(output_transcription=transcription, partial=not finished, model_version=self._model)
        return LlmResponse(input_transcription=transcription, partial=not finished, model_version=self._model)

    def _usage(self, output_words: int) -> LlmResponse:
        # As ADK's Gemini live connection reports it: a response of its own, once per model turn
        # (Gemini Live's usageMetadata is per turn, not a running total). Fake but plausible counts.
        return LlmResponse(
            usage_metadata=types.GenerateContentResponseUsageMetadata(
                prompt_token_count=16, candidates_token_count=output_words, total_token_count=16 + output_words,
            ),
            model_version=self._model,
        )

    def _turn_complete(self) -> LlmResponse:
        return LlmResponse(turn_complete=True, model_version=self._model)

    def _restart_audio_timer(self) -> None:
        self._cancel_audio_timer()
        self._audio_timer = asyncio.get_running_loop().create_task(self._flush_audio_after_pause())

    def _cancel_audio_timer(self) -> None:
        if self._audio_timer is not None:
            self._audio_timer.cancel()
            self._audio_timer = None

    async def _flush_audio_after_pause(self) -> None:
        await asyncio.sleep(self._audio_pause)
        self._audio_timer = None
        self._flush_audio()

    def _flush_audio(self) -> None:
        if self._audio_bytes:
            byte_count, self._audio_bytes = self._audio_bytes, 0
            self._queue(self._audio_turn(byte_count))
