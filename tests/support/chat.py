"""What a chat test says to the chat service and reads back: the browser's requests, ADK's events of
a call or an answer, and a response read to its end."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from gateway.chat.service import Attachment
from gateway.core.chat_request import parse_chat_body

CALL = "call-1"
USER = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "pay 50 to Hanako"}]}


def call_event(tool: str) -> dict[str, Any]:
    """ADK's event of the model calling `tool` (CALL)."""
    args = {"amount": 50, "recipient": "Hanako", "currency": "USD"} if tool == "process_payment" else {}
    return {"author": "a", "content": {"role": "model", "parts": [{"functionCall": {"id": CALL, "name": tool, "args": args}}]}}


def response_event(tool: str, response: dict[str, Any]) -> dict[str, Any]:
    return {"author": "a", "content": {"role": "user", "parts": [{"functionResponse": {"id": CALL, "name": tool, "response": response}}]}}


def text_events(*pieces: str) -> list[dict[str, Any]]:
    """ADK's streamed answer: a partial event per piece, then the aggregated final one."""
    partials = [{"author": "a", "partial": True, "content": {"role": "model", "parts": [{"text": p}]}} for p in pieces]
    return [*partials, {"author": "a", "content": {"role": "model", "parts": [{"text": "".join(pieces)}]}, "finishReason": "STOP"}]


def request(*messages: dict[str, Any], message_id: str | None = None) -> Any:
    """The AI SDK's POST of chat-1 (`submit-message`), parsed as the transports parse it."""
    body: dict[str, Any] = {"id": "chat-1", "messages": list(messages), "trigger": "submit-message"}
    if message_id:
        body["messageId"] = message_id
    return parse_chat_body(body, version_header=None, default_version=6)


async def read(attachment: Attachment) -> list[dict[str, Any]]:
    """Every chunk of a response, read to its end (within 5 s)."""
    frames: list[bytes] = []

    async def follow() -> None:
        async for batch in attachment.response.follow():
            frames.extend(batch)

    await asyncio.wait_for(follow(), 5)
    return [orjson.loads(f) for f in frames]


def answered(first: list[dict[str, Any]], tool: str, approved: bool) -> dict[str, Any]:
    """The assistant message a Chat sends back once the person clicked."""
    request_chunk = next(c for c in first if c["type"] == "tool-approval-request")
    return {
        "id": first[0]["messageId"], "role": "assistant",
        "parts": [
            {"type": "step-start"},
            {
                "type": f"tool-{tool}", "toolCallId": CALL, "state": "approval-responded", "input": {},
                "approval": {"id": request_chunk["approvalId"], "approved": approved},
            },
        ],
    }
