"""ADK events in, AI SDK UI message chunks out: the sans-IO heart of the gateway.

A `Converter` turns the events of ADK runs into the chunks of ONE assistant message. It owns the
rules the AI SDK client enforces on a stream (DESIGN.md section 2): a text or reasoning block is
opened before its deltas and closed before `finish-step`; a tool part exists before any chunk that
names its `toolCallId`; ADK's streamed `partial` text is not repeated when the aggregated final
event arrives; ADK's confirmation machinery (`adk_request_confirmation` and its placeholder
response) never reaches the browser as tool parts of its own.

It does no I/O and reads no clock: events are plain dicts straight from the upstream JSON (the
upstream is trusted, so nothing is validated chunk by chunk on this hot path), chunks are plain
dicts ready to encode. Callers feed events and decide when a response ends:
`finish()` when the run is over or waits for a person.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from .approvals import CallState, GatedCall, Outcome, refusal_code
from .config import ToolPolicy
from .protocol import ClientVersion, finish_reason_for

__all__ = ["CONFIRMATION_TOOL", "ApprovalRequested", "Converter", "map_finish_reason"]

Chunk = dict[str, Any]

CONFIRMATION_TOOL: Final = "adk_request_confirmation"

# google.genai FinishReason names -> AI SDK finish reasons.
_FINISH_REASONS: Final = {
    "STOP": "stop",
    "MAX_TOKENS": "length",
    "SAFETY": "content-filter",
    "RECITATION": "content-filter",
    "BLOCKLIST": "content-filter",
    "PROHIBITED_CONTENT": "content-filter",
    "SPII": "content-filter",
    "IMAGE_SAFETY": "content-filter",
    "IMAGE_PROHIBITED_CONTENT": "content-filter",
    "IMAGE_RECITATION": "content-filter",
    "MALFORMED_FUNCTION_CALL": "error",
}

# Usage fields as Gemini reports them -> the names the AI SDK uses for LanguageModelUsage.
_USAGE_FIELDS: Final = (
    ("promptTokenCount", "inputTokens"),
    ("candidatesTokenCount", "outputTokens"),
    ("totalTokenCount", "totalTokens"),
    ("thoughtsTokenCount", "reasoningTokens"),
    ("cachedContentTokenCount", "cachedInputTokens"),
)


# ADK serialises bytes as URL-safe base64; browsers (atob, data: URLs) want the standard alphabet.
_STANDARD_BASE64 = str.maketrans("-_", "+/")


def map_finish_reason(adk_reason: str | None) -> str:
    if not adk_reason:
        return "stop"
    return _FINISH_REASONS.get(adk_reason, "other")


def _approval_request(approval_id: str, tool_call_id: str, hint: str | None) -> Chunk:
    chunk: Chunk = {"type": "tool-approval-request", "approvalId": approval_id, "toolCallId": tool_call_id}
    if hint:
        # ai 6 and ai 7 keep this as the tool part's `approval.descriptor`, for the UI to show.
        chunk["approvalDescriptor"] = {"hint": hint}
    return chunk


def _is_default_hint(hint: Any) -> bool:
    # ADK's generated hint instructs the model, not the person; a tool's own hint is worth showing.
    return not isinstance(hint, str) or hint.startswith("Please approve or reject the tool call ")


@dataclass(frozen=True)
class ApprovalRequested:
    """ADK paused a tool call for a person's decision (native `require_confirmation`)."""

    approval_id: str
    tool_call_id: str
    tool_name: str
    args: dict[str, Any]
    hint: str | None = None


class _Block:
    """An open text or reasoning block, with its chunk types spelled out once (not per delta)."""

    __slots__ = ("delta", "end", "id")

    def __init__(self, kind: str, block_id: str) -> None:
        self.id = block_id
        self.delta = _DELTA_TYPES[kind]
        self.end = _END_TYPES[kind]


_START_TYPES: Final = {"text": "text-start", "reasoning": "reasoning-start"}
_DELTA_TYPES: Final = {"text": "text-delta", "reasoning": "reasoning-delta"}
_END_TYPES: Final = {"text": "text-end", "reasoning": "reasoning-end"}

# The read-only stand-in for a set nothing was added to yet (see Converter._grow).
_NONE: Final[frozenset[str]] = frozenset()


@dataclass
class Converter:
    """Chunks for one assistant message, possibly spread over several ADK runs and responses.

    `known_tool_calls` are tool call ids the client already holds in this message (a continuation
    after an approval): their outputs need no new tool part. `denied_tool_calls` are calls the
    person rejected: ADK reports them as an error response, the client wants `tool-output-denied`.
    `policy` says which tools the gateway gates (approval, browser): their calls are expected to
    be announced by the plugin through `gate_opened`, and the message waits until they are.
    """

    message_id: str
    version: ClientVersion = 6
    known_tool_calls: Iterable[str] = ()
    denied_tool_calls: Iterable[str] = ()
    policy: Callable[[str], ToolPolicy] | None = None

    approvals: list[ApprovalRequested] = field(default_factory=list, init=False)
    """Approvals requested during the current response; read by the caller at `finish()`."""
    failed: bool = field(default=False, init=False)
    aborted: bool = field(default=False, init=False)
    bypassed: list[str] = field(default_factory=list, init=False)
    """Gated tools that answered without the plugin asking (it is not installed?); read and cleared by the caller."""
    abandoned: list[tuple[str, str | None]] = field(default_factory=list, init=False)
    """(tool call id, refusal code) of announced calls that ADK answered before the gateway released
    them: the plugin stopped waiting. Read and cleared by the caller, which ends them in its ledger."""

    # Sets of tool call ids that most messages never touch. Until something is added they are the
    # shared empty frozenset (reads work, `_grow` makes the set), as an empty set costs 216 bytes
    # and a held or finished run keeps its converter. (Not annotated: they are no dataclass fields.)
    _denied = _NONE
    _awaiting_confirmation = _NONE
    _gates_expected = _NONE
    _gates_open = _NONE
    _gates_seen = _NONE
    _held_inputs = _NONE
    _answered_in_browser = _NONE

    _tools_shown = _NONE

    def __post_init__(self) -> None:
        if self.known_tool_calls:
            self._tools_shown = set(self.known_tool_calls)
        if self.denied_tool_calls:
            self._denied = set(self.denied_tool_calls)
        # Copied into the sets above: a held run keeps neither the caller's collections nor
        # (through them) its turn plan. An empty frozenset is a 216-byte object of its own.
        self.known_tool_calls = self.denied_tool_calls = ()
        self._blocks: dict[str, _Block] = {}
        self._block_seq = 0
        self._step_open = False
        # After tool outputs, the model's next words belong to a new step (a new model call).
        self._step_needs_break = False
        # Text already streamed as partials; the aggregated final event must not repeat it.
        self._streamed_partials = False
        self._finish_reason: str | None = None
        self._usage: dict[str, int] = {}
        # Gateway-gated calls (`_gates_expected`, `_gates_open`, `_gates_seen`, `_held_inputs`):
        # seen in the model's output but not yet announced by the plugin, announced and waiting for
        # a person, and held back from the browser until approved. `_answered_in_browser`: calls
        # whose output the browser produced itself (ADK's echo of it is not news to the client).
        # Live transcriptions: the model's (streamed as text) and the person's (a data part).
        self._streamed_transcript = False
        self._heard_text = ""
        self._heard_seq = 0

    def _grow(self, name: str) -> set[str]:
        """The set attribute `name`, made a real set on first use."""
        found = getattr(self, name)
        if found is _NONE:
            found = set()
            setattr(self, name, found)
        return found

    def _drop(self, name: str, item: str) -> None:
        found = getattr(self, name)
        if item in found:  # never true of the empty stand-in
            found.discard(item)

    @property
    def gates_open(self) -> bool:
        """Some gated call was announced and is not released yet. `feed` never opens one (only
        `gate_opened` does), so while this is false no event can make the message wait."""
        return bool(self._gates_open)

    @property
    def waiting_for_person(self) -> bool:
        """Every gated call of the turn is announced and at least one waits for a person."""
        return bool(self._gates_open) and not self._gates_expected

    # ---- response boundaries -------------------------------------------------------------

    def start(self) -> list[Chunk]:
        """The first chunk of a response; reusing the message id continues the same message."""
        self.approvals = []
        return [{"type": "start", "messageId": self.message_id}]

    def finish(self) -> list[Chunk]:
        """Close everything open and end the response.

        The finish reason is `tool-calls` when the message now waits for a person, which is what
        lets the AI SDK hand the answer back (the seeds' deadlock came from not closing here).
        """
        if self.aborted:
            return []
        out = self._close_blocks()
        if self._step_open:
            out.append({"type": "finish-step"})
            self._step_open = False
        self._step_needs_break = False
        if self.failed:
            reason = "error"
        elif self.approvals or self._awaiting_confirmation or self._gates_open:
            reason = "tool-calls"
        else:
            reason = self._finish_reason or "stop"
        finish: Chunk = {"type": "finish", "finishReason": finish_reason_for(reason, self.version)}
        if self._usage:
            finish["messageMetadata"] = {"usage": dict(self._usage)}
        out.append(finish)
        return out

    def abort(self) -> list[Chunk]:
        """The browser stopped the response: close what is open and say so; no `finish` follows."""
        out = self._close_blocks()
        if self._step_open:
            out.append({"type": "finish-step"})
            self._step_open = False
        out.append({"type": "abort"})
        self.aborted = True
        return out

    def error(self, text: str) -> list[Chunk]:
        """An error the person should see; the message can still be finished afterwards."""
        out = self._close_blocks()
        if not self.failed:
            # A crashing ADK run reports itself twice (an errorCode event, then the run error).
            out.append({"type": "error", "errorText": text})
        self.failed = True
        return out

    # ---- events --------------------------------------------------------------------------

    def feed(self, event: dict[str, Any]) -> list[Chunk]:
        """The chunks one ADK event produces (often none)."""
        if "error" in event and "content" not in event and "author" not in event:
            # /run_sse reports a failed run as {"error": ..., "error_details": ...}.
            return self.error(str(event.get("error") or "the agent run failed"))

        out: list[Chunk] = []
        partial = event.get("partial")
        content = event.get("content")
        parts = content.get("parts") if isinstance(content, dict) else None
        if parts:
            if partial:
                for part in parts:
                    text = part.get("text")
                    if text:
                        self._streamed_partials = True
                        self._delta(out, "reasoning" if part.get("thought") else "text", text)
            else:
                self._final_parts(out, parts, event)
        if not partial:
            reason = event.get("finishReason")
            if reason:
                self._finish_reason = map_finish_reason(reason)
            usage = event.get("usageMetadata")
            if usage:
                self._add_usage(usage)
        if (
            "interrupted" in event or "outputTranscription" in event or "inputTranscription" in event
            or "errorCode" in event or "errorMessage" in event
        ):
            self._rare(out, event, bool(partial))  # most events have none of these keys
        return out

    def _rare(self, out: list[Chunk], event: dict[str, Any], partial: bool) -> None:
        """Live mode's interruptions and transcriptions, and error codes."""
        if event.get("interrupted"):
            # Live mode: the person spoke over the model. What was said so far stands.
            out.extend(self._close_blocks())
            self._finish_reason = "interrupted"
        transcript = event.get("outputTranscription")
        if transcript:
            self._transcript(out, transcript, partial)
        heard = event.get("inputTranscription")
        if heard:
            out.append(self._heard(heard, partial))
        error_code = event.get("errorCode")
        error_message = event.get("errorMessage")
        if error_code or error_message:
            text = f"{error_code}: {error_message}" if error_code and error_message else str(error_message or error_code)
            out.extend(self.error(text))

    def _final_parts(self, out: list[Chunk], parts: list[dict[str, Any]], event: dict[str, Any]) -> None:
        streamed, self._streamed_partials = self._streamed_partials, False
        for part in parts:
            text = part.get("text")
            if text is not None:
                if not streamed and text:
                    kind = "reasoning" if part.get("thought") else "text"
                    self._delta(out, kind, text)
                    out.extend(self._close_block(kind))
                continue
            call = part.get("functionCall")
            if call is not None:
                self._function_call(out, call)
                continue
            response = part.get("functionResponse")
            if response is not None:
                self._function_response(out, response)
                continue
            inline = part.get("inlineData")
            if inline is not None:
                self._model_output(out)
                mime = inline.get("mimeType") or "application/octet-stream"
                data = (inline.get("data") or "").translate(_STANDARD_BASE64)
                if mime.startswith("audio/pcm"):
                    # Live audio: many small pieces to play as they come, not files to keep.
                    out.append({"type": "data-pcm", "data": {"mimeType": mime, "data": data}, "transient": True})
                else:
                    out.append({"type": "file", "mediaType": mime, "url": f"data:{mime};base64,{data}"})
                continue
            file_data = part.get("fileData")
            if file_data is not None and file_data.get("fileUri"):
                self._model_output(out)
                out.append(
                    {
                        "type": "file",
                        "mediaType": file_data.get("mimeType") or "application/octet-stream",
                        "url": file_data["fileUri"],
                    }
                )
            # executableCode / codeExecutionResult and future part kinds have no UI chunk yet.
        # The aggregated final event closes whatever its partials opened.
        if streamed:
            out.extend(self._close_blocks())

    def _function_call(self, out: list[Chunk], call: dict[str, Any]) -> None:
        call_id = call.get("id") or ""
        name = call.get("name") or ""
        args = call.get("args") or {}
        if name == CONFIRMATION_TOOL:
            self._confirmation_call(out, call_id, args)
            return
        self._show_tool(out, call_id, name, args)

    def _confirmation_call(self, out: list[Chunk], approval_id: str, args: dict[str, Any]) -> None:
        original = args.get("originalFunctionCall") or {}
        tool_call_id = original.get("id")
        if not tool_call_id or not approval_id:
            return
        name = original.get("name") or ""
        tool_args = original.get("args") or {}
        self._show_tool(out, tool_call_id, name, tool_args)
        self._grow("_awaiting_confirmation").add(tool_call_id)
        confirmation = args.get("toolConfirmation") or {}
        self.approvals.append(
            ApprovalRequested(approval_id, tool_call_id, name, tool_args, confirmation.get("hint"))
        )
        hint = confirmation.get("hint")
        out.append(_approval_request(approval_id, tool_call_id, None if _is_default_hint(hint) else hint))

    def _show_tool(self, out: list[Chunk], call_id: str, name: str, args: Any) -> None:
        policy = self.policy(name) if self.policy is not None else None
        if policy is not None and policy.gated and call_id not in self._gates_seen:
            self._grow("_gates_seen").add(call_id)
            self._grow("_gates_expected").add(call_id)
        if call_id in self._tools_shown:
            return
        self._model_output(out)
        self._grow("_tools_shown").add(call_id)
        out.append({"type": "tool-input-start", "toolCallId": call_id, "toolName": name})
        if policy is not None and policy.approval and policy.runs_in == "browser":
            # The AI SDK runs a browser tool (onToolCall) on tool-input-available: before the person
            # approved, the input travels as a delta, which shows it without running it.
            self._grow("_held_inputs").add(call_id)
            out.append({"type": "tool-input-delta", "toolCallId": call_id, "inputTextDelta": orjson.dumps(args).decode()})
        else:
            out.append({"type": "tool-input-available", "toolCallId": call_id, "toolName": name, "input": args})

    # ---- gateway-gated calls (the plugin path) ---------------------------------------------

    def gate_opened(self, call: GatedCall) -> list[Chunk]:
        """The plugin announced a gated call: show it and, if it needs one, ask for approval."""
        out: list[Chunk] = []
        self._show_tool(out, call.tool_call_id, call.tool, call.args)
        self._grow("_gates_seen").add(call.tool_call_id)
        self._drop("_gates_expected", call.tool_call_id)
        self._grow("_gates_open").add(call.tool_call_id)
        if call.state is CallState.AWAITING_APPROVAL:
            out.append(_approval_request(call.id, call.tool_call_id, call.policy.hint))
        if call.released:
            out += self.gate_changed(call)
        return out

    def gate_announced(self, tool_call_id: str) -> bool:
        return tool_call_id in self._gates_open

    def gate_changed(self, call: GatedCall) -> list[Chunk]:
        """A gated call moved on (decided, answered, timed out); returns what the browser must see now."""
        call_id = call.tool_call_id
        if not call.released:
            if call.state is CallState.AWAITING_OUTPUT and call_id in self._held_inputs:
                # Approved: hand the call to the browser. No new step: the chunk updates the tool
                # part where it stands (a new step would make the client add a second part).
                self._drop("_held_inputs", call_id)
                return [{"type": "tool-input-available", "toolCallId": call_id, "toolName": call.tool, "input": call.args}]
            return []
        self._end_gate(call_id)
        if call.shown_as_denied:
            self._grow("_denied").add(call_id)
        elif call.outcome in (Outcome.OUTPUT, Outcome.OUTPUT_ERROR):
            self._grow("_answered_in_browser").add(call_id)
        return []

    def _end_gate(self, call_id: str) -> None:
        self._drop("_gates_open", call_id)
        self._drop("_gates_expected", call_id)
        self._drop("_held_inputs", call_id)

    def _function_response(self, out: list[Chunk], response: dict[str, Any]) -> None:
        call_id = response.get("id") or ""
        name = response.get("name") or ""
        if name == CONFIRMATION_TOOL or call_id in self._awaiting_confirmation:
            # ADK's own bookkeeping: the answer echo, or the "requires confirmation" placeholder.
            return
        if call_id in self._answered_in_browser:
            return
        if call_id not in self._tools_shown:
            # The client rejects a tool chunk for a call it has never seen: introduce it first.
            self._show_tool(out, call_id, name, {})
        result = response.get("response")
        refusal = refusal_code(result)
        if call_id in self._gates_expected:
            self._drop("_gates_expected", call_id)
            # Never announced: either the plugin refused the call before the gateway could announce
            # it (gateway unreachable, no policy) or the gateway refused it at once, both marked;
            # or the tool ran without the plugin asking, which is what the bypass alarm is for.
            if refusal is None:
                self.bypassed.append(name)
        elif call_id in self._gates_open:
            # Announced, never released, yet answered: the plugin stopped waiting (its long poll
            # ended) and answered ADK itself, since it only runs a tool on the gateway's verdict.
            # Nobody waits for a person here any more, so what the model says next is not held
            # back: it streams on in one response instead of one closed response per event.
            self._end_gate(call_id)
            self.abandoned.append((call_id, refusal))
        # Outputs belong to the step that made the call; in a continuation no step is open and,
        # like the AI SDK's own streamText, none is opened just for them.
        self._step_needs_break = self._step_open
        if call_id in self._denied:
            out.append({"type": "tool-output-denied", "toolCallId": call_id})
        elif isinstance(result, dict) and isinstance(result.get("error"), str) and len(result) == (1 if refusal is None else 2):
            # ADK's convention for a failed tool: {"error": "..."}, maybe marked as a refusal (the
            # marker is the gateway's bookkeeping, not something to show).
            out.append({"type": "tool-output-error", "toolCallId": call_id, "errorText": result["error"]})
        else:
            out.append({"type": "tool-output-available", "toolCallId": call_id, "output": result})

    # ---- live-mode transcriptions ----------------------------------------------------------

    def _transcript(self, out: list[Chunk], transcript: dict[str, Any], partial: bool) -> None:
        """What the model said aloud, as the message's text: partials stream, the final closes."""
        text = transcript.get("text") or ""
        if partial:
            if text:
                self._streamed_transcript = True
                self._delta(out, "text", text)
            return
        if not self._streamed_transcript and text:
            self._delta(out, "text", text)
        self._streamed_transcript = False
        out.extend(self._close_block("text"))

    def _heard(self, transcript: dict[str, Any], partial: bool) -> Chunk:
        """What the person said aloud: one data part, updated in place (same id) as it grows."""
        text = transcript.get("text") or ""
        if partial:
            self._heard_text += text
        else:
            self._heard_text = text
        chunk: Chunk = {
            "type": "data-transcription",
            "id": f"heard-{self._heard_seq}",
            "data": {"role": "user", "text": self._heard_text, "finished": not partial},
        }
        if not partial:
            self._heard_seq += 1
            self._heard_text = ""
        return chunk

    # ---- blocks and steps ----------------------------------------------------------------

    def _model_output(self, out: list[Chunk]) -> None:
        """The model is speaking: open a step, or start a new one after tool results."""
        if self._step_needs_break and self._step_open:
            out.extend(self._close_blocks())
            out.append({"type": "finish-step"})
            self._step_open = False
        self._step_needs_break = False
        self._ensure_step(out)

    def _ensure_step(self, out: list[Chunk]) -> None:
        if not self._step_open:
            out.append({"type": "start-step"})
            self._step_open = True

    def _delta(self, out: list[Chunk], kind: str, text: str) -> None:
        block = self._blocks.get(kind)
        if block is None:
            self._model_output(out)
            # Thinking comes before speaking; the client renders parts in the order they open.
            out.extend(self._close_block("reasoning" if kind == "text" else "text"))
            self._block_seq += 1
            block = _Block(kind, f"{kind[0]}{self._block_seq}")
            self._blocks[kind] = block
            out.append({"type": _START_TYPES[kind], "id": block.id})
        out.append({"type": block.delta, "id": block.id, "delta": text})

    def _close_block(self, kind: str) -> list[Chunk]:
        block = self._blocks.pop(kind, None)
        return [{"type": block.end, "id": block.id}] if block else []

    def _close_blocks(self) -> list[Chunk]:
        if not self._blocks:
            return []
        out = [{"type": b.end, "id": b.id} for b in self._blocks.values()]
        self._blocks.clear()
        return out

    def _add_usage(self, usage: dict[str, Any]) -> None:
        for adk_name, sdk_name in _USAGE_FIELDS:
            value = usage.get(adk_name)
            if isinstance(value, int):
                self._usage[sdk_name] = self._usage.get(sdk_name, 0) + value
