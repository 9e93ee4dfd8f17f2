"""Hand-built AI SDK requests for tests that need control a real Chat does not give (replays, forgeries)."""

from __future__ import annotations

import secrets
from typing import Any

from tests.procs import GatewayProcess, Reply, request


def new_chat() -> str:
    return "chat-" + secrets.token_hex(6)


def user(text: str) -> dict[str, Any]:
    return {"id": "u-" + secrets.token_hex(4), "role": "user", "parts": [{"type": "text", "text": text}]}


def post(gw: GatewayProcess, chat_id: str, messages: list[dict[str, Any]], **extra: Any) -> Reply:
    return request(gw.base, "POST", "/api/chat", {"id": chat_id, "messages": messages, "trigger": "submit-message", **extra})


def assistant_from(reply: Reply, decisions: list[bool] | None = None) -> dict[str, Any]:
    """The assistant message a Chat would hold after `reply`, with approvals answered."""
    return assistant_message(reply.chunks, decisions)


def assistant_message(chunks: list[dict[str, Any]], decisions: list[bool] | None = None) -> dict[str, Any]:
    """The assistant message a Chat would hold after a response's `chunks`, with its approvals
    answered by `decisions` in order (the rest left requested)."""
    message_id = chunks[0]["messageId"]
    parts: list[dict[str, Any]] = [{"type": "step-start"}]
    tools: dict[str, dict[str, Any]] = {}
    for chunk in chunks:
        if chunk["type"] == "tool-input-start":
            tools[chunk["toolCallId"]] = part = {
                "type": f"tool-{chunk['toolName']}", "toolCallId": chunk["toolCallId"], "state": "input-streaming",
            }
            parts.append(part)
        elif chunk["type"] == "tool-input-available":
            tools[chunk["toolCallId"]].update(state="input-available", input=chunk["input"])
        elif chunk["type"] == "tool-approval-request":
            tools[chunk["toolCallId"]].update(state="approval-requested", approval={"id": chunk["approvalId"]})
    for part, approved in zip([p for p in parts if p.get("state") == "approval-requested"], decisions or []):
        part["state"] = "approval-responded"
        part["approval"]["approved"] = approved
    return {"id": message_id, "role": "assistant", "parts": parts}


def types(reply: Reply) -> list[str]:
    return [c["type"] for c in reply.chunks]
