"""A pending ADK confirmation across a restart of the ADK server, on each supported release (issue 25).

The real gateway in front of the stock ADK API server with the demo agent, whose process_payment
asks ADK's own `require_confirmation` (DEMO_NATIVE_CONFIRMATION=1), and a ledger of its real
executions (DEMO_TOOL_LEDGER). "pay 50 to Hanako" reaches the browser as an approval request; the
ADK server is killed (-9) and started again on the same port; then the browser approves.

- With a SQLite session store (what `make run` and the deploy kit use), ADK's session still holds the
  paused call: the payment runs exactly once and the continuation streams.
- With `memory://` the restart lost it: the answer is a 410 `approval_gone` whose sentence a person
  understands (not a 200 carrying ADK's `ValueError: Function call not found ...`), the payment
  never runs, and the chat goes on with a new message.

The newest release is this venv's; the older ones (ADK_VERSIONS, default the oldest, 1.22.1) run
from their own venv as in test_adk_versions.py. The same two cases also run through the stock ai 6
and ai 7 Chat (tests/js/chat-driver.mjs, its Approve held until the restart is done), on the newest.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest

from gateway.demo import adk_venv, sqlite_uri
from gateway.demo.tools import process_payment
from tests.chatflow import assistant_from, new_chat, post, types, user
from tests.integration.conftest import SharedAgents
from tests.integration.test_adk_versions import VERSIONS
from tests.jsdriver import run_chat
from tests.procs import AdkServer, Agent, GatewayProcess, Ledger, Reply, gateway_process, metric_value, start_agent

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

# The newest release, this venv's own.
NEWEST = metadata.version("google-adk")
LOST = "the agent service restarted and lost this approval; send your message again"


@pytest.fixture(scope="module", params=[NEWEST, *VERSIONS])
def adk(request: pytest.FixtureRequest) -> Path | None:
    """The `adk` command of the release under test (None: this venv's ADK)."""
    if request.param == NEWEST:
        return None
    try:
        return adk_venv.ensure(request.param) / "bin" / "adk"
    except adk_venv.VenvError as exc:
        pytest.fail(str(exc))


@dataclass
class Stack:
    server: AdkServer
    gateway: GatewayProcess
    ledger: Ledger

    def payments(self) -> list[dict]:
        return self.ledger.runs()

    def restart_adk(self) -> None:
        """kill -9, then the same command on the same port; returns once the gateway's probe sees it."""
        self.server.kill()
        self.server.start()
        deadline = time.monotonic() + 30
        while metric_value(self.gateway.base, "adk_gateway_upstream_up") != 1 and time.monotonic() < deadline:
            time.sleep(0.1)


def native_agent(agents: SharedAgents, adk: Path | None, store: str) -> Agent:
    """ADK whose payments ask ADK's own confirmation, its sessions in `store` ("sqlite": a file,
    "memory"), on the release whose `adk` command is given (None: this venv's). The tests that ask
    for the same one share it (each restart of it is a test's own)."""
    def start(tmp: Path) -> Agent:
        sessions = sqlite_uri(tmp / "sessions.db") if store == "sqlite" else "memory://"
        return start_agent(tmp, adk=adk, sessions=sessions, env={"DEMO_NATIVE_CONFIRMATION": "1"})

    return agents.get(f"native-{store}-{adk or 'newest'}", start)


@contextmanager
def native_stack(tmp: Path, agent: Agent) -> Iterator[Stack]:
    """The gateway, without a tool policy, in front of `agent` (native_agent)."""
    with gateway_process(tmp, agent.server.base) as gw:
        yield Stack(agent.server, gw, agent.ledger)


def text(reply) -> str:
    return "".join(c["delta"] for c in reply.chunks if c["type"] == "text-delta")


def ask(gw: GatewayProcess) -> tuple[str, dict, Reply]:
    chat, first_message = new_chat(), user("pay 50 to Hanako")
    first = post(gw, chat, [first_message])
    assert first.status == 200, first.body[:300]
    assert "tool-approval-request" in types(first), first.body[-2000:]
    return chat, first_message, first


def test_a_pending_confirmation_survives_an_adk_restart_on_sqlite(
    adk: Path | None, shared_agents: SharedAgents, tmp_path: Path,
) -> None:
    agent = native_agent(shared_agents, adk, "sqlite")
    store = agent.server.tmp / "sessions.db"
    with native_stack(tmp_path, agent) as stack:
        gw = stack.gateway
        chat, first_message, first = ask(gw)
        call_id = next(c for c in first.chunks if c["type"] == "tool-approval-request")["toolCallId"]
        assert stack.payments() == [] and store.stat().st_size > 0  # ADK's session is in the file

        stack.restart_adk()
        answer = assistant_from(first, [True])
        second = post(gw, chat, [first_message, answer], messageId=answer["id"])

        assert second.status == 200, second.body[:300]
        assert second.chunks[0] == {"type": "start", "messageId": answer["id"]}
        paid = {"type": "tool-output-available", "toolCallId": call_id, "output": process_payment(50, "Hanako", "USD")}
        assert paid in second.chunks, second.body[-2000:]
        assert text(second).startswith("Done: sent 50 USD to Hanako")
        assert second.chunks[-1]["finishReason"] == "stop"
        assert [p["session_id"] for p in stack.payments()] == [chat]
        # Answered once: a replay after the restart changes nothing.
        replay = post(gw, chat, [first_message, answer], messageId=answer["id"])
        assert replay.status == 410 and replay.json()["error"]["code"] == "approval_gone"
        assert len(stack.payments()) == 1


def test_an_approval_lost_with_in_memory_sessions_is_410_and_the_chat_goes_on(
    adk: Path | None, shared_agents: SharedAgents, tmp_path: Path,
) -> None:
    with native_stack(tmp_path, native_agent(shared_agents, adk, "memory")) as stack:
        gw = stack.gateway
        chat, first_message, first = ask(gw)

        stack.restart_adk()
        answer = assistant_from(first, [True])
        second = post(gw, chat, [first_message, answer], messageId=answer["id"])

        assert second.status == 410, (second.status, second.body[-2000:])
        assert second.headers["content-type"].startswith("application/json")
        assert second.json()["error"] == {"code": "approval_gone", "message": LOST}
        assert b"ValueError" not in second.body
        assert stack.payments() == []
        # The person sends the message again: ADK asks anew, and that approval works.
        again_message = user("pay 50 to Hanako")
        again = post(gw, chat, [first_message, answer, again_message])
        assert again.status == 200 and "tool-approval-request" in types(again), again.body[-2000:]
        answer2 = assistant_from(again, [True])
        third = post(gw, chat, [first_message, answer, again_message, answer2], messageId=answer2["id"])
        assert third.status == 200 and text(third).startswith("Done: sent 50 USD to Hanako"), third.body[-2000:]
        assert [p["session_id"] for p in stack.payments()] == [chat]


def drive_across_a_restart(stack: Stack, hold: Path, version: int, steps: list[dict]) -> dict:
    """The stock Chat runs `steps`; the first holds its Approve until the ADK server was restarted."""
    result: dict = {}
    driver = threading.Thread(target=lambda: result.update(run_chat(
        version, f"{stack.gateway.base}/api/chat", keep_going_after_error=True, timeout=120,
        steps=[{**steps[0], "holdAnswersUntil": str(hold)}, *steps[1:]],
    )))
    driver.start()
    ready = hold.with_name(hold.name + ".ready")
    deadline = time.monotonic() + 90
    while not ready.exists() and driver.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.exists(), "the approval never reached the Chat"
    stack.restart_adk()
    hold.write_text("")
    driver.join(150)
    assert result, "the chat driver did not report"
    assert not result["schemaErrors"], result["schemaErrors"]
    return result


def test_a_stock_chat_approves_across_an_adk_restart_on_sqlite(shared_agents: SharedAgents, tmp_path: Path) -> None:
    """The page's Approve, clicked after the restart, runs the payment once and streams the rest.
    On ai 6 only: what is proved is ADK's session outliving its process, the same for either
    client (ai 7 approves after a restart in the lost-approval row below)."""
    version = 6
    with native_stack(tmp_path, native_agent(shared_agents, None, "sqlite")) as stack:
        result = drive_across_a_restart(
            stack, tmp_path / f"answer-{version}", version, [{"send": "pay 50 to Hanako", "approvals": "approve"}],
        )
        assert result["stepErrors"] == [None] and result["ok"], result["error"]
        assert len(stack.payments()) == 1
        assert "Done: sent 50 USD to Hanako" in json.dumps(result["messages"][-1])


@pytest.mark.parametrize("version", [6, 7])
def test_a_stock_chat_reads_the_lost_approval_and_goes_on(shared_agents: SharedAgents, tmp_path: Path, version: int) -> None:
    """The stock AI SDK Chat, as a page: the Approve after the restart fails with an error a person
    can read (the 410's JSON body, which the stock transport makes the error's message); the person
    sends the message again, approves, and the payment runs once. On both clients: each builds the
    error from the response its own way (ai 7 as an APICallError)."""
    with native_stack(tmp_path, native_agent(shared_agents, None, "memory")) as stack:
        result = drive_across_a_restart(stack, tmp_path / f"answer-{version}", version, [
            {"send": "pay 50 to Hanako", "approvals": "approve"},
            {"send": "pay 50 to Hanako", "approvals": "approve"},
        ])
        lost, again = result["stepErrors"]
        assert lost is not None and json.loads(lost) == {"error": {"code": "approval_gone", "message": LOST}}
        assert again is None and result["ok"], result["error"]
        assert len(stack.payments()) == 1
        assert "Done: sent 50 USD to Hanako" in json.dumps(result["messages"][-1])
