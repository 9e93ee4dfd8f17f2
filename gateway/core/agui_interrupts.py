"""What an AG-UI interrupt of this gateway is: its id, the answer it asks for, when it expires (sans-IO).

An interrupt stands for one approval the chatting user answers (core/agui_stream.py makes it when the
chat asks; core/agui_input.py reads the resume that answers it). A resume entry carries only the
interrupt's id, and the chat's answer names both the approval and the call, so the id holds both.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final

__all__ = ["RESPONSE_SCHEMA", "interrupt", "interrupt_id", "split_interrupt_id"]

# What a resume's payload answers to an approval interrupt.
RESPONSE_SCHEMA: Final = {
    "type": "object",
    "properties": {"approved": {"type": "boolean"}, "reason": {"type": "string"}},
    "required": ["approved"],
    "additionalProperties": False,
}
# An interrupt's id names the approval and the call: a resume carries only the id, and the chat's
# answer (chat_request's approval-responded part) needs both. Neither id ever holds this character.
_ID_SEPARATOR: Final = ":"


def interrupt_id(approval_id: str, tool_call_id: str) -> str:
    return f"{approval_id}{_ID_SEPARATOR}{tool_call_id}"


def split_interrupt_id(value: str) -> tuple[str, str] | None:
    """(approval id, tool call id) of an interrupt id this gateway made, or None."""
    approval_id, sep, tool_call_id = value.partition(_ID_SEPARATOR)
    return (approval_id, tool_call_id) if sep and approval_id and tool_call_id else None


def interrupt(
    approval_id: str, tool_call_id: str, tool: str, hint: Any, expires: float | None,
) -> dict[str, Any]:
    """The interrupt of one approval: the tool's hint as its message, and `expires` (wall seconds,
    None: no deadline) as ISO 8601, the convention a client parses."""
    out: dict[str, Any] = {
        "id": interrupt_id(approval_id, tool_call_id), "reason": "tool_approval", "toolCallId": tool_call_id,
        "message": hint if isinstance(hint, str) and hint else f"Approve the call to {tool or 'this tool'}?",
        "responseSchema": RESPONSE_SCHEMA,
        "metadata": {"approvalId": approval_id, **({"tool": tool} if tool else {})},
    }
    if expires is not None:
        out["expiresAt"] = datetime.fromtimestamp(expires, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return out
