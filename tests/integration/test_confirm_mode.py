"""`upstream.approvals: confirm` on the real stack: the stock ADK API server with the plugin, on the
newest ADK (this venv) and the oldest supported one (.venv-adk-<version>, as test_adk_versions.py).

A gated call then holds nothing open: the plugin asks ADK's own confirmation, ADK ends the run with
the request in its session, and the answer (whichever gateway process receives it) re-runs the call
once. Shown here with the ledger of real executions (the demo's DEMO_TOOL_LEDGER):

- the plugin inside each ADK's own Runner (adk_confirm_probe.py): SSE asks ADK, not the gateway,
  and the answer runs the payment once (approve) or never (deny); live keeps the blocking path;
- "pay 50 to Hanako" through the gateway, approved and denied, with no plugin request at all;
- the same answered after a kill -9 of the gateway and a fresh start (memory backend): ADK, which
  kept the request, runs the payment once;
- every demo row with the stock ai 6 and ai 7 Chats over SSE and WebSocket;
- browser tools (change_bgm, and get_location after an approval): shown chunk for chunk as hold
  mode shows them, their output carried to ADK as the confirmation's payload (the tool's server
  stand-in never runs), an answer replayed refused, and an output after a kill -9 of the gateway.

`ADK_VERSIONS` names the old versions (default 1.22.1); `ADK_VENV_DIR` may point at a ready venv of
the first one instead of building .venv-adk-<version> here. Each old-ADK process loads this
checkout's plugin sources (PYTHONPATH), which a venv built earlier may not hold yet.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gateway.demo import adk_venv
from gateway.demo.tools import process_payment
from tests.chatflow import assistant_from, new_chat, post, types, user
from tests.demo_rows import LOCATION, SCENARIOS as DEMO_ROWS
from tests.demo_rows import check_rows, said
from tests.jsdriver import assert_clean, run_chat, run_chats
from tests.integration.conftest import SharedAgents, plugin_agent
from tests.procs import (
    DEMO_TOOLS, ROOT, AdkServer, Agent, GatewayProcess, Ledger, gateway_process, metric_value, plugin_stack, request,
    start_agent, stop_process,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

PLUGIN = "adk_gateway_plugin.GatewayPlugin"
PROBE = Path(__file__).with_name("adk_confirm_probe.py")
HINT = "Money leaves the account when you approve."
PLACEHOLDER = {"error": "This tool call requires confirmation, please approve or reject."}
OLD = [v.strip() for v in os.environ.get("ADK_VERSIONS", "1.22.1").split(",") if v.strip()]



def held_plugin_requests(gw: GatewayProcess) -> float:
    """Plugin requests that waited for a verdict. The asks a tool's rules answer at once (`rule`,
    or `confirm`: ADK asks the person) hold nothing open."""
    return sum(metric_value(gw.base, "adk_gateway_plugin_requests_total", {"result": r}) for r in ("run", "respond"))

def _old_venv(version: str) -> Path:
    given = os.environ.get("ADK_VENV_DIR")
    if given and version == OLD[0]:
        return Path(given)
    try:
        return adk_venv.ensure(version)
    except adk_venv.VenvError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="module", params=["newest", *OLD])
def adk(request: pytest.FixtureRequest) -> tuple[str, Path | None]:
    """(label, venv) of an ADK to run: None is this venv's (the newest)."""
    return request.param, None if request.param == "newest" else _old_venv(request.param)


def _plugin_env() -> dict[str, str]:
    # This checkout's plugin first, whatever copy the venv holds.
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "plugin"), os.environ.get("PYTHONPATH")]))}


# ---- the plugin inside each ADK's own Runner ------------------------------------------------------


@pytest.mark.parametrize("answer", ["approve", "deny"])
def test_on_sse_the_plugin_asks_adk_and_the_answer_runs_the_call_once_or_never(adk: tuple[str, Path | None], answer: str) -> None:
    python = sys.executable if adk[1] is None else str(adk[1] / "bin" / "python")
    done = subprocess.run(
        [python, str(PROBE), "sse", answer], capture_output=True, text=True, timeout=120, cwd=ROOT,
        env={**os.environ, **_plugin_env()},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout)
    assert seen["plugin_file"].startswith(str(ROOT / "plugin"))
    assert seen["asked_gateway"] == 0 and seen["ran_before_answer"] == 0
    pay, confirmation, placeholder = seen["first"]
    assert pay["call"] == "process_payment" and confirmation["call"] == "adk_request_confirmation"
    assert confirmation["long_running"] is True
    assert confirmation["args"]["originalFunctionCall"]["id"] == pay["id"]
    assert confirmation["args"]["toolConfirmation"]["hint"] == HINT
    assert placeholder == {"response": "process_payment", "id": pay["id"], "value": PLACEHOLDER}
    [result] = seen["second"]
    assert result["id"] == pay["id"]
    if answer == "approve":
        assert seen["ran"] == 1 and result["value"] == process_payment(50, "Hanako", "USD")
        assert seen["final_text"].startswith("Done: sent 50 USD to Hanako")
    else:
        assert seen["ran"] == 0 and result["value"] == {"error": "This tool call is rejected."}
        assert "was not made" in seen["final_text"]


def test_on_live_the_plugin_keeps_the_blocking_path(adk: tuple[str, Path | None]) -> None:
    python = sys.executable if adk[1] is None else str(adk[1] / "bin" / "python")
    done = subprocess.run(
        [python, str(PROBE), "live", "approve"], capture_output=True, text=True, timeout=120, cwd=ROOT,
        env={**os.environ, **_plugin_env()},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout)
    assert seen["asked_gateway"] == 1 and seen["ran"] == 1
    assert all(p.get("call") != "adk_request_confirmation" for p in seen["first"])


# ---- through the gateway ----------------------------------------------------------------------------


@pytest.fixture
def agent(adk: tuple[str, Path | None], shared_agents: SharedAgents) -> Agent:
    """The stock ADK API server with the plugin, on the ADK under test: one the module's tests (and
    test_confirm_timeouts.py's, test_resume_rebuild.py's) share, each with a gateway of its own."""
    venv = adk[1]
    return shared_agents.get(f"confirm-{adk[0]}", lambda tmp: start_agent(
        tmp, plugin=PLUGIN, adk=None if venv is None else venv / "bin" / "adk", env=_plugin_env(),
    ))


@contextmanager
def confirm_stack(
    tmp: Path, agent: Agent, *, payment_timeout: str = "5m", on_timeout: str = "deny",
) -> Iterator[tuple[AdkServer, GatewayProcess, str]]:
    """A gateway with `approvals: confirm` in front of `agent`; yields (adk, gateway, the gateway's
    YAML extra). `payment_timeout`, `on_timeout`: process_payment's policy."""
    extra = DEMO_TOOLS.format(payment_timeout=payment_timeout, on_timeout=on_timeout) + agent.internal_config()
    with gateway_process(tmp, agent.server.base, extra, approvals="confirm") as gw:
        yield agent.server, gw, extra


def runs(ledger: Ledger) -> list[dict]:
    return ledger.runs()


def text(reply) -> str:
    return "".join(c["delta"] for c in reply.chunks if c["type"] == "text-delta")


def ask_to_pay(gw: GatewayProcess) -> tuple[str, dict, object, str]:
    chat, first_message = new_chat(), user("pay 50 to Hanako")
    first = post(gw, chat, [first_message])
    assert types(first) == [
        "start", "start-step", "tool-input-start", "tool-input-available", "tool-approval-request", "finish-step", "finish",
    ], first.body[-2000:]
    request = first.chunks[4]
    # ADK's own confirmation (its id), showing the tool policy's hint.
    assert request["approvalId"].startswith("adk-") and request["approvalDescriptor"] == {"hint": HINT}
    assert first.chunks[-1]["finishReason"] == "tool-calls"
    return chat, first_message, first, request["toolCallId"]


def answer(gw: GatewayProcess, chat: str, first_message: dict, first, approved: bool, call_id: str) -> None:
    reply = assistant_from(first, [approved])
    second = post(gw, chat, [first_message, reply], messageId=reply["id"])
    assert second.status == 200 and second.chunks[0] == {"type": "start", "messageId": reply["id"]}, second.body[-2000:]
    if approved:
        assert second.chunks[1] == {"type": "tool-output-available", "toolCallId": call_id, "output": process_payment(50, "Hanako", "USD")}
        assert text(second).startswith("Done: sent 50 USD to Hanako")
    else:
        assert second.chunks[1] == {"type": "tool-output-denied", "toolCallId": call_id}, second.body[-2000:]
        assert "not made" in text(second)
    assert second.chunks[-1]["finishReason"] == "stop"


def test_approve_and_deny_through_the_gateway_hold_no_plugin_request(adk: tuple[str, Path | None], agent: Agent, tmp_path: Path) -> None:
    ledger = agent.ledger
    with confirm_stack(tmp_path, agent) as (_, gw, _extra):
        for approved in (True, False):
            chat, first_message, first, call_id = ask_to_pay(gw)
            # Nothing waits anywhere but in ADK's session: the run ended (waiting), no plugin request.
            assert metric_value(gw.base, "adk_gateway_approvals_pending") == 1
            assert metric_value(gw.base, "adk_gateway_runs_total", {"outcome": "waiting"}) == (1 if approved else 2)
            answer(gw, chat, first_message, first, approved, call_id)
            paid = [r for r in runs(ledger) if r["session_id"] == chat]
            assert len(paid) == (1 if approved else 0), paid
        assert held_plugin_requests(gw) == 0
        for outcome in ("approved", "denied"):
            assert metric_value(
                gw.base, "adk_gateway_approval_wait_seconds_count", {"tool": "process_payment", "outcome": outcome},
            ) == 1
        assert metric_value(gw.base, "adk_gateway_policy_bypassed_total") == 0
        assert metric_value(gw.base, "adk_gateway_approvals_pending") == 0
        assert len(runs(ledger)) == 1
        answered = [(line["tool"], line["outcome"]) for line in gw.log_lines() if line.get("event") == "approval_answered"]
        assert answered == [("process_payment", "approved"), ("process_payment", "denied")], answered


def test_an_answer_after_the_gateway_was_killed_and_restarted_runs_the_payment_once(
    adk: tuple[str, Path | None], agent: Agent, tmp_path: Path,
) -> None:
    ledger = agent.ledger
    with confirm_stack(tmp_path, agent) as (server, gw, extra):
        pending = [ask_to_pay(gw) for _ in range(2)]
        gw.proc.kill()  # kill -9: the gateway's memory (its chats, its ledger) is gone
        gw.proc.wait()
        assert runs(ledger) == []
        with gateway_process(tmp_path, server.base, extra, approvals="confirm", port=gw.port) as again:
            (chat_a, message_a, first_a, call_a), (chat_b, message_b, first_b, call_b) = pending
            answer(again, chat_a, message_a, first_a, True, call_a)
            answer(again, chat_b, message_b, first_b, False, call_b)
            assert [r["session_id"] for r in runs(ledger)] == [chat_a]
            # A replay of the approval, to the restarted gateway, runs nothing again.
            reply = assistant_from(first_a, [True])
            replay = post(again, chat_a, [message_a, reply], messageId=reply["id"])
            assert replay.status == 410, replay.body[-2000:]
            assert len(runs(ledger)) == 1
        stop_process(gw.proc)


@pytest.mark.js
def test_every_demo_row_with_stock_clients_in_confirm_mode(
    adk: tuple[str, Path | None], agent: Agent, shared_agents: SharedAgents, tmp_path: Path,
) -> None:
    """The demo script with the stock ai 6 and ai 7 Chats over SSE and WebSocket: every gated call,
    the browser tools' too, goes through ADK's confirmation (no plugin request at all), each
    approved payment runs exactly once, no denied or abandoned one ever. On the newest ADK, the
    browser tools' rows over SSE receive chunk for chunk what they receive on the held path."""
    ledger = agent.ledger
    over_sse: dict[int, dict[str, dict]] = {}
    with confirm_stack(tmp_path, agent) as (_, gw, _extra):
        names = list(DEMO_ROWS)
        for version in (6, 7):
            for transport in ("sse", "ws"):
                batch = [
                    {"version": version, "api": f"{gw.base}/api/chat", "steps": DEMO_ROWS[name], "transport": transport,
                     "ws_url": gw.base.replace("http", "ws", 1) + "/api/chat/ws"}
                    for name in names
                ]
                results: dict[str, dict] = {}
                for start in range(0, len(batch), 5):
                    results.update(zip(names[start:start + 5], run_chats(batch[start:start + 5], timeout=90)))
                try:
                    check_rows(results)
                except AssertionError as exc:
                    raise AssertionError(f"ADK {adk[0]}, ai {version} over {transport}: {exc}") from None
                if transport == "sse":
                    over_sse[version] = results
        paid = Counter(r["args"]["recipient"] for r in runs(ledger) if r["tool"] == "process_payment")
        # Per client and transport: "approve" pays Hanako once, "two" pays one of Alice and Bob;
        # "deny" and "moved_on" (a new message instead of an answer) never pay.
        assert paid["Hanako"] == 4 and paid["Alice"] + paid["Bob"] == 4, paid
        # Nothing went through the plugin's held requests (a gateway gate's id is gw-...).
        for tool in ("process_payment", "get_location", "change_bgm"):
            ids = {line["approval_id"] for line in gw.log_lines() if line.get("tool") == tool and "approval_id" in line}
            assert ids and all(i.startswith("adk-") for i in ids), (tool, sorted(ids))
        assert held_plugin_requests(gw) == 0
        assert metric_value(gw.base, "adk_gateway_policy_bypassed_total") == 0
        assert metric_value(gw.base, "adk_gateway_ws_frames_total", {"direction": "in", "type": "send"}) >= len(names)
    # The chunks are the gateway's: one ADK shows them (the rows above run on each).
    if adk[0] == "newest":
        check_as_on_the_held_path(shared_agents, tmp_path, over_sse)


# ---- browser tools in confirm mode -----------------------------------------------------------------

# What the held path (live mode) shows for these rows (tests/integration/test_gateway_approvals.py, docs/protocol.md).
BGM_FIRST = ["start", "start-step", "tool-input-start", "tool-input-available", "finish-step", "finish"]
LOCATION_FIRST = ["start", "start-step", "tool-input-start", "tool-input-delta", "tool-approval-request", "finish-step", "finish"]


def with_output(message: dict, call_id: str, output: object, *, error: str | None = None) -> dict:
    """The assistant message after the browser ran `call_id` (the AI SDK's addToolOutput)."""
    parts = []
    for part in message["parts"]:
        if part.get("toolCallId") == call_id:
            part = {**part, "state": "output-error", "errorText": error} if error else {**part, "state": "output-available", "output": output}
        parts.append(part)
    return {**message, "parts": parts}


def handed_over(message: dict, reply) -> dict:
    """The message after the handover response: the tool part's input is available (and runs)."""
    inputs = {c["toolCallId"]: c["input"] for c in reply.chunks if c["type"] == "tool-input-available"}
    return {**message, "parts": [
        {**p, "input": inputs[p["toolCallId"]]} if p.get("toolCallId") in inputs else p for p in message["parts"]
    ]}


def session_result(server: AdkServer, chat: str, call_id: str) -> list[object]:
    """Every response ADK's session holds for the call (the placeholder, then the result)."""
    reply = request(server.base, "GET", f"/apps/demo_agent/users/anonymous/sessions/{chat}")
    assert reply.status == 200, reply.body[-500:]
    found = []
    for event in reply.json().get("events", []):
        for part in (event.get("content") or {}).get("parts") or []:
            response = part.get("functionResponse") or part.get("function_response")
            if response and response.get("id") == call_id:
                found.append(response.get("response"))
    return found


def play(gw: GatewayProcess) -> tuple[str, dict, object, str]:
    chat, first_message = new_chat(), user("play track 2")
    first = post(gw, chat, [first_message])
    assert types(first) == BGM_FIRST, first.body[-2000:]
    assert first.chunks[3]["toolName"] == "change_bgm" and first.chunks[3]["input"] == {"track": 2}
    assert first.chunks[-1]["finishReason"] == "tool-calls"
    return chat, first_message, first, first.chunks[3]["toolCallId"]


def locate(gw: GatewayProcess) -> tuple[str, dict, object, str, str]:
    chat, first_message = new_chat(), user("where am I")
    first = post(gw, chat, [first_message])
    assert types(first) == LOCATION_FIRST, first.body[-2000:]
    request_chunk = first.chunks[4]
    assert request_chunk["approvalId"].startswith("adk-")  # ADK's confirmation, under the original call
    assert first.chunks[-1]["finishReason"] == "tool-calls"
    return chat, first_message, first, request_chunk["toolCallId"], request_chunk["approvalId"]


def approve_location(gw: GatewayProcess, chat: str, first_message: dict, first, call_id: str) -> dict:
    """Approve: the call is handed to the browser as hold mode hands it over; ADK hears nothing yet."""
    approved = assistant_from(first, [True])
    second = post(gw, chat, [first_message, approved], messageId=approved["id"])
    assert second.status == 200, second.body[-2000:]
    assert second.chunks == [
        {"type": "start", "messageId": approved["id"]},
        {"type": "tool-input-available", "toolCallId": call_id, "toolName": "get_location", "input": {}},
        {"type": "finish", "finishReason": "tool-calls"},
    ], second.body[-2000:]
    return handed_over(approved, second)


def send_output(gw: GatewayProcess, chat: str, first_message: dict, message: dict, call_id: str, output: object) -> object:
    done = with_output(message, call_id, output)
    reply = post(gw, chat, [first_message, done], messageId=done["id"])
    assert reply.status == 200, reply.body[-2000:]
    assert reply.chunks[0] == {"type": "start", "messageId": done["id"]}
    # The browser has the output: not echoed (as in hold mode), and ADK's machinery never shown.
    assert not [c for c in reply.chunks if c.get("toolCallId")], reply.body[-2000:]
    assert reply.chunks[-1]["finishReason"] == "stop"
    return reply


def test_browser_tools_hold_nothing_and_their_output_answers_adk(adk: tuple[str, Path | None], agent: Agent, tmp_path: Path) -> None:
    ledger = agent.ledger
    with confirm_stack(tmp_path, agent) as (server, gw, _extra):
        # change_bgm: no approval; the output is the confirmation's answer.
        chat, first_message, first, call_id = play(gw)
        assert session_result(server, chat, call_id) == [PLACEHOLDER]  # waiting in ADK's session
        reply = send_output(gw, chat, first_message, assistant_from(first), call_id, {"playing": 2})
        assert "track 2" in text(reply)
        # The browser's output is the call's result; the tool's server stand-in never ran.
        assert session_result(server, chat, call_id) == [PLACEHOLDER, {"playing": 2}]
        replay = post(gw, chat, [first_message, with_output(assistant_from(first), call_id, {"playing": 2})], messageId=first.chunks[0]["messageId"])
        assert replay.status == 410 and replay.json()["error"]["code"] == "approval_gone", replay.body[-500:]
        assert len(session_result(server, chat, call_id)) == 2

        # get_location: approved (nothing reaches ADK), run, its output answers ADK.
        chat, first_message, first, call_id, _approval = locate(gw)
        message = approve_location(gw, chat, first_message, first, call_id)
        assert session_result(server, chat, call_id) == [PLACEHOLDER]
        reply = send_output(gw, chat, first_message, message, call_id, LOCATION)
        assert "35.6812" in text(reply)
        assert session_result(server, chat, call_id) == [PLACEHOLDER, LOCATION]
        replay = post(gw, chat, [first_message, with_output(message, call_id, LOCATION)], messageId=message["id"])
        assert replay.status == 410, replay.body[-500:]

        # get_location denied: ADK is told at once; the browser never gets the call to run.
        chat, first_message, first, call_id, _approval = locate(gw)
        denied = assistant_from(first, [False])
        reply = post(gw, chat, [first_message, denied], messageId=denied["id"])
        assert reply.chunks[1] == {"type": "tool-output-denied", "toolCallId": call_id}, reply.body[-2000:]
        assert "tool-input-available" not in types(reply) and reply.chunks[-1]["finishReason"] == "stop"
        assert session_result(server, chat, call_id) == [PLACEHOLDER, {"error": "This tool call is rejected."}]

        # The browser's error is the call's result too.
        chat, first_message, first, call_id = play(gw)
        failed = with_output(assistant_from(first), call_id, None, error="Autoplay is blocked")
        reply = post(gw, chat, [first_message, failed], messageId=failed["id"])
        assert reply.status == 200 and not [c for c in reply.chunks if c.get("toolCallId")], reply.body[-2000:]
        assert session_result(server, chat, call_id) == [PLACEHOLDER, {"error": "Autoplay is blocked"}]

        assert held_plugin_requests(gw) == 0  # nothing held open
        assert metric_value(gw.base, "adk_gateway_policy_bypassed_total") == 0
        assert metric_value(gw.base, "adk_gateway_approvals_pending") == 0
        for tool, outcome, count in (("change_bgm", "output", 1), ("change_bgm", "error", 1), ("get_location", "output", 1)):
            assert metric_value(
                gw.base, "adk_gateway_browser_tool_wait_seconds_count", {"tool": tool, "outcome": outcome},
            ) == count, (tool, outcome)
        for outcome in ("approved", "denied"):
            assert metric_value(
                gw.base, "adk_gateway_approval_wait_seconds_count", {"tool": "get_location", "outcome": outcome},
            ) == 1


def test_outputs_of_no_browser_tool_or_of_another_chat_are_refused(adk: tuple[str, Path | None], agent: Agent, tmp_path: Path) -> None:
    if adk[0] != "newest":
        pytest.skip("the gateway's own checks: one ADK shows them")
    with confirm_stack(tmp_path, agent) as (server, gw, _extra):
        chat, first_message, first, call_id = play(gw)
        # Another chat names the call: not one of its own, refused, and the real one still works.
        other = new_chat()
        refused = post(gw, other, [first_message, with_output(assistant_from(first), call_id, {"playing": 9})])
        assert refused.status == 400 and refused.json()["error"]["code"] == "invalid_request", refused.body[-500:]
        # An output for a server tool's call, even named as a browser tool's, answers nothing: the
        # payment is neither run nor rejected by it.
        pay_chat, pay_message, pay_first, pay_call = ask_to_pay(gw)
        for name in ("process_payment", "change_bgm"):
            forged = with_output(assistant_from(pay_first), pay_call, {"success": True})
            forged["parts"] = [{**p, "type": f"tool-{name}"} if p.get("toolCallId") == pay_call else p for p in forged["parts"]]
            refused = post(gw, pay_chat, [pay_message, forged], messageId=forged["id"])
            assert refused.status == 400 and refused.json()["error"]["code"] == "invalid_request", refused.body[-500:]
        assert session_result(server, pay_chat, pay_call) == [PLACEHOLDER]
        assert session_result(server, chat, call_id) == [PLACEHOLDER]
        # An output before the approval it needs (the browser never had the call to run) is no answer.
        chat_b, message_b, first_b, call_b, _approval = locate(gw)
        early = with_output(assistant_from(first_b), call_b, LOCATION)
        refused = post(gw, chat_b, [message_b, early], messageId=early["id"])
        assert refused.status == 400, refused.body[-500:]
        assert session_result(server, chat_b, call_b) == [PLACEHOLDER]
        # An output past the request limit (chat.max_body_bytes) is refused before anything reads it.
        huge = with_output(assistant_from(first), call_id, {"playing": "x" * (5 * 1024 * 1024)})
        refused = post(gw, chat, [first_message, huge], messageId=huge["id"])
        assert refused.status == 413 and refused.headers["content-type"].startswith("application/json"), refused.body[-500:]
        assert session_result(server, chat, call_id) == [PLACEHOLDER]
        reply = send_output(gw, chat, first_message, assistant_from(first), call_id, {"playing": 2})
        assert "track 2" in text(reply)


def test_browser_outputs_after_the_gateway_was_killed_and_restarted(adk: tuple[str, Path | None], agent: Agent, tmp_path: Path) -> None:
    with confirm_stack(tmp_path, agent) as (server, gw, extra):
        bgm = play(gw)
        before_approval = locate(gw)
        after_approval = locate(gw)
        handed = approve_location(gw, *after_approval[:4])
        gw.proc.kill()  # kill -9: the chats and their ledgers are gone
        gw.proc.wait()
        with gateway_process(tmp_path, server.base, extra, approvals="confirm", port=gw.port) as again:
            chat, first_message, first, call_id = bgm
            assert "track 2" in text(send_output(again, chat, first_message, assistant_from(first), call_id, {"playing": 2}))
            assert session_result(server, chat, call_id) == [PLACEHOLDER, {"playing": 2}]
            # Approved before the restart: the output alone goes on.
            chat, first_message, _first, call_id, _approval = after_approval
            assert "35.6812" in text(send_output(again, chat, first_message, handed, call_id, LOCATION))
            # Asked before the restart: the approval is handed over from ADK's session, then the output.
            chat, first_message, first, call_id, _approval = before_approval
            message = approve_location(again, chat, first_message, first, call_id)
            assert "35.6812" in text(send_output(again, chat, first_message, message, call_id, LOCATION))
            # A replay, to the restarted gateway, reaches ADK no more.
            replay = post(again, chat, [first_message, with_output(message, call_id, LOCATION)], messageId=message["id"])
            assert replay.status == 410, replay.body[-500:]
            assert session_result(server, chat, call_id) == [PLACEHOLDER, LOCATION]
        stop_process(gw.proc)


BROWSER_ROWS = ("bgm", "location", "location_denied")


def wire(result: dict) -> list[list[dict]]:
    """What each request of a stock Chat received, ids made comparable across two servers, the
    model's words left out (a denial's reads ADK's rejection text in confirm mode)."""
    names: dict[str, str] = {}

    def same(value: object) -> object:
        if isinstance(value, str) and (value.startswith(("adk-", "gw-", "msg-")) or value in names):
            return names.setdefault(value, f"id{len(names)}")
        return value

    responses: dict[int, list[dict]] = {}
    for index, chunk in result["chunks"]:
        if chunk["type"] == "text-delta":
            continue
        keep = {k: same(v) for k, v in chunk.items() if k not in ("messageMetadata",)}
        if keep["type"] == "tool-input-start" or "toolCallId" in keep:
            keep["toolCallId"] = names.setdefault(chunk["toolCallId"], f"call{len(names)}")
        responses.setdefault(index, []).append(keep)
    return list(responses.values())


def check_as_on_the_held_path(shared_agents: SharedAgents, tmp_path: Path, over_sse: dict[int, dict[str, dict]]) -> None:
    """ai 6 and ai 7 over SSE, every chunk parsed by the SDK: the browser tools' rows in confirm
    mode (`over_sse`, per version) received, request by request, what the same rows receive on the
    held path, a live upstream's (only ids and the model's words differ)."""
    batch = [(version, name) for version in (6, 7) for name in BROWSER_ROWS]
    (tmp_path / "hold").mkdir()
    with plugin_stack(tmp_path / "hold", upstream_mode="live", agent=plugin_agent(shared_agents)) as hold:
        held = run_chats([{"version": v, "api": f"{hold.gateway.base}/api/chat", "steps": DEMO_ROWS[n]} for v, n in batch], timeout=60)
        assert metric_value(hold.gateway.base, "adk_gateway_plugin_requests_total") > 0
    confirmed = [over_sse[version][name] for version, name in batch]
    for (version, name), before, after in zip(batch, held, confirmed):
        assert_clean(before)
        assert_clean(after)
        assert wire(after) == wire(before), f"ai {version}, {name}"
        assert [p["state"] for m in after["messages"] for p in m["parts"] if p["type"].startswith("tool-")] == [
            p["state"] for m in before["messages"] for p in m["parts"] if p["type"].startswith("tool-")
        ]
    check_rows_browser = {name: r for (v, name), r in zip(batch, confirmed)}
    assert "35.6812" in said(check_rows_browser["location"]) and "track 2" in said(check_rows_browser["bgm"])
    assert check_rows_browser["location_denied"]["toolCalls"] == []


@pytest.mark.js
@pytest.mark.parametrize("version", [6, 7])
def test_a_stock_chat_runs_a_browser_tool_approved_after_a_gateway_kill(
    adk: tuple[str, Path | None], agent: Agent, tmp_path: Path, version: int,
) -> None:
    """"where am I": the Chat holds its Approve while the gateway is killed (-9) and started again;
    then the approval hands the call over (from ADK's session), the browser runs it, and its output
    reaches the model."""
    if adk[0] != "newest" and version == 6:
        pytest.skip("one client on the old ADK is enough here")
    with confirm_stack(tmp_path, agent) as (server, gw, extra):
        hold = tmp_path / f"answer-{version}"
        result: dict = {}
        steps = [{**DEMO_ROWS["location"][0], "holdAnswersUntil": str(hold)}]
        driver = threading.Thread(target=lambda: result.update(run_chat(version, f"{gw.base}/api/chat", steps=steps, timeout=120)))
        driver.start()
        ready = hold.with_name(hold.name + ".ready")
        deadline = time.monotonic() + 60
        while not ready.exists() and driver.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), "the approval never reached the Chat"
        gw.proc.kill()
        gw.proc.wait()
        with gateway_process(tmp_path, server.base, extra, approvals="confirm", port=gw.port):
            hold.write_text("")
            driver.join(150)
        assert result, "the chat driver did not report"
        assert_clean(result)
        [part] = [p for m in result["messages"] for p in m["parts"] if p["type"].startswith("tool-")]
        assert part["state"] == "output-available" and part["output"] == LOCATION
        assert "35.6812" in said(result)
        assert [c["toolName"] for c in result["toolCalls"]] == ["get_location"]
        assert session_result(server, result["chatId"], part["toolCallId"]) == [PLACEHOLDER, LOCATION]
        stop_process(gw.proc)
