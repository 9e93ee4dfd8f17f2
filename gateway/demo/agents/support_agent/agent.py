"""Defines ``root_agent``, the support agent: the demo's second app behind the same gateway.

ADK's loader imports this folder as the top-level package ``support_agent`` and
names the app after the folder, as it does for ``demo_agent``. Both apps play the
same offline script (`gateway.demo.script`); the scripted model reads which tools
the request declares, so this agent only ever calls ``lookup_order`` and
``issue_refund``, and answers a payment or weather request in text.

The model is chosen as for demo_agent (``GOOGLE_API_KEY``, ``DEMO_MODEL``,
``DEMO_CHUNK_DELAY``); ``DEMO_NATIVE_CONFIRMATION=1`` makes issue_refund use ADK's
own ``require_confirmation`` instead of the gateway's tool policy.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

try:
    import gateway.demo  # noqa: F401
except ImportError:
    # Loaded by file location outside the gateway package (a bare `adk api_server
    # gateway/demo/agents`, or another venv's `adk`): make the checkout importable,
    # as demo_agent/agent.py explains.
    sys.path.insert(0, str(Path(__file__).resolve().parents[4]))

from google.adk.agents import LlmAgent

from gateway.demo.model import choose_model
from gateway.demo.tools import build_support_tools

INSTRUCTION = """\
You are the customer support assistant of the adk-gateway demo shop. Be brief.
- When the user asks where an order is or for its status, call lookup_order(order_id)
  and report the status.
- To refund money on an order, call issue_refund(order_id, amount, currency="USD") once.
  A person approves each refund; after the result, say how much was refunded on which
  order and the refund id, or that the refund was not made.
- You cannot make payments or do anything else: say so briefly and quote the user's message.
"""


root_agent = LlmAgent(
    name="support_agent",
    description="Offline support agent: order lookups, and refunds a person approves.",
    model=choose_model(),
    instruction=INSTRUCTION,
    tools=build_support_tools(native_confirmation=os.environ.get("DEMO_NATIVE_CONFIRMATION") == "1"),
)
