"""A page reloaded from scratch after the gateway lost its memory resumes into the waiting approval
(issue 25, item 5): the stock ADK API server with the plugin in confirm mode (and a tool's own
`require_confirmation`), on the newest ADK and the oldest supported one (ADK_VERSIONS, as
test_confirm_mode.py), the real gateway killed (-9) and started again on the memory backend, and a
fresh stock ai 6 / ai 7 Chat (tests/js/chat-driver.mjs) that calls resumeStream()
over SSE and over WebSocket: it is shown the approval request again, approves, the continuation
streams, and the payment runs exactly once (the demo's ledger of real executions). And with two
replicas on Redis, a resume on the survivor of a kill -9 of the replica that asked.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.chatflow import assistant_from, new_chat, post, types, user
from tests.demo_rows import said, tool_states
from tests.integration.conftest import STORES, SharedAgents, plugin_agent
from tests.integration.test_adk_restart import native_agent, native_stack
from tests.integration.test_confirm_mode import adk, agent, confirm_stack, runs  # noqa: F401 - fixtures
from tests.jsdriver import assert_clean, run_chats
from tests.ops.stack import replicas, wait_until
from tests.procs import Agent, GatewayProcess, gateway_process, request

pytestmark = [pytest.mark.integration, pytest.mark.js, pytest.mark.timeout(900)]

CLIENTS = [(6, "sse"), (7, "sse"), (6, "ws"), (7, "ws")]


def _runs(gw: GatewayProcess, chats: dict[tuple[int, str], str], steps: list[dict]) -> dict[tuple[int, str], dict]:
    batch = [
        {"version": version, "api": f"{gw.base}/api/chat", "chat_id": chats[(version, transport)], "steps": steps,
         "transport": transport, "ws_url": gw.base.replace("http", "ws", 1) + "/api/chat/ws"}
        for version, transport in chats
    ]
    return dict(zip(chats, run_chats(batch, timeout=60)))


def _asked_then_killed(gw: GatewayProcess, chats: dict[tuple[int, str], str]) -> dict[tuple[int, str], str]:
    """Each chat's approval asked; the gateway killed. Returns each chat's assistant message id."""
    asked = _runs(gw, chats, [{"send": "pay 50 to Hanako"}])
    for client, result in asked.items():
        assert_clean(result)
        assert tool_states(result) == ["approval-requested"], client
    gw.proc.kill()  # kill -9: the gateway's memory (its chats, their runs, its ledger) is gone
    gw.proc.wait()
    return {client: result["messages"][-1]["id"] for client, result in asked.items()}


def _resumed_and_approved(
    gw: GatewayProcess, chats: dict[tuple[int, str], str], message_ids: dict[tuple[int, str], str],
) -> dict[tuple[int, str], dict]:
    # A fresh page: no messages of its own, it resumes, is shown the request, approves.
    resumed = _runs(gw, chats, [{"resume": True, "approvals": "approve"}])
    for client, result in resumed.items():
        assert_clean(result)
        assert result["status"] == "ready", client
        [message] = result["messages"]
        # Rebuilt under the id the gateway streamed it under (ADK's session keeps it).
        assert message["role"] == "assistant" and message["id"] == message_ids[client], message
        assert tool_states(result) == ["output-available"], (client, message["parts"])
        assert "Done: sent 50 USD to Hanako" in said(result), client
        first = result["requests"][0]
        if client[1] == "sse":
            assert first["method"] == "GET" and first["status"] == 200, first
        else:
            assert first["type"] == "resume" and result["terminals"][0] == "end", result["terminals"]
    return resumed


@pytest.fixture(params=STORES)
def stored_agent(request: pytest.FixtureRequest, adk: tuple, agent: Agent, shared_agents: SharedAgents) -> Agent:  # noqa: F811
    """The agent under test on each of ADK's session stores (SQLite: this venv's ADK, as `make run`)."""
    if request.param == "memory":
        return agent
    if adk[1] is not None:
        pytest.skip("ADK's SQLite store is exercised on the newest ADK")
    return plugin_agent(shared_agents, store=request.param)


def test_a_reloaded_page_resumes_into_the_approval_after_a_gateway_kill(stored_agent: Agent, tmp_path: Path) -> None:
    agent = stored_agent
    ledger = agent.ledger
    chats = {client: new_chat() for client in CLIENTS}
    with confirm_stack(tmp_path, agent) as (server, gw, extra):
        message_ids = _asked_then_killed(gw, chats)
        assert runs(ledger) == []
        with gateway_process(tmp_path, server.base, extra, approvals="confirm", port=gw.port) as again:
            _resumed_and_approved(again, chats, message_ids)
            # Each payment ran exactly once, each in its own chat.
            assert sorted(r["session_id"] for r in runs(ledger)) == sorted(chats.values())
            # Answered: a resume now replays the finished message, and nothing waits any more.
            for chat in chats.values():
                replay = request(again.base, "GET", f"/api/chat/{chat}/stream")
                assert replay.status in (200, 204), replay.body[:300]
            rebuilt = [line for line in again.log_lines() if line.get("event") == "approval_rebuilt"]
            assert len(rebuilt) == len(chats), rebuilt
        # A gateway started afresh once more: ADK's sessions wait for nothing, a resume is a 204.
        with gateway_process(tmp_path, server.base, extra, approvals="confirm", port=gw.port) as third:
            for chat in chats.values():
                assert request(third.base, "GET", f"/api/chat/{chat}/stream").status == 204
        assert len(runs(ledger)) == len(chats)


def test_a_page_that_kept_its_message_resumes_into_that_same_message(adk: tuple, agent: Agent, tmp_path: Path) -> None:  # noqa: F811
    """The page kept its messages (in memory, or the app's storage) while the gateway was killed and
    started again; it resumes: the rebuilt stream carries the message id the gateway streamed the
    message under (ADK's session holds it: the state delta of the run's first event), so the stock
    Chat replaces its message instead of adding a second one; the Approve that follows continues
    that same message, and the payment runs once."""
    ledger = agent.ledger
    chats = {client: new_chat() for client in CLIENTS}
    holds = {client: tmp_path / f"answer-{client[0]}-{client[1]}" for client in CLIENTS}
    with confirm_stack(tmp_path, agent) as (server, gw, extra):
        batch = [
            {"version": version, "api": f"{gw.base}/api/chat", "chat_id": chats[(version, transport)],
             "transport": transport, "ws_url": gw.base.replace("http", "ws", 1) + "/api/chat/ws",
             "keep_going_after_error": True,
             "steps": [{"send": "pay 50 to Hanako", "holdAnswersUntil": str(holds[(version, transport)])},
                       {"resume": True, "approvals": "approve"}]}
            for version, transport in CLIENTS
        ]
        reports: list[dict] = []
        driver = threading.Thread(target=lambda: reports.extend(run_chats(batch, timeout=120)))
        driver.start()
        ready = [hold.with_name(hold.name + ".ready") for hold in holds.values()]
        wait_until(lambda: all(r.exists() for r in ready) or not driver.is_alive(), "the approvals to reach the pages", 90)
        assert all(r.exists() for r in ready), reports
        gw.proc.kill()  # kill -9: the gateway's memory (its chats, their runs, its ledger) is gone
        gw.proc.wait()
        with gateway_process(tmp_path, server.base, extra, approvals="confirm", port=gw.port):
            for hold in holds.values():
                hold.write_text("")
            driver.join(150)
            assert reports, "the chat driver did not report"
            for client, result in zip(CLIENTS, reports):
                assert_clean(result)
                assert result["stepErrors"] == [None, None] and result["status"] == "ready", (client, result["error"])
                first_id = next(chunk["messageId"] for index, chunk in result["chunks"] if chunk["type"] == "start")
                shown = [(m["role"], m["id"], [p.get("state") for p in m["parts"] if "state" in p]) for m in result["messages"]]
                assert len(shown) == 2, (client, shown)  # one assistant message, not two
                user_message, message = result["messages"]
                assert user_message["role"] == "user" and message["role"] == "assistant", result["messages"]
                assert message["id"] == first_id, (client, message["id"], first_id)
                assert tool_states(result) == ["output-available"], (client, message["parts"])
                assert "Done: sent 50 USD to Hanako" in said(result), client
                # The rebuilt stream, and the Approve's continuation, are that message's.
                starts = [chunk["messageId"] for _, chunk in result["chunks"] if chunk["type"] == "start"]
                assert set(starts) == {first_id} and len(starts) == 3, (client, starts)
            assert sorted(r["session_id"] for r in runs(ledger)) == sorted(chats.values())


def test_with_the_tool_s_own_require_confirmation_too(adk: tuple, shared_agents: SharedAgents, tmp_path: Path) -> None:  # noqa: F811
    agent = native_agent(shared_agents, None if adk[1] is None else adk[1] / "bin" / "adk", "memory")
    chats = {client: new_chat() for client in CLIENTS[:2]}
    with native_stack(tmp_path, agent) as stack:
        message_ids = _asked_then_killed(stack.gateway, chats)
        with gateway_process(tmp_path, stack.server.base, port=stack.gateway.port) as again:
            _resumed_and_approved(again, chats, message_ids)
            assert sorted(p["session_id"] for p in stack.payments()) == sorted(chats.values())


def test_a_resume_on_b_after_a_died_rebuilds_the_approval_a_asked(tmp_path: Path) -> None:
    """Two replicas on Redis, confirm mode: A asked and its run ended (nothing lives in A but the
    chat's record), A is killed; a reloaded page's resume reaches B, which takes the chat over and
    rebuilds the approval from ADK's session; the Approve on B runs the payment once."""
    with replicas(tmp_path, approvals="confirm") as r:
        chat, first_message = new_chat(), user("pay 50 to Hanako")
        first = post(r.a, chat, [first_message])
        assert types(first)[-3:] == ["tool-approval-request", "finish-step", "finish"], first.body[-2000:]
        r.a.proc.kill()
        r.a.proc.wait()
        # Until A is known dead the resume is forwarded to it (and fails); then B takes the chat over.
        resumed = wait_until(
            lambda: (reply := request(r.b.base, "GET", f"/api/chat/{chat}/stream")).status == 200 and reply,
            "B to take the chat over and rebuild its message",
        )
        assert types(resumed) == types(first), resumed.body[-2000:]
        ask = resumed.chunks[4]
        assert ask["approvalId"] == first.chunks[4]["approvalId"] and ask["toolCallId"] == first.chunks[4]["toolCallId"]
        message_id = resumed.chunks[0]["messageId"]
        assert message_id == first.chunks[0]["messageId"]  # the message A streamed, as ADK's session says
        answer = assistant_from(resumed, [True])
        second = post(r.b, chat, [answer], messageId=message_id)
        assert second.status == 200 and second.chunks[0] == {"type": "start", "messageId": message_id}, second.body[-2000:]
        assert second.chunks[1]["type"] == "tool-output-available" and second.chunks[1]["output"]["success"] is True
        assert len(r.ledger.of(chat)) == 1
        replay = post(r.b, chat, [answer], messageId=message_id)
        assert replay.status == 410 and len(r.ledger.of(chat)) == 1
