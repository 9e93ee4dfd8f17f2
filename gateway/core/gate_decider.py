"""The machine's port to where an approval is decided: `GateDecider`, and what of the chat it is shown (sans-IO).

The chat's machine (core/chat_machine.py) records what waits, but what the plugin's ask about a
tool call comes to (the tool's rules, who answers, how by the upstream mode) is the approvals
room's to say (approvals/decision.py). The core may not import the room (tests/unit/test_layers.py),
so the machine names what it needs here and is handed the room's decider when it is built
(chat/record.py).

A machine built without one (`NO_DECIDER`: a machine built alone, in a test) refuses every ask
(`no_decider`): a forgotten decider fails closed, never open.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Protocol

from .approvals import REFUSAL_KEY, GatedCall, Verdict
from .chat_events import ToolAsked
from .chat_outputs import GateDecided

__all__ = ["NO_DECIDER", "ChatView", "GateDecider", "refuse_ask"]


@dataclass(frozen=True, slots=True)
class ChatView:
    """What of the chat the decision reads: whether a run is under way (to show the call), how many
    calls wait already, and the call recorded for this tool call, if the plugin asked before."""

    running: bool
    waiting: int
    asked_before: GatedCall | None = None


class GateDecider(Protocol):
    def decide(self, ask: ToolAsked, chat: ChatView) -> GateDecided:
        """What the plugin's `ask` comes to in the chat seen as `chat`; nothing is recorded here."""
        ...


def refuse_ask(reason: str, text: str) -> Verdict:
    """The verdict of an ask refused at once: ADK's `{"error"}` with the refusal's marker."""
    return Verdict(run=False, reason=reason, response={"error": text, REFUSAL_KEY: reason})


@dataclass(frozen=True, slots=True)
class _NoDecider:
    """A machine handed no decider: nothing may run that it was asked about."""

    def decide(self, ask: ToolAsked, chat: ChatView) -> GateDecided:
        return GateDecided("refuse", refuse_ask("no_decider", "The gateway has no decision for this call; it was not run."))


NO_DECIDER: Final[GateDecider] = _NoDecider()
