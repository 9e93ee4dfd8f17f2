"""A message that waits for a person, rebuilt from ADK's session when the gateway forgot it (sans-IO).

A native confirmation (confirm mode's, or a tool's own `require_confirmation`) lives in ADK's
session: an `adk_request_confirmation` call nobody answered. A gateway that restarted (memory
backend), or a replica that never ran the chat, has no run to replay to a page that resumes
(`GET /api/chat/{id}/stream`, a WebSocket `resume`), yet ADK still waits for the person.

`waiting_message` reads the session ADK's GET answers and finds the assistant message that waits:
the events since the person's last message, when nothing but ADK's placeholder responses follows
the last confirmation nobody answered (a model that went on without the answer does not wait).
`replay` feeds those events to the chat's machine (chat_machine.py, so its turns and the real
converter), one run per ADK run as the live message had them (an answered confirmation started the
next), so the page gets what a live run would have sent: the tool parts, the approval requests, the
last response finished with `tool-calls`. The chat's ledger records the confirmations as the end of
those runs would have, so the answer that follows is taken as after a normal run, and a replay of
it is refused.

The message id is the one the gateway streamed the message under, so a page that kept the message
(in memory, or in the app's storage) and resumes gets the same message back, which the AI SDK
replaces, instead of a second one it would add: the gateway sends it with each of a chat's runs as
ADK's `state_delta` (`MESSAGE_ID_STATE_KEY`), which ADK stores on the user event that starts the
run. A message whose runs did not carry it (written before, or by another client) takes an id
derived from ADK's invocation id. Either way every replica rebuilds the same message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ..config.agent import ToolPolicy
from .chat_events import NativeAnswered, RunClosed, RunStarts, UpstreamRead
from .chat_machine import ChatMachine
from .converter import CONFIRMATION_TOOL
from .ledger import NativeConfirmation
from .message_writer import Chunk
from .protocol import ClientVersion
from .turn import Chunks, Raised

__all__ = [
    "MESSAGE_ID_STATE_KEY", "Answer", "Rebuilt", "Segment", "WaitingMessage", "message_id_state", "replay",
    "streamed_message_id", "waiting_message",
]

# The session state key under which the gateway tells ADK the id of the message a run writes. Not
# `temp:` (ADK does not store those), nor `app:`/`user:` (shared beyond the session). ADK's
# instruction templating reads `{name}` or `{app:|user:|temp:name}` only, so no instruction reads
# this one, and the gateway's own prefix keeps it apart from an agent's keys.
MESSAGE_ID_STATE_KEY: Final = "adk_gateway:message_id"
_MESSAGE_ID_PREFIX: Final = "msg-adk-"
# As a browser's message ids (chat_request.py): what the rebuild sends back as one.
_MESSAGE_ID_MAX: Final = 256


@dataclass(frozen=True, slots=True)
class Answer:
    """The person's answer to a confirmation, as ADK's session holds it."""

    approval_id: str
    tool_call_id: str
    approved: bool


@dataclass(frozen=True, slots=True)
class Segment:
    """The events of one ADK run of the message, and the answers that started it (none: the first)."""

    answers: tuple[Answer, ...]
    events: tuple[dict[str, Any], ...]


@dataclass(frozen=True, slots=True)
class WaitingMessage:
    message_id: str
    segments: tuple[Segment, ...]
    # The confirmations nobody answered (approval ids), which the message ends on.
    pending: frozenset[str]


@dataclass(frozen=True, slots=True)
class Response:
    """One browser response of the message, and what the browser added before it (for replays)."""

    added: list[Chunk]
    chunks: list[Chunk]


@dataclass(frozen=True, slots=True)
class Rebuilt:
    message_id: str
    responses: list[Response]
    # The confirmations now pending in the ledger (the caller counts them as waiting).
    pending: list[NativeConfirmation] = field(default_factory=list)


def _parts(event: Mapping[str, Any]) -> list[Any]:
    content = event.get("content")
    parts = content.get("parts") if isinstance(content, dict) else None
    return parts if isinstance(parts, list) else []


def _confirmation(part: Any, key: str) -> dict[str, Any] | None:
    value = part.get(key) if isinstance(part, dict) else None
    if isinstance(value, dict) and value.get("name") == CONFIRMATION_TOOL and isinstance(value.get("id"), str):
        return value
    return None


def _is_person(event: Mapping[str, Any]) -> bool:
    """The person's own message: a user event carrying more than function responses."""
    parts = _parts(event)
    return event.get("author") == "user" and any(not (isinstance(p, dict) and "functionResponse" in p) for p in parts)


def _answers(event: Mapping[str, Any], asked: Mapping[str, str]) -> tuple[Answer, ...]:
    found = []
    for part in _parts(event):
        response = _confirmation(part, "functionResponse")
        if response is not None:
            body = response.get("response")
            approved = isinstance(body, dict) and body.get("confirmed") is True
            found.append(Answer(response["id"], asked.get(response["id"], ""), approved))
    return tuple(found)


def _only_results(event: Mapping[str, Any]) -> bool:
    """An agent event that says nothing new: function responses only (ADK's placeholders)."""
    parts = _parts(event)
    return event.get("author") != "user" and all(
        isinstance(p, dict) and p.get("functionResponse") is not None and p.get("text") is None and p.get("functionCall") is None
        for p in parts
    )


def _as_streamed(run: tuple[dict[str, Any], ...]) -> tuple[dict[str, Any], ...]:
    """A run's events in the order ADK streamed them. ADK streams a confirmation's request before
    the placeholder response of the call it asks about, but stamps the placeholder first, and a
    store that reads a session back by timestamp (ADK's SQLite store) gives the placeholder first,
    which the converter would show as the call's error. Each such placeholder goes back after the
    request that asks about its call."""
    asked_at: dict[str, int] = {}  # a call asked about -> where its confirmation's request is
    for index, event in enumerate(run):
        for part in _parts(event):
            call = _confirmation(part, "functionCall")
            args = call.get("args") if call is not None else None
            original = args.get("originalFunctionCall") if isinstance(args, dict) else None
            if isinstance(original, dict) and isinstance(original.get("id"), str):
                asked_at[original["id"]] = index
    held: dict[int, list[dict[str, Any]]] = {}
    ordered: list[dict[str, Any]] = []
    for index, event in enumerate(run):
        ids = [p["functionResponse"].get("id") for p in _parts(event)] if _only_results(event) else []
        later = [asked_at.get(i, -1) if isinstance(i, str) else -1 for i in ids]
        if later and min(later) > index:
            held.setdefault(max(later), []).append(event)
            continue
        ordered += [event, *held.pop(index, ())]
    return tuple(ordered)


def message_id_state(message_id: str) -> dict[str, str]:
    """The `state_delta` of a `/run_sse` request whose run writes the message `message_id`."""
    return {MESSAGE_ID_STATE_KEY: message_id}


def streamed_message_id(events: Iterable[Mapping[str, Any]]) -> str | None:
    """The message id the gateway sent with the newest of these runs that carried one (the state
    delta of the user event that started it), or None."""
    for event in reversed(list(events)):
        actions = event.get("actions")
        delta = actions.get("stateDelta") if isinstance(actions, dict) and event.get("author") == "user" else None
        value = delta.get(MESSAGE_ID_STATE_KEY) if isinstance(delta, dict) else None
        if isinstance(value, str) and 0 < len(value) <= _MESSAGE_ID_MAX:
            return value
    return None


def waiting_message(session: Any) -> WaitingMessage | None:
    """The assistant message of `session` (ADK's session JSON) that waits for the person's
    answers to confirmations, or None if nothing waits."""
    raw = session.get("events") if isinstance(session, dict) else None
    events = [e for e in raw if isinstance(e, dict) and not e.get("partial")] if isinstance(raw, list) else []
    start = next((i + 1 for i in range(len(events) - 1, -1, -1) if _is_person(events[i])), 0)
    message = events[start:]
    if not message:
        return None
    asked: dict[str, str] = {}  # approval id -> the tool call it asks about
    last_ask = -1
    for index, event in enumerate(message):
        if event.get("author") == "user":
            continue
        for part in _parts(event):
            call = _confirmation(part, "functionCall")
            if call is not None:
                args = call.get("args")
                original = args.get("originalFunctionCall") if isinstance(args, dict) else None
                asked[call["id"]] = str(original.get("id") or "") if isinstance(original, dict) else ""
                last_ask = index
    answered = {part["functionResponse"]["id"] for e in events for part in _parts(e) if _confirmation(part, "functionResponse")}
    pending = frozenset(a for a in asked if a not in answered)
    if not pending or not all(_only_results(e) for e in message[last_ask + 1 :]):
        return None
    segments: list[Segment] = []
    answers: tuple[Answer, ...] = ()
    run: list[dict[str, Any]] = []
    for event in message:
        if event.get("author") == "user":
            segments.append(Segment(answers, tuple(run)))
            answers, run = _answers(event, asked), []
        else:
            run.append(event)
    segments.append(Segment(answers, tuple(run)))
    segments = [Segment(s.answers, _as_streamed(s.events)) for s in segments]
    # The person's message (if any) started the first run: its event carries that run's id.
    message_id = streamed_message_id(events[max(start - 1, 0):])
    if message_id is None:
        first = message[0]
        message_id = _MESSAGE_ID_PREFIX + str(first.get("invocationId") or first.get("id") or "")
    return WaitingMessage(message_id, tuple(s for s in segments if s.events or s.answers), pending)


def _approval_responses(answers: Iterable[Answer], version: ClientVersion) -> list[Chunk]:
    # As chats.py writes the answers a browser added between two responses: ai 6 has no such chunk.
    if version != 7:
        return []
    return [{"type": "tool-approval-response", "approvalId": a.approval_id, "approved": a.approved} for a in answers]


def replay(
    message: WaitingMessage,
    *,
    machine: ChatMachine,
    now: float,
    version: ClientVersion = 6,
    policy: Callable[[str], ToolPolicy] | None = None,
    confirms: Callable[[str], bool] | None = None,
) -> Rebuilt | None:
    """The message's responses as live runs would have written them: one run of `machine` (the
    chat's, with no run under way) per segment, through its events, so its ledger and last turn
    are left as those runs' ends leave them. None if a run could not take the events (they are
    not what ADK writes)."""
    responses: list[Response] = []
    known: list[str] = []
    for segment in message.segments:
        for answer in segment.answers:
            machine.handle(NativeAnswered(answer.approval_id))
        start = RunStarts(
            message.message_id, now, version=version, known_tool_calls=list(known),
            denied_tool_calls=[a.tool_call_id for a in segment.answers if not a.approved and a.tool_call_id],
            policy=policy, confirms=confirms,
        )
        outputs = [
            *machine.handle(start), *machine.handle(UpstreamRead(segment.events, now)), *machine.handle(RunClosed(now)),
        ]
        if any(isinstance(o, Raised) for o in outputs):
            return None
        chunks = [chunk for o in outputs if isinstance(o, Chunks) for chunk in o.chunks]
        known += [c["toolCallId"] for c in chunks if c["type"] == "tool-input-start"]
        responses.append(Response(_approval_responses(segment.answers, version), chunks))
    pending = [c for c in machine.ledger.pending_native() if c.approval_id in message.pending]
    return Rebuilt(message.message_id, responses, pending)
