"""AG-UI's `RunAgentInput` in, the chat request the engine reads out (sans-IO).

An AG-UI client posts the whole thread on every run, as the AI SDK does, with two differences:
its assistant turn is several messages (text, tool calls, each tool result its own `tool`
message), and it answers an approval with a `resume` entry naming the interrupt, not in a message.
This module rewrites the input as the AI SDK request the chat already understands
(core/chat_request.py): each assistant turn one message whose tool parts hold the calls and their
results, a resumed interrupt's part `approval-responded`, a tool message's part `output-available`
(or `output-error`). So an answer over AG-UI is matched, checked and carried out by the same code as
an answer over the AI SDK, and the client is trusted with no more than there (the approval id an
interrupt names is checked against the chat's ledger and ADK's session, never taken on its word).

`InvalidRequest` names the offending field, for a 400.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, Final, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .agui_interrupts import split_interrupt_id
from .chat_request import CHAT_ID_PATTERN, ChatRequest, InvalidRequest, parse_chat_body, plan_turn

__all__ = ["AguiInput", "parse_run_input"]

_MAX_RESUME: Final = 64
_CANCELLED_REASON: Final = "The person cancelled the approval."


class _Edge(BaseModel):
    model_config = ConfigDict(extra="allow")


class _Resume(_Edge):
    interruptId: str = Field(min_length=1, max_length=600)
    status: Literal["resolved", "cancelled"]
    payload: Any = None


class _Tool(_Edge):
    name: str = Field(min_length=1, max_length=256)


class _Input(_Edge):
    threadId: str = Field(pattern=CHAT_ID_PATTERN)
    runId: str = Field(min_length=1, max_length=128)
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[_Tool] = []
    resume: list[_Resume] | None = Field(default=None, max_length=_MAX_RESUME)


@dataclass(frozen=True)
class AguiInput:
    thread_id: str
    run_id: str
    request: ChatRequest
    # The frontend tools the client declared (the policy's browser tools are the only ones it may).
    tools: tuple[str, ...]

    @property
    def denied_before(self) -> list[str]:
        """The calls whose interrupts this input denied while sending a new message: the run that
        follows is about the new message, so nothing in it ends those calls for the client."""
        plan = plan_turn(self.request)
        return [a.tool_call_id for a in plan.answers if not a.approved] if plan.new_message is not None else []


def parse_run_input(raw: bytes) -> AguiInput:
    """Validate a `RunAgentInput` body and rewrite it as the chat request it amounts to."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"body is not valid JSON: {exc}") from None
    try:
        run = _Input.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise InvalidRequest(f"{where}: {first['msg']}") from None
    messages = _ui_messages(run.messages)
    if run.resume:
        _apply_resume(messages, run.resume)
    if not messages:
        raise InvalidRequest("messages: no user or assistant message to act on")
    body = {"id": run.threadId, "messages": messages, "aiSdkVersion": 7}
    request = parse_chat_body(body, version_header=None, default_version=7)
    return AguiInput(run.threadId, run.runId, request, tuple(t.name for t in run.tools))


def _ui_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The thread as AI SDK messages: each run of assistant and tool messages one assistant message."""
    out: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        role = message.get("role")
        message_id = message.get("id")
        if not isinstance(message_id, str) or not message_id:
            raise InvalidRequest(f"{where}.id: a non-empty string is required")
        if role == "user":
            out.append({"id": message_id, "role": "user", "parts": _user_parts(message.get("content"), where)})
        elif role in ("system", "developer"):
            content = message.get("content")
            out.append({"id": message_id, "role": "system", "parts": [{"type": "text", "text": content}]
                        if isinstance(content, str) else []})
        elif role == "assistant":
            turn = _assistant_turn(out, message_id)
            content = message.get("content")
            if isinstance(content, str) and content:
                turn["parts"].append({"type": "text", "text": content})
            for call in message.get("toolCalls") or []:
                turn["parts"].append(_tool_part(call, f"{where}.toolCalls"))
        elif role == "tool":
            _tool_result(out, message, where)
        elif role in ("reasoning", "activity"):
            continue  # the client's rendering of the run, not input
        else:
            raise InvalidRequest(f"{where}.role: not an AG-UI message role")
    return out


def _assistant_turn(out: list[dict[str, Any]], message_id: str) -> dict[str, Any]:
    if out and out[-1]["role"] == "assistant":
        return out[-1]
    turn: dict[str, Any] = {"id": message_id, "role": "assistant", "parts": []}
    out.append(turn)
    return turn


def _tool_part(call: Any, where: str) -> dict[str, Any]:
    if not isinstance(call, dict) or not isinstance(call.get("id"), str) or not isinstance(call.get("function"), dict):
        raise InvalidRequest(f"{where}: a tool call has an id and a function")
    function = call["function"]
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"{where}: a tool call's function has a name")
    try:
        args = orjson.loads(function.get("arguments") or "{}")
    except orjson.JSONDecodeError:
        args = {}
    return {"type": "dynamic-tool", "toolName": name, "toolCallId": call["id"], "state": "input-available", "input": args}


def _find_part(out: list[dict[str, Any]], tool_call_id: str) -> dict[str, Any] | None:
    for message in reversed(out):
        if message["role"] != "assistant":
            continue
        for part in message["parts"]:
            if part.get("toolCallId") == tool_call_id:
                return part
    return None


def _tool_result(out: list[dict[str, Any]], message: dict[str, Any], where: str) -> None:
    call_id = message.get("toolCallId")
    if not isinstance(call_id, str):
        raise InvalidRequest(f"{where}.toolCallId: a string is required")
    part = _find_part(out, call_id)
    if part is None:
        raise InvalidRequest(f"{where}.toolCallId: no assistant message before it holds the call {call_id!r}")
    error = message.get("error")
    if isinstance(error, str) and error:
        part.update(state="output-error", errorText=error)
        return
    content = message.get("content")
    output: Any = content
    if isinstance(content, str):
        try:
            output = orjson.loads(content)
        except orjson.JSONDecodeError:
            output = content
    part.update(state="output-available", output=output)


def _user_parts(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise InvalidRequest(f"{where}.content: a string or a list of parts is required")
    parts: list[dict[str, Any]] = []
    for i, part in enumerate(content):
        if not isinstance(part, dict):
            raise InvalidRequest(f"{where}.content[{i}]: a part is an object")
        if part.get("type") == "text":
            parts.append({"type": "text", "text": str(part.get("text", ""))})
        elif isinstance(part.get("source"), dict):
            parts.append(_file_part(part["source"], f"{where}.content[{i}].source"))
        elif part.get("type") == "binary":  # AG-UI before 1.0
            source = {"type": "data", "value": part.get("data"), "mimeType": part.get("mimeType")} if part.get("data") \
                else {"type": "url", "value": part.get("url"), "mimeType": part.get("mimeType")}
            parts.append(_file_part(source, f"{where}.content[{i}]"))
    return parts


def _file_part(source: dict[str, Any], where: str) -> dict[str, Any]:
    mime, value = source.get("mimeType"), source.get("value")
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"{where}.value: a string is required")
    if not isinstance(mime, str) or not mime:
        raise InvalidRequest(f"{where}.mimeType: required")
    if source.get("type") == "data":
        try:
            base64.b64decode(value, validate=True)
        except ValueError:
            raise InvalidRequest(f"{where}.value: invalid base64 data") from None
        return {"type": "file", "mediaType": mime, "url": f"data:{mime};base64,{value}"}
    if source.get("type") == "url":
        return {"type": "file", "mediaType": mime, "url": value}
    raise InvalidRequest(f"{where}.type: 'data' or 'url' is required")


def _apply_resume(messages: list[dict[str, Any]], entries: list[_Resume]) -> None:
    """Each resumed interrupt's tool part answered, as the AI SDK's approval-responded part is."""
    for i, entry in enumerate(entries):
        where = f"resume[{i}]"
        ids = split_interrupt_id(entry.interruptId)
        if ids is None:
            raise InvalidRequest(f"{where}.interruptId: not an interrupt of this gateway")
        approval_id, tool_call_id = ids
        part = _find_part(messages, tool_call_id)
        if part is None:
            raise InvalidRequest(f"{where}.interruptId: the messages hold no call {tool_call_id!r}")
        if entry.status == "cancelled":
            approved, reason = False, _CANCELLED_REASON
        else:
            payload = entry.payload
            if not isinstance(payload, dict) or not isinstance(payload.get("approved"), bool):
                raise InvalidRequest(f"{where}.payload: {{\"approved\": true|false, \"reason\"?: string}} is required")
            approved, reason = payload["approved"], payload.get("reason")
            if reason is not None and not isinstance(reason, str):
                raise InvalidRequest(f"{where}.payload.reason: a string is required")
        approval: dict[str, Any] = {"id": approval_id, "approved": approved}
        if reason:
            approval["reason"] = reason
        part.update(state="approval-responded", approval=approval)
