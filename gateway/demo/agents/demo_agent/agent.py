"""Defines ``root_agent``, the demo agent the stock ADK API server loads.

ADK's loader imports this folder as the top-level package ``demo_agent`` (it puts
the agents folder on ``sys.path``), looks for ``app`` then ``root_agent``, and
names the app after the folder.

The model is the offline `ScriptedLlm` unless ``GOOGLE_API_KEY`` is set, in which
case it is the Gemini model named by ``DEMO_MODEL`` (default gemini-2.5-flash).
``DEMO_MODEL=scripted`` forces the offline model even with a key, which is what
the fixture recorder and the tests use. ``DEMO_NATIVE_CONFIRMATION=1`` makes
process_payment use ADK's own ``require_confirmation`` instead of the gateway's
tool policy.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

try:
    import gateway.demo  # noqa: F401
except ImportError:
    # The loader imports us by file location, not as part of the gateway package:
    # when the server was not started through gateway.demo.api_server_command
    # (e.g. a bare `adk api_server gateway/demo/agents`, or another venv's `adk`
    # on an older ADK, as `make run-adk` does), make the checkout importable.
    # What this agent imports from it (gateway/__init__.py, gateway/demo/*) needs
    # google-adk alone: the agent runs where the daemon is not installed
    # (tests/integration/test_adk_versions.py checks it in such a venv).
    sys.path.insert(0, str(Path(__file__).resolve().parents[4]))

from google.adk.agents import LlmAgent

from gateway.demo.model import choose_model
from gateway.demo.tools import build_tools

INSTRUCTION = """\
You are the demo assistant of adk-gateway. Be brief.
- To pay someone, call process_payment(amount, recipient, currency="USD") once per payment;
  "pay 10 to Alice and 20 to Bob" is two calls in one turn. The user confirms each payment;
  after the result, say whom you paid and the transaction id, or that the payment was not made.
- For the weather, call get_weather(city) and report the condition and temperature.
- When the user asks where they are, call get_location() and repeat the coordinates.
- When the user asks to play a track, call change_bgm(track).
- Otherwise answer briefly and quote the user's message.
"""


root_agent = LlmAgent(
    name="demo_agent",
    description="Offline demo agent: payments with confirmation, weather, browser tools.",
    model=choose_model(),
    instruction=INSTRUCTION,
    tools=build_tools(native_confirmation=os.environ.get("DEMO_NATIVE_CONFIRMATION") == "1"),
)
