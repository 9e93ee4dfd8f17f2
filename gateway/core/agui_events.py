"""ADK events in, AG-UI 1.0 events out, for one run: the sans-IO core of the AG-UI protocol (issue #40).

An `AguiRun` turns the events of ONE ADK run (the same decoded events core/converter.py takes,
core/adk_events.py) into AG-UI 1.0 events as plain dicts with the spec's camelCase fields, ready to
encode. It owns the order the AG-UI client enforces (`@ag-ui/client`'s verify pipeline): RUN_STARTED
first; a text or reasoning message is started before its content and ended before anything else
speaks; a tool call is started, given its arguments and ended before its result; nothing follows
RUN_FINISHED or RUN_ERROR. Which message is open, and whether the run is still going, is explicit
state (`Phase`, `_open`), so a caller cannot produce an event out of order by calling in an odd order.

Not here yet (docs/ag-ui.md, "Not yet"): approvals as interrupts, frontend tools, the route. A run
that asks ADK for a confirmation ends in RUN_ERROR rather than pretending to succeed (fail closed).
It does no I/O and reads no clock: ids come from the run id the caller gives.
"""

from __future__ import annotations

import enum
from typing import Any, Final

import orjson

from .adk_events import UNSET, AdkEvent, as_event, error_code_text, run_failed_text

__all__ = ["CONFIRMATION_UNSUPPORTED", "AguiEvent", "AguiRun", "Phase"]

AguiEvent = dict[str, Any]

# ADK's tool that asks a person to confirm a call (as core/converter.py names it).
_CONFIRMATION_TOOL: Final = "adk_request_confirmation"
CONFIRMATION_UNSUPPORTED: Final = (
    "This run needs a person to approve a tool call, and approvals over AG-UI are not served yet (issue #40)."
)

# ADK's usageMetadata fields -> AG-UI TokenUsage fields. Gemini counts thoughts apart from the
# candidates; AG-UI's outputTokens includes reasoning, so they are added in (`_add_usage`).
_USAGE_FIELDS: Final = (
    ("promptTokenCount", "inputTokens"),
    ("candidatesTokenCount", "outputTokens"),
    ("thoughtsTokenCount", "reasoningTokens"),
    ("cachedContentTokenCount", "cachedInputTokens"),
)


class Phase(enum.Enum):
    """Where the run is: only RUNNING takes ADK events; the two ends take nothing more."""

    NEW = "new"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"


class _Open:
    """The message being streamed: text or reasoning, and its id (AG-UI allows one kind at a time here)."""

    __slots__ = ("id", "kind")

    def __init__(self, kind: str, message_id: str) -> None:
        self.kind = kind
        self.id = message_id


class AguiRun:
    """The AG-UI events of one run on one thread: `start`, `feed` each ADK event, then `finish`.

    `error` ends the run as RUN_ERROR with the sentence the AI SDK routes show for the same failure;
    after either end every call returns no events.
    """

    def __init__(self, thread_id: str, run_id: str) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.phase = Phase.NEW
        self._open: _Open | None = None
        self._seq = 0
        # Text already streamed as partials; ADK's aggregated final event repeats it.
        self._streamed_partials = False
        # The assistant message tool calls belong to (the model's text of the same response).
        self._assistant_id: str | None = None
        self._calls_shown: dict[str, None] = {}
        self._usage: dict[str, dict[str, int]] = {}

    # ---- the run's ends ------------------------------------------------------------------

    def start(self) -> list[AguiEvent]:
        if self.phase is not Phase.NEW:
            return []
        self.phase = Phase.RUNNING
        return [{"type": "RUN_STARTED", "threadId": self.thread_id, "runId": self.run_id, "protocolVersion": "1.0"}]

    def finish(self) -> list[AguiEvent]:
        """The run ended upstream: close what is open and report success (nothing after an error)."""
        if self.phase is not Phase.RUNNING:
            return []
        out = self._close()
        self.phase = Phase.FINISHED
        event: AguiEvent = {
            "type": "RUN_FINISHED", "threadId": self.thread_id, "runId": self.run_id, "outcome": {"type": "success"},
        }
        if self._usage:
            event["usage"] = self._usage_list()
        out.append(event)
        return out

    def error(self, text: str, code: str | None = None) -> list[AguiEvent]:
        """The run failed: the open message is ended (the client keeps what was said), then RUN_ERROR."""
        if self.phase is not Phase.RUNNING:
            return []
        out = self._close()
        self.phase = Phase.FAILED
        event: AguiEvent = {"type": "RUN_ERROR", "message": text}
        if code:
            event["code"] = code
        if self._usage:
            event["usage"] = self._usage_list()
        out.append(event)
        return out

    # ---- ADK events ----------------------------------------------------------------------

    def feed(self, event: AdkEvent | dict[str, Any]) -> list[AguiEvent]:
        """The AG-UI events one ADK event produces (often none)."""
        if self.phase is not Phase.RUNNING:
            return []
        if type(event) is not AdkEvent:
            event = as_event(event)
        if event.error is not UNSET and event.content is UNSET and event.author is UNSET:
            # /run_sse reports a failed run as {"error": ..., "error_details": ...}.
            return self.error(run_failed_text(event.error))
        out: list[AguiEvent] = []
        content = event.content
        parts = content.get("parts") if isinstance(content, dict) else None
        if parts:
            if event.partial:
                self._partial_parts(out, parts)
            else:
                self._final_parts(out, parts)
        if not event.partial and event.usageMetadata:
            # Partial events repeat a running count; the final one is the call's (counted once).
            self._add_usage(event.usageMetadata, event.modelVersion)
        if self.phase is Phase.RUNNING and (event.errorCode or event.errorMessage):
            code = str(event.errorCode) if event.errorCode else None  # the schema wants a string
            out += self.error(error_code_text(event.errorCode, event.errorMessage), code=code)
        return out

    def _partial_parts(self, out: list[AguiEvent], parts: list[dict[str, Any]]) -> None:
        # Partial function calls are repeated whole by the final event: only text streams.
        for part in parts:
            text = part.get("text")
            if text:
                self._streamed_partials = True
                self._say(out, "reasoning" if part.get("thought") else "text", text)

    def _final_parts(self, out: list[AguiEvent], parts: list[dict[str, Any]]) -> None:
        streamed, self._streamed_partials = self._streamed_partials, False
        for part in parts:
            if self.phase is not Phase.RUNNING:
                return
            if (call := part.get("functionCall")) is not None:
                self._function_call(out, call)
            elif (response := part.get("functionResponse")) is not None:
                self._function_response(out, response)
            elif part.get("text") and not streamed:
                self._say(out, "reasoning" if part.get("thought") else "text", part["text"])
                out += self._close()
            # Media and code parts have no AG-UI event in this slice (docs/ag-ui.md).
        if streamed:
            out += self._close()

    # ---- messages ------------------------------------------------------------------------

    def _next_id(self) -> str:
        self._seq += 1
        return f"{self.run_id}-{self._seq}"

    def _say(self, out: list[AguiEvent], kind: str, text: str) -> None:
        """Text or reasoning, in the open message of its kind, or a new one (closing the other kind)."""
        if self._open is not None and self._open.kind != kind:
            out += self._close()
        if self._open is None:
            self._open = _Open(kind, self._next_id())
            if kind == "text":
                self._assistant_id = self._open.id
                out.append({"type": "TEXT_MESSAGE_START", "messageId": self._open.id, "role": "assistant"})
            else:
                out.append({"type": "REASONING_START", "messageId": self._open.id})
                out.append({"type": "REASONING_MESSAGE_START", "messageId": self._open.id, "role": "reasoning"})
        content = "TEXT_MESSAGE_CONTENT" if kind == "text" else "REASONING_MESSAGE_CONTENT"
        out.append({"type": content, "messageId": self._open.id, "delta": text})

    def _close(self) -> list[AguiEvent]:
        opened, self._open = self._open, None
        if opened is None:
            return []
        if opened.kind == "text":
            return [{"type": "TEXT_MESSAGE_END", "messageId": opened.id}]
        return [
            {"type": "REASONING_MESSAGE_END", "messageId": opened.id},
            {"type": "REASONING_END", "messageId": opened.id},
        ]

    # ---- tool calls ----------------------------------------------------------------------

    def _function_call(self, out: list[AguiEvent], call: dict[str, Any]) -> None:
        if call.get("name") == _CONFIRMATION_TOOL:
            # ADK paused the run for a person; without interrupts the client could only see a call
            # that never gets a result. Say so instead (issue #40 brings interrupts).
            out += self.error(CONFIRMATION_UNSUPPORTED, code="approval_unsupported")
            return
        self._show_call(out, call.get("id") or "", call.get("name") or "", call.get("args") or {})

    def _show_call(self, out: list[AguiEvent], call_id: str, name: str, args: Any) -> None:
        if call_id in self._calls_shown:
            return
        out += self._close()
        self._calls_shown[call_id] = None
        start: AguiEvent = {"type": "TOOL_CALL_START", "toolCallId": call_id, "toolCallName": name}
        if self._assistant_id is not None:
            start["parentMessageId"] = self._assistant_id
        # ADK gives a call's arguments whole: one ARGS event carries them.
        out += [
            start,
            {"type": "TOOL_CALL_ARGS", "toolCallId": call_id, "delta": orjson.dumps(args).decode()},
            {"type": "TOOL_CALL_END", "toolCallId": call_id},
        ]

    def _function_response(self, out: list[AguiEvent], response: dict[str, Any]) -> None:
        call_id = response.get("id") or ""
        if call_id not in self._calls_shown:
            # A result for a call this run never showed (a resumed one): the client needs its call.
            self._show_call(out, call_id, response.get("name") or "", {})
        out += self._close()
        # What the model says after tool results is a new assistant message.
        self._assistant_id = None
        out.append({
            "type": "TOOL_CALL_RESULT", "messageId": self._next_id(), "toolCallId": call_id, "role": "tool",
            "content": orjson.dumps(response.get("response")).decode(),
        })

    # ---- usage ---------------------------------------------------------------------------

    def _add_usage(self, usage: dict[str, Any], model: Any) -> None:
        entry = self._usage.setdefault(model if isinstance(model, str) else "", {})
        for adk_name, agui_name in _USAGE_FIELDS:
            value = usage.get(adk_name)
            if isinstance(value, int):
                entry[agui_name] = entry.get(agui_name, 0) + value
        thoughts = usage.get("thoughtsTokenCount")
        if isinstance(thoughts, int):
            entry["outputTokens"] = entry.get("outputTokens", 0) + thoughts

    def _usage_list(self) -> list[dict[str, Any]]:
        """One TokenUsage per model; totalTokens is input plus output, as the spec defines it."""
        out = []
        for model, counts in self._usage.items():
            entry: dict[str, Any] = {**({"model": model} if model else {}), **counts}
            entry["totalTokens"] = counts.get("inputTokens", 0) + counts.get("outputTokens", 0)
            out.append(entry)
        return out
