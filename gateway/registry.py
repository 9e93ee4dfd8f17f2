"""The per-session registry: what the gateway remembers about each chat between requests.

A chat is keyed by (user id, AI SDK chat id), so a browser can only ever reach chats of its own
user: the same chat id under another user is a different chat with a different ADK session. Each
chat remembers its ADK session, its current run (for serialising requests and for resume) and
the approvals it is waiting on (for latency metrics).

Everything here is in-process memory. Callers use only the `Registry` methods, so a shared backend
for several replicas can take its place without touching them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .runs import Run

__all__ = ["Chat", "PendingApproval", "Registry"]


@dataclass(frozen=True)
class PendingApproval:
    approval_id: str
    tool_call_id: str
    tool_name: str
    requested_at: float


@dataclass(eq=False)
class Chat:
    user_id: str
    chat_id: str
    session_id: str
    last_active: float
    session_ready: bool = False
    run: Run | None = None
    pending: dict[str, PendingApproval] = field(default_factory=dict)


class Registry:
    def __init__(self) -> None:
        self._chats: dict[tuple[str, str], Chat] = {}

    def __len__(self) -> int:
        return len(self._chats)

    def get(self, user_id: str, chat_id: str, *, now: float) -> Chat:
        """The chat, created on first use. The ADK session id is the chat id (scoped by user in ADK)."""
        chat = self._chats.get((user_id, chat_id))
        if chat is None:
            chat = self._chats[(user_id, chat_id)] = Chat(user_id, chat_id, chat_id, now)
        chat.last_active = now
        return chat

    def find(self, user_id: str, chat_id: str) -> Chat | None:
        return self._chats.get((user_id, chat_id))

    def expire(self, *, idle_before: float) -> list[Chat]:
        """Forget chats idle since before `idle_before` that have nothing streaming; returns them."""
        gone = [
            chat
            for chat in self._chats.values()
            if chat.last_active < idle_before and (chat.run is None or not chat.run.streaming)
        ]
        for chat in gone:
            del self._chats[(chat.user_id, chat.chat_id)]
        return gone

    def chats(self) -> list[Chat]:
        return list(self._chats.values())
