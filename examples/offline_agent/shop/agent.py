"""An agent of your own behind the gateway: the scripted model without GOOGLE_API_KEY, Gemini with it."""

from __future__ import annotations

import os

from google.adk.agents import LlmAgent

from .scripted_model import ScriptedModel


def lookup_order(order_id: str) -> dict:
    """Where an order is."""
    return {"order_id": order_id, "status": "delivered"}


def issue_refund(order_id: str, amount: float) -> dict:
    """Refunds `amount` on an order."""
    return {"order_id": order_id, "refunded": amount}


root_agent = LlmAgent(
    name="shop",
    model=ScriptedModel() if not os.environ.get("GOOGLE_API_KEY") else "gemini-2.5-flash",
    instruction="You are a shop's support assistant. Look orders up and refund them when asked.",
    tools=[lookup_order, issue_refund],
)
