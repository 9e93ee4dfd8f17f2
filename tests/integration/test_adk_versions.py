"""The plugin and the demo agent on an older ADK (the oldest supported), in its own venv, behind this gateway (issue 15).

The venv is `.venv-adk-<version>` at the checkout's root, built by gateway.demo.adk_venv exactly as
`make run-adk` builds it: google-adk==<version> first (the operator's environment), then the plugin
with the command docs/approvals.md gives (`pip install ./plugin`). The first build costs a minute or
three (pip's cache decides); later runs reuse it while the plugin's sources are unchanged.

- installing the plugin changed no installed distribution (google-adk and google-genai above all);
- the plugin inside a real ADK of each side (the newest in this venv, the old one in its own), over
  run_async and run_live, with a verdict of run and of deny: asked once, ran as decided. This is
  where the versions differ (adk_gateway_plugin's docstring): ADK 1.22's live path calls no plugin
  before_tool_callback, so there the agent-level backstop must be the one that asks;
- the approval demo row through the normal gateway, with the stock `adk api_server` of the old
  venv upstream over /run_sse: "pay 50 to Hanako", approved (the payment runs once) and denied
  (it never runs); and `adk-gateway demo --agent-venv`, which `make run-adk` runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.demo import adk_venv
from gateway.demo.tools import process_payment
from tests.chatflow import assistant_from, new_chat, post, types, user
from tests.demo_rows import SCENARIOS as DEMO_ROWS
from tests.demo_rows import check_rows
from tests.jsdriver import run_chats
from tests.procs import GatewayProcess, free_port, plugin_stack, stop_process, wait_http

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

# The oldest google-adk the plugin supports (docs/approvals.md, "Supported ADK versions").
OLDEST = "1.22.1"
# `ADK_VERSIONS=1.22.1,1.39.1 pytest tests/integration/test_adk_versions.py` runs the old-ADK side
# on each (a venv each, built once).
VERSIONS = [v.strip() for v in os.environ.get("ADK_VERSIONS", OLDEST).split(",") if v.strip()]
# Versions whose /run_live calls no plugin before_tool_callback (google/adk-python#4704): there the
# plugin's agent-level backstop must be the hook that asks. Fixed by 1.39.1.
LIVE_SKIPS_PLUGIN_HOOKS = {"1.22.1"}
PLUGIN = "adk_gateway_plugin.GatewayPlugin"
PROBE = Path(__file__).with_name("adk_plugin_probe.py")
REFUSAL_KEY = "adk_gateway_refusal"


@pytest.fixture(scope="module", params=VERSIONS)
def old(request: pytest.FixtureRequest) -> tuple[str, Path]:
    """(version, venv) of an older ADK with the plugin installed as documented."""
    try:
        return request.param, adk_venv.ensure(request.param)
    except adk_venv.VenvError as exc:
        pytest.fail(str(exc))


def run_in(venv_python: str, *args: str, cwd: Path = adk_venv.ROOT) -> str:
    done = subprocess.run([venv_python, *args], check=False, capture_output=True, text=True, timeout=120, cwd=cwd)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_documented_plugin_install_changes_no_installed_version(old: tuple[str, Path]) -> None:
    version, venv = old
    record = adk_venv.read_record(version)
    assert record is not None
    before, now = record["before_plugin"], adk_venv.installed(venv)
    assert before["google-adk"] == now["google-adk"] == version
    assert now["google-genai"] == before["google-genai"]
    # Everything the operator had is still there at the same version; the plugin is all that was added.
    assert adk_venv.changes(before, now) == []
    python = str(venv / "bin" / "python")
    requires = json.loads(run_in(python, "-c", "import importlib.metadata as m, json; print(json.dumps(m.requires('adk-gateway-plugin')))"))
    assert sorted(r.split(">")[0].split("<")[0] for r in requires) == ["google-adk", "httpx"]
    # And the documented command, run again now, would install nothing but the plugin itself.
    report = json.loads(run_in(python, "-m", "pip", "install", "--dry-run", "--quiet", "--report", "-", "./plugin"))
    assert [i["metadata"]["name"] for i in report["install"]] == ["adk-gateway-plugin"]


def probe(python: str, mode: str, verdict: str) -> dict:
    """One "pay 50 to Hanako" turn in ADK's runner with the plugin (adk_plugin_probe.py), checked."""
    seen = json.loads(run_in(python, str(PROBE), mode, verdict))
    assert seen["asked"] == 1 and seen["asked_about"] == ["process_payment"]
    if verdict == "run":
        assert seen["ran"] == 1 and seen["responses"] == [process_payment(50, "Hanako", "USD")]
        assert seen["final_text"].startswith("Done: sent 50 USD to Hanako")
    else:
        assert seen["ran"] == 0
        assert seen["responses"] == [{"error": "Denied by the probe.", REFUSAL_KEY: "denied"}]
        assert "was not made" in seen["final_text"]
    # The plugin's own workaround for ToolConfirmation's warning (ADK 1.x warns on a bare one).
    assert seen["plugin_confirmation_warns"] == 0
    return seen


MODES = pytest.mark.parametrize("mode", ["sse", "live"])
VERDICTS = pytest.mark.parametrize("verdict", ["run", "deny"])


@MODES
@VERDICTS
def test_the_plugin_gates_each_call_once_on_the_newest_adk(mode: str, verdict: str) -> None:
    seen = probe(sys.executable, mode, verdict)
    assert seen["adk"].startswith("2.")
    assert seen["hooks"] == ["before_tool_callback"]
    assert seen["tools_have_behavior"] is True


@MODES
@VERDICTS
def test_the_plugin_gates_each_call_once_on_an_old_adk(old: tuple[str, Path], mode: str, verdict: str) -> None:
    version, venv = old
    seen = probe(str(venv / "bin" / "python"), mode, verdict)
    assert seen["adk"] == version
    # The installed copy, not this checkout's sources.
    assert seen["plugin_file"].startswith(str(venv))
    # 1.22's live path calls only the agent's callbacks: there the backstop is the hook that asked.
    backstop = mode == "live" and version in LIVE_SKIPS_PLUGIN_HOOKS
    assert seen["hooks"] == (["_backstop"] if backstop else ["before_tool_callback"])
    if version.startswith("1."):
        assert seen["tools_have_behavior"] is False
        if verdict == "deny":  # the process's first ToolConfirmation (1.39 warns once per process)
            assert seen["tool_confirmation_warns"] >= 1
    # The demo agent ran without any of the gateway daemon's modules.
    assert seen["daemon_modules"] == []


def test_the_daemon_is_not_installed_in_the_old_venv(old: tuple[str, Path], tmp_path: Path) -> None:
    # What makes the daemon_modules check above meaningful: the demo agent could not have used them
    # (outside the checkout, where nothing puts it on sys.path).
    missing = run_in(
        str(old[1] / "bin" / "python"), "-c",
        "import importlib.util as u; print(sorted(m for m in ('structlog', 'prometheus_client', 'redis', 'gateway') "
        "if u.find_spec(m) is None))",
        cwd=tmp_path,
    )
    assert missing.strip() == "['gateway', 'prometheus_client', 'redis', 'structlog']"


def text(reply) -> str:
    return "".join(c["delta"] for c in reply.chunks if c["type"] == "text-delta")


def test_approval_row_through_the_gateway_with_an_old_adk_upstream(old: tuple[str, Path], tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    with plugin_stack(
        tmp_path, adk=old[1] / "bin" / "adk", plugin=PLUGIN, adk_env={"DEMO_TOOL_LEDGER": str(ledger)},
        upstream_mode="live",  # the blocking path's `gw-` approval (confirm on old ADKs: test_confirm_mode.py)
    ) as stack:
        gw = stack.gateway
        for approved in (True, False):
            chat, first_message = new_chat(), user("pay 50 to Hanako")
            first = post(gw, chat, [first_message])
            assert types(first) == [
                "start", "start-step", "tool-input-start", "tool-input-available", "tool-approval-request",
                "finish-step", "finish",
            ], first.body[-2000:]
            call_id = first.chunks[4]["toolCallId"]
            assert first.chunks[4]["approvalId"].startswith("gw-")

            answer = assistant_from(first, [approved])
            second = post(gw, chat, [first_message, answer], messageId=answer["id"])
            assert second.chunks[0] == {"type": "start", "messageId": answer["id"]}
            if approved:
                assert second.chunks[1] == {
                    "type": "tool-output-available", "toolCallId": call_id,
                    "output": process_payment(50, "Hanako", "USD"),
                }
                assert text(second).startswith("Done: sent 50 USD to Hanako")
            else:
                assert second.chunks[1] == {"type": "tool-output-denied", "toolCallId": call_id}
                assert "not made" in text(second)
            assert second.chunks[-1]["finishReason"] == "stop"
            runs = [json.loads(line) for line in ledger.read_text().splitlines()] if ledger.exists() else []
            # Approved: it ran once, in this chat; denied: still only the approved chat's run.
            assert len(runs) == 1, runs
            if approved:
                assert runs[0]["session_id"] == chat and runs[0]["args"] == {"amount": 50, "recipient": "Hanako", "currency": "USD"}
        log = (tmp_path / next(p.name for p in tmp_path.glob("adk-*.log"))).read_text()
        assert "Failed to load plugin" not in log, log[-3000:]


def test_the_demo_serves_with_its_agent_in_an_old_venv(old: tuple[str, Path], tmp_path: Path) -> None:
    # What `make run-adk ADK=<version>` runs once the venv is there, with PORT as for `make run`.
    port, log = free_port(), tmp_path / "demo.log"
    env = {k: v for k, v in os.environ.items() if k not in ("GOOGLE_API_KEY", "GEMINI_API_KEY", "ADK_GATEWAY_SECRET")}
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "demo", "--agent-venv", str(old[1])],
            stdout=out, stderr=subprocess.STDOUT,
            env={**env, "PORT": str(port), "DEMO_MODEL": "scripted", "DEMO_SESSION_STORE": f"sqlite:{tmp_path / 'sessions.db'}"},
            cwd=tmp_path,
        )
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", timeout=120, proc=proc, log=log)
        gw = GatewayProcess(f"http://127.0.0.1:{port}", port, log, proc, tmp_path)
        chat, first_message = new_chat(), user("pay 50 to Hanako")
        first = post(gw, chat, [first_message])
        assert "tool-approval-request" in types(first), log.read_text()[-3000:]
        answer = assistant_from(first, [True])
        second = post(gw, chat, [first_message, answer], messageId=answer["id"])
        assert second.chunks[1]["type"] == "tool-output-available", second.body[-2000:]
        assert text(second).startswith("Done: sent 50 USD to Hanako")
        assert f"from {old[1]}" in log.read_text()
    finally:
        stop_process(proc)


def test_the_demo_refuses_an_agent_venv_without_adk(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "demo", "--agent-venv", str(tmp_path / "nowhere")],
        check=False, capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    assert done.returncode == 2 and "gateway.demo.adk_venv" in done.stderr, done.stderr


@pytest.mark.js
@pytest.mark.parametrize("upstream_mode", ["sse", "live"])
def test_every_demo_row_with_stock_clients_on_an_old_adk(old: tuple[str, Path], tmp_path: Path, upstream_mode: str) -> None:
    """The demo script (DESIGN.md section 4) with the stock ai 6 and ai 7 Chats over SSE and
    WebSocket, against the old ADK's own api_server, through its /run_sse or its /run_live."""
    with plugin_stack(tmp_path, adk=old[1] / "bin" / "adk", plugin=PLUGIN, upstream_mode=upstream_mode) as stack:
        base = stack.gateway.base
        names = list(DEMO_ROWS)
        for version in (6, 7):
            for transport in ("sse", "ws"):
                runs = [
                    {"version": version, "api": f"{base}/api/chat", "steps": DEMO_ROWS[name], "transport": transport,
                     "ws_url": base.replace("http", "ws", 1) + "/api/chat/ws"}
                    for name in names
                ]
                results: dict[str, dict] = {}
                # Groups of five: the test config lets one user hold many streams, but the old
                # ADK server answers one process's worth at a time.
                for start in range(0, len(runs), 5):
                    results.update(zip(names[start:start + 5], run_chats(runs[start:start + 5], timeout=90)))
                try:
                    check_rows(results)
                except AssertionError as exc:
                    raise AssertionError(f"ADK {old[0]}, {upstream_mode} upstream, ai {version} over {transport}: {exc}") from None
