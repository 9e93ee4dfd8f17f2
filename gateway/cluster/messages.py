"""What replicas say to each other through their inboxes: one frozen class per message, and its JSON.

Three kinds of message reach a replica's inbox (the backends carry them as JSON objects):

- `Forwarded`: work for a chat this replica owns, from the replica that received the request.
  `Submit`, `Resume`, `Audio` and `Gate` want a `Reply`; `Abort`, `SocketClosed`, `Unfollow`
  and `Expire` are notices, answered by nothing.
- `Reply`: the owner's answer to one of them: `Relayed` (the relay that carries the response),
  `Refused` (the HTTP refusal the asker answers with), `Decided` (a gated call's verdict, given at
  once) or `Waiting` (the gated call waits for a person; its verdict follows as `Released`).
- `Released`: that verdict, once a person or a deadline decided.

Only replicas of one release talk to each other, so the format may change with the code. What
arrives is still checked before anything acts on it: the inbox is a Redis channel, and a message
that is not one of these is refused whole (`MalformedMessage`), never half-applied; and of a
refusal's headers, which the asker copies into its browser's response, only `Retry-After` is kept.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, ClassVar, Self, TypeAlias, get_args

from ..core.approvals import Verdict
from ..core.refusals import HttpError
from ..core.protocol import ClientVersion

# Field types whose readers accept their absence (fields added after replicas of older releases).
Flag: TypeAlias = bool
Claims: TypeAlias = dict[str, Any]
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")

__all__ = [
    "WORK", "Abort", "Answer", "Audio", "Decided", "Expire", "Forwarded", "Gate", "MalformedMessage", "Message",
    "Refused", "Relayed", "Released", "Reply", "Resume", "SocketClosed", "Submit", "Unfollow", "Waiting", "Work",
    "from_json",
]


class MalformedMessage(ValueError):
    """What arrived in an inbox is not a message replicas send each other; the text says why
    without quoting it (it may carry a user's message)."""


# ---- work for the chat's owner ---------------------------------------------------------------


class _Work:
    """Work is read from its JSON field by field, each by the reader of its type (_READERS)."""

    op: ClassVar[str]

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Self:
        return cls(**{f.name: _READERS[f.type](raw, f.name) for f in fields(cls)})


@dataclass(frozen=True)
class Submit(_Work):
    """A new message (or answers to a waiting run): ChatService.submit on the owner."""

    op: ClassVar[str] = "submit"
    user: str
    # The agent whose route the request came in on.
    agent: str
    # The chat request as parse_chat_body reads it: the owner validates it again, as its own.
    body: dict[str, Any]
    # The caller's identity claims, for the tool rules (none from a replica older than them).
    claims: Claims = field(default_factory=dict)


@dataclass(frozen=True)
class _ForChat(_Work):
    """Work on one chat of one user, on the routes of one agent."""

    user: str
    chat: str
    agent: str


@dataclass(frozen=True)
class Resume(_ForChat):
    """Replay and follow the chat's latest response."""

    op: ClassVar[str] = "resume"


@dataclass(frozen=True)
class Audio(_ForChat):
    """A chunk of the browser's microphone for the chat's live session."""

    op: ClassVar[str] = "audio"
    mime: str
    data: str
    version: ClientVersion


@dataclass(frozen=True)
class Abort(_ForChat):
    """Stop the chat's run (a notice: nothing answers it)."""

    op: ClassVar[str] = "abort"


@dataclass(frozen=True)
class SocketClosed(_ForChat):
    """The browser's WebSocket that followed the chat closed (a notice: its live session may end)."""

    op: ClassVar[str] = "socket_closed"


@dataclass(frozen=True)
class Unfollow(_Work):
    """Nobody reads the relay `key` any more: its browser went away before the response ended (a
    notice). The owner stops relaying it, so the response no longer counts it as read."""

    op: ClassVar[str] = "unfollow"
    user: str
    key: str


@dataclass(frozen=True)
class Gate(_Work):
    """The plugin asks about a gated call in the chat whose ADK session is `session`."""

    op: ClassVar[str] = "gate"
    # The ADK app whose plugin asks: it names the agent.
    app: str
    user: str
    session: str
    tool_call_id: str
    tool: str
    args: dict[str, Any]
    # The plugin asks ADK's confirmation unless a rule decides (confirm mode): ask nobody here.
    confirm: Flag = False
    # The plugin marks ADK's confirmation with the gateway's payload: a call its approvers decide
    # is confirmed by ADK too (core/approver_confirmations.py), not held.
    approvers: Flag = False


@dataclass(frozen=True)
class Expire(_Work):
    """A confirmation's deadline passed (a notice): the owner answers it (deadline_timer.py)."""

    op: ClassVar[str] = "expire"
    user: str
    # The deadline as deadlines.Deadline writes it: the owner reads it again, as its own.
    deadline: str


@dataclass(frozen=True)
class Decide(_Work):
    """Approvers decided gated call `approval` (their quorum reached, through the approvals API): the
    owner applies it. Answered with `Decided`, its result `decided`, `already` or `gone`."""

    op: ClassVar[str] = "decide"
    user: str
    session: str
    approval: str
    approved: Flag
    reason: str
    # {"deciders": [{"user", "auth"}, ...]}: who decided, for the audit trail.
    deciders: dict[str, Any]


Work = Submit | Resume | Audio | Abort | SocketClosed | Unfollow | Gate | Expire | Decide
WORK: tuple[type[Work], ...] = (Submit, Resume, Audio, Abort, SocketClosed, Unfollow, Gate, Expire, Decide)
_WORK_BY_OP: MappingProxyType[str, type[Work]] = MappingProxyType({kind.op: kind for kind in WORK})


@dataclass(frozen=True)
class Forwarded:
    """Work sent to the chat's owner by `sender`, the replica holding the browser's (or the plugin's)
    request. The owner's Reply carries `request_id`; a notice gets no Reply."""

    sender: str
    request_id: str
    work: Work
    # The sender's span as a W3C traceparent ("" when not traced): the owner's spans join its trace.
    trace: str = ""

    def to_json(self) -> dict[str, Any]:
        # The wire names are the work classes' field names.
        traced = {"traceparent": self.trace} if self.trace else {}
        return {"op": self.work.op, **vars(self.work), "from": self.sender, "id": self.request_id, **traced}


# ---- the owner's answers ---------------------------------------------------------------------


@dataclass(frozen=True)
class Relayed:
    """The response is relayed under `key`; None: there is no response to follow (a resume of nothing)."""

    key: str | None

    def to_json(self) -> dict[str, Any]:
        return {"relay": self.key}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Relayed:
        key = raw["relay"]
        if key is not None and not isinstance(key, str):
            raise MalformedMessage("`relay` is not a relay key")
        return cls(key)


@dataclass(frozen=True)
class Refused:
    """The owner refused the request: the asker answers its browser with this."""

    status: int
    code: str
    message: str
    headers: dict[str, str]

    @classmethod
    def of(cls, error: HttpError) -> Refused:
        return cls(error.status, error.code, error.message, dict(error.headers))

    def error(self) -> HttpError:
        return HttpError(self.status, self.code, self.message, self.headers or None)

    def to_json(self) -> dict[str, Any]:
        return {"error": {"status": self.status, "code": self.code, "message": self.message, "headers": self.headers}}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Refused:
        error = _object(raw, "error")
        status, headers = error.get("status"), error.get("headers") or {}
        if type(status) is not int or not 400 <= status <= 599:
            raise MalformedMessage("`error.status` is not an HTTP error status")
        if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
            raise MalformedMessage("`error.headers` is not an object of strings")
        return cls(status, _text(error, "code"), _text(error, "message"), _allowed_headers(headers))


# The only header of a forwarded refusal that reaches the browser (the asker copies a refusal's
# headers into its response): a closed list, so that a message published into an inbox cannot set
# a cookie, a redirect or a CORS grant on another replica's response.
_RETRY_AFTER = "Retry-After"
_MAX_RETRY_AFTER_DIGITS = 6


def _allowed_headers(headers: dict[str, str]) -> dict[str, str]:
    allowed = {}
    for name, value in headers.items():
        # Whole seconds only (the gateway never sends a date): nothing else can ride in the value.
        if name.lower() == _RETRY_AFTER.lower() and value.isascii() and value.isdigit() and len(value) <= _MAX_RETRY_AFTER_DIGITS:
            allowed[_RETRY_AFTER] = value
    return allowed


@dataclass(frozen=True)
class Decided:
    """A gated call's verdict, and its label for the plugin-request metrics."""

    verdict: Verdict
    result: str

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict.as_json(), "result": self.result}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Decided:
        return cls(Verdict.from_json(_object(raw, "verdict")), _text(raw, "result"))


@dataclass(frozen=True)
class Waiting:
    """The gated call `call` (its approval id) waits for a person: its verdict comes as `Released`."""

    call: str

    def to_json(self) -> dict[str, Any]:
        return {"call": self.call}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Waiting:
        return cls(_text(raw, "call"))


Answer = Relayed | Refused | Decided | Waiting
# Which answer a reply carries, by the key only that answer writes; checked in this order.
_ANSWERS: tuple[tuple[str, type[Answer]], ...] = (
    ("error", Refused), ("call", Waiting), ("verdict", Decided), ("relay", Relayed),
)


@dataclass(frozen=True)
class Reply:
    """The owner's answer to the Forwarded request `request_id`."""

    request_id: str
    answer: Answer

    def to_json(self) -> dict[str, Any]:
        return {"reply": self.request_id, **self.answer.to_json()}


@dataclass(frozen=True)
class Released:
    """The verdict of the gated call `call`, sent to the replica that was told it is Waiting."""

    op: ClassVar[str] = "verdict"
    call: str
    decided: Decided

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "call": self.call, **self.decided.to_json()}


Message = Forwarded | Reply | Released


def from_json(raw: Any) -> Message:
    """The message a JSON object from an inbox is; MalformedMessage if it is none."""
    if not isinstance(raw, dict):
        raise MalformedMessage("not a JSON object")
    if "reply" in raw:
        return Reply(_text(raw, "reply"), _answer(raw))
    op = raw.get("op")
    if op == Released.op:
        return Released(_text(raw, "call"), Decided.from_json(raw))
    kind = _WORK_BY_OP.get(op) if isinstance(op, str) else None
    if kind is None:
        raise MalformedMessage("no known `op`")
    return Forwarded(_text(raw, "from"), _text(raw, "id"), kind.from_json(raw), _traceparent(raw))


def _traceparent(raw: dict[str, Any]) -> str:
    # Absent from an older replica's (or an untraced) message; one that is not a traceparent only
    # loses the link between two traces, so it is dropped rather than the work refused.
    value = raw.get("traceparent")
    return value if isinstance(value, str) and _TRACEPARENT.fullmatch(value) else ""


def _answer(raw: dict[str, Any]) -> Answer:
    for key, kind in _ANSWERS:
        if key in raw:
            return kind.from_json(raw)
    raise MalformedMessage("a reply without an answer")


def _text(raw: dict[str, Any], key: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str):
        raise MalformedMessage(f"`{key}` is not a string")
    return value


def _object(raw: dict[str, Any], key: str) -> dict[str, Any]:
    value = raw.get(key)
    if not isinstance(value, dict):
        raise MalformedMessage(f"`{key}` is not an object")
    return value


def _flag(raw: dict[str, Any], key: str) -> bool:
    # Absent from an older replica's message: that replica never sets it.
    value = raw.get(key, False)
    if not isinstance(value, bool):
        raise MalformedMessage(f"`{key}` is not true or false")
    return value


def _claims(raw: dict[str, Any], key: str) -> dict[str, Any]:
    return _object(raw, key) if key in raw else {}


def _version(raw: dict[str, Any], key: str) -> ClientVersion:
    value = raw.get(key)
    if type(value) is not int or value not in get_args(ClientVersion):
        raise MalformedMessage(f"`{key}` is not an AI SDK version")
    return value


# How a work field is read, by its annotation (as written: this module postpones annotations).
_READERS: MappingProxyType[Any, Callable[[dict[str, Any], str], Any]] = MappingProxyType({
    "str": _text, "dict[str, Any]": _object, "ClientVersion": _version, "Flag": _flag, "Claims": _claims,
})
