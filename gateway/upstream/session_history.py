"""What an ADK session's history says of its native confirmations: the `adk_request_confirmation`
calls asked, those answered, and what each asks about (read from the session ADK's GET answers,
upstream/client.py `AdkClient.confirmations`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.approver_confirmations import ApproverMark, marked, read_mark
from ..core.rebuild import streamed_message_id

__all__ = ["AskedCall", "SessionConfirmations", "session_confirmations"]


@dataclass(frozen=True)
class SessionConfirmations:
    """The native confirmations (`adk_request_confirmation` calls) an ADK session holds: the ids it
    asked, and those it holds an answer to. Both empty when the session does not exist."""

    asked: frozenset[str] = frozenset()
    answered: frozenset[str] = frozenset()
    # What each asked confirmation is about, by approval id (deadlines.py works a deadline out from it).
    calls: Mapping[str, AskedCall] = field(default_factory=dict)

    @property
    def originals(self) -> dict[str, tuple[str, str, dict[str, Any]]]:
        """Each asked confirmation's original call: approval id -> (tool call id, tool name, args)."""
        return {approval: (c.tool_call_id, c.tool, c.args) for approval, c in self.calls.items()}


@dataclass(frozen=True)
class AskedCall:
    """The call an `adk_request_confirmation` asks about, and when ADK asked (its event's
    `timestamp`, seconds since the epoch; None if the event has none)."""

    tool_call_id: str
    tool: str
    timestamp: float | None
    args: dict[str, Any] = field(default_factory=dict)
    # The message the gateway was writing when ADK asked (the newest id its runs told ADK as
    # state, core/rebuild.py); None if no run of the gateway's said.
    message_id: str | None = None
    # Who answers it, as the gateway marked the confirmation (its approvers); None: the chatting person.
    mark: ApproverMark | None = None
    # Whether the confirmation's payload names approvers at all (even unreadably): never the chatting person's.
    for_approvers: bool = False


def session_confirmations(session: Any) -> SessionConfirmations:
    """What a session (as ADK's GET answers it; None: no such session) holds of its confirmations."""
    if session is None:
        return SessionConfirmations()
    return SessionConfirmations(
        asked=frozenset(_confirmation_ids(session, "functionCall", "function_call")),
        answered=frozenset(_confirmation_ids(session, "functionResponse", "function_response")),
        calls=_asked_calls(session),
    )


def _confirmation_ids(session: Any, camel: str, snake: str) -> set[str]:
    """The ids of the `adk_request_confirmation` parts of a kind (calls, or responses) in a session's
    events, whichever case ADK wrote the key in."""
    found: set[str] = set()
    events = session.get("events") if isinstance(session, dict) else None
    for event in events if isinstance(events, list) else ():
        content = event.get("content") if isinstance(event, dict) else None
        parts = content.get("parts") if isinstance(content, dict) else None
        for part in parts if isinstance(parts, list) else ():
            call = (part.get(camel) or part.get(snake)) if isinstance(part, dict) else None
            if isinstance(call, dict) and call.get("name") == "adk_request_confirmation" and isinstance(call.get("id"), str):
                found.add(call["id"])
    return found



def _asked_calls(session: Any) -> dict[str, AskedCall]:
    """The calls a session's `adk_request_confirmation` calls ask about, by approval id."""
    found: dict[str, AskedCall] = {}
    events = session.get("events") if isinstance(session, dict) else None
    message_id: str | None = None
    for event in events if isinstance(events, list) else ():
        if isinstance(event, dict):
            message_id = streamed_message_id((event,)) or message_id
        content = event.get("content") if isinstance(event, dict) else None
        parts = content.get("parts") if isinstance(content, dict) else None
        stamp = event.get("timestamp") if isinstance(event, dict) else None
        timestamp = float(stamp) if isinstance(stamp, (int, float)) and not isinstance(stamp, bool) else None
        for part in parts if isinstance(parts, list) else ():
            call = (part.get("functionCall") or part.get("function_call")) if isinstance(part, dict) else None
            if not isinstance(call, dict) or call.get("name") != "adk_request_confirmation" or not isinstance(call.get("id"), str):
                continue
            args = call.get("args")
            original = (args.get("originalFunctionCall") or args.get("original_function_call")) if isinstance(args, dict) else None
            if isinstance(original, dict) and isinstance(original.get("id"), str) and isinstance(original.get("name"), str):
                original_args = original.get("args")
                asked = args.get("toolConfirmation") or args.get("tool_confirmation") if isinstance(args, dict) else None
                payload = asked.get("payload") if isinstance(asked, dict) else None
                found[call["id"]] = AskedCall(
                    original["id"], original["name"], timestamp, original_args if isinstance(original_args, dict) else {},
                    message_id, read_mark(payload), marked(payload),
                )
    return found
