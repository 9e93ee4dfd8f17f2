"""ChatService around gated calls, with ADK faked in-process: the ledger, the metrics and what the
browser receives when the plugin's wait ends without a verdict."""

from __future__ import annotations

import asyncio

import pytest

from gateway.core.approvals import REFUSAL_KEY, GatedCall, Outcome, Verdict
from gateway.chat.service import Attachment, ChatService
from gateway.config.schema import parse_config
from gateway.ops.metrics import GatewayMetrics
from tests.support.adk import ScriptedAdk
from tests.support.chat import CALL, USER, answered, call_event, read, request, response_event, text_events
from tests.support.recordings import check_stream_rules, types
from tests.support.service import chat_service, held_engine, shipped_service

# The default agent of a config with the single-agent keys (named after upstream.app_name).
AGENT = "demo_agent"

CONFIG = """\
internal:
  secret: s3cret
tools:
  process_payment:
    approval: true
    timeout: 5m
  get_location:
    approval: true
    runs_in: browser
    timeout: 5m
  change_bgm:
    runs_in: browser
    timeout: 5m
"""
GAVE_UP = "Nobody decided within ADK_GATEWAY_MAX_WAIT (2 s); the call was not run."


def scripted_service() -> tuple[ScriptedAdk, ChatService, GatewayMetrics]:
    """A ChatService on the scripted ADK, with its metrics; every message id is msg-1."""
    adk = ScriptedAdk()
    # The held engine (the plugin's held request, `gw-` ids), live mode's, through the scripted /run_sse.
    service = chat_service(held_engine(parse_config(CONFIG, env={})), adk=adk, new_id="msg-1")
    return adk, service, service.metrics


async def asked(adk: ScriptedAdk, service: ChatService, tool: str) -> tuple[Attachment, GatedCall]:
    """chat-1's first message, whose run calls `tool`, and the plugin's ask of it, held open."""
    attachment = await service.submit(AGENT, "u", request(USER))
    adk.reads.put_nowait([call_event(tool)])
    await asyncio.sleep(0.01)
    call = service.gates.open(app_name=AGENT, user_id="u", session_id="chat-1", tool_call_id=CALL, tool=tool, args={})
    assert isinstance(call, GatedCall)
    return attachment, call


# The assistant message with change_bgm's output, as the browser sends it once it ran the tool.
BGM_OUTPUT = {
    "id": "msg-1", "role": "assistant", "parts": [
        {"type": "step-start"},
        {"type": "tool-change_bgm", "toolCallId": CALL, "state": "output-available", "input": {}, "output": {"ok": True}},
    ],
}


def wait_count(metrics: GatewayMetrics, name: str, tool: str, outcome: str) -> float:
    return metrics.registry.get_sample_value(f"{name}_count", {"agent": AGENT, "tool": tool, "outcome": outcome}) or 0.0


@pytest.mark.parametrize("tool", ["process_payment", "get_location"])
async def test_plugin_giving_up_is_abandoned_and_the_late_answer_gets_the_error_and_the_whole_text(tool: str) -> None:
    adk, service, metrics = scripted_service()
    attachment, call = await asked(adk, service, tool)
    assert not call.released
    first = await read(attachment)
    assert types(first)[-3:] == ["tool-approval-request", "finish-step", "finish"]

    # The plugin's long poll ended without a verdict; it answered ADK itself, and the model went on.
    adk.reads.put_nowait([response_event(tool, {"error": GAVE_UP, REFUSAL_KEY: "max_wait"})])
    for event in text_events("The payment ", "was not made: ", "nobody decided."):
        adk.reads.put_nowait([event])
    adk.reads.put_nowait(None)
    chat = service._registry.find(AGENT, "u", "chat-1")  # noqa: SLF001 - the run's task, to wait for its end
    assert chat is not None and await chat.ended(5) and not chat.machine.running

    # The person clicks Approve afterwards: the tool never runs, and the answer reads what happened.
    late = await read(await service.submit(AGENT, "u", request(USER, answered(first, tool, True), message_id="msg-1")))
    expected = [
        "start", "tool-output-error", "start-step", "text-start", "text-delta", "text-delta", "text-delta",
        "text-end", "finish-step", "finish",
    ]
    assert types(late) == expected, late
    assert late[0] == {"type": "start", "messageId": "msg-1"}
    assert late[1] == {"type": "tool-output-error", "toolCallId": CALL, "errorText": GAVE_UP}
    assert "".join(c["delta"] for c in late if c["type"] == "text-delta") == "The payment was not made: nobody decided."
    assert late[-1]["finishReason"] == "stop"
    check_stream_rules(late, known=[CALL])

    # The ledger knows the plugin gave up, before and after the late answer.
    assert call.outcome is Outcome.ABANDONED
    assert wait_count(metrics, "adk_gateway_approval_wait_seconds", tool, "abandoned") == 1
    for outcome in ("approved", "denied", "cancelled", "timeout"):
        assert wait_count(metrics, "adk_gateway_approval_wait_seconds", tool, outcome) == 0, outcome
    assert metrics.registry.get_sample_value("adk_gateway_approvals_pending", {"agent": AGENT}) == 0
    assert (metrics.registry.get_sample_value("adk_gateway_policy_bypassed_total", {"agent": AGENT, "tool": tool}) or 0) == 0

    # A reload replays the whole message: the first response (its finish only its metadata), then this one.
    resumed = service.resume(AGENT, "u", "chat-1")
    boundary = {"type": "message-metadata", "messageMetadata": first[-1].get("messageMetadata")}
    assert resumed is not None and await read(resumed) == [*first[:-1], boundary, *late]


async def test_a_plugin_refusal_without_asking_counts_no_bypass_but_a_real_result_does() -> None:
    adk, service, metrics = scripted_service()

    def bypassed() -> float:
        return metrics.registry.get_sample_value("adk_gateway_policy_bypassed_total", {"agent": AGENT, "tool": "process_payment"}) or 0.0

    attachment = await service.submit(AGENT, "u", request(USER))
    refusal = {"error": "The approval gateway's tool policy is unavailable; it was not run.", REFUSAL_KEY: "policy_unavailable"}
    adk.reads.put_nowait([call_event("process_payment"), response_event("process_payment", refusal)])
    adk.reads.put_nowait(None)
    chunks = await read(attachment)
    assert {"type": "tool-output-error", "toolCallId": CALL, "errorText": refusal["error"]} in chunks
    assert bypassed() == 0

    attachment = await service.submit(AGENT, "u", request(USER, {**USER, "id": "u2"}))
    adk.reads.put_nowait([call_event("process_payment"), response_event("process_payment", {"success": True})])
    adk.reads.put_nowait(None)
    await read(attachment)
    assert bypassed() == 1


async def test_a_browser_tools_output_after_the_plugin_gave_up_is_dropped_and_its_request_reads_what_happened() -> None:
    adk, service, metrics = scripted_service()
    attachment, call = await asked(adk, service, "change_bgm")
    first = await read(attachment)
    assert types(first)[-3:] == ["tool-input-available", "finish-step", "finish"]

    adk.reads.put_nowait([response_event("change_bgm", {"error": GAVE_UP, REFUSAL_KEY: "max_wait"})])
    adk.reads.put_nowait(text_events("I could not change the music."))
    adk.reads.put_nowait(None)
    chat = service._registry.find(AGENT, "u", "chat-1")  # noqa: SLF001
    assert chat is not None and await chat.ended(5) and not chat.machine.running

    # The browser ran the tool meanwhile (onToolCall) and posts its output: too late for ADK.
    late = await read(await service.submit(AGENT, "u", request(USER, BGM_OUTPUT, message_id="msg-1")))
    assert types(late) == ["start", "tool-output-error", "start-step", "text-start", "text-delta", "text-end", "finish-step", "finish"]
    assert late[-1]["finishReason"] == "stop"
    assert call.outcome is Outcome.ABANDONED
    assert wait_count(metrics, "adk_gateway_browser_tool_wait_seconds", "change_bgm", "abandoned") == 1
    assert wait_count(metrics, "adk_gateway_browser_tool_wait_seconds", "change_bgm", "output") == 0


async def test_a_resume_after_a_browser_tools_output_replays_the_output_the_browser_added() -> None:
    """Issue 24, defect 11: the browser puts a browser tool's output into the message itself (the
    continuation does not repeat it); the AI SDK rebuilds a resumed message from the stream alone, so
    the replay carries it between the two responses."""
    adk, service, _metrics = scripted_service()
    attachment, call = await asked(adk, service, "change_bgm")
    first = await read(attachment)
    continuation = await service.submit(AGENT, "u", request(USER, BGM_OUTPUT, message_id="msg-1"))
    assert await asyncio.wait_for(service.gates.wait(call), 1) is not None
    resumed = service.resume(AGENT, "u", "chat-1")
    assert resumed is not None
    adk.reads.put_nowait([response_event("change_bgm", {"ok": True})])
    adk.reads.put_nowait(text_events("Now playing."))
    adk.reads.put_nowait(None)
    goes_on = await read(continuation)
    assert "tool-output-available" not in types(goes_on)  # the browser has it
    boundary = {"type": "message-metadata", "messageMetadata": first[-1].get("messageMetadata")}
    added = {"type": "tool-output-available", "toolCallId": CALL, "output": {"ok": True}}
    assert await read(resumed) == [*first[:-1], boundary, added, *goes_on]


async def test_an_output_given_while_the_run_writes_is_in_that_response_where_it_was_given() -> None:
    """What the run writes while the browser works (another tool's words) is held in a response of its
    own; the output arrives in the middle of it, and a replay shows it there."""
    adk, service, _metrics = scripted_service()
    attachment, call = await asked(adk, service, "change_bgm")
    first = await read(attachment)
    for event in text_events("Meanwhile, ", "hello."):
        adk.reads.put_nowait([event])
    chat = service._registry.find(AGENT, "u", "chat-1")  # noqa: SLF001
    assert chat is not None and chat.run is not None
    for _ in range(200):
        if b"hello." in b"".join(chat.run.current.frames):
            break
        await asyncio.sleep(0)
    continuation = await service.submit(AGENT, "u", request(USER, BGM_OUTPUT, message_id="msg-1"))
    assert await asyncio.wait_for(service.gates.wait(call), 1) is not None
    adk.reads.put_nowait([response_event("change_bgm", {"ok": True})])
    adk.reads.put_nowait(None)
    held = await read(continuation)
    added = {"type": "tool-output-available", "toolCallId": CALL, "output": {"ok": True}}
    assert held.count(added) == 1
    assert "".join(c["delta"] for c in held if c["type"] == "text-delta") == "Meanwhile, hello."
    assert held.index(added) > max(i for i, c in enumerate(held) if c["type"] == "text-delta")
    resumed = service.resume(AGENT, "u", "chat-1")
    boundary = {"type": "message-metadata", "messageMetadata": first[-1].get("messageMetadata")}
    assert resumed is not None and await read(resumed) == [*first[:-1], boundary, *held]


# ---- the shipped config's rules on arguments they cannot read (config/rules.py: fail closed) -------


async def test_a_payment_far_above_the_cap_written_as_a_string_is_refused_never_asked_of_the_payer() -> None:
    adk, service = shipped_service()
    await service.submit("demo_agent", "payer", request(USER))
    adk.reads.put_nowait([call_event("process_payment")])
    await asyncio.sleep(0.01)
    args = {"amount": "50000000", "recipient": "Hanako", "currency": "USD"}
    verdict = service.gates.open(app_name="demo_agent", user_id="payer", session_id="chat-1", tool_call_id=CALL,
                                 tool="process_payment", args=args, confirm=True)
    # Not CONFIRM (ADK's confirmation, which the payer answers): the cap refuses it, saying why.
    assert isinstance(verdict, Verdict) and not verdict.run and verdict.response is not None
    assert verdict.response[REFUSAL_KEY] == "denied_by_rule"
    assert "could not be evaluated" in verdict.response["error"] and "10,000 or more" in verdict.response["error"]


@pytest.mark.parametrize("approvers", [True, False])
async def test_a_refund_the_rule_cannot_read_waits_for_a_supervisor_never_the_requester(approvers: bool) -> None:
    """On /run_sse a call for approvers is ADK's confirmation marked with them (plugin 0.3), never
    held here and never confirmed unmarked: a 0.2 plugin, which cannot mark it, is refused."""
    adk, service = shipped_service()
    await service.submit("support_agent", "customer", request(USER))
    event = call_event("issue_refund")
    event["content"]["parts"][0]["functionCall"]["args"] = {"amount": "5000"}
    adk.reads.put_nowait([event])
    await asyncio.sleep(0.01)
    verdict = service.gates.open(app_name="support_agent", user_id="customer", session_id="chat-1", tool_call_id=CALL,
                                 tool="issue_refund", args={"amount": "5000"}, confirm=True, approvers=approvers)
    assert isinstance(verdict, Verdict) and not verdict.run
    if approvers:
        who = {"approvers": "supervisors", "self_approval": False, "quorum": 1, "rule": "large_refund"}
        assert verdict.confirm and verdict.payload == {"adk_gateway": {"approvers": who}}
    else:
        assert not verdict.confirm and verdict.reason == "plugin_too_old" and verdict.response == {
            "error": "This call waits for approvers, which needs adk-gateway-plugin 0.3 or newer on the agent; it was not run.",
            REFUSAL_KEY: "plugin_too_old",
        }
    # Nothing waits here for it: the requester has nothing to answer.
    assert service.gates.find(app_name="support_agent", user_id="customer", session_id="chat-1", tool_call_id=CALL) is None


async def test_an_ask_past_its_users_cap_is_refused_by_the_machine_and_counted_by_the_gates() -> None:
    """The user's count of listed approvals is an input of the decision (the cluster reads it from
    the store before asking); the gates carry the refusal out: counted by agent, nothing recorded."""
    adk, service, metrics = scripted_service()
    await service.submit(AGENT, "u", request(USER))
    adk.reads.put_nowait([call_event("process_payment")])
    await asyncio.sleep(0.01)
    cap = service.config.max_pending_approvals_per_user(AGENT)
    ask = {"app_name": AGENT, "user_id": "u", "session_id": "chat-1", "tool": "process_payment", "args": {}}
    refused = service.gates.open(tool_call_id=CALL, user_waiting=cap, **ask)  # type: ignore[arg-type]
    assert isinstance(refused, Verdict) and not refused.run and refused.reason == "too_many_pending_user"
    assert refused.response is not None and "max_pending_approvals_per_user" in refused.response["error"]
    assert metrics.registry.get_sample_value("adk_gateway_approvals_over_user_cap_total", {"agent": AGENT}) == 1
    chat = service._registry.find(AGENT, "u", "chat-1")  # noqa: SLF001 - its ledger: nothing recorded
    assert chat is not None and chat.ledger.call(CALL) is None
    # One below the cap, or a count nobody could read: the call waits, and nothing more is counted.
    for waiting, call_id in ((cap - 1, "c-2"), (None, "c-3")):
        call = service.gates.open(tool_call_id=call_id, user_waiting=waiting, **ask)  # type: ignore[arg-type]
        assert isinstance(call, GatedCall) and not call.released
    assert metrics.registry.get_sample_value("adk_gateway_approvals_over_user_cap_total", {"agent": AGENT}) == 1
    adk.reads.put_nowait(None)
    await service.close()
