"""The per-session registry: what the gateway remembers about each chat between requests.

A chat is keyed by (user id, AI SDK chat id), so a browser can only ever reach chats of its own
user: the same chat id under another user is a different chat with a different ADK session. Each
chat remembers its ADK session, its current run (for serialising requests and for resume) and
the native ADK approvals it is waiting on (for latency metrics).

The registry also holds the gateway-gated tool calls (approval queues and browser-tool delegates)
and the waiters for their verdicts: the plugin's request waits here until a person, the browser
or the deadline releases the call.

Everything here is this process's memory: the chats this replica runs. With several replicas,
what they share (which replica runs which chat) is gateway/cluster's, not this module's.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .approvals import GatedCall, Verdict
from .errors import Refusal
from .runs import Run

if TYPE_CHECKING:
    from .chats import RunDriver
    from .live import LiveLink

__all__ = ["Chat", "ChatNotFound", "PendingApproval", "Registry", "TooManyChats"]


# Answered native confirmations a chat remembers; older ones are looked up in ADK's session.
_ANSWERED_KEPT = 256


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
    # The task driving `run` while its upstream stream is open.
    driver: RunDriver | None = None
    # The chat's ADK live session, in live upstream mode.
    live: LiveLink | None = None
    pending: dict[str, PendingApproval] = field(default_factory=dict)
    # Native confirmations answered through this chat (oldest first): a replay must not reach ADK,
    # whose 1.x releases run the confirmed tool again.
    answered_native: dict[str, None] = field(default_factory=dict)

    def remember_answered(self, approval_id: str) -> None:
        self.answered_native[approval_id] = None
        if len(self.answered_native) > _ANSWERED_KEPT:
            del self.answered_native[next(iter(self.answered_native))]


class ChatNotFound(Refusal):
    """The chat id belongs to another user: to this caller it does not exist."""

    status = 404
    code = "chat_not_found"

    def public_message(self) -> str:
        return "no such chat"  # not the id: the answer must not confirm whose it is


class TooManyChats(Exception):
    """The user already has as many chats as the gateway keeps per user."""


class Registry:
    def __init__(self, max_chats_per_user: int = 1_000_000) -> None:
        self.max_chats_per_user = max_chats_per_user
        self._chats: dict[tuple[str, str], Chat] = {}
        # Chat ids are global to the browser side: the first user to use one owns it.
        self._owners: dict[str, str] = {}
        self._per_user: dict[str, int] = {}
        self._calls: dict[str, GatedCall] = {}
        self._calls_by_tool_call: dict[tuple[str, str, str], GatedCall] = {}
        self._waiters: dict[str, list[asyncio.Future[Verdict]]] = {}

    def __len__(self) -> int:
        return len(self._chats)

    def get(self, user_id: str, chat_id: str, *, now: float) -> Chat:
        """The chat, created on first use. The ADK session id is the chat id (scoped by user in ADK).

        Raises ChatNotFound when another user owns the id, TooManyChats at the per-user cap.
        """
        chat = self._chats.get((user_id, chat_id))
        if chat is None:
            owner = self._owners.get(chat_id)
            if owner is not None and owner != user_id:
                raise ChatNotFound(chat_id)
            if self._per_user.get(user_id, 0) >= self.max_chats_per_user:
                raise TooManyChats(user_id)
            chat = self._chats[(user_id, chat_id)] = Chat(user_id, chat_id, chat_id, now)
            self._owners[chat_id] = user_id
            self._per_user[user_id] = self._per_user.get(user_id, 0) + 1
        chat.last_active = now
        return chat

    def find(self, user_id: str, chat_id: str) -> Chat | None:
        """The caller's chat, or None; raises ChatNotFound when another user owns the id."""
        owner = self._owners.get(chat_id)
        if owner is not None and owner != user_id:
            raise ChatNotFound(chat_id)
        return self._chats.get((user_id, chat_id))

    def find_session(self, user_id: str, session_id: str) -> Chat | None:
        """The chat behind an ADK session (the plugin's view: no ownership question)."""
        return self._chats.get((user_id, session_id))

    def expire(self, *, idle_before: float) -> list[Chat]:
        """Forget chats idle since before `idle_before` that have nothing streaming; returns them."""
        gone = [
            chat
            for chat in self._chats.values()
            if chat.last_active < idle_before
            and (chat.run is None or not chat.run.streaming)
            and (chat.driver is None or not chat.driver.alive)
        ]
        for chat in gone:
            del self._chats[(chat.user_id, chat.chat_id)]
            self._owners.pop(chat.chat_id, None)
            left = self._per_user.get(chat.user_id, 1) - 1
            if left > 0:
                self._per_user[chat.user_id] = left
            else:
                self._per_user.pop(chat.user_id, None)
            for call in self.calls_of(chat.user_id, chat.chat_id):
                self._forget_call(call)
        return gone

    def chats(self) -> list[Chat]:
        return list(self._chats.values())

    # ---- gated tool calls ------------------------------------------------------------------

    def add_call(self, call: GatedCall) -> GatedCall:
        """Store a new gated call, or return the one already stored for the same tool call."""
        key = (call.user_id, call.session_id, call.tool_call_id)
        existing = self._calls_by_tool_call.get(key)
        if existing is not None:
            return existing
        self._calls[call.id] = call
        self._calls_by_tool_call[key] = call
        return call

    def call(self, approval_id: str) -> GatedCall | None:
        return self._calls.get(approval_id)

    def call_for_tool_call(self, user_id: str, session_id: str, tool_call_id: str) -> GatedCall | None:
        return self._calls_by_tool_call.get((user_id, session_id, tool_call_id))

    def calls_of(self, user_id: str, chat_id: str) -> list[GatedCall]:
        return [c for c in self._calls.values() if c.user_id == user_id and c.chat_id == chat_id]

    def open_calls(self) -> list[GatedCall]:
        return [c for c in self._calls.values() if not c.released]

    async def wait(self, call: GatedCall) -> Verdict:
        """The call's verdict, once it is released."""
        if call.verdict is not None:
            return call.verdict
        future: asyncio.Future[Verdict] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(call.id, []).append(future)
        try:
            return await future
        finally:
            waiters = self._waiters.get(call.id)
            if waiters and future in waiters:
                waiters.remove(future)

    def release(self, call: GatedCall) -> None:
        """Deliver a released call's verdict to everyone waiting for it."""
        assert call.verdict is not None
        for future in self._waiters.pop(call.id, []):
            if not future.done():
                future.set_result(call.verdict)

    def _forget_call(self, call: GatedCall) -> None:
        self._calls.pop(call.id, None)
        self._calls_by_tool_call.pop((call.user_id, call.session_id, call.tool_call_id), None)
        self._waiters.pop(call.id, None)

    def stats(self) -> dict[str, Any]:
        return {"chats": len(self._chats), "calls": len(self._calls), "open_calls": len(self.open_calls())}
