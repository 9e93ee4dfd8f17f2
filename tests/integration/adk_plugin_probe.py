"""Runs the gateway plugin inside a real ADK, in whatever venv runs this file, and prints what it saw.

Not a test module: tests/integration/test_adk_versions.py runs it with the interpreter of each ADK
venv (the project's, on the newest ADK, and .venv-adk-<version>), because one process can hold one
google-adk. It imports only the standard library, google-adk, the installed plugin and the demo
agent's modules (gateway.demo.*, which need google-adk alone), so it runs where the gateway daemon
is not installed.

    python adk_plugin_probe.py MODE VERDICT      MODE: sse | live    VERDICT: run | deny

One scripted turn, "pay 50 to Hanako", through ADK's own Runner with the plugin registered, against
a fake gateway (a stdlib HTTP server) whose policy gates process_payment and whose verdict is
VERDICT. Printed as one JSON object: the ADK version, how many times the gateway was asked, which
hook asked (the plugin's before_tool_callback or the agent-level backstop), how many times the
payment really ran (the demo's ledger), the function response ADK recorded, plus the facts the
plugin adapts to (whether tools have `behavior`, whether ToolConfirmation warns).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import threading
import warnings
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SECRET = "probe-secret"
POLICY = {"tools": {"process_payment": {"approval": True, "runs_in": "server", "gated": True}}, "refresh": 30}


class FakeGateway(BaseHTTPRequestHandler):
    verdict: ClassVar[dict] = {}
    asked: ClassVar[list] = []

    def do_GET(self) -> None:
        # The plugin names its app (`?app_name=`): one gateway may serve several agents.
        if self.headers.get("Authorization") != f"Bearer {SECRET}" or self.path.split("?")[0] != "/internal/v1/policy":
            self._answer(401, {})
            return
        self._answer(200, POLICY)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        type(self).asked.append(body)
        self._answer(200, type(self).verdict)

    def _answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


async def run_turn(mode: str, plugin: object) -> list:
    from google.adk.agents import LlmAgent
    from google.adk.agents.live_request_queue import LiveRequestQueue
    from google.adk.agents.run_config import RunConfig
    from google.adk.runners import InMemoryRunner
    from google.genai import types

    from gateway.demo.model import ScriptedLlm
    from gateway.demo.tools import build_tools

    agent = LlmAgent(name="demo_agent", model=ScriptedLlm(), instruction="demo", tools=build_tools())
    runner = InMemoryRunner(agent=agent, app_name="demo_agent", plugins=[plugin])
    session = await runner.session_service.create_session(app_name="demo_agent", user_id="u1")
    message = types.Content(role="user", parts=[types.Part(text="pay 50 to Hanako")])
    events = []
    if mode == "sse":
        async for event in runner.run_async(user_id="u1", session_id=session.id, new_message=message):
            events.append(event)
        return events
    queue = LiveRequestQueue()
    queue.send_content(message)

    async def live() -> None:
        async for event in runner.run_live(
            user_id="u1", session_id=session.id, live_request_queue=queue,
            run_config=RunConfig(response_modalities=[types.Modality.TEXT]),
        ):
            events.append(event)
            if event.turn_complete:
                return  # ADK 1.x's run_live does not end on its own after a close: stop reading here

    await asyncio.wait_for(live(), 20)
    queue.close()
    return events


def main() -> None:
    mode, verdict = sys.argv[1], sys.argv[2]
    import adk_gateway_plugin
    import google.adk
    from adk_gateway_plugin import REFUSAL_KEY, GatewayPlugin
    from google.adk.tools.function_tool import FunctionTool
    from google.adk.tools.tool_confirmation import ToolConfirmation

    ledger = Path(tempfile.mkdtemp()) / "ledger.jsonl"
    os.environ["DEMO_TOOL_LEDGER"] = str(ledger)
    FakeGateway.verdict = (
        {"verdict": "run"} if verdict == "run"
        else {"verdict": "respond", "response": {"error": "Denied by the probe.", REFUSAL_KEY: "denied"}}
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeGateway)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    plugin = GatewayPlugin(url=f"http://127.0.0.1:{server.server_address[1]}", secret=SECRET)
    hooks: list[str] = []
    gate = plugin._gate

    async def counting_gate(tool, tool_args, tool_context):
        # Which hook reached the decision: the frame above is before_tool_callback or _backstop.
        hooks.append(sys._getframe(1).f_code.co_name)
        return await gate(tool, tool_args, tool_context)

    plugin._gate = counting_gate  # type: ignore[method-assign]
    events = asyncio.run(run_turn(mode, plugin))
    server.shutdown()

    responses = [
        r.response for e in events for r in (e.get_function_responses() or []) if r.name == "process_payment"
    ]
    with warnings.catch_warnings(record=True) as bare:
        warnings.simplefilter("always")
        ToolConfirmation(confirmed=True)
    with warnings.catch_warnings(record=True) as via_plugin:
        warnings.simplefilter("always")
        adk_gateway_plugin._confirmed()
    tool = FunctionTool(lambda: None)
    print(json.dumps({
        "adk": google.adk.__version__,
        "plugin_file": adk_gateway_plugin.__file__,
        "asked": len(FakeGateway.asked),
        "asked_about": [a["tool"] for a in FakeGateway.asked],
        "hooks": hooks,
        "ran": len(ledger.read_text().splitlines()) if ledger.exists() else 0,
        "responses": responses,
        "final_text": next(
            (p.text for e in reversed(events) if e.content and not e.partial for p in e.content.parts or () if p.text),
            None,
        ),
        "tools_have_behavior": hasattr(tool, "behavior"),
        "tool_confirmation_warns": len(bare),
        "plugin_confirmation_warns": len(via_plugin),
        "daemon_modules": sorted(
            m for m in sys.modules
            if m.split(".")[0] in {"structlog", "prometheus_client", "redis"}
            or (m.startswith("gateway.") and not m.startswith("gateway.demo"))
        ),
    }, default=str))


if __name__ == "__main__":
    main()
