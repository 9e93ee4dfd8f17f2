"""A resume in the middle of an approval's continuation ends, in the stock AI SDK Chat (ai 6 and ai 7),
with the message an unbroken stream gives (issue 24, defect 11).

The streams are the gateway's own: the first response and its continuation as the answering request
reads them, and the replay a resume reads while the continuation streams. tests/js/check-resume.mjs
plays them to a real Chat with DefaultChatTransport three ways: read whole; the same page whose
connection fails mid-continuation, then `resumeStream()`; a reloaded page whose messages come from
the app's storage, then `resumeStream()`.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from typing import Any

import orjson
import pytest

from gateway.core.approvals import GatedCall, Verdict
from gateway.chat.attachment import browser_added
from gateway.core.converter import Converter
from gateway.core.chat_request import ApprovalAnswer, parse_chat_body
from gateway.chat.chunk_log import Run
from tests.jsdriver import JS_DIR
from tests.support.recordings import continuing, convert
from tests.support.chat import CALL, call_event, read, response_event, text_events
from tests.unit.test_chat_gates import BGM_OUTPUT, scripted_service
from tests.unit.test_chat_service import AGENT, TOOL, USER, Env, answer_of, env, until  # noqa: F401

pytestmark = pytest.mark.js



def check_resume(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    node = shutil.which("node")
    if node is None:
        raise AssertionError("node is not on PATH; the resume check needs Node 20+")
    proc = subprocess.run(
        [node, str(JS_DIR / "check-resume.mjs")], cwd=JS_DIR, input=json.dumps(cases),
        capture_output=True, text=True, timeout=120,
    )
    if proc.returncode != 0:
        raise AssertionError(f"resume check crashed (exit {proc.returncode}); stderr:\n{proc.stderr}")
    return json.loads(proc.stdout)


def stored_pages(first: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """What an app may have stored when the page reloads: the user message only, or also the assistant
    message as the first response left it."""
    user = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "pay 50 to Hanako"}]}
    asked = {
        "id": first[0]["messageId"], "role": "assistant",
        "parts": [{"type": "step-start"}, {
            "type": "tool-process_payment", "toolCallId": next(c["toolCallId"] for c in first if "toolCallId" in c),
            "state": "approval-requested", "input": {},
            "approval": {"id": next(c["approvalId"] for c in first if c["type"] == "tool-approval-request")},
        }],
    }
    return [[user], [user, asked]]


def assert_same_message(result: dict[str, Any]) -> None:
    assert result["errors"] == {}, result["errors"]
    unbroken = result["unbroken"]
    assert unbroken["parts"][-1]["type"] == "text"  # the whole reply arrived
    assert result["dropped"]["statusAfterCut"] == "error"  # the cut was seen as a network failure
    for way in (result["dropped"], *result["reloaded"]):
        assert way["count"] == 2  # one user message, one assistant message: nothing duplicated
        for got, expected in zip(way["message"]["parts"], unbroken["parts"]):
            assert got == expected
        assert way["message"] == unbroken


def request(*messages: dict[str, Any], version: int, message_id: str | None = None) -> Any:
    data: dict[str, Any] = {"id": "chat-1", "messages": list(messages), "trigger": "submit-message"}
    if message_id:
        data["messageId"] = message_id
    return parse_chat_body(data, version_header=str(version), default_version=6)


async def gated_streams(env: Env, version: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """A gated approval (the demo's policy): the first response, its continuation, and the replay of a
    resume made while the continuation streams."""
    attachment = await env.service.submit(AGENT, "u", request(USER, version=version))
    env.adk.reads.put_nowait([call_event(TOOL)])
    await until(lambda: env.chat().ledger.expected(CALL))
    call = env.service.gates.open(app_name=AGENT, user_id="u", session_id="chat-1", tool_call_id=CALL, tool=TOOL, args={})
    assert isinstance(call, GatedCall)
    first = await read(attachment)
    attachment = await env.service.submit(AGENT, "u", request(USER, answer_of(first, True), version=version, message_id="msg-1"))
    assert await asyncio.wait_for(env.service.gates.wait(call), 1) == Verdict(run=True)
    env.plugin_answers(call.verdict, {"success": True})  # type: ignore[arg-type]
    env.says("Paid ")
    await until(lambda: "Paid " in str(env.chat().run.current.frames))  # type: ignore[union-attr]
    resumed = env.service.resume(AGENT, "u", "chat-1")
    assert resumed is not None
    env.says("in full.")
    env.ends()
    return first, await read(attachment), await read(resumed)


def native_streams(version: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """ADK's native confirmation, recorded: the answer starts a new run that continues the message
    (as ChatService._start_run makes it)."""
    first = convert("pay_hanako", Converter("m1", version=version))
    ask = next(c for c in first if c["type"] == "tool-approval-request")
    continuation = convert("pay_hanako_approve", continuing("m1", version=version, known=[ask["toolCallId"]]))
    asked = Run("m1")
    asked.publish([orjson.dumps(c) for c in first])
    asked.end_response(0.0)
    goes_on = Run("m1", earlier=asked.message())
    answer = ApprovalAnswer(ask["approvalId"], ask["toolCallId"], TOOL, approved=True)
    goes_on.browser_added(browser_added(version, [answer], []))  # type: ignore[arg-type]
    goes_on.publish([orjson.dumps(c) for c in continuation[:3]])
    replay = goes_on.resumable(0.0, 60.0)
    assert replay is not None
    goes_on.publish([orjson.dumps(c) for c in continuation[3:]])
    goes_on.end_response(0.0)
    return first, continuation, [orjson.loads(f) for f in replay.earlier + tuple(replay.response.frames)]


async def browser_tool_streams(version: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """A browser tool (no approval): the first response calls it, the page adds its output, and the
    continuation does not repeat it."""
    adk, service, _metrics = scripted_service()
    try:
        attachment = await service.submit(AGENT, "u", request(USER, version=version))
        adk.reads.put_nowait([call_event("change_bgm")])
        await asyncio.sleep(0.01)
        call = service.gates.open(app_name=AGENT, user_id="u", session_id="chat-1", tool_call_id=CALL, tool="change_bgm", args={})
        assert isinstance(call, GatedCall)
        first = await read(attachment)
        attachment = await service.submit(AGENT, "u", request(USER, BGM_OUTPUT, version=version, message_id="msg-1"))
        assert await asyncio.wait_for(service.gates.wait(call), 1) is not None
        resumed = service.resume(AGENT, "u", "chat-1")
        assert resumed is not None
        adk.reads.put_nowait([response_event("change_bgm", {"ok": True})])
        for event in text_events("Now ", "playing."):
            adk.reads.put_nowait([event])
        adk.reads.put_nowait(None)
        return first, await read(attachment), await read(resumed)
    finally:
        await service.close()


@pytest.mark.parametrize("version", [6, 7])
async def test_a_resume_after_a_browser_tools_output_rebuilds_the_message_of_an_unbroken_stream(version: int) -> None:
    first, continuation, replay = await browser_tool_streams(version)
    tool_output = {"tool": "change_bgm", "toolCallId": CALL, "output": {"ok": True}}
    [result] = check_resume([{
        "version": version, "first": first, "continuation": continuation, "replay": replay, "toolOutput": tool_output,
        "dropAfter": 2, "stored": [[{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "play"}]}]],
    }])
    assert_same_message(result)


@pytest.mark.parametrize("version", [6, 7])
async def test_a_resume_mid_continuation_rebuilds_the_message_of_an_unbroken_stream(env: Env, version: int) -> None:
    cases = []
    for first, continuation, replay in (await gated_streams(env, version), native_streams(version)):
        answered = [c for c in replay if c["type"] == "tool-approval-response"]
        assert [c["approved"] for c in answered] == ([True] if version == 7 else [])
        for drop_after in (1, len(continuation) - 2):
            cases.append({
                "version": version, "first": first, "continuation": continuation, "replay": replay,
                "approved": True, "dropAfter": drop_after, "stored": stored_pages(first),
            })
    for result in check_resume(cases):
        if version == 6:
            # ai 6 has no chunk for the person's answer: a replay rebuilds the part's states and
            # output, but not the `approved` flag the browser had set (docs/protocol.md, resume).
            for part in result["unbroken"]["parts"]:
                if "approval" in part:
                    part["approval"] = {"id": part["approval"]["id"]}
        assert_same_message(result)
