"""Browser chat requests in, what to send to ADK out (sans-IO).

The AI SDK posts the whole conversation on every turn; ADK already holds it in its session. This
module validates the untrusted request body at the edge and works out the only things ADK does not
have yet: the new user message, or the person's answers found in the last assistant message.

It owns the request vocabulary (`ChatRequest`, `ApprovalAnswer`, `TurnPlan`) and raises
`InvalidRequest` with a message that names the offending field, so the browser gets a useful 400.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from typing import Any, Final, Literal, get_args

import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError

from .converter import CONFIRMATION_TOOL
from .refusals import Refusal
from .protocol import ClientVersion, client_version

__all__ = [
    "ApprovalAnswer",
    "ChatRequest",
    "InvalidRequest",
    "ToolOutput",
    "TurnPlan",
    "confirmation_message",
    "confirmation_response",
    "is_chat_id",
    "parse_chat_body",
    "parse_chat_request",
    "plan_turn",
]

CHAT_ID_PATTERN: Final = r"^[A-Za-z0-9_-]{1,128}$"
_CHAT_ID = re.compile(CHAT_ID_PATTERN)


def is_chat_id(value: str) -> bool:
    return _CHAT_ID.match(value) is not None


class InvalidRequest(Refusal):
    """The browser sent something the gateway cannot act on; the message is safe to show it."""

    status = 400
    code = "invalid_request"


class _Edge(BaseModel):
    # The AI SDK adds fields over time; unknown ones pass, the ones we use are checked.
    model_config = ConfigDict(extra="allow")


Role = Literal["system", "user", "assistant"]
_ROLES: Final = get_args(Role)
_MESSAGE_ID_MAX: Final = 256


class UIMessage(_Edge):
    id: str = Field(min_length=1, max_length=_MESSAGE_ID_MAX)
    role: Role
    parts: list[dict[str, Any]]


class _Body(_Edge):
    id: str = Field(min_length=1, max_length=128)
    # Checked in parse_chat_body: the messages the turn reads in full, the earlier ones shallowly.
    messages: list[Any] = Field(min_length=1)
    trigger: Literal["submit-message", "regenerate-message"] = "submit-message"
    messageId: str | None = None
    aiSdkVersion: int | str | None = None


class _TextPart(_Edge):
    text: str


class _FilePart(_Edge):
    mediaType: str = Field(min_length=1)
    url: str = Field(min_length=1)
    filename: str | None = None


class _Approval(_Edge):
    id: str = Field(min_length=1, max_length=256)
    # Strict: "yes", "on" or 1 are not an approval; only JSON true is.
    approved: StrictBool | None = None
    reason: str | None = None


class _ToolPart(_Edge):
    toolCallId: str = Field(min_length=1, max_length=256)
    state: str
    approval: _Approval | None = None
    output: Any = None
    errorText: str | None = None


# The messages a turn reads: the last, and the one before it (an approval the person typed past).
# ADK's session holds the conversation; the earlier messages are the client's copy of it.
_READ: Final = 2


@dataclass(frozen=True)
class ChatRequest:
    chat_id: str
    trigger: str
    # The messages before the last two, as sent (each an object with id, role and parts): counted
    # against the limits and forwarded, never read.
    history: list[dict[str, Any]]
    # The last two messages (one in a new chat), validated in full.
    recent: list[UIMessage]
    version: ClientVersion

    @property
    def message_count(self) -> int:
        return len(self.history) + len(self.recent)

    def as_body(self) -> dict[str, Any]:
        """The request as a body `parse_chat_body` reads back the same (to forward it to another replica)."""
        return {
            "id": self.chat_id, "trigger": self.trigger, "aiSdkVersion": self.version,
            "messages": [*self.history, *(m.model_dump(mode="json") for m in self.recent)],
        }


@dataclass(frozen=True)
class ApprovalAnswer:
    approval_id: str
    tool_call_id: str
    tool_name: str
    approved: bool
    # True when the person never answered and moved on: the gateway rejects on their behalf.
    implicit: bool = False
    reason: str | None = None
    # The confirmation's payload for ADK (`{"adk_gateway": {...}}`, docs/approvals.md), made by the
    # gateway: a browser tool's output or error, a timeout's error. Never a browser's payload as sent.
    payload: dict[str, Any] | None = None
    # The gateway's answer to a confirmation whose deadline passed (implicit too).
    timed_out: bool = False
    # The gateway's answer for the approvers who decided (user, auth each), their quorum reached.
    deciders: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ToolOutput:
    """What the browser produced for a tool call (the AI SDK's addToolOutput)."""

    tool_call_id: str
    tool_name: str
    output: Any
    error_text: str | None = None
    # The approval the tool part shows (a tool that needed one): True only if the person approved.
    approved: bool = False


@dataclass(frozen=True)
class TurnPlan:
    """What one browser request asks of ADK."""

    # Content to send as `new_message`; None when the request only carries answers.
    new_message: dict[str, Any] | None
    # Answers to approvals. Sent before `new_message` when both are present.
    answers: tuple[ApprovalAnswer, ...]
    # Tool outputs the continued message holds (browser tools, but server tools' too).
    outputs: tuple[ToolOutput, ...]
    # Set when the request continues an assistant message rather than starting a new one.
    continue_message_id: str | None
    # Tool calls the client already shows in the continued message.
    known_tool_calls: frozenset[str]

    @property
    def denied_tool_calls(self) -> frozenset[str]:
        return frozenset(a.tool_call_id for a in self.answers if not a.approved)


def _errors(exc: ValidationError, prefix: str) -> str:
    first = exc.errors()[0]
    loc = prefix
    for part in first["loc"]:
        loc += f"[{part}]" if isinstance(part, int) else (f".{part}" if loc else str(part))
    more = len(exc.errors()) - 1
    suffix = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return f"{loc or 'body'}: {first['msg']}{suffix}"


def parse_chat_request(raw: bytes, *, version_header: str | None, default_version: ClientVersion) -> ChatRequest:
    """Validate a `DefaultChatTransport` POST body."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"body is not valid JSON: {exc}") from None
    return parse_chat_body(data, version_header=version_header, default_version=default_version)


def parse_chat_body(data: Any, *, version_header: str | None, default_version: ClientVersion) -> ChatRequest:
    """Validate a chat request already decoded from JSON (a POST body, or a WebSocket `send` frame)."""
    if not isinstance(data, dict):
        raise InvalidRequest("body must be a JSON object with `id` and `messages`")
    try:
        body = _Body.model_validate(data)
    except ValidationError as exc:
        raise InvalidRequest(_errors(exc, "")) from None
    if not _CHAT_ID.match(body.id):
        raise InvalidRequest("id: a chat id is 1-128 letters, digits, '_' or '-'")
    version = client_version(version_header, body.aiSdkVersion, default_version)
    messages = body.messages
    first_read = max(len(messages) - _READ, 0)
    history = messages[:first_read]
    for i, message in enumerate(history):
        _check_history(message, i)
    recent = [_message(message, i) for i, message in enumerate(messages[first_read:], first_read)]
    return ChatRequest(body.id, body.trigger, history, recent, version)


def _message(data: Any, index: int) -> UIMessage:
    try:
        return UIMessage.model_validate(data)
    except ValidationError as exc:
        raise InvalidRequest(_errors(exc, f"messages[{index}]")) from None


def _check_history(data: Any, index: int) -> None:
    """An earlier message has the shape of one; its parts are the client's rendering, not read
    (a full validation per message made a turn cost more as the chat grew: docs/performance.md)."""
    if not isinstance(data, dict):
        raise InvalidRequest(f"messages[{index}]: a message is an object with id, role and parts")
    message_id = data.get("id")
    if not isinstance(message_id, str) or not 0 < len(message_id) <= _MESSAGE_ID_MAX:
        raise InvalidRequest(f"messages[{index}].id: a string of 1-{_MESSAGE_ID_MAX} characters is required")
    if data.get("role") not in _ROLES:
        raise InvalidRequest(f"messages[{index}].role: one of {', '.join(map(repr, _ROLES))} is required")
    parts = data.get("parts")
    if not isinstance(parts, list) or not all(type(part) is dict for part in parts):
        raise InvalidRequest(f"messages[{index}].parts: a list of objects is required")


def _parse_part(model: type[_Edge], part: dict[str, Any], where: str) -> Any:
    try:
        return model.model_validate(part)
    except ValidationError as exc:
        raise InvalidRequest(_errors(exc, where)) from None


def _tool_name(part: dict[str, Any]) -> str:
    kind = str(part.get("type", ""))
    if kind == "dynamic-tool":
        return str(part.get("toolName", ""))
    return kind.removeprefix("tool-")


def _is_tool_part(part: dict[str, Any]) -> bool:
    kind = part.get("type")
    return isinstance(kind, str) and (kind.startswith("tool-") or kind == "dynamic-tool")


def _user_content(message: UIMessage, where: str) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    for i, part in enumerate(message.parts):
        kind = part.get("type")
        if kind == "text":
            text = _parse_part(_TextPart, part, f"{where}.parts[{i}]").text
            if text:
                parts.append({"text": text})
        elif kind == "file":
            parts.append(_file_part(_parse_part(_FilePart, part, f"{where}.parts[{i}]"), f"{where}.parts[{i}]"))
        # Reasoning, data-* and step parts are the client's own rendering state, not user input.
    if not parts:
        raise InvalidRequest(f"{where}: the user message has no text or file parts")
    return {"role": "user", "parts": parts}


def _file_part(part: _FilePart, where: str) -> dict[str, Any]:
    if part.url.startswith("data:"):
        header, sep, payload = part.url.partition(",")
        if not sep or not header.endswith(";base64"):
            raise InvalidRequest(f"{where}.url: data URLs must be base64-encoded")
        try:
            base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidRequest(f"{where}.url: invalid base64 data") from None
        return {"inlineData": {"mimeType": part.mediaType, "data": payload}}
    return {"fileData": {"mimeType": part.mediaType, "fileUri": part.url}}


def _answers(message: UIMessage, where: str, *, implicit: bool) -> list[ApprovalAnswer]:
    """Answers held by an assistant message's tool parts.

    `implicit` is for a message the person moved past by typing: an approval still waiting there
    is answered as a rejection, so ADK does not keep a paused call forever.
    """
    answers = []
    for i, part in enumerate(message.parts):
        if not _is_tool_part(part) or part.get("state") not in ("approval-requested", "approval-responded"):
            continue
        tool = _parse_part(_ToolPart, part, f"{where}.parts[{i}]")
        if tool.approval is None:
            raise InvalidRequest(f"{where}.parts[{i}].approval: missing for state {tool.state}")
        if tool.state == "approval-responded":
            if tool.approval.approved is None:
                raise InvalidRequest(f"{where}.parts[{i}].approval.approved: required when state is approval-responded")
            answers.append(
                ApprovalAnswer(
                    tool.approval.id, tool.toolCallId, _tool_name(part), tool.approval.approved,
                    reason=tool.approval.reason,
                )
            )
        elif implicit:
            answers.append(ApprovalAnswer(tool.approval.id, tool.toolCallId, _tool_name(part), False, implicit=True))
    return answers


def _outputs(message: UIMessage, where: str) -> list[ToolOutput]:
    outputs = []
    for i, part in enumerate(message.parts):
        if not _is_tool_part(part) or part.get("state") not in ("output-available", "output-error"):
            continue
        tool = _parse_part(_ToolPart, part, f"{where}.parts[{i}]")
        error = (tool.errorText or "the browser tool failed") if tool.state == "output-error" else None
        approved = tool.approval is not None and tool.approval.approved is True
        outputs.append(ToolOutput(tool.toolCallId, _tool_name(part), tool.output, error, approved))
    return outputs


def plan_turn(request: ChatRequest) -> TurnPlan:
    """What ADK must receive for this request; raises InvalidRequest when there is nothing to do."""
    messages = request.recent
    last_index = request.message_count - 1
    last = messages[-1]
    where = f"messages[{last_index}]"
    if last.role == "user":
        answers: list[ApprovalAnswer] = []
        if len(messages) >= 2 and messages[-2].role == "assistant":
            answers = _answers(messages[-2], f"messages[{last_index - 1}]", implicit=True)
        return TurnPlan(_user_content(last, where), tuple(answers), (), None, frozenset())
    if last.role == "assistant":
        answers = _answers(last, where, implicit=False)
        outputs = _outputs(last, where)
        if not answers and not outputs:
            raise InvalidRequest(f"{where}: an assistant message is only sent back to answer an approval or a tool call")
        known = frozenset(
            str(p["toolCallId"]) for p in last.parts if _is_tool_part(p) and isinstance(p.get("toolCallId"), str)
        )
        return TurnPlan(None, tuple(answers), tuple(outputs), last.id, known)
    raise InvalidRequest(f"{where}.role: the last message must come from the user or answer an approval")


def confirmation_response(approval_id: str, confirmed: bool, payload: dict[str, Any] | None = None) -> dict[str, Any]:
    """One answer to ADK's `adk_request_confirmation` call `approval_id`, as a function response part.

    ADK answers HTTP 500 to extra keys in `response`: only `confirmed` and, when given, `payload`
    (the one other key ADK accepts, which it puts on the re-run call's `tool_confirmation`).
    """
    response: dict[str, Any] = {"confirmed": confirmed}
    if payload is not None:
        response["payload"] = payload
    return {"functionResponse": {"id": approval_id, "name": CONFIRMATION_TOOL, "response": response}}


def confirmation_message(answers: tuple[ApprovalAnswer, ...] | list[ApprovalAnswer]) -> dict[str, Any]:
    """The ADK message that answers native confirmations: function responses and nothing else."""
    return {"role": "user", "parts": [confirmation_response(a.approval_id, a.approved, a.payload) for a in answers]}
