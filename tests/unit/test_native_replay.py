"""A native ADK confirmation answered twice reaches ADK once (issue 15's fixtures: ADK 1.x runs
the confirmed tool again on a replayed answer, where 2.13 ignores it)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.chat.service import ChatService, Gone
from gateway.core.chat_request import parse_chat_body
from tests.support.adk import CONFIRM_ID, NativeAdk
from tests.support.chat import USER, read, request
from tests.support.service import chat_service

# The default agent of a config with the single-agent keys (named after upstream.app_name).
AGENT = "demo_agent"


def user(text: str, message_id: str = "u2") -> dict[str, Any]:
    return {"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}


def confirmations(adk: NativeAdk) -> int:
    return sum(
        1 for message in adk.sent for part in message.get("parts", ())
        if part.get("functionResponse", {}).get("id") == CONFIRM_ID
    )


def service(adk: NativeAdk) -> ChatService:
    return chat_service("", adk=adk)


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
    reads = adk.session_reads
    with pytest.raises(Gone):
        await chats.submit(AGENT, "alice", request(USER, answer, message_id=answer["id"]))
    assert confirmations(adk) == 1
    assert adk.session_reads == reads  # known here as answered: no need to ask ADK


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
    adk.asked.add(CONFIRM_ID)  # asked by a run before this gateway started
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


def test_the_session_s_confirmations_are_read_in_either_case() -> None:
    from gateway.upstream.client import _confirmation_ids

    session = {"events": [
        {"content": {"parts": [{"functionCall": {"id": "adk-a", "name": "adk_request_confirmation", "args": {}}}]}},
        {"content": {"parts": [{"function_call": {"id": "adk-c", "name": "adk_request_confirmation"}}]}},
        {"content": {"parts": [{"functionResponse": {"id": "adk-a", "name": "adk_request_confirmation", "response": {}}}]}},
        {"content": {"parts": [{"function_response": {"id": "adk-b", "name": "adk_request_confirmation"}}]}},
        {"content": {"parts": [{"functionResponse": {"id": "call-1", "name": "process_payment"}}, {"text": "x"}]}},
        {"content": None}, "junk",
    ]}
    assert _confirmation_ids(session, "functionResponse", "function_response") == {"adk-a", "adk-b"}
    assert _confirmation_ids(session, "functionCall", "function_call") == {"adk-a", "adk-c"}
    assert _confirmation_ids({"events": "nope"}, "functionCall", "function_call") == set()
    assert _confirmation_ids([], "functionCall", "function_call") == set()


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


async def test_an_answer_adk_lost_in_a_restart_is_410_and_never_reaches_adk() -> None:
    """Issue 25: ADK restarted on in-memory sessions between the ask and the answer. The gateway
    still holds the confirmation as pending, but ADK's session no longer has the call; forwarded,
    the answer came back as a 200 whose error chunk was ADK's `ValueError: Function call not found`."""
    adk = NativeAdk()
    chats = service(adk)
    first = await _finished(chats, "alice", request(USER))
    adk.restart()
    answer = approval_of(first)
    with pytest.raises(Gone) as refused:
        await chats.submit(AGENT, "alice", request(USER, answer, message_id=answer["id"]))
    assert refused.value.status == 410 and refused.value.code == "approval_gone"
    assert "restarted and lost this approval" in str(refused.value)
    assert confirmations(adk) == 0
    # The lost approval no longer counts as pending, and a new message works.
    assert chats.metrics.approvals_pending.labels(AGENT)._value.get() == 0
    again = await _finished(chats, "alice", request(USER, answer, user("pay 50 to Hanako again")))
    assert confirmations(adk) == 0 and "tool-approval-request" in [c["type"] for c in again]
    await chats.close()


async def test_an_answer_to_a_confirmation_this_chat_never_asked_is_410_without_blaming_a_restart() -> None:
    """Another chat's (or a made-up) ADK confirmation id answered here: ADK's session of this chat
    does not hold it, as after an ADK restart, but nothing restarted: the refusal must not say so."""
    adk = NativeAdk()
    chats = service(adk)
    first = await _finished(chats, "alice", request(USER))
    answer = approval_of(first)
    foreign = {**answer, "parts": [
        {**part, "approval": {**part["approval"], "id": "adk-of-another-chat"}} if "approval" in part else part
        for part in answer["parts"]
    ]}
    with pytest.raises(Gone) as refused:
        await chats.submit(AGENT, "alice", request(USER, foreign, message_id=answer["id"]))
    assert refused.value.status == 410 and refused.value.code == "approval_gone"
    assert "restarted" not in str(refused.value) and "not pending in this chat" in str(refused.value)
    assert confirmations(adk) == 0
    # The chat's own confirmation still waits, and its answer still goes through.
    await _finished(chats, "alice", request(USER, answer, message_id=answer["id"]))
    assert confirmations(adk) == 1
    await chats.close()


async def test_a_lost_answer_alongside_a_new_message_is_left_out() -> None:
    adk = NativeAdk()
    chats = service(adk)
    first = await _finished(chats, "alice", request(USER))
    adk.restart()
    answer = approval_of(first)
    chunks = await _finished(chats, "alice", request(USER, answer, user("never mind")))
    assert "error" not in [c["type"] for c in chunks]
    assert confirmations(adk) == 0
    await chats.close()


async def test_a_native_answer_in_live_mode_is_refused_without_asking_adk() -> None:
    """Live mode has no ADK confirmations: the answer is a 400 as before, and costs no session read."""
    from gateway.core.chat_request import InvalidRequest

    adk = NativeAdk()
    chats = chat_service("upstream:\n  mode: live\n", adk=adk)
    answer = {
        "id": "msg-1", "role": "assistant", "parts": [{"type": "step-start"}, {
            "type": "tool-process_payment", "toolCallId": "call-1", "state": "approval-responded",
            "input": {"amount": 50}, "approval": {"id": CONFIRM_ID, "approved": True},
        }],
    }
    with pytest.raises(InvalidRequest):
        await chats.submit(AGENT, "alice", request(USER, answer, message_id="msg-1"))
    assert adk.session_reads == 0 and adk.sent == []
