"""The demo agents' tools: fake, deterministic, offline.

demo_agent (`build_tools`): `process_payment` and `get_weather` run in the agent
process. `get_location` and `change_bgm` stand for tools that run in the browser:
the gateway's ADK plugin answers them with the browser's output before ADK would
call them, so their bodies only run when no gateway plugin is installed, and then
report that.

support_agent (`build_support_tools`): `lookup_order` and `issue_refund`, both in
the agent process; the gateway's policy gates `issue_refund` behind a person.

When `DEMO_TOOL_LEDGER` names a file, every real execution of `process_payment`
or `issue_refund` appends one JSON line to it (`LEDGER_ENV`): the ledger the
operations fault suite (tests/ops) counts to prove that no failure moves money
twice, or moves it when nobody approved. Unset, nothing is written.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any

from google.adk.tools.function_tool import FunctionTool
from google.adk.tools.tool_context import ToolContext

LEDGER_ENV = "DEMO_TOOL_LEDGER"

_CONDITIONS = ("sunny", "partly cloudy", "cloudy", "light rain", "clear")
_ORDER_STATUSES = ("being packed", "shipped", "out for delivery", "delivered")


def _digest(*values: object) -> str:
    return hashlib.sha256("|".join(str(v) for v in values).encode()).hexdigest()


def _record_execution(tool: str, args: dict[str, Any], tool_context: ToolContext | None) -> None:
    path = os.environ.get(LEDGER_ENV)
    if not path:
        return
    entry = {
        "tool": tool,
        "session_id": tool_context.session.id if tool_context is not None else None,
        "function_call_id": tool_context.function_call_id if tool_context is not None else None,
        "args": args,
        "at": time.time(),
    }
    # One write(2) on an O_APPEND descriptor: lines from concurrent calls never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(entry, sort_keys=True) + "\n").encode())
    finally:
        os.close(fd)


def process_payment(
    amount: float, recipient: str, currency: str = "USD", tool_context: ToolContext | None = None
) -> dict[str, Any]:
    """Sends a payment of `amount` in `currency` to `recipient`.

    Args:
      amount: How much to pay, in units of `currency`.
      recipient: Who receives the payment.
      currency: ISO 4217 currency code, USD by default.
    """
    # ADK passes `tool_context` (and leaves it out of the declaration the model sees); the ledger
    # needs it to name the session and the call.
    _record_execution("process_payment", {"amount": amount, "recipient": recipient, "currency": currency}, tool_context)
    # Derived from the arguments so recorded fixtures stay stable across runs.
    transaction_id = "txn-" + _digest(amount, recipient, currency)[:12]
    return {
        "success": True,
        "transaction_id": transaction_id,
        "amount": amount,
        "recipient": recipient,
        "currency": currency,
    }


def get_weather(city: str) -> dict[str, Any]:
    """Returns the current weather in `city` (a deterministic fake).

    Args:
      city: The city to report on, e.g. "Tokyo".
    """
    seed = int(_digest(city.strip().lower())[:8], 16)
    return {
        "city": city,
        "condition": _CONDITIONS[seed % len(_CONDITIONS)],
        "temperature_c": 10 + seed % 20,
    }


def get_location() -> dict[str, Any]:
    """Returns the user's current coordinates; runs in the user's browser."""
    return {"error": "get_location runs in the browser, and no gateway plugin answered it."}


def change_bgm(track: int) -> dict[str, Any]:
    """Switches the background music to `track`; runs in the user's browser.

    Args:
      track: The track number to play.
    """
    return {"error": "change_bgm runs in the browser, and no gateway plugin answered it."}


def lookup_order(order_id: str) -> dict[str, Any]:
    """Returns the status of order `order_id` (a deterministic fake).

    Args:
      order_id: The order number, e.g. "1234".
    """
    seed = int(_digest("order", order_id.strip().lstrip("#"))[:8], 16)
    return {
        "order_id": order_id,
        "status": _ORDER_STATUSES[seed % len(_ORDER_STATUSES)],
        "items": 1 + seed % 4,
        "total": 20 + seed % 180,
        "currency": "USD",
    }


def issue_refund(
    order_id: str, amount: float, currency: str = "USD", tool_context: ToolContext | None = None
) -> dict[str, Any]:
    """Refunds `amount` in `currency` on order `order_id`.

    Args:
      order_id: The order to refund, e.g. "1234".
      amount: How much to refund, in units of `currency`.
      currency: ISO 4217 currency code, USD by default.
    """
    _record_execution("issue_refund", {"order_id": order_id, "amount": amount, "currency": currency}, tool_context)
    return {
        "success": True,
        "refund_id": "rf-" + _digest(order_id, amount, currency)[:12],
        "order_id": order_id,
        "amount": amount,
        "currency": currency,
    }


def build_tools(native_confirmation: bool = False) -> list[FunctionTool]:
    """Fresh tool instances for one agent.

    Which calls need a person is the gateway's tool policy (config/gateway.yaml), enforced by its
    plugin. `native_confirmation` makes process_payment declare ADK's own `require_confirmation`
    instead, for agents (and tests) that use ADK's native confirmation flow.
    """
    return [
        FunctionTool(process_payment, require_confirmation=native_confirmation),
        FunctionTool(get_weather),
        FunctionTool(get_location),
        FunctionTool(change_bgm),
    ]


def build_support_tools(native_confirmation: bool = False) -> list[FunctionTool]:
    """Fresh tool instances for the support agent.

    As with `build_tools`, the gateway's tool policy decides who approves a refund;
    `native_confirmation` makes issue_refund declare ADK's own `require_confirmation` instead.
    """
    return [
        FunctionTool(lookup_order),
        FunctionTool(issue_refund, require_confirmation=native_confirmation),
    ]
