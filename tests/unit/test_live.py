"""A chat's live session: events reach the turn in progress, and a turn ends at the right turnComplete;
and the session outlives the browser's socket until its turn ends (ChatService, ADK's socket faked)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from gateway.core.approvals import GatedCall, Outcome, Verdict
from gateway.chat.record import Chat
from gateway.chat.service import Attachment, ChatService
from gateway.upstream.live import LiveLink
from gateway.ops.metrics import GatewayMetrics
from gateway.upstream.client import UpstreamError
from tests.support.adk import LIVE_CALL, LIVE_RESULT, TURN_COMPLETE, LiveAdk, LiveConnection, live_text
from tests.support.service import chat_service
from tests.support.chat import CALL as CALL_ID, USER, answered, call_event, read, request as body, response_event
from tests.support.waiting import until
from tests.unit.fixtures import LIVE_FOLDERS, ROOT, events, types




async def play(link: LiveLink, conn: LiveConnection, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for event in events:
        conn.inbox.put_nowait(event)
    return [e async for e in link.turn({"content": {"role": "user", "parts": [{"text": "hi"}]}})]


async def test_a_turn_ends_at_turn_complete_and_sends_its_request_first() -> None:
    conn = LiveConnection()
    link = LiveLink(conn)  # type: ignore[arg-type]
    got = await play(link, conn, [live_text("a"), TURN_COMPLETE, live_text("next turn")])
    assert got == [live_text("a"), TURN_COMPLETE]
    assert conn.sent == [{"content": {"role": "user", "parts": [{"text": "hi"}]}}]
    await link.close()


async def test_turn_complete_right_after_tool_results_does_not_end_the_turn() -> None:
    conn = LiveConnection()
    link = LiveLink(conn)  # type: ignore[arg-type]
    got = await play(link, conn, [LIVE_CALL, LIVE_RESULT, TURN_COMPLETE, live_text("answer"), TURN_COMPLETE])
    assert got == [LIVE_CALL, LIVE_RESULT, TURN_COMPLETE, live_text("answer"), TURN_COMPLETE]
    await link.close()


async def test_events_between_turns_are_dropped_and_counted() -> None:
    conn = LiveConnection()
    closed: list[bool] = []
    link = LiveLink(conn, on_closed=lambda: closed.append(True))  # type: ignore[arg-type]
    conn.inbox.put_nowait(live_text("unprompted"))
    await asyncio.sleep(0.01)
    assert link.dropped == 1
    await link.close()
    assert closed == [True] and not link.alive


async def test_socket_closing_mid_turn_is_an_upstream_error() -> None:
    conn = LiveConnection()
    link = LiveLink(conn)  # type: ignore[arg-type]
    with pytest.raises(UpstreamError):
        await play(link, conn, [live_text("a"), None])  # type: ignore[list-item]
    with pytest.raises(UpstreamError):
        await play(link, conn, [])


async def cut_after_first_event(link: LiveLink, conn: LiveConnection) -> None:
    """A turn whose reader leaves after its first event (the browser stopped it)."""
    conn.inbox.put_nowait(live_text("Hel"))
    turn = link.turn_batches({"content": {"role": "user", "parts": [{"text": "hi"}]}})
    assert list(await anext(turn)) == [live_text("Hel")]
    await turn.aclose()


async def test_a_turn_left_before_its_end_is_dropped_up_to_it_and_the_next_waits_for_it() -> None:
    conn = LiveConnection()
    link = LiveLink(conn)  # type: ignore[arg-type]
    await cut_after_first_event(link, conn)
    assert not link.in_turn and not await link.settle(0.01)
    with pytest.raises(UpstreamError, match="settle first"):
        await play(link, conn, [])
    for event in (live_text("lo"), TURN_COMPLETE):
        conn.inbox.put_nowait(event)
    assert await link.settle(1) and link.dropped == 2
    assert await play(link, conn, [live_text("Bye"), TURN_COMPLETE]) == [live_text("Bye"), TURN_COMPLETE]
    await link.close()


async def test_the_socket_closing_mid_cut_ends_the_cut_and_refuses_the_next_turn() -> None:
    conn = LiveConnection()
    link = LiveLink(conn)  # type: ignore[arg-type]
    await cut_after_first_event(link, conn)
    await conn.close()
    assert await link.settle(1) and not link.alive
    with pytest.raises(UpstreamError, match="live session is closed"):
        await play(link, conn, [])
    await link.close()


# ---- recorded sessions of every supported ADK (tests/fixtures/adk_live*, tests/unit/fixtures.py) ----

def _one_turn_recordings() -> list[tuple[str, str]]:
    cases = []
    for folder in LIVE_FOLDERS:
        log = json.loads((ROOT / folder / "requests.json").read_text())
        for name, entry in log.items():
            sends = [s for s in entry["steps"] if "send" in s and s["send"] != {"close": True}]
            if len(sends) == 1 and {"awaitTurnComplete": 1} in entry["steps"]:
                cases.append((folder, name))
    return cases


@pytest.mark.parametrize(("folder", "name"), _one_turn_recordings())
async def test_a_recorded_turn_is_exactly_what_adk_sent_for_it(folder: str, name: str) -> None:
    recorded = events(name, folder)
    conn = LiveConnection()
    link = LiveLink(conn)  # type: ignore[arg-type]
    got = await play(link, conn, recorded)
    # The turn ends at the recording's last turnComplete, not at one that follows tool results.
    assert got == recorded and recorded[-1].get("turnComplete")
    await link.close()


@pytest.mark.parametrize("folder", LIVE_FOLDERS)
async def test_two_recorded_turns_split_at_their_turn_complete(folder: str) -> None:
    recorded = events("two_turns", folder)
    first_end = next(i for i, e in enumerate(recorded) if e.get("turnComplete")) + 1
    conn = LiveConnection()
    link = LiveLink(conn)  # type: ignore[arg-type]
    assert await play(link, conn, recorded[:first_end]) == recorded[:first_end]
    assert await play(link, conn, recorded[first_end:]) == recorded[first_end:]
    await link.close()


# ---- a live chat whose browser socket closes (ChatService, ADK's live socket faked) ----------------

LIVE_CONFIG = """\
internal:
  secret: s3cret
upstream:
  mode: live
chat:
  on_disconnect: {on_disconnect}
tools:
  process_payment:
    approval: true
    timeout: 2s
"""
AGENT = "demo_agent"
TOOL = "process_payment"
NEW = {"id": "u2", "role": "user", "parts": [{"type": "text", "text": "and again"}]}


@dataclass
class LiveEnv:
    adk: LiveAdk
    service: ChatService
    metrics: GatewayMetrics

    @property
    def conn(self) -> LiveConnection:
        return self.adk.opened[-1]

    def chat(self) -> Chat:
        chat = self.service._registry.find(AGENT, "u", "chat-1")
        assert chat is not None
        return chat

    def open_sessions(self) -> float:
        return self.metrics.registry.get_sample_value("adk_gateway_live_sessions", {"agent": AGENT}) or 0.0

    async def submit(self, *messages: dict[str, Any], message_id: str | None = None) -> Attachment:
        attachment = await self.service.submit(AGENT, "u", body(*messages, message_id=message_id))
        await until(lambda: bool(self.adk.opened) and self.chat().live is not None)
        return attachment

    async def socket_closed(self) -> None:
        await self.service.socket_closed(AGENT, "u", "chat-1")

    async def turn_ended(self) -> None:
        chat = self.chat()
        assert await chat.ended(5) and not chat.machine.running


def live_env(on_disconnect: str) -> AsyncIterator[LiveEnv]:
    async def make() -> AsyncIterator[LiveEnv]:
        adk, metrics = LiveAdk(), GatewayMetrics()
        service = chat_service(LIVE_CONFIG.format(on_disconnect=on_disconnect), adk=adk, metrics=metrics)
        yield LiveEnv(adk, service, metrics)
        await service.close()

    return make()


@pytest.fixture
async def env() -> AsyncIterator[LiveEnv]:
    async for made in live_env("continue"):
        yield made


@pytest.fixture
async def cancelling_env() -> AsyncIterator[LiveEnv]:
    async for made in live_env("cancel"):
        yield made


def partial(text: str) -> dict[str, Any]:
    return {"author": "a", "partial": True, "content": {"role": "model", "parts": [{"text": text}]}}


def says(conn: LiveConnection, *pieces: str) -> None:
    for piece in pieces:
        conn.inbox.put_nowait(partial(piece))
    conn.inbox.put_nowait({"author": "a", "content": {"role": "model", "parts": [{"text": "".join(pieces)}]}})
    conn.inbox.put_nowait(TURN_COMPLETE)


async def settled() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_a_socket_closed_mid_turn_leaves_the_turn_running_and_a_resume_on_a_new_socket_reads_it_whole(env: LiveEnv) -> None:
    first = await env.submit(USER)
    env.conn.inbox.put_nowait(partial("Hel"))
    await settled()
    await env.socket_closed()  # mid-reply; `continue`, the default
    resumed = env.service.resume(AGENT, "u", "chat-1")  # the new socket's `resume`
    assert resumed is not None
    says(env.conn, "lo")
    chunks = await read(resumed)
    assert "error" not in types(chunks)
    assert "".join(c["delta"] for c in chunks if c["type"] == "text-delta") == "Hello"
    assert chunks[-1]["type"] == "finish"
    assert await read(first) == chunks  # the same response, replayed whole
    await env.turn_ended()
    # A browser came back before the turn ended: its session stays for the next turn.
    assert env.chat().live is not None and env.chat().live.alive and env.open_sessions() == 1
    second = await env.submit(USER, {"id": "a1", "role": "assistant", "parts": []}, NEW)
    says(env.conn, "Again.")
    assert types(await read(second))[-1] == "finish"
    assert len(env.adk.opened) == 1


async def test_a_turn_whose_browser_never_came_back_closes_its_live_session_when_it_ends(env: LiveEnv) -> None:
    await env.submit(USER)
    env.conn.inbox.put_nowait(partial("Hel"))
    await settled()
    await env.socket_closed()
    assert env.open_sessions() == 1  # the turn still needs it
    says(env.conn, "lo")
    await env.turn_ended()
    await settled()
    # A model connection is not held for a browser that left: closed once the turn is over.
    assert env.chat().live is None and env.open_sessions() == 0
    # A resume after that still reads the whole message, and the next turn opens a new session.
    resumed = env.service.resume(AGENT, "u", "chat-1")
    assert resumed is not None
    chunks = await read(resumed)
    assert "error" not in types(chunks) and chunks[-1]["type"] == "finish"
    nxt = await env.submit(USER, {"id": "a1", "role": "assistant", "parts": []}, NEW)
    says(env.conn, "Again.")
    assert types(await read(nxt))[-1] == "finish"
    assert len(env.adk.opened) == 2


async def test_a_socket_closed_between_turns_closes_the_live_session_at_once(env: LiveEnv) -> None:
    first = await env.submit(USER)
    says(env.conn, "Hi.")
    await read(first)
    await env.turn_ended()
    assert env.open_sessions() == 1
    await env.socket_closed()
    assert env.chat().live is None and env.open_sessions() == 0


async def test_a_socket_closed_while_an_approval_waits_keeps_the_turn_and_the_approval_on_a_new_socket(env: LiveEnv) -> None:
    first = await env.submit(USER)
    env.conn.inbox.put_nowait(call_event(TOOL))
    await until(lambda: env.chat().ledger.expected(CALL_ID))
    call = env.service.gates.open(app_name=AGENT, user_id="u", session_id="chat-1", tool_call_id=CALL_ID, tool=TOOL, args={"amount": 50})
    assert isinstance(call, GatedCall)
    asked = await read(first)
    assert types(asked)[-3:] == ["tool-approval-request", "finish-step", "finish"]
    await env.socket_closed()  # the person's socket drops while they decide
    await settled()
    assert env.chat().machine.running and env.open_sessions() == 1
    # The new socket resumes (the ended response: what the stock client reads), then answers.
    resumed = env.service.resume(AGENT, "u", "chat-1")
    assert resumed is not None and "error" not in types(await read(resumed))
    answer = await env.submit(USER, answered(asked, TOOL, True), message_id=asked[0]["messageId"])
    assert await asyncio.wait_for(env.service.gates.wait(call), 1) == Verdict(run=True)
    env.conn.inbox.put_nowait(response_event(TOOL, {"success": True}))
    says(env.conn, "Paid.")
    chunks = await read(answer)
    assert "error" not in types(chunks)
    assert {"type": "tool-output-available", "toolCallId": CALL_ID, "output": {"success": True}} in chunks
    assert chunks[-1]["type"] == "finish" and call.outcome is Outcome.APPROVED


async def test_with_on_disconnect_cancel_a_socket_closed_mid_turn_aborts_the_turn_and_closes_the_session(cancelling_env: LiveEnv) -> None:
    env = cancelling_env
    first = await env.submit(USER)
    env.conn.inbox.put_nowait(partial("Hel"))
    await settled()
    await env.socket_closed()
    chunks = await read(first)
    assert chunks[-1] == {"type": "abort"} and "error" not in types(chunks)
    assert not env.chat().machine.running and env.chat().live is None and env.open_sessions() == 0


async def test_with_on_disconnect_cancel_a_socket_closed_while_an_approval_waits_cancels_the_call(cancelling_env: LiveEnv) -> None:
    env = cancelling_env
    first = await env.submit(USER)
    env.conn.inbox.put_nowait(call_event(TOOL))
    await until(lambda: env.chat().ledger.expected(CALL_ID))
    call = env.service.gates.open(app_name=AGENT, user_id="u", session_id="chat-1", tool_call_id=CALL_ID, tool=TOOL, args={"amount": 50})
    assert isinstance(call, GatedCall)
    assert types(await read(first))[-1] == "finish"
    await env.socket_closed()
    verdict = await asyncio.wait_for(env.service.gates.wait(call), 1)
    assert not verdict.run and call.outcome is Outcome.CANCELLED
    assert not env.chat().machine.running and env.chat().live is None and env.open_sessions() == 0


# ---- a live turn left before its end: its remainder is not the next answer ----------------------

def text_deltas(chunks: list[dict[str, Any]]) -> str:
    return "".join(c["delta"] for c in chunks if c["type"] == "text-delta")


async def test_after_a_stop_the_next_message_reads_its_own_answer_not_the_rest_of_the_stopped_one(env: LiveEnv) -> None:
    """The browser stopped reading mid-reply (SSE `stop()`, `on_disconnect: continue`) and sent the
    next message: the stopped turn goes on in ADK's live session, and its rest, up to its
    `turnComplete`, is dropped before the next message goes out and its answer is read."""
    first = await env.submit(USER)
    env.conn.inbox.put_nowait(partial("Hel"))
    await until(lambda: len(env.chat().run.current.frames) > 2)  # type: ignore[union-attr]
    first.response.close()  # the browser went away
    second = await env.service.submit(AGENT, "u", body(USER, NEW))
    await settled()
    assert len(env.conn.sent) == 1  # the stopped turn has not ended in ADK: the next waits
    says(env.conn, "lo")  # the rest of the stopped answer
    await until(lambda: len(env.conn.sent) == 2)
    says(env.conn, "Bye")  # the next message's answer
    chunks = await read(second)
    assert text_deltas(chunks) == "Bye" and chunks[-1]["type"] == "finish"
    assert len(env.conn.sent) == 2 and env.chat().live is not None and env.chat().live.dropped == 3


async def test_a_stopped_turn_that_never_ends_gives_its_live_session_up_for_a_new_one(env: LiveEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gateway.chat.agent_runs._LIVE_CUT_SECONDS", 0.05)
    first = await env.submit(USER)
    env.conn.inbox.put_nowait(partial("Hel"))
    await until(lambda: len(env.chat().run.current.frames) > 2)  # type: ignore[union-attr]
    first.response.close()
    stuck = env.conn
    second = await env.service.submit(AGENT, "u", body(USER, NEW))
    await asyncio.wait_for(until_opened(env, 2), 5)
    says(env.conn, "Bye")
    chunks = await read(second)
    assert text_deltas(chunks) == "Bye" and chunks[-1]["type"] == "finish"
    assert len(stuck.sent) == 1 and len(env.conn.sent) == 1


async def until_opened(env: LiveEnv, count: int) -> None:
    while len(env.adk.opened) < count or len(env.conn.sent) < 1:
        await asyncio.sleep(0.01)
