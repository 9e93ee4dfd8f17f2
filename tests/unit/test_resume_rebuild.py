"""A resume that reaches a gateway which forgot the chat (a restart on the memory backend, a replica
that never ran it) finds the approval ADK's session still waits for (issue 25, item 5): the message
is rebuilt from the session (rebuild.py), the Approve that follows continues it and runs the tool
once, a replay of that Approve is refused. Sessions recorded from the stock ADK API server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from gateway.core.rebuild import MESSAGE_ID_STATE_KEY
from gateway.chat.service import ChatService, Gone
from gateway.chat.registry import ChatNotFound
from tests.support.adk import SessionStoreAdk
from tests.support.chat import read, request
from tests.support.clock import Clock
from tests.support.service import chat_service

AGENT = "demo_agent"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "waiting_sessions"
USER = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "pay 50 to Hanako"}]}


def service(adk: SessionStoreAdk, clock: Clock | None = None, yaml: str = "") -> ChatService:
    return chat_service(yaml, adk=adk, clock=clock or Clock())


def recorded(label: str, scenario: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{label}.json").read_text())[scenario]


def approved(chunks: list[dict[str, Any]], yes: bool = True) -> dict[str, Any]:
    """The assistant message a fresh page holds after the resume, its Approve (or Deny) clicked."""
    call = next(c for c in chunks if c["type"] == "tool-input-available")
    ask = next(c for c in chunks if c["type"] == "tool-approval-request")
    return {
        "id": chunks[0]["messageId"], "role": "assistant", "parts": [{"type": "step-start"}, {
            "type": "tool-process_payment", "toolCallId": call["toolCallId"], "state": "approval-responded",
            "input": call["input"], "approval": {"id": ask["approvalId"], "approved": yes},
        }],
    }


def pending_gauge(chats: ChatService) -> float:
    return chats.metrics.approvals_pending.labels(AGENT)._value.get()  # type: ignore[attr-defined]


@pytest.mark.parametrize("label", ["newest", "1.22.1"])
@pytest.mark.parametrize("scenario", ["confirm_pay", "native_pay"])
async def test_a_fresh_gateway_resumes_into_the_waiting_approval_and_the_approve_runs_once(label: str, scenario: str) -> None:
    adk = SessionStoreAdk(recorded(label, scenario))
    chats = service(adk)
    assert chats.resume(AGENT, "alice", "chat-1") is None  # nothing of it here

    resumed = await chats.resume_waiting(AGENT, "alice", "chat-1")

    assert resumed is not None
    chunks = await read(resumed)
    assert [c["type"] for c in chunks] == [
        "start", "start-step", "tool-input-start", "tool-input-available", "tool-approval-request", "finish-step", "finish",
    ]
    message_id = chunks[0]["messageId"]
    assert message_id.startswith("msg-adk-") and chunks[-1]["finishReason"] == "tool-calls"
    assert adk.asked_for == [("alice", "chat-1")]  # the caller's own session, by its chat id
    assert pending_gauge(chats) == 1

    # The page (fresh: no user message) approves; the SDK sends the rebuilt message back.
    answer = approved(chunks)
    second = await read(await chats.submit(AGENT, "alice", request(answer, message_id=message_id)))
    await asyncio.sleep(0)
    assert second[0] == {"type": "start", "messageId": message_id}
    assert {"type": "tool-output-available", "toolCallId": answer["parts"][1]["toolCallId"], "output": {"success": True}} in second
    assert second[-1]["finishReason"] == "stop"
    assert adk.paid == 1 and pending_gauge(chats) == 0

    # A resume now replays the whole message: the rebuilt ask, then the continuation.
    again = chats.resume(AGENT, "alice", "chat-1")
    assert again is not None
    replayed = await read(again)
    assert replayed[: len(chunks) - 1] == chunks[:-1] and replayed[len(chunks) :] == second
    # The Approve again (a replay): refused, known here as answered, nothing reaches ADK.
    with pytest.raises(Gone):
        await chats.submit(AGENT, "alice", request(answer, message_id=message_id))
    assert adk.paid == 1 and len(adk.sent) == 1
    await chats.close()


async def test_a_page_that_kept_the_message_resumes_and_answers_into_that_same_message() -> None:
    """The message was streamed as `msg-live` (its run's state delta says so in ADK's session): the
    rebuilt stream is that message, for the AI SDK to replace rather than add a second one; the
    Approve continues it, and its run tells ADK the same id (a later rebuild finds it again)."""
    session = recorded("newest", "confirm_pay")
    session["events"][0]["actions"]["stateDelta"] = {MESSAGE_ID_STATE_KEY: "msg-live"}
    adk = SessionStoreAdk(session)
    chats = service(adk)
    chunks = await read(await chats.resume_waiting(AGENT, "alice", "chat-1"))  # type: ignore[arg-type]
    assert chunks[0] == {"type": "start", "messageId": "msg-live"}
    answer = approved(chunks)
    second = await read(await chats.submit(AGENT, "alice", request(USER, answer, message_id="msg-live")))
    assert second[0] == {"type": "start", "messageId": "msg-live"} and adk.paid == 1
    assert adk.deltas == [{MESSAGE_ID_STATE_KEY: "msg-live"}]
    await chats.close()


async def test_a_deny_after_the_rebuild_runs_nothing() -> None:
    adk = SessionStoreAdk(recorded("newest", "confirm_pay"))
    chats = service(adk)
    resumed = await chats.resume_waiting(AGENT, "alice", "chat-1")
    assert resumed is not None
    chunks = await read(resumed)
    answer = approved(chunks, yes=False)
    second = await read(await chats.submit(AGENT, "alice", request(answer, message_id=chunks[0]["messageId"])))
    assert {"type": "tool-output-denied", "toolCallId": answer["parts"][1]["toolCallId"]} in second
    assert adk.paid == 0
    await chats.close()


async def test_a_session_left_with_the_user_message_of_a_page_that_kept_it_is_answered_too() -> None:
    # A page that kept its messages sends the user message along with the answer.
    adk = SessionStoreAdk(recorded("newest", "confirm_pay"))
    chats = service(adk)
    chunks = await read(await chats.resume_waiting(AGENT, "alice", "chat-1"))  # type: ignore[arg-type]
    answer = approved(chunks)
    second = await read(await chats.submit(AGENT, "alice", request(USER, answer, message_id=answer["id"])))
    assert second[0]["messageId"] == answer["id"] and adk.paid == 1
    await chats.close()


@pytest.mark.parametrize("scenario", ["confirm_paid", "hello", "confirm_two_one_answered", None])
async def test_nothing_pending_is_still_nothing_to_resume(scenario: str | None) -> None:
    adk = SessionStoreAdk(None if scenario is None else recorded("newest", scenario))
    chats = service(adk)
    assert await chats.resume_waiting(AGENT, "alice", "chat-1") is None
    # And the chat is not taken for it: no run, nothing counted.
    assert chats.local_chats() == [] and pending_gauge(chats) == 0


async def test_another_user_finds_nothing_of_it() -> None:
    adk = SessionStoreAdk(recorded("newest", "confirm_pay"), owner="alice")
    chats = service(adk)
    assert await chats.resume_waiting(AGENT, "mallory", "chat-1") is None
    assert adk.asked_for == [("mallory", "chat-1")]  # ADK scopes sessions by user
    # Once alice's chat is known here, the id is hers: mallory's resume is 404, ADK not asked.
    assert await chats.resume_waiting(AGENT, "alice", "chat-1") is not None
    with pytest.raises(ChatNotFound):
        await chats.resume_waiting(AGENT, "mallory", "chat-1")
    assert len(adk.asked_for) == 2


async def test_an_unreachable_agent_service_leaves_nothing_to_resume() -> None:
    adk = SessionStoreAdk(recorded("newest", "confirm_pay"))
    adk.down = True
    chats = service(adk)
    assert await chats.resume_waiting(AGENT, "alice", "chat-1") is None
    assert chats.metrics.upstream_errors.labels(AGENT, "connect")._value.get() == 1  # type: ignore[attr-defined]


async def test_past_the_replay_retention_a_known_waiting_chat_is_rebuilt_again() -> None:
    """A gateway that did not restart: the message asked, was read, and a minute later the page
    reloads; the run's replay is past `chat.run_retention`, ADK's session still waits."""
    adk = SessionStoreAdk(recorded("newest", "confirm_pay"))
    clock = Clock()
    chats = service(adk, clock)
    first = await read(await chats.resume_waiting(AGENT, "alice", "chat-1"))  # type: ignore[arg-type]
    clock.now += 3600
    assert chats.resume(AGENT, "alice", "chat-1") is None
    again = await chats.resume_waiting(AGENT, "alice", "chat-1")
    assert again is not None and await read(again) == first
    assert pending_gauge(chats) == 1  # the same approval, counted once
    await chats.close()


async def test_a_resume_while_a_run_goes_on_follows_it_without_asking_adk() -> None:
    adk = SessionStoreAdk(recorded("newest", "confirm_pay"))
    chats = service(adk)
    chunks = await read(await chats.resume_waiting(AGENT, "alice", "chat-1"))  # type: ignore[arg-type]
    asked = len(adk.asked_for)
    # Within the retention the rebuilt message replays from memory.
    assert await chats.resume_waiting(AGENT, "alice", "chat-1") is not None
    assert len(adk.asked_for) == asked
    assert chunks[-1]["finishReason"] == "tool-calls"
    await chats.close()


async def test_live_agents_have_no_confirmations_to_rebuild() -> None:
    adk = SessionStoreAdk(recorded("newest", "confirm_pay"))
    chats = service(adk, yaml="upstream:\n  url: http://127.0.0.1:1\n  mode: live\n")
    assert await chats.resume_waiting(AGENT, "alice", "chat-1") is None
    assert adk.asked_for == []


@pytest.mark.parametrize("version", [6, 7])
async def test_the_answers_between_two_runs_are_replayed_for_the_client_s_version(version: int) -> None:
    from tests.unit.test_rebuild import _answered_then_asked

    chats = service(SessionStoreAdk(_answered_then_asked("newest", approved=True)))
    resumed = await chats.resume_waiting(AGENT, "alice", "chat-1", version)  # type: ignore[arg-type]
    assert resumed is not None
    said = [c for c in await read(resumed) if c["type"] == "tool-approval-response"]
    assert [c["approved"] for c in said] == ([True] if version == 7 else [])
    await chats.close()
