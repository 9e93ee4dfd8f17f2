"""A chat, as this replica remembers it between requests.

A chat is keyed by (user id, AI SDK chat id): a browser can only ever reach chats of its own user.
It belongs to one agent (upstream/agents.py), whose routes alone reach it. It holds its ADK session (on
the client of its agent's upstream it was made with), its current run log (that requests follow),
its live session in live mode, its machine (core/chat_machine.py: the ledger of calls that wait
for a person and the current turn, as data) and the actor that alone drives that machine
(chat/actor.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..core.chat_machine import ChatMachine
from ..core.ledger import Ledger
from .actor import ChatActor
from ..upstream.live import LiveLink
from .chunk_log import Run
from ..upstream.client import AdkClient

__all__ = ["Chat"]


# Slots: every remembered chat keeps one, and a held stream's is a new chat's (no per-instance dict).
@dataclass(eq=False, slots=True)
class Chat:
    user_id: str
    chat_id: str
    session_id: str
    last_active: float
    # The agent the chat belongs to (its name in the config).
    agent: str = ""
    # The upstream client its ADK session lives behind; a reload that changes the agent's upstream
    # gives the agent a new one, which the chat takes (and re-checks its session on) next turn.
    upstream: AdkClient | None = None
    session_ready: bool = False
    # The gateway cut the chat's last `/run_sse` stream before its end: ADK may still be writing
    # that run into the session, and the next run waits for it (upstream/cut_runs.py).
    upstream_cut: bool = False
    run: Run | None = None
    # The chat's ADK live session, in live upstream mode.
    live: LiveLink | None = None
    # The browser socket that drove the chat closed while its run went on, and no request of the
    # chat came since: its live session closes when the run ends (chat/agent_runs.py).
    browser_left: bool = False
    # The chat's kept state was read (or is not needed) here: chat/kept_states.py.
    adopted: bool = False
    # The identity claims of the user's latest request (JWT; empty otherwise): the tool rules read them.
    claims: dict[str, Any] = field(default_factory=dict)
    machine: ChatMachine = field(default_factory=ChatMachine)
    # The only caller of `machine`; the registry makes it with the chat.
    actor: ChatActor = field(init=False, repr=False)

    @property
    def ledger(self) -> Ledger:
        return self.machine.ledger

    @property
    def running(self) -> bool:
        """A run of this chat is under way here (the machine says so, not a task)."""
        return self.machine.running
