"""The chat's chunks in, AG-UI 1.0 events out, for one AG-UI run: the sans-IO core of the AG-UI route.

An AG-UI run reads the same chat as an AI SDK request does: the chat's machine turns ADK's events
into the AI SDK's UI message chunks (ai 7's, the richest: automatic approvals, approval responses),
and an `AguiStream` turns those chunks into AG-UI 1.0 events as plain dicts with the spec's
camelCase fields. So an approval, a browser tool, an approvers' decision, a restart's rebuild and a
replica's relay reach an AG-UI client through the one engine that serves the AI SDK, and nothing of
it is decided here: this module only says it in AG-UI's words.

It owns the order `@ag-ui/client`'s verify pipeline enforces (RUN_STARTED first; a message or
reasoning span started before its content and ended before anything else speaks; a tool call's
start, arguments and end before its result; everything closed and nothing after the run's end),
and how the run ends: an approval the chatting user answers ends it with an `interrupt` outcome
bound to the call, browser tools handed over end it as a success naming them in
`pendingToolCallIds`, an `abort` ends it `cancelled`, an `error` chunk is RUN_ERROR. A call its
approvers decide is not an interrupt (the requester cannot answer it): it shows as an activity
(`adk_gateway.approval`) updated in place while the run waits for them (docs/ag-ui.md).

No sockets, clocks or globals: the caller gives the run's ids, the time the run started and each
tool's approval timeout (for `expiresAt`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, Final

import orjson

from .agui_interrupts import interrupt

__all__ = ["APPROVAL_ACTIVITY", "AguiEvent", "AguiStream", "Phase"]

AguiEvent = dict[str, Any]

PROTOCOL_VERSION: Final = "1.0"
# The activity a call its approvers decide shows as, and the custom event of a rule's decision.
APPROVAL_ACTIVITY: Final = "adk_gateway.approval"
class Phase(enum.Enum):
    """Where the run is: only RUNNING takes chunks; either end takes nothing more."""

    NEW = "new"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"


class _Call:
    """One tool call as this run has shown it."""

    __slots__ = ("args_sent", "ended", "name", "result", "started_here")

    def __init__(self, name: str) -> None:
        self.name = name
        self.started_here = self.args_sent = self.ended = self.result = False


class AguiStream:
    """The AG-UI events of one run on one thread: `start`, `feed` each chunk, then `end`.

    `now` is the run's start (seconds since the epoch) and `timeout_of(tool)` the tool's approval
    timeout in seconds, or None: together they give an interrupt's `expiresAt`.
    """

    def __init__(
        self, thread_id: str, run_id: str, *, now: float = 0.0,
        timeout_of: Callable[[str], float | None] = lambda _tool: None,
    ) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.phase = Phase.NEW
        self._now = now
        self._timeout_of = timeout_of
        # The open text or reasoning message: (kind, AG-UI message id), and the chunk id it came from.
        self._open: tuple[str, str] | None = None
        self._open_chunk_id: str | None = None
        self._seq = 0
        self._parent: str | None = None
        self._calls: dict[str, _Call] = {}
        # Approvals the chatting user answers, still open: approval id -> interrupt.
        self._asked: dict[str, AguiEvent] = {}
        # Approvals decided without them (a rule, approvers): approval id -> the call and the rule.
        self._decided: dict[str, dict[str, str]] = {}
        # Browser tools handed over (their input is available) and not answered in this run.
        self._handed: dict[str, None] = {}
        self._usage: dict[str, dict[str, int]] = {}  # model -> AG-UI TokenUsage counts
        # How the run ended (the outcome's type, or "error"); None while it runs.
        self.outcome: str | None = None

    # ---- the run's ends ------------------------------------------------------------------

    def start(self) -> list[AguiEvent]:
        if self.phase is not Phase.NEW:
            return []
        self.phase = Phase.RUNNING
        return [{"type": "RUN_STARTED", "threadId": self.thread_id, "runId": self.run_id,
                 "protocolVersion": PROTOCOL_VERSION}]

    def end(self) -> list[AguiEvent]:
        """The chat's response ended: close what is open and say how the run finished."""
        if self.phase is not Phase.RUNNING:
            return []
        out = self._close_all()
        self.phase = Phase.FINISHED
        ending: dict[str, Any]
        if self._asked:
            self.outcome = "interrupt"
            ending = {"type": "interrupt", "interrupts": list(self._asked.values())}
        else:
            self.outcome = "success"
            ending = {"type": "success"}
            pending = [call_id for call_id in self._handed if not self._calls[call_id].result]
            if pending:
                ending["pendingToolCallIds"] = pending
        out.append(self._finished(ending))
        return out

    def denied_before(self, tool_call_ids: list[str]) -> list[AguiEvent]:
        """Results for calls the input denied as it moved on (a cancelled interrupt beside a new
        message): ADK is told so, and no later chunk shows it, so the client's call gets its end here."""
        out: list[AguiEvent] = []
        for call_id in tool_call_ids:
            out += self.feed({"type": "tool-output-denied", "toolCallId": call_id})
        return out

    def cancelled(self) -> list[AguiEvent]:
        if self.phase is not Phase.RUNNING:
            return []
        out = self._close_all()
        self.phase = Phase.FINISHED
        self.outcome = "cancelled"
        out.append(self._finished({"type": "cancelled"}))
        return out

    def error(self, message: str, code: str | None = None) -> list[AguiEvent]:
        """The run failed or was refused: what is open is ended (the client keeps what was said)."""
        if self.phase is Phase.NEW:
            out = self.start()
        elif self.phase is Phase.RUNNING:
            out = []
        else:
            return []
        out += self._close_all()
        self.phase = Phase.FAILED
        self.outcome = "error"
        event: AguiEvent = {"type": "RUN_ERROR", "message": message}
        if code:
            event["code"] = code
        out.append(event)
        return out

    def _finished(self, outcome: dict[str, Any]) -> AguiEvent:
        event: AguiEvent = {"type": "RUN_FINISHED", "threadId": self.thread_id, "runId": self.run_id, "outcome": outcome}
        if self._usage:
            event["usage"] = [
                {**({"model": model} if model else {}), **counts,
                 "totalTokens": counts.get("inputTokens", 0) + counts.get("outputTokens", 0)}
                for model, counts in self._usage.items()
            ]
        return event

    # ---- chunks --------------------------------------------------------------------------

    def feed(self, chunk: dict[str, Any]) -> list[AguiEvent]:
        """The AG-UI events one chunk produces (often none)."""
        if self.phase is not Phase.RUNNING:
            return []
        kind = chunk.get("type")
        handler = _HANDLERS.get(kind) if isinstance(kind, str) else None
        if handler is None:
            return []  # steps, media, sources, transcriptions: nothing AG-UI's client would show
        out: list[AguiEvent] = []
        handler(self, out, chunk)
        return out

    def _text_start(self, out: list[AguiEvent], chunk: dict[str, Any]) -> None:
        self._open_message(out, "text" if chunk["type"] == "text-start" else "reasoning", str(chunk.get("id", "")))

    def _text_delta(self, out: list[AguiEvent], chunk: dict[str, Any]) -> None:
        kind = "text" if chunk["type"] == "text-delta" else "reasoning"
        delta = chunk.get("delta")
        if not isinstance(delta, str) or not delta:
            return  # nothing said (@ag-ui/core accepts it; a client gains nothing from it)
        if self._open is None or self._open[0] != kind or self._open_chunk_id != chunk.get("id"):
            # Something else spoke in between (AG-UI allows one open message): a new one goes on.
            self._open_message(out, kind, str(chunk.get("id", "")))
        assert self._open is not None
        content = "TEXT_MESSAGE_CONTENT" if kind == "text" else "REASONING_MESSAGE_CONTENT"
        out.append({"type": content, "messageId": self._open[1], "delta": delta})

    def _text_end(self, out: list[AguiEvent], chunk: dict[str, Any]) -> None:
        if self._open_chunk_id == chunk.get("id"):
            out += self._close()

    def _open_message(self, out: list[AguiEvent], kind: str, chunk_id: str) -> None:
        out += self._close()
        self._seq += 1
        message_id = f"{self.run_id}-{self._seq}"
        self._open, self._open_chunk_id = (kind, message_id), chunk_id
        if kind == "text":
            self._parent = message_id
            out.append({"type": "TEXT_MESSAGE_START", "messageId": message_id, "role": "assistant"})
        else:
            out.append({"type": "REASONING_START", "messageId": message_id})
            out.append({"type": "REASONING_MESSAGE_START", "messageId": message_id, "role": "reasoning"})

    def _close(self) -> list[AguiEvent]:
        opened, self._open, self._open_chunk_id = self._open, None, None
        if opened is None:
            return []
        kind, message_id = opened
        if kind == "text":
            return [{"type": "TEXT_MESSAGE_END", "messageId": message_id}]
        return [{"type": "REASONING_MESSAGE_END", "messageId": message_id}, {"type": "REASONING_END", "messageId": message_id}]

    def _close_all(self) -> list[AguiEvent]:
        out = self._close()
        for call_id, call in self._calls.items():
            if call.started_here and not call.ended:
                call.ended = True
                out.append({"type": "TOOL_CALL_END", "toolCallId": call_id})
        return out

    # ---- tool calls ----------------------------------------------------------------------

    def _call(self, out: list[AguiEvent], call_id: str, name: str) -> _Call:
        """The call, started in this run if it was not (a call shown in an earlier run is
        announced again, without arguments, when it is handed to the browser)."""
        call = self._calls.get(call_id)
        if call is None:
            call = self._calls[call_id] = _Call(name)
        if not call.started_here:
            out += self._close()
            call.started_here = True
            start: AguiEvent = {"type": "TOOL_CALL_START", "toolCallId": call_id, "toolCallName": call.name or name}
            if self._parent is not None:
                start["parentMessageId"] = self._parent
            out.append(start)
        return call

    def _end_call(self, out: list[AguiEvent], call_id: str) -> None:
        call = self._calls.get(call_id)
        if call is not None and call.started_here and not call.ended:
            call.ended = True
            out.append({"type": "TOOL_CALL_END", "toolCallId": call_id})

    def _tool_input_start(self, out: list[AguiEvent], chunk: dict[str, Any]) -> None:
        self._call(out, str(chunk.get("toolCallId", "")), str(chunk.get("toolName", "")))

    def _tool_input_delta(self, out: list[AguiEvent], chunk: dict[str, Any]) -> None:
        call_id = str(chunk.get("toolCallId", ""))
        call = self._call(out, call_id, "")
        delta = chunk.get("inputTextDelta")
        if call.ended or not isinstance(delta, str) or not delta:
            return
        call.args_sent = True
        out.append({"type": "TOOL_CALL_ARGS", "toolCallId": call_id, "delta": delta})

    def _tool_input_available(self, out: list[AguiEvent], chunk: dict[str, Any]) -> None:
        call_id = str(chunk.get("toolCallId", ""))
        # A call first shown in this run came with tool-input-start; one without it was shown in
        # an earlier run (approved since, now handed over): the client holds its arguments already.
        shown_here = call_id in self._calls
        call = self._call(out, call_id, str(chunk.get("toolName", "")))
        if shown_here and not call.args_sent and not call.ended:
            call.args_sent = True
            out.append({"type": "TOOL_CALL_ARGS", "toolCallId": call_id, "delta": orjson.dumps(chunk.get("input", {})).decode()})
        self._end_call(out, call_id)
        # Its output may follow in this run (a server tool); if not, the browser runs it.
        self._handed[call_id] = None

    def _tool_output(self, out: list[AguiEvent], chunk: dict[str, Any]) -> None:
        call_id = str(chunk.get("toolCallId", ""))
        kind = chunk["type"]
        if kind == "tool-output-available":
            output = chunk.get("output")
            content = output if isinstance(output, str) else orjson.dumps(output).decode()
        elif kind == "tool-output-error":
            content = orjson.dumps({"error": chunk.get("errorText", "")}).decode()
        else:  # tool-output-denied
            content = orjson.dumps({"denied": True}).decode()
        out += self._close()
        self._end_call(out, call_id)
        call = self._calls.setdefault(call_id, _Call(""))
        call.result = True
        self._handed.pop(call_id, None)
        # A result ends the assistant's message: what the model says next is a new one.
        self._parent = None
        out.append({"type": "TOOL_CALL_RESULT", "messageId": f"{self.run_id}-result-{call_id}", "toolCallId": call_id,
                    "role": "tool", "content": content})

    # ---- approvals -----------------------------------------------------------------------

    def _approval_request(self, out: list[AguiEvent], chunk: dict[str, Any]) -> None:
        approval_id, call_id = str(chunk.get("approvalId", "")), str(chunk.get("toolCallId", ""))
        descriptor = chunk.get("approvalDescriptor")
        descriptor = descriptor if isinstance(descriptor, dict) else {}
        if chunk.get("isAutomatic") or descriptor.get("approvers"):
            # Decided without the chatting user: its response says how (below), naming call and rule.
            rule = descriptor.get("rule")
            self._decided[approval_id] = {"toolCallId": call_id, **({"rule": rule} if isinstance(rule, str) else {})}
            return
        out += self._close()
        self._end_call(out, call_id)
        tool = self._calls[call_id].name if call_id in self._calls else ""
        timeout = self._timeout_of(tool) if tool else None
        self._asked[approval_id] = interrupt(
            approval_id, call_id, tool, descriptor.get("hint"), None if timeout is None else self._now + timeout,
        )
        # Not handed to the browser before the person approves (the AI SDK route withholds it too).
        self._handed.pop(call_id, None)

    def _approval_response(self, out: list[AguiEvent], chunk: dict[str, Any]) -> None:
        approval_id = str(chunk.get("approvalId", ""))
        if self._asked.pop(approval_id, None) is not None:
            return  # the person's own answer, echoed back
        value: dict[str, Any] = {"approvalId": approval_id, **self._decided.pop(approval_id, {}),
                                 "approved": bool(chunk.get("approved"))}
        if isinstance(chunk.get("reason"), str):
            value["reason"] = chunk["reason"]
        out += self._close()
        out.append({"type": "CUSTOM", "name": APPROVAL_ACTIVITY, "value": value})

    def _approver_part(self, out: list[AguiEvent], chunk: dict[str, Any]) -> None:
        data = chunk.get("data")
        if not isinstance(data, dict):
            return
        out += self._close()
        out.append({"type": "ACTIVITY_SNAPSHOT", "messageId": f"approval-{chunk.get('id', '')}",
                    "activityType": APPROVAL_ACTIVITY, "content": data, "replace": True})

    # ---- the end of the chat's response --------------------------------------------------

    def _finish(self, out: list[AguiEvent], chunk: dict[str, Any]) -> None:
        metadata = chunk.get("messageMetadata")
        if not isinstance(metadata, dict) or not isinstance(metadata.get("usage"), dict):
            return
        model = metadata.get("model")
        entry = self._usage.setdefault(model if isinstance(model, str) else "", {})
        usage = metadata["usage"]
        for name in ("inputTokens", "outputTokens", "reasoningTokens", "cachedInputTokens"):
            value = usage.get(name)
            if isinstance(value, int):
                entry[name] = entry.get(name, 0) + value
        # AG-UI counts reasoning inside the output; the AI SDK beside it.
        if isinstance(usage.get("reasoningTokens"), int):
            entry["outputTokens"] = entry.get("outputTokens", 0) + usage["reasoningTokens"]

    def _error(self, out: list[AguiEvent], chunk: dict[str, Any]) -> None:
        out += self.error(str(chunk.get("errorText") or "The agent failed."), code="agent_error")

    def _abort(self, out: list[AguiEvent], chunk: dict[str, Any]) -> None:
        out += self.cancelled()

_Handler = Callable[[AguiStream, list[AguiEvent], dict[str, Any]], None]
_HANDLERS: Final[dict[str, _Handler]] = {
    "text-start": AguiStream._text_start,
    "text-delta": AguiStream._text_delta,
    "text-end": AguiStream._text_end,
    "reasoning-start": AguiStream._text_start,
    "reasoning-delta": AguiStream._text_delta,
    "reasoning-end": AguiStream._text_end,
    "tool-input-start": AguiStream._tool_input_start,
    "tool-input-delta": AguiStream._tool_input_delta,
    "tool-input-available": AguiStream._tool_input_available,
    "tool-output-available": AguiStream._tool_output,
    "tool-output-error": AguiStream._tool_output,
    "tool-output-denied": AguiStream._tool_output,
    "tool-approval-request": AguiStream._approval_request,
    "tool-approval-response": AguiStream._approval_response,
    "data-approval": AguiStream._approver_part,
    "finish": AguiStream._finish,
    "error": AguiStream._error,
    "abort": AguiStream._abort,
}
