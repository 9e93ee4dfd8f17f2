"""The registry: an index of the chats this replica remembers, and of whose approval ids are whose.

A chat is keyed by (user id, AI SDK chat id), so a browser can only ever reach chats of its own
user: the same chat id under another user is a different chat with a different ADK session. Chat
ids are global to the browser side, so the first user to use one owns it here, and the agent it
was first used on: on another agent's routes the id does not exist either.

Approval ids of gated calls are indexed to their chat, so an answer that names another chat's
approval is told so (403) rather than taken for a stale one. What the calls are and how they
stand is each chat's ledger's (core/ledger.py), not the registry's.

Everything here is this process's memory. With several replicas, what they share (which replica
runs which chat) is gateway/cluster's.
"""

from __future__ import annotations

from ..approvals.ports import WaitingConfirmation
from ..core.refusals import Refusal
from .ports import ChatMaker, attached
from .record import Chat

__all__ = ["ChatNotFound", "Registry", "TooManyChats"]


class ChatNotFound(Refusal):
    """The chat id belongs to another user, or to another agent: to this caller, here, it does not exist."""

    status = 404
    code = "chat_not_found"

    def public_message(self) -> str:
        return "no such chat"  # not the id: the answer must not confirm whose it is


class TooManyChats(Exception):
    """The user already has as many chats as the gateway keeps per user."""


class _NoMaker:
    """No chat service drives this registry's chats yet: a chat that could not run is refused."""

    def new_chat(self, agent: str, user_id: str, chat_id: str, now: float) -> Chat:
        raise RuntimeError("no chat service makes this registry's chats")


_NO_MAKER: ChatMaker = _NoMaker()


class Registry:
    def __init__(self, max_chats_per_user: int = 1_000_000) -> None:
        self.max_chats_per_user = max_chats_per_user
        # Makes each new chat: the chat service that drives the chats (`attach`).
        self._maker: ChatMaker = _NO_MAKER
        self._chats: dict[tuple[str, str], Chat] = {}
        self._owners: dict[str, str] = {}
        self._per_user: dict[str, int] = {}
        self._approvals: dict[str, Chat] = {}

    def attach(self, maker: ChatMaker) -> None:
        """Who makes each new chat (chat/ports.py); once, by the chat service."""
        attached(self._maker, _NO_MAKER, "the registry's chat maker")
        self._maker = maker

    def __len__(self) -> int:
        return len(self._chats)

    def get(self, agent: str, user_id: str, chat_id: str, *, now: float) -> Chat:
        """The chat, created on first use. The ADK session id is the chat id (scoped by user in ADK).

        Raises ChatNotFound when another user owns the id or it is another agent's chat,
        TooManyChats at the per-user cap.
        """
        chat = self._chats.get((user_id, chat_id))
        if chat is not None and chat.agent != agent:
            raise ChatNotFound(chat_id)
        if chat is None:
            owner = self._owners.get(chat_id)
            if owner is not None and owner != user_id:
                raise ChatNotFound(chat_id)
            if self._per_user.get(user_id, 0) >= self.max_chats_per_user:
                raise TooManyChats(user_id)
            chat = self._maker.new_chat(agent, user_id, chat_id, now)
            self._chats[(user_id, chat_id)] = chat
            self._owners[chat_id] = user_id
            self._per_user[user_id] = self._per_user.get(user_id, 0) + 1
        chat.last_active = now
        return chat

    def find(self, agent: str, user_id: str, chat_id: str) -> Chat | None:
        """The caller's chat, or None; raises ChatNotFound when another user owns the id or
        it is another agent's chat."""
        owner = self._owners.get(chat_id)
        if owner is not None and owner != user_id:
            raise ChatNotFound(chat_id)
        chat = self._chats.get((user_id, chat_id))
        if chat is not None and chat.agent != agent:
            raise ChatNotFound(chat_id)
        return chat

    def waiting_for_approvers(self, agent: str, user_id: str, chat_id: str, approval_id: str) -> WaitingConfirmation | None:
        """The confirmation for approvers a chat here waits for (the approvals desk's view), if any."""
        try:
            chat = self.find(agent, user_id, chat_id)
        except ChatNotFound:
            return None
        if chat is None:
            return None
        found = chat.ledger.native(approval_id) or next(
            (c for c in chat.ledger.asked_for_approvers() or [] if c.approval_id == approval_id), None
        )
        if found is None or not found.for_approvers:
            return None
        return WaitingConfirmation(chat.agent, chat.user_id, chat.chat_id, chat.session_id, found)

    def find_session(self, user_id: str, session_id: str) -> Chat | None:
        """The chat behind an ADK session (the plugin's view: no ownership question)."""
        return self._chats.get((user_id, session_id))

    def index_approval(self, approval_id: str, chat: Chat) -> None:
        self._approvals[approval_id] = chat

    def approval_chat(self, approval_id: str) -> Chat | None:
        """The chat whose ledger holds the gated call with this approval id."""
        return self._approvals.get(approval_id)

    def expire(self, *, idle_before: float) -> list[Chat]:
        """Forget chats idle since before `idle_before` whose machine is settled (no run under way
        or being started); returns them."""
        gone = [chat for chat in self._chats.values() if chat.last_active < idle_before and chat.machine.settled]
        for chat in gone:
            chat.drop_deadline()
            del self._chats[(chat.user_id, chat.chat_id)]
            self._owners.pop(chat.chat_id, None)
            left = self._per_user.get(chat.user_id, 1) - 1
            if left > 0:
                self._per_user[chat.user_id] = left
            else:
                self._per_user.pop(chat.user_id, None)
            for call in chat.ledger.calls():
                self._approvals.pop(call.id, None)
        return gone

    def chats(self) -> list[Chat]:
        return list(self._chats.values())
