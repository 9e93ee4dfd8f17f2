"""The AI SDK's rules for one assistant message's chunks: responses, steps and text blocks.

A `MessageWriter` makes the chunks that frame a message, whatever its content came from: `start`
and `finish` of each response, `start-step`/`finish-step` around each model call, and text or
reasoning blocks opened before their deltas and closed before the step ends (DESIGN.md section 2).
The converter (core/converter.py) builds on it with what ADK's events say.

Sans-IO: chunks are plain dicts ready to encode; nothing is read or written here.
"""

from __future__ import annotations

from typing import Any, Final

from .protocol import ClientVersion, finish_reason_for

__all__ = ["Chunk", "MessageWriter", "map_finish_reason"]

Chunk = dict[str, Any]

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
    # ADK 1.x passes Gemini Live's usage through unmapped: its output is `responseTokenCount`.
    ("responseTokenCount", "outputTokens"),
    ("totalTokenCount", "totalTokens"),
    ("thoughtsTokenCount", "reasoningTokens"),
    ("cachedContentTokenCount", "cachedInputTokens"),
)

_START_TYPES: Final = {"text": "text-start", "reasoning": "reasoning-start"}
_DELTA_TYPES: Final = {"text": "text-delta", "reasoning": "reasoning-delta"}
_END_TYPES: Final = {"text": "text-end", "reasoning": "reasoning-end"}


def map_finish_reason(adk_reason: str | None) -> str:
    if not adk_reason:
        return "stop"
    return _FINISH_REASONS.get(adk_reason, "other")


class _Block:
    """An open text or reasoning block, with its chunk types spelled out once (not per delta)."""

    __slots__ = ("delta", "end", "id")

    def __init__(self, kind: str, block_id: str) -> None:
        self.id = block_id
        self.delta = _DELTA_TYPES[kind]
        self.end = _END_TYPES[kind]


class MessageWriter:
    """The framing chunks of one assistant message, possibly spread over several responses."""

    def __init__(self, message_id: str, version: ClientVersion = 6) -> None:
        self.message_id = message_id
        self.version = version
        self.failed = False
        self.aborted = False
        self._blocks: dict[str, _Block] = {}
        self._block_seq = 0
        self._step_open = False
        # After tool outputs, the model's next words belong to a new step (a new model call).
        self._step_needs_break = False
        self._finish_reason: str | None = None
        self._usage: dict[str, int] = {}
        # The model that made the message's last LLM call (ADK's `modelVersion`), for the finish.
        self._model: str | None = None
        # (model, usage) of each LLM call whose usage was seen (one final event per call); read
        # and cleared by the turn, which hands them to the shell to count.
        self.usage_seen: list[tuple[str, dict[str, Any]]] = []

    # ---- response boundaries -------------------------------------------------------------

    def start(self) -> list[Chunk]:
        """The first chunk of a response; reusing the message id continues the same message."""
        return [{"type": "start", "messageId": self.message_id}]

    def waits_for_person(self) -> bool:
        """Whether the message now waits for a person's answer (the converter knows)."""
        return False

    def finish(self) -> list[Chunk]:
        """Close everything open and end the response.

        The finish reason is `tool-calls` when the message waits for a person, which is what lets
        the AI SDK hand the answer back (the seeds' deadlock came from not closing here).
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
        elif self.waits_for_person():
            reason = "tool-calls"
        else:
            reason = self._finish_reason or "stop"
        finish: Chunk = {"type": "finish", "finishReason": finish_reason_for(reason, self.version)}
        if self._usage:
            metadata: dict[str, Any] = {"usage": dict(self._usage)}
            if self._model:
                metadata["model"] = self._model
            finish["messageMetadata"] = metadata
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

    # ---- blocks and steps ----------------------------------------------------------------

    def _model_output(self, out: list[Chunk]) -> None:
        """The model is speaking: open a step, or start a new one after tool results."""
        if self._step_needs_break and self._step_open:
            out.extend(self._close_blocks())
            out.append({"type": "finish-step"})
            self._step_open = False
        self._step_needs_break = False
        if not self._step_open:
            out.append({"type": "start-step"})
            self._step_open = True

    def _tool_results(self) -> None:
        """Outputs belong to the step that made the call; in a continuation no step is open and,
        like the AI SDK's own streamText, none is opened just for them."""
        self._step_needs_break = self._step_open

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

    def _set_finish_reason(self, adk_reason: str) -> None:
        self._finish_reason = map_finish_reason(adk_reason)

    def _interrupted(self, out: list[Chunk]) -> None:
        # Live mode: the person spoke over the model. What was said so far stands.
        out.extend(self._close_blocks())
        self._finish_reason = "interrupted"

    def _add_usage(self, usage: dict[str, Any], model: Any = None) -> None:
        """One LLM call's usage (ADK reports it on the call's final, non-partial event)."""
        if isinstance(model, str) and model:
            self._model = model
        else:
            model = ""
        self.usage_seen.append((model, usage))
        for adk_name, sdk_name in _USAGE_FIELDS:
            value = usage.get(adk_name)
            if isinstance(value, int):
                self._usage[sdk_name] = self._usage.get(sdk_name, 0) + value
