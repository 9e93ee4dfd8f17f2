"""A chat, as this replica remembers it between requests.

A chat is keyed by (user id, AI SDK chat id): a browser can only ever reach chats of its own user.
It belongs to one agent (upstream/agents.py), whose routes alone reach it. It holds its ADK session (on
the client of its agent's upstream it was made with), its current run (the run log that requests follow, and the driver that
runs it), its live session in live mode, and its ledger: the calls that wait for a person.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .driver import RunDriver
from ..core.ledger import Ledger
from ..upstream.live import LiveLink
from .chunk_log import Run
from ..upstream.client import AdkClient

__all__ = ["Chat"]


@dataclass(eq=False)
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
    run: Run | None = None
    # Drives `run`; its task is alive while the run's upstream stream is open.
    driver: RunDriver | None = None
    # The chat's ADK live session, in live upstream mode.
    live: LiveLink | None = None
    # The browser socket that drove the chat closed while its run went on, and no request of the
    # chat came since: its live session closes when the run ends (chat/agent_runs.py).
    browser_left: bool = False
    ledger: Ledger = field(default_factory=Ledger)

    @property
    def running(self) -> bool:
        """An upstream run of this chat is going on here."""
        return self.driver is not None and self.driver.alive
