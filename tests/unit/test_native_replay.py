"""A native ADK confirmation answered twice reaches ADK once (issue 15's fixtures: ADK 1.x runs
the confirmed tool again on a replayed answer, where 2.13 ignores it)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.agents import Agents
from gateway.chats import ChatService, Gone
from gateway.config import parse_config
from gateway.messages import parse_chat_body
from gateway.metrics import GatewayMetrics
from gateway.registry import Registry
from tests.unit.test_chat_gates import USER, read, request

# The default agent of a config with the single-agent keys (named after upstream.app_name).
AGENT = "demo_agent"

CONFIRM_ID = "adk-confirm-1"


class NativeAdk:
    """ADK with a native confirmation: the first run asks, every run after answers; records what it was sent."""

    def __init__(self, answered_in_session: tuple[str, ...] = ()) -> None:
        self.sent: list[dict[str, Any]] = []
        self.answered_in_session = set(answered_in_session)
        self.session_reads = 0

    async def ensure_session(self, user_id: str, session_id: str) -> None:
        return None

    async def answered_confirmations(self, user_id: str, session_id: str) -> set[str]:
        self.session_reads += 1
        return set(self.answered_in_session)

    async def run_sse_batches(self, *, new_message: dict[str, Any], **_: Any) -> Any:
        self.sent.append(new_message)
        if len(self.sent) == 1:
            yield [
                {"author": "a", "content": {"role": "model", "parts": [{"functionCall": {
                    "id": CONFIRM_ID, "name": "adk_request_confirmation",
                    "args": {"originalFunctionCall": {"id": "call-1", "name": "process_payment", "args": {"amount": 50}},
                             "toolConfirmation": {"hint": "ok?", "confirmed": False}},
                }}]}, "longRunningToolIds": [CONFIRM_ID]},
            ]
        else:
            yield [{"author": "a", "content": {"role": "model", "parts": [{"text": "Paid."}]}, "finishReason": "STOP"}]


def confirmations(adk: NativeAdk) -> int:
    return sum(
        1 for message in adk.sent for part in message.get("parts", ())
        if part.get("functionResponse", {}).get("id") == CONFIRM_ID
    )


def service(adk: NativeAdk) -> ChatService:
    config = parse_config("", env={})
    return ChatService(
        agents=Agents(config, client=lambda _: adk), registry=Registry(), metrics=GatewayMetrics(), config=config,  # type: ignore[arg-type, return-value]
    )


def approval_of(first: list[dict[str, Any]]) -> dict[str, Any]:
    ask = next(c for c in first if c["type"] == "tool-approval-request")
    return {
        "id": first[0]["messageId"], "role": "assistant",
        "parts": [{"type": "step-start"}, {
            "type": "tool-process_payment", "toolCallId": ask["toolCallId"], "state": "approval-responded",
            "input": {"amount": 50}, "approval": {"id": ask["approvalId"], "approved": True},
        }],
    }


async def _finished(chats: ChatService, user: str, body: Any) -> list[dict[str, Any]]:
    chunks = await read(await chats.submit(AGENT, user, body))
    await asyncio.sleep(0)  # the run's task records its answers as it ends
    return chunks


async def test_a_replayed_native_answer_is_410_and_never_reaches_adk() -> None:
    adk = NativeAdk()
    chats = service(adk)
    first = await _finished(chats, "alice", request(USER))
    answer = approval_of(first)
    second = await _finished(chats, "alice", request(USER, answer, message_id=answer["id"]))
    assert "text-delta" in [c["type"] for c in second]
    with pytest.raises(Gone):
        await chats.submit(AGENT, "alice", request(USER, answer, message_id=answer["id"]))
    assert confirmations(adk) == 1
    assert adk.session_reads == 0  # known here: no need to ask ADK


async def test_after_a_restart_adk_s_session_says_the_answer_was_given() -> None:
    """A fresh gateway (or another replica) knows nothing of the chat: ADK's session does."""
    adk = NativeAdk(answered_in_session=(CONFIRM_ID,))
    chats = service(adk)
    answer = {
        "id": "msg-1", "role": "assistant", "parts": [{"type": "step-start"}, {
            "type": "tool-process_payment", "toolCallId": "call-1", "state": "approval-responded",
            "input": {"amount": 50}, "approval": {"id": CONFIRM_ID, "approved": True},
        }],
    }
    with pytest.raises(Gone):
        await chats.submit(AGENT, "alice", request(USER, answer, message_id="msg-1"))
    assert adk.sent == [] and adk.session_reads == 1


async def test_an_unknown_answer_adk_still_waits_for_is_forwarded() -> None:
    adk = NativeAdk()
    adk.sent.append({})  # as if the asking run happened before a restart
    chats = service(adk)
    answer = {
        "id": "msg-1", "role": "assistant", "parts": [{"type": "step-start"}, {
            "type": "tool-process_payment", "toolCallId": "call-1", "state": "approval-responded",
            "input": {"amount": 50}, "approval": {"id": CONFIRM_ID, "approved": True},
        }],
    }
    chunks = await _finished(chats, "alice", request(USER, answer, message_id="msg-1"))
    assert "text-delta" in [c["type"] for c in chunks]
    assert confirmations(adk) == 1


def test_the_session_s_confirmation_answers_are_read_in_either_case() -> None:
    from gateway.upstream import _confirmation_answers

    session = {"events": [
        {"content": {"parts": [{"functionResponse": {"id": "adk-a", "name": "adk_request_confirmation", "response": {}}}]}},
        {"content": {"parts": [{"function_response": {"id": "adk-b", "name": "adk_request_confirmation"}}]}},
        {"content": {"parts": [{"functionResponse": {"id": "call-1", "name": "process_payment"}}, {"text": "x"}]}},
        {"content": None}, "junk",
    ]}
    assert _confirmation_answers(session) == {"adk-a", "adk-b"}
    assert _confirmation_answers({"events": "nope"}) == set() and _confirmation_answers([]) == set()


async def test_a_resume_after_a_native_answer_replays_the_earlier_run_too() -> None:
    """Issue 24, defect 11: the answer starts a new run on the same message; a resume replays the run
    that asked, the person's answer (ai 7 has a chunk for it), then the new run."""
    def v7(*messages: dict[str, Any], message_id: str | None = None) -> Any:
        body: dict[str, Any] = {"id": "chat-1", "messages": list(messages), "trigger": "submit-message"}
        if message_id:
            body["messageId"] = message_id
        return parse_chat_body(body, version_header="7", default_version=6)

    chats = service(NativeAdk())
    first = await _finished(chats, "u", v7(USER))
    answer = approval_of(first)
    second = await _finished(chats, "u", v7(USER, answer, message_id=answer["id"]))
    assert second[0] == {"type": "start", "messageId": answer["id"]}
    resumed = chats.resume(AGENT, "u", "chat-1")
    assert resumed is not None
    boundary = {"type": "message-metadata", "messageMetadata": first[-1].get("messageMetadata")}
    said = {"type": "tool-approval-response", "approvalId": CONFIRM_ID, "approved": True}
    assert await read(resumed) == [*first[:-1], boundary, said, *second]
    await chats.close()
