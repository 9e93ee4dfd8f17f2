"""Runs the plugin's `confirm` mode inside a real ADK, in whatever venv runs this file; prints what it saw.

Not a test module: tests/integration/test_confirm_mode.py runs it with the interpreter of each ADK
venv (one process holds one google-adk), like adk_plugin_probe.py, whose fake gateway it reuses.

    python adk_confirm_probe.py MODE ANSWER      MODE: sse | live    ANSWER: approve | deny

"pay 50 to Hanako" through ADK's own Runner with the plugin, against a fake gateway whose policy
marks process_payment `confirm`. On sse the first run must end on ADK's `adk_request_confirmation`
(the plugin asked the fake gateway nothing); the answer then goes in as ADK's confirmation function
response in a second run. On live the plugin must take the blocking path (it asks the gateway,
whose verdict is ANSWER). Printed as one JSON object.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import adk_plugin_probe as probe  # noqa: E402

HINT = "Money leaves the account when you approve."
probe.POLICY = {
    "tools": {"process_payment": {"approval": True, "runs_in": "server", "gated": True, "confirm": True, "hint": HINT}},
    "refresh": 30,
}


def parts(events: list) -> list[dict]:
    """Each function call and response of `events`, as plain dicts (name, id, args or response)."""
    out = []
    for event in events:
        for call in event.get_function_calls() or []:
            out.append({"call": call.name, "id": call.id, "args": json.loads(json.dumps(call.args, default=str)),
                        "long_running": call.id in (event.long_running_tool_ids or set())})
        for resp in event.get_function_responses() or []:
            out.append({"response": resp.name, "id": resp.id, "value": json.loads(json.dumps(resp.response, default=str))})
    return out


def text_of(events: list) -> str | None:
    return next(
        (p.text for e in reversed(events) if e.content and not e.partial for p in e.content.parts or () if p.text), None
    )


async def sse(plugin: object, approve: bool) -> dict:
    from google.adk.agents import LlmAgent
    from google.adk.runners import InMemoryRunner
    from google.genai import types

    from gateway.demo.model import ScriptedLlm
    from gateway.demo.tools import build_tools

    agent = LlmAgent(name="demo_agent", model=ScriptedLlm(), instruction="demo", tools=build_tools())
    runner = InMemoryRunner(agent=agent, app_name="demo_agent", plugins=[plugin])
    session = await runner.session_service.create_session(app_name="demo_agent", user_id="u1")
    message = types.Content(role="user", parts=[types.Part(text="pay 50 to Hanako")])
    first = [e async for e in runner.run_async(user_id="u1", session_id=session.id, new_message=message)]
    seen_first = parts(first)
    ran_before_answer = probe_ran()
    asked = next((p for p in seen_first if p.get("call") == "adk_request_confirmation"), None)
    second: list = []
    if asked is not None:
        answer = types.Content(role="user", parts=[types.Part(function_response=types.FunctionResponse(
            id=asked["id"], name="adk_request_confirmation", response={"confirmed": approve},
        ))])
        second = [e async for e in runner.run_async(user_id="u1", session_id=session.id, new_message=answer)]
    return {
        "first": seen_first, "ran_before_answer": ran_before_answer, "second": parts(second),
        "final_text": text_of(second),
    }


def probe_ran() -> int:
    ledger = Path(os.environ["DEMO_TOOL_LEDGER"])
    return len(ledger.read_text().splitlines()) if ledger.exists() else 0


def main() -> None:
    mode, answer = sys.argv[1], sys.argv[2]
    import adk_gateway_plugin
    import google.adk
    from adk_gateway_plugin import REFUSAL_KEY, GatewayPlugin

    os.environ["DEMO_TOOL_LEDGER"] = str(Path(tempfile.mkdtemp()) / "ledger.jsonl")
    probe.FakeGateway.verdict = (
        {"verdict": "run"} if answer == "approve"
        else {"verdict": "respond", "response": {"error": "Denied by the probe.", REFUSAL_KEY: "denied"}}
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), probe.FakeGateway)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    plugin = GatewayPlugin(url=f"http://127.0.0.1:{server.server_address[1]}", secret=probe.SECRET)
    if mode == "sse":
        seen = asyncio.run(sse(plugin, answer == "approve"))
    else:
        events = asyncio.run(probe.run_turn("live", plugin))
        seen = {"first": parts(events), "final_text": text_of(events)}
    server.shutdown()
    print(json.dumps({
        "adk": google.adk.__version__, "plugin_file": adk_gateway_plugin.__file__,
        "asked_gateway": len(probe.FakeGateway.asked), "ran": probe_ran(), **seen,
    }, default=str))


if __name__ == "__main__":
    main()
