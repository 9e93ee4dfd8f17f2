"""ChatService's riskiest paths, with ADK scripted in-process (tests/support/adk.py):
whose approvals a request may answer, gated calls approved, denied, replayed, timed out, cancelled
by a new message or an abort, a second request while one streams, and a reload's replay.

Each test asserts what the browser reads (the chunks of the attachment) and/or the refusal the
request gets (status and code), and what the plugin's waiting request is told (the verdict).
The clock is moved by hand: nothing here sleeps for a deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from gateway.core.approvals import REFUSAL_KEY, CallState, GatedCall, Outcome, Verdict
from gateway.chat.record import Chat
from gateway.chat.service import Attachment, ChatBusy, ChatService, Forbidden, Gone
from gateway.config.schema import parse_config
from gateway.core.chat_request import parse_chat_body
from gateway.ops.metrics import GatewayMetrics
from gateway.chat.registry import ChatNotFound
from tests.support.recordings import check_stream_rules, types
from tests.support.adk import SEALED, ScriptedAdk
from tests.support.chat import CALL, USER, answered, call_event, read, response_event
from tests.support.clock import Clock
from tests.support.service import GONE, chat_service, held_engine
from tests.unit.test_chat_gates import wait_count

# The default agent of a config with the single-agent keys (named after upstream.app_name).
AGENT = "demo_agent"

TOOL = "process_payment"
CONFIG = """\
internal:
  secret: s3cret
tools:
  process_payment:
    approval: true
    timeout: 2s
"""
WAIT = "adk_gateway_approval_wait_seconds"


NEW_MESSAGE = {"id": "u2", "role": "user", "parts": [{"type": "text", "text": "never mind, what time is it?"}]}


@dataclass
class Env:
    adk: ScriptedAdk
    service: ChatService
    metrics: GatewayMetrics
    clock: Clock

    def chat(self, user: str = "u", chat_id: str = "chat-1") -> Chat:
        chat = self.service._registry.find(AGENT, user, chat_id)
        assert chat is not None
        return chat

    async def run_ended(self, user: str = "u", chat_id: str = "chat-1") -> None:
        chat = self.chat(user, chat_id)
        assert await chat.ended(5) and not chat.machine.running

    def runs(self, outcome: str) -> float:
        return self.metrics.registry.get_sample_value("adk_gateway_runs_total", {"agent": AGENT, "outcome": outcome}) or 0.0

    def sample(self, name: str, labels: dict[str, str] | None = None) -> float:
        return self.metrics.registry.get_sample_value(name, labels or {}) or 0.0

    def ends(self) -> None:
        self.adk.ends()

    def says(self, *pieces: str) -> None:
        self.adk.says(*pieces)

    async def approve(self, call: GatedCall, first: list[dict[str, Any]]) -> Attachment:
        """The person's Approve of `call`, asked in chat-1's msg-1 (`first`): the plugin's wait ends in `run`."""
        attachment = await self.service.submit(AGENT, "u", body(USER, answer_of(first, True), message_id="msg-1"))
        assert await asyncio.wait_for(self.service.gates.wait(call), 1) == Verdict(run=True)
        return attachment

    def paid(self, call: GatedCall) -> None:
        """ADK runs the payment the plugin let through, says "Paid." and ends the run."""
        assert call.verdict is not None
        self.plugin_answers(call.verdict, {"success": True})
        self.says("Paid.")
        self.ends()

    def plugin_answers(self, verdict: Verdict, result: dict[str, Any] | None = None) -> None:
        """What ADK streams once the plugin has its verdict: the tool's result, or the refusal."""
        response = result if verdict.run else verdict.response
        assert response is not None
        self.adk.reads.put_nowait([response_event(TOOL, response)])


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    adk, clock = ScriptedAdk(), Clock()
    ids = iter(f"msg-{n}" for n in range(1, 100))
    service = chat_service(held_engine(parse_config(CONFIG, env={})), adk=adk, clock=clock, new_id=lambda: next(ids))
    yield Env(adk, service, service.metrics, clock)
    await service.close()


def body(*messages: dict[str, Any], chat_id: str = "chat-1", message_id: str | None = None) -> Any:
    data: dict[str, Any] = {"id": chat_id, "messages": list(messages), "trigger": "submit-message"}
    if message_id:
        data["messageId"] = message_id
    return parse_chat_body(data, version_header=None, default_version=6)


def answer_of(first: list[dict[str, Any]], approved: bool, approval_id: str | None = None) -> dict[str, Any]:
    """The assistant message the AI SDK posts back once the person clicked (optionally naming another approval)."""
    message = answered(first, TOOL, approved)
    if approval_id is not None:
        message["parts"][1]["approval"]["id"] = approval_id
    return message


def still_asking(first: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant message as it stands when the person types instead of clicking."""
    ask = next(c for c in first if c["type"] == "tool-approval-request")
    return {
        "id": first[0]["messageId"], "role": "assistant",
        "parts": [
            {"type": "step-start"},
            {"type": f"tool-{TOOL}", "toolCallId": CALL, "state": "approval-requested", "input": {}, "approval": {"id": ask["approvalId"]}},
        ],
    }


async def until(condition: Callable[[], bool]) -> None:
    """Let the run's task take what the scripted ADK sent (a few loop turns, never a sleep for a deadline)."""
    for _ in range(200):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


async def gated_call(env: Env, user: str = "u", chat_id: str = "chat-1") -> tuple[GatedCall, list[dict[str, Any]]]:
    """A new message whose model turn calls the gated tool; the plugin opens the call; the browser
    reads the first response, which asks for approval. Returns the call and that response."""
    attachment = await env.service.submit(AGENT, user, body(USER, chat_id=chat_id))
    env.adk.reads.put_nowait([call_event(TOOL)])
    await until(lambda: env.chat(user, chat_id).ledger.expected(CALL))
    call = env.service.gates.open(app_name=AGENT, user_id=user, session_id=chat_id, tool_call_id=CALL, tool=TOOL, args={"amount": 50})
    assert isinstance(call, GatedCall) and call.state is CallState.AWAITING_APPROVAL
    first = await read(attachment)
    assert types(first)[-3:] == ["tool-approval-request", "finish-step", "finish"]
    assert first[-1]["finishReason"] == "tool-calls"
    assert next(c for c in first if c["type"] == "tool-approval-request")["approvalId"] == call.id
    check_stream_rules(first)
    return call, first


def text_of(chunks: list[dict[str, Any]]) -> str:
    return "".join(c["delta"] for c in chunks if c["type"] == "text-delta")


# ---- whose approval is it ---------------------------------------------------------------------


async def test_an_approval_of_another_chat_of_the_same_user_is_forbidden_and_stays_pending_for_its_own_chat(env: Env) -> None:
    call, first = await gated_call(env)
    # chat-2 is the same user's other chat: its request names chat-1's approval.
    with pytest.raises(Forbidden) as refused:
        await env.service.submit(AGENT, "u", body(USER, answer_of(first, True), chat_id="chat-2", message_id="msg-1"))
    assert (refused.value.status, refused.value.code) == (403, "forbidden")
    # Alongside a new message it is no stale leftover either: the id is known, and it is not this chat's.
    with pytest.raises(Forbidden):
        await env.service.submit(AGENT, "u", body(USER, answer_of(first, True), NEW_MESSAGE, chat_id="chat-2"))
    assert call.state is CallState.AWAITING_APPROVAL and call.verdict is None

    # Its own chat still answers it.
    attachment = await env.approve(call, first)
    env.paid(call)
    chunks = await read(attachment)
    assert {"type": "tool-output-available", "toolCallId": CALL, "output": {"success": True}} in chunks
    check_stream_rules(chunks, known=[CALL])


async def test_another_users_chat_id_is_not_found_for_every_request(env: Env) -> None:
    call, first = await gated_call(env)
    for request in (body(USER), body(USER, answer_of(first, True), message_id="msg-1")):
        with pytest.raises(ChatNotFound) as refused:
            await env.service.submit(AGENT, "mallory", request)
        assert (refused.value.status, refused.value.code) == (404, "chat_not_found")
        assert refused.value.public_message() == "no such chat"
    with pytest.raises(ChatNotFound):
        env.service.resume(AGENT, "mallory", "chat-1")
    assert env.service.abort(AGENT, "mallory", "chat-1") is False
    assert env.chat().machine.running and call.state is CallState.AWAITING_APPROVAL


async def test_another_users_approval_answered_from_their_own_chat_is_forbidden(env: Env) -> None:
    call, first = await gated_call(env)
    with pytest.raises(Forbidden):
        await env.service.submit(AGENT, "mallory", body(USER, answer_of(first, True), chat_id="mallory-chat", message_id="msg-1"))
    assert call.verdict is None


# ---- approvals the gateway does not know ------------------------------------------------------


async def test_an_answer_only_request_to_an_unknown_gateway_approval_is_gone(env: Env) -> None:
    call, first = await gated_call(env)
    with pytest.raises(Gone) as refused:
        await env.service.submit(AGENT, "u", body(USER, answer_of(first, True, approval_id="gw-forgotten"), message_id="msg-1"))
    assert (refused.value.status, refused.value.code) == (410, "approval_gone")
    # The real call is untouched.
    assert call.state is CallState.AWAITING_APPROVAL and call.verdict is None


async def test_an_unknown_gateway_approval_beside_a_new_message_is_stale_history_and_the_message_runs(env: Env) -> None:
    stale = {
        "id": "msg-old", "role": "assistant",
        "parts": [
            {"type": "step-start"},
            {"type": f"tool-{TOOL}", "toolCallId": "call-old", "state": "approval-responded", "input": {},
             "approval": {"id": "gw-from-before-a-restart", "approved": True}},
        ],
    }
    attachment = await env.service.submit(AGENT, "u", body(USER, stale, NEW_MESSAGE))
    env.says("It is ", "noon.")
    env.ends()
    chunks = await read(attachment)
    assert types(chunks) == ["start", "start-step", "text-start", "text-delta", "text-delta", "text-end", "finish-step", "finish"]
    assert chunks[0] == {"type": "start", "messageId": "msg-1"}
    assert text_of(chunks) == "It is noon." and chunks[-1]["finishReason"] == "stop"
    check_stream_rules(chunks)
    await env.run_ended()
    assert env.chat().ledger.calls() == [] and env.runs("completed") == 1


# ---- a gated call answered --------------------------------------------------------------------


async def test_an_approved_gated_call_runs_once_and_its_answer_reads_the_result_and_the_models_words(env: Env) -> None:
    call, first = await gated_call(env)
    plugin = asyncio.create_task(env.service.gates.wait(call))
    await asyncio.sleep(0)
    assert not plugin.done()

    attachment = await env.service.submit(AGENT, "u", body(USER, answer_of(first, True), message_id="msg-1"))
    verdict = await asyncio.wait_for(plugin, 1)
    assert verdict == Verdict(run=True) and call.outcome is Outcome.APPROVED
    assert await env.service.gates.wait(call) == verdict  # a later ask gets the same verdict

    env.plugin_answers(verdict, {"success": True, "transaction_id": "T-1"})
    env.says("Paid ", "50 USD.")
    env.ends()
    chunks = await read(attachment)
    assert types(chunks) == [
        "start", "tool-output-available", "start-step", "text-start", "text-delta", "text-delta", "text-end",
        "finish-step", "finish",
    ]
    assert chunks[0] == {"type": "start", "messageId": "msg-1"}
    assert chunks[1] == {"type": "tool-output-available", "toolCallId": CALL, "output": {"success": True, "transaction_id": "T-1"}}
    assert text_of(chunks) == "Paid 50 USD." and chunks[-1]["finishReason"] == "stop"
    check_stream_rules(chunks, known=[CALL])

    await env.run_ended()
    assert wait_count(env.metrics, WAIT, TOOL, "approved") == 1
    assert env.sample("adk_gateway_approvals_pending", {"agent": AGENT}) == 0
    assert env.runs("completed") == 1


async def test_a_held_ask_about_a_call_adk_was_to_confirm_still_gates_it() -> None:
    """Defense in depth: the internal listener refuses a held ask about an sse agent (a plugin older
    than 0.2 asks so; tests/unit/test_plugin_too_old.py), but one that reached the chat's gate all the
    same is shown as a `gw-` approval and decided as on the held engine: the call never runs unasked."""
    adk, clock = ScriptedAdk(), Clock()
    ids = iter(f"msg-{n}" for n in range(1, 100))
    config = parse_config(CONFIG, env={})
    assert config.agents[AGENT].confirms(TOOL)
    service = chat_service(config, adk=adk, clock=clock, new_id=lambda: next(ids))
    env = Env(adk, service, service.metrics, clock)
    try:
        call, first = await gated_call(env)
        assert call.id.startswith("gw-")
        plugin = asyncio.create_task(env.service.gates.wait(call))
        await asyncio.sleep(0)
        assert not plugin.done()
        attachment = await env.service.submit(AGENT, "u", body(USER, answer_of(first, True), message_id="msg-1"))
        assert await asyncio.wait_for(plugin, 1) == Verdict(run=True) and call.outcome is Outcome.APPROVED
        env.plugin_answers(Verdict(run=True), {"success": True})
        env.says("Paid.")
        env.ends()
        chunks = await read(attachment)
        assert chunks[1] == {"type": "tool-output-available", "toolCallId": CALL, "output": {"success": True}}
        await env.run_ended()
        assert env.sample("adk_gateway_policy_bypassed_total", {"agent": AGENT, "tool": TOOL}) == 0
    finally:
        await service.close()


async def test_a_denied_gated_call_is_refused_to_the_plugin_and_shown_denied(env: Env) -> None:
    call, first = await gated_call(env)
    denial = answer_of(first, False)
    denial["parts"][1]["approval"]["reason"] = "wrong amount"
    attachment = await env.service.submit(AGENT, "u", body(USER, denial, message_id="msg-1"))
    verdict = await asyncio.wait_for(env.service.gates.wait(call), 1)
    assert not verdict.run and verdict.response is not None
    assert verdict.response[REFUSAL_KEY] == "denied" and "wrong amount" in verdict.response["error"]
    assert call.outcome is Outcome.DENIED

    env.plugin_answers(verdict)
    env.says("I did not pay.")
    env.ends()
    chunks = await read(attachment)
    assert types(chunks) == ["start", "tool-output-denied", "start-step", "text-start", "text-delta", "text-end", "finish-step", "finish"]
    assert chunks[1] == {"type": "tool-output-denied", "toolCallId": CALL}
    assert chunks[-1]["finishReason"] == "stop"
    check_stream_rules(chunks, known=[CALL])
    await env.run_ended()
    assert wait_count(env.metrics, WAIT, TOOL, "denied") == 1


# ---- the same answer twice --------------------------------------------------------------------


async def test_an_answer_replayed_while_its_response_streams_reads_the_same_response_and_changes_no_verdict(env: Env) -> None:
    call, first = await gated_call(env)
    one = await env.service.submit(AGENT, "u", body(USER, answer_of(first, True), message_id="msg-1"))
    assert call.verdict == Verdict(run=True)
    # A second tab (or a retrying client) posts the same message, then a contrary one: only the first answer counts.
    two = await env.service.submit(AGENT, "u", body(USER, answer_of(first, True), message_id="msg-1"))
    three = await env.service.submit(AGENT, "u", body(USER, answer_of(first, False), message_id="msg-1"))
    assert call.outcome is Outcome.APPROVED and call.verdict == Verdict(run=True)

    env.paid(call)
    chunks = await read(one)
    assert await read(two) == chunks and await read(three) == chunks
    assert chunks.count({"type": "tool-output-available", "toolCallId": CALL, "output": {"success": True}}) == 1
    assert chunks[-1]["finishReason"] == "stop"
    check_stream_rules(chunks, known=[CALL])
    await env.run_ended()
    assert wait_count(env.metrics, WAIT, TOOL, "approved") == 1
    assert wait_count(env.metrics, WAIT, TOOL, "denied") == 0


async def test_an_answer_replayed_after_the_run_ended_and_was_read_is_gone_and_changes_nothing(env: Env) -> None:
    call, first = await gated_call(env)
    attachment = await env.service.submit(AGENT, "u", body(USER, answer_of(first, True), message_id="msg-1"))
    env.paid(call)
    await read(attachment)
    await env.run_ended()

    for approved in (True, False):
        with pytest.raises(Gone) as refused:
            await env.service.submit(AGENT, "u", body(USER, answer_of(first, approved), message_id="msg-1"))
        assert (refused.value.status, refused.value.code) == (410, "approval_gone")
    assert call.outcome is Outcome.APPROVED and call.verdict == Verdict(run=True)
    assert wait_count(env.metrics, WAIT, TOOL, "approved") == 1
    assert env.runs("completed") == 1


async def test_an_answer_replayed_after_the_run_ended_unread_reads_the_kept_response(env: Env) -> None:
    call, first = await gated_call(env)
    # The answering request drops before it reads anything (a closed tab); the run goes on.
    await env.service.submit(AGENT, "u", body(USER, answer_of(first, True), message_id="msg-1"))
    env.paid(call)
    await env.run_ended()

    replay = await read(await env.service.submit(AGENT, "u", body(USER, answer_of(first, True), message_id="msg-1")))
    assert types(replay) == ["start", "tool-output-available", "start-step", "text-start", "text-delta", "text-end", "finish-step", "finish"]
    check_stream_rules(replay, known=[CALL])
    assert call.outcome is Outcome.APPROVED
    # Now read whole: a further replay is gone.
    with pytest.raises(Gone):
        await env.service.submit(AGENT, "u", body(USER, answer_of(first, True), message_id="msg-1"))


# ---- one response at a time -------------------------------------------------------------------


async def test_a_new_message_while_a_response_streams_is_busy(env: Env) -> None:
    attachment = await env.service.submit(AGENT, "u", body(USER))
    env.says("Working ")
    await until(lambda: len(env.chat().run.current.frames) > 2)  # type: ignore[union-attr]
    with pytest.raises(ChatBusy) as refused:
        await env.service.submit(AGENT, "u", body(USER, NEW_MESSAGE))
    assert (refused.value.status, refused.value.code, refused.value.retry_after) == (409, "chat_busy", 1)
    assert env.chat().run.message_id == "msg-1"  # type: ignore[union-attr]

    env.says("on it.")
    env.ends()
    chunks = await read(attachment)
    assert text_of(chunks).startswith("Working ") and chunks[-1]["finishReason"] == "stop"
    check_stream_rules(chunks)


async def test_a_new_message_after_the_browser_stopped_reading_ends_the_old_run_and_starts_a_new_one(env: Env) -> None:
    """The AI SDK's stop() drops the request; with `on_disconnect: continue` the run goes on, and the
    person's next message must not be refused until it ends (issue 24, defect 10)."""
    attachment = await env.service.submit(AGENT, "u", body(USER))
    old = env.chat().run
    assert old is not None
    env.says("Working ")
    await until(lambda: len(old.current.frames) > 2)
    attachment.response.close()  # what the transport does when its browser went away

    new = await asyncio.wait_for(env.service.submit(AGENT, "u", body(USER, NEW_MESSAGE)), 5)
    stopped = [orjson.loads(f) for f in old.current.frames]
    assert stopped[-1] == {"type": "abort"} and "finish" not in types(stopped) and text_of(stopped) == "Working "
    assert env.runs("cancelled") == 1

    env.says("It is ", "noon.")
    env.ends()
    chunks = await read(new)
    assert chunks[0] == {"type": "start", "messageId": "msg-2"}
    assert text_of(chunks) == "It is noon." and chunks[-1]["finishReason"] == "stop"
    check_stream_rules(chunks)
    await env.run_ended()
    assert env.runs("completed") == 1


async def test_the_run_after_a_stopped_one_reaches_adk_only_once_adk_sealed_the_stopped_run(env: Env) -> None:
    """Stop, then a new message: the gateway cuts the stopped run's stream, and ADK writes that run's
    abort seal into the session after the cut. On a database session store a run that loaded the
    session before the seal fails its first write (StaleSessionError), so the new run goes out only
    once ADK's session shows the seal."""
    attachment = await env.service.submit(AGENT, "u", body(USER))
    env.says("Working ")
    await until(lambda: len(env.chat().run.current.frames) > 2)  # type: ignore[union-attr]
    attachment.response.close()
    writing = {"events": [{"author": "user"}, {"author": "a", "content": {}}], "lastUpdateTime": 1.0}
    env.adk.sessions = [writing, writing | {"lastUpdateTime": 1.5}, SEALED]

    new = await asyncio.wait_for(env.service.submit(AGENT, "u", body(USER, NEW_MESSAGE)), 5)
    env.says("It is ", "noon.")
    env.ends()
    chunks = await read(new)
    assert text_of(chunks) == "It is noon." and chunks[-1]["finishReason"] == "stop"
    # The stopped run, three reads until the seal, one more to see it stay the last write, the new run.
    assert env.adk.calls == ["run", "session", "session", "session", "session", "run"]


async def test_after_an_abort_the_next_run_waits_for_adk_s_seal_too(env: Env) -> None:
    """A WebSocket `abort` cuts the run's stream as Stop over SSE does."""
    await env.service.submit(AGENT, "u", body(USER))
    env.says("Working ")
    await until(lambda: len(env.chat().run.current.frames) > 2)  # type: ignore[union-attr]
    assert env.service.abort(AGENT, "u", "chat-1")
    await env.run_ended()
    second = await env.service.submit(AGENT, "u", body(USER, NEW_MESSAGE))
    env.says("It is ", "noon.")
    env.ends()
    assert text_of(await read(second)) == "It is noon."
    assert env.adk.calls == ["run", "session", "session", "run"]


async def test_a_run_whose_stream_ended_is_not_waited_for(env: Env) -> None:
    """Only a cut run may still be writing: after one that ADK ended, the next goes out at once."""
    first = await env.service.submit(AGENT, "u", body(USER))
    env.says("Done.")
    env.ends()
    await read(first)
    await env.run_ended()
    second = await env.service.submit(AGENT, "u", body(USER, NEW_MESSAGE))
    env.says("It is ", "noon.")
    env.ends()
    assert text_of(await read(second)) == "It is noon."
    assert env.adk.calls == ["run", "run"]


async def test_a_reader_whose_browser_is_gone_does_not_keep_the_chat_busy(env: Env) -> None:
    attachment = await env.service.submit(AGENT, "u", body(USER))
    env.says("Working ")
    await until(lambda: len(env.chat().run.current.frames) > 2)  # type: ignore[union-attr]
    attachment.response.watch(GONE)  # the HTTP connection dropped; no write noticed it yet

    new = await asyncio.wait_for(env.service.submit(AGENT, "u", body(USER, NEW_MESSAGE)), 5)
    env.says("Noon.")
    env.ends()
    assert text_of(await read(new)) == "Noon."


async def test_a_new_message_while_another_tab_still_reads_the_response_is_busy(env: Env) -> None:
    first = await env.service.submit(AGENT, "u", body(USER))
    env.says("Working ")
    await until(lambda: len(env.chat().run.current.frames) > 2)  # type: ignore[union-attr]
    other_tab = env.service.resume(AGENT, "u", "chat-1")
    assert other_tab is not None
    first.response.close()  # this tab stopped; the other one still follows

    with pytest.raises(ChatBusy):
        await env.service.submit(AGENT, "u", body(USER, NEW_MESSAGE))
    assert env.chat().run.message_id == "msg-1" and env.chat().machine.running  # type: ignore[union-attr]

    other_tab.response.close()
    new = await asyncio.wait_for(env.service.submit(AGENT, "u", body(USER, NEW_MESSAGE)), 5)
    assert new.run is not None and new.run.message_id == "msg-2"


async def test_two_new_messages_after_a_stop_start_one_run_and_the_other_is_busy(env: Env) -> None:
    attachment = await env.service.submit(AGENT, "u", body(USER))
    env.says("Working ")
    await until(lambda: len(env.chat().run.current.frames) > 2)  # type: ignore[union-attr]
    attachment.response.close()

    one = asyncio.create_task(env.service.submit(AGENT, "u", body(USER, NEW_MESSAGE)))
    two = asyncio.create_task(env.service.submit(AGENT, "u", body(USER, {**NEW_MESSAGE, "id": "u3"})))
    results = await asyncio.wait_for(asyncio.gather(one, two, return_exceptions=True), 5)
    assert sorted(type(r).__name__ for r in results) == ["Attachment", "ChatBusy"], results
    assert len(env.service._tasks) == 1 and env.runs("cancelled") == 1


# ---- the person moves on ----------------------------------------------------------------------


async def test_a_new_message_instead_of_an_answer_cancels_the_call_ends_the_old_run_and_starts_a_new_one(env: Env) -> None:
    call, first = await gated_call(env)
    plugin = asyncio.create_task(env.service.gates.wait(call))
    old_run = env.chat().run
    assert old_run is not None and env.chat().machine.running

    submitted = asyncio.create_task(env.service.submit(AGENT, "u", body(USER, still_asking(first), NEW_MESSAGE)))
    verdict = await asyncio.wait_for(plugin, 1)
    assert not verdict.run and verdict.response is not None and verdict.response[REFUSAL_KEY] == "cancelled"
    assert call.outcome is Outcome.CANCELLED
    assert not submitted.done()  # the new message waits for the old run to end

    # The plugin answers ADK with the refusal, the model says a word, ADK ends the old run.
    env.plugin_answers(verdict)
    env.says("Cancelled.")
    env.ends()
    attachment = await asyncio.wait_for(submitted, 5)
    assert not old_run.streaming and env.chat().machine.running
    assert env.chat().run is not old_run

    env.says("It is ", "noon.")
    env.ends()
    chunks = await read(attachment)
    assert chunks[0] == {"type": "start", "messageId": "msg-2"}
    assert types(chunks) == ["start", "start-step", "text-start", "text-delta", "text-delta", "text-end", "finish-step", "finish"]
    assert text_of(chunks) == "It is noon." and chunks[-1]["finishReason"] == "stop"
    check_stream_rules(chunks)
    await env.run_ended()
    assert wait_count(env.metrics, WAIT, TOOL, "cancelled") == 1
    assert env.sample("adk_gateway_approvals_pending", {"agent": AGENT}) == 0
    assert env.runs("completed") == 2


async def test_a_replayed_answer_to_a_call_of_a_run_that_a_new_message_ended_is_not_attached_to_the_new_run(env: Env) -> None:
    call, first = await gated_call(env)
    submitted = asyncio.create_task(env.service.submit(AGENT, "u", body(USER, still_asking(first), NEW_MESSAGE)))
    env.plugin_answers(await asyncio.wait_for(env.service.gates.wait(call), 1))
    env.ends()
    new_run = await asyncio.wait_for(submitted, 5)
    env.says("It is ")
    await until(lambda: len(env.chat().run.current.frames) > 2)  # type: ignore[union-attr]

    # Another tab still shows msg-1 and posts its (now stale) approval while msg-2 streams.
    try:
        stale = await env.service.submit(AGENT, "u", body(USER, answer_of(first, True), message_id="msg-1"))
    except Gone:
        stale = None
    env.says("noon.")
    env.ends()
    assert (await read(new_run))[0] == {"type": "start", "messageId": "msg-2"}
    assert call.outcome is Outcome.CANCELLED
    if stale is not None:
        # If it is answered at all, it must be with msg-1's own chunks, never another message's.
        assert stale.response.response is not new_run.response.response  # type: ignore[attr-defined]
        assert (await read(stale))[0] == {"type": "start", "messageId": "msg-1"}


async def test_two_new_messages_while_the_old_run_winds_down_start_one_run_and_the_other_is_busy(env: Env) -> None:
    call, first = await gated_call(env)
    one = asyncio.create_task(env.service.submit(AGENT, "u", body(USER, still_asking(first), NEW_MESSAGE)))
    await asyncio.sleep(0)
    two = asyncio.create_task(env.service.submit(AGENT, "u", body(USER, still_asking(first), {**NEW_MESSAGE, "id": "u3"})))
    env.plugin_answers(await asyncio.wait_for(env.service.gates.wait(call), 1))
    env.ends()
    results = await asyncio.wait_for(asyncio.gather(one, two, return_exceptions=True), 5)
    assert isinstance(results[0], Attachment), results
    assert isinstance(results[1], ChatBusy), results
    assert len(env.service._tasks) == 1


# ---- deadlines --------------------------------------------------------------------------------


async def test_a_call_past_its_deadline_times_out_and_the_late_answer_reads_what_happened(env: Env) -> None:
    call, first = await gated_call(env)
    assert call.deadline == env.clock.now + 2
    plugin = asyncio.create_task(env.service.gates.wait(call))

    env.clock.now += 1.9
    assert env.chat().deadlines_due(env.clock.now) is not None and not call.released
    env.clock.now += 0.2
    assert env.chat().deadlines_due(env.clock.now) is None and call.released
    verdict = await asyncio.wait_for(plugin, 1)
    assert not verdict.run and verdict.response is not None and verdict.response[REFUSAL_KEY] == "timeout"
    assert call.outcome is Outcome.TIMEOUT
    assert wait_count(env.metrics, WAIT, TOOL, "timeout") == 1
    assert env.sample("adk_gateway_approval_timeouts_total", {"agent": AGENT, "tool": TOOL}) == 1
    assert env.sample("adk_gateway_approvals_pending", {"agent": AGENT}) == 0
    assert env.chat().deadlines_due(env.clock.now) is None  # once
    assert env.sample("adk_gateway_approval_timeouts_total", {"agent": AGENT, "tool": TOOL}) == 1

    # The model carries on while nobody is attached; what it says is kept for the browser.
    env.plugin_answers(verdict)
    env.says("Nobody approved, so I did not pay.")
    env.ends()
    await env.run_ended()

    late = await read(await env.service.submit(AGENT, "u", body(USER, answer_of(first, True), message_id="msg-1")))
    assert types(late) == ["start", "tool-output-denied", "start-step", "text-start", "text-delta", "text-end", "finish-step", "finish"]
    assert late[0] == {"type": "start", "messageId": "msg-1"} and late[-1]["finishReason"] == "stop"
    check_stream_rules(late, known=[CALL])
    assert call.outcome is Outcome.TIMEOUT and call.verdict == verdict
    assert wait_count(env.metrics, WAIT, TOOL, "approved") == 0


# ---- abort ------------------------------------------------------------------------------------


async def test_an_abort_while_the_run_streams_ends_the_response_with_abort_and_cancels_its_open_call(env: Env) -> None:
    attachment = await env.service.submit(AGENT, "u", body(USER))
    # Two gated calls in one model turn: the response stays open until the plugin asked about both.
    env.adk.reads.put_nowait([{"author": "a", "content": {"role": "model", "parts": [
        {"functionCall": {"id": CALL, "name": TOOL, "args": {"amount": 10}}},
        {"functionCall": {"id": "call-2", "name": TOOL, "args": {"amount": 20}}},
    ]}}])
    await until(lambda: env.chat().ledger.expected("call-2"))
    call = env.service.gates.open(app_name=AGENT, user_id="u", session_id="chat-1", tool_call_id=CALL, tool=TOOL, args={"amount": 10})
    assert isinstance(call, GatedCall)
    assert env.chat().run.streaming  # type: ignore[union-attr]
    plugin = asyncio.create_task(env.service.gates.wait(call))

    assert env.service.abort(AGENT, "u", "chat-1") is True
    chunks = await read(attachment)
    assert chunks[-1] == {"type": "abort"}
    assert "finish" not in types(chunks) and types(chunks).count("abort") == 1
    assert {"type": "tool-approval-request", "approvalId": call.id, "toolCallId": CALL} in chunks

    verdict = await asyncio.wait_for(plugin, 1)
    assert not verdict.run and verdict.response is not None and verdict.response[REFUSAL_KEY] == "cancelled"
    assert call.outcome is Outcome.CANCELLED
    await env.run_ended()
    assert env.runs("cancelled") == 1 and env.runs("completed") == 0
    assert wait_count(env.metrics, WAIT, TOOL, "cancelled") == 1
    assert env.sample("adk_gateway_approvals_pending", {"agent": AGENT}) == 0
    # The run is over: nothing more to abort, and the plugin's ask about the second call is refused at once.
    assert env.service.abort(AGENT, "u", "chat-1") is False
    late = env.service.gates.open(app_name=AGENT, user_id="u", session_id="chat-1", tool_call_id="call-2", tool=TOOL, args={"amount": 20})
    assert isinstance(late, Verdict) and not late.run and late.reason == "no_browser"


# ---- resume -----------------------------------------------------------------------------------


async def test_resume_replays_a_read_response_within_run_retention_and_none_after(env: Env) -> None:
    assert env.service.resume(AGENT, "u", "chat-1") is None  # no such chat yet
    attachment = await env.service.submit(AGENT, "u", body(USER))
    env.says("Hello ", "there.")

    live = env.service.resume(AGENT, "u", "chat-1")  # a reload while it streams follows the same response
    assert live is not None and live.response.response is attachment.response.response  # type: ignore[attr-defined]

    env.ends()
    chunks = await read(attachment)
    check_stream_rules(chunks)
    await env.run_ended()
    assert await read(live) == chunks

    retention = env.service.config.chat.run_retention
    env.clock.now += retention - 1
    resumed = env.service.resume(AGENT, "u", "chat-1")
    assert resumed is not None and await read(resumed) == chunks
    env.clock.now += 2
    assert env.service.resume(AGENT, "u", "chat-1") is None


async def test_a_resume_during_the_continuation_after_an_approval_replays_the_whole_message(env: Env) -> None:
    """Issue 24, defect 11: a browser that dropped while the reply after an approval streamed was
    handed the continuation alone; the AI SDK starts a resumed message from nothing, so its first
    chunk, the output of the call made in the first response, failed ("No tool invocation found")."""
    call, first = await gated_call(env)
    attachment = await env.approve(call, first)
    env.plugin_answers(call.verdict, {"success": True})  # type: ignore[arg-type]
    env.says("Paid ")
    await until(lambda: "Paid " in str(env.chat().run.current.frames))  # type: ignore[union-attr]
    resumed = env.service.resume(AGENT, "u", "chat-1")  # the connection dropped here
    assert resumed is not None
    env.says("in full.")
    env.ends()
    continuation = await read(attachment)
    replayed = await read(resumed)
    # One stream: the first response (its finish now only its metadata), then the continuation.
    boundary = {"type": "message-metadata", "messageMetadata": first[-1].get("messageMetadata")}
    assert replayed == [*first[:-1], boundary, *continuation]
    assert [c["type"] for c in replayed].count("finish") == 1 and replayed[0]["type"] == "start"
    check_stream_rules(replayed)


# ---- what a run says while a person decides -------------------------------------------------


async def test_what_the_run_says_while_the_person_decides_is_held_whole_for_a_reload_and_then_the_answer(env: Env) -> None:
    """A non-blocking tool's words, say: before issue 14 each event closed a response of its own and
    only the last was kept, so a reload or the answer saw the tail alone."""
    call, first = await gated_call(env)
    env.says("While you decide, ", "I checked ", "your balance.")
    await until(lambda: "your balance." in str(env.chat().run.current.frames))  # type: ignore[union-attr]
    resumed = env.service.resume(AGENT, "u", "chat-1")
    assert resumed is not None
    held = await read(resumed)
    assert text_of(held) == "While you decide, I checked your balance."
    assert held[-1] == {"type": "finish", "finishReason": "tool-calls"}  # still waits: the AI SDK can answer
    check_stream_rules(held, known=[CALL])

    attachment = await env.approve(call, first)
    env.paid(call)
    chunks = await read(attachment)
    assert {"type": "tool-output-available", "toolCallId": CALL, "output": {"success": True}} in chunks
    assert text_of(chunks) == "Paid." and chunks[-1]["finishReason"] == "stop"
    check_stream_rules(chunks, known=[CALL])


async def test_without_a_reload_the_answer_reads_what_the_run_said_meanwhile_and_goes_on(env: Env) -> None:
    call, first = await gated_call(env)
    env.says("While you decide, ", "I checked ", "your balance.")
    await until(lambda: "your balance." in str(env.chat().run.current.frames))  # type: ignore[union-attr]
    attachment = await env.approve(call, first)
    env.paid(call)
    chunks = await read(attachment)
    assert text_of(chunks) == "While you decide, I checked your balance.Paid."
    assert chunks[-1]["finishReason"] == "stop"
    check_stream_rules(chunks, known=[CALL])


async def test_a_new_message_while_the_run_says_things_nobody_reads_yet_cancels_the_call_as_typed_instead(env: Env) -> None:
    """A held response is streaming and unread: the new message settles the waiting call (the person
    typed instead of answering: cancelled, never run), not an abort, and not a 409 (issue 24, defect 10)."""
    call, first = await gated_call(env)
    plugin = asyncio.create_task(env.service.gates.wait(call))
    env.says("While you decide, ", "I checked ", "your balance.")
    await until(lambda: "your balance." in str(env.chat().run.current.frames))  # type: ignore[union-attr]
    assert env.chat().run.streaming  # type: ignore[union-attr]

    submitted = asyncio.create_task(env.service.submit(AGENT, "u", body(USER, still_asking(first), NEW_MESSAGE)))
    verdict = await asyncio.wait_for(plugin, 1)
    assert not verdict.run and verdict.response is not None and verdict.response[REFUSAL_KEY] == "cancelled"
    assert call.outcome is Outcome.CANCELLED
    env.plugin_answers(verdict)
    env.ends()
    attachment = await asyncio.wait_for(submitted, 5)
    env.says("It is noon.")
    env.ends()
    chunks = await read(attachment)
    assert chunks[0] == {"type": "start", "messageId": "msg-2"} and text_of(chunks) == "It is noon."
    assert wait_count(env.metrics, WAIT, TOOL, "cancelled") == 1
    assert env.runs("completed") == 2 and env.runs("cancelled") == 0
