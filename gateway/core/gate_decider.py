"""The machine's port to where an approval is decided: `GateDecider`, and what of the chat it is shown (sans-IO).

The chat's machine (core/chat_machine.py) records what waits, but what the plugin's ask about a
tool call comes to (the tool's rules, who answers, how by the upstream mode) is the approvals
room's to say (approvals/decision.py). The core may not import the room (tests/unit/test_layers.py),
so the machine names what it needs here and is handed the room's decider when it is built
(chat/record.py). It has no default: a machine cannot be built without one, so none can forget it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .approvals import GatedCall
from .chat_events import ToolAsked
from .chat_outputs import GateDecided

__all__ = ["ChatView", "GateDecider"]


@dataclass(frozen=True, slots=True)
class ChatView:
    """What of the chat the decision reads: whether a run is under way (to show the call), how many
    calls wait already (held here; and ADK's confirmations its approvers answer), and the call
    recorded for this tool call, if the plugin asked before."""

    run_under_way: bool
    waiting: int
    asked_before: GatedCall | None = None
    approvers_waiting: int = 0


class GateDecider(Protocol):
    def decide(self, ask: ToolAsked, chat: ChatView) -> GateDecided:
        """What the plugin's `ask` comes to in the chat seen as `chat`; nothing is recorded here."""
        ...
