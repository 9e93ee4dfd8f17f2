"""The chat layer's ports: what it needs from the layers around it, named as `typing.Protocol`s.

The chat layer calls these; whoever implements one is handed to it, at construction or through
one `attach` (where construction order forces it: the cluster is built on the chat service), and
never assigned onto the chat layer's objects as a callback, which the import contract could not
see (tests/unit/test_layers.py fails on that). Each port has a null implementation, the chat
layer's default when nothing is attached (a chat service built alone, in a test): a single
replica with nothing to tell.

- `RunWatcher`: told when a chat's run starts and ends (the cluster's run marks in the shared directory).
- `DeadlineQueue`: the one deadline queue (ADK confirmations' and chats' held calls'), kept by the
  replicas together (cluster/deadline_timer.py).
- `StateStore`: a chat's state kept outside this process (cluster/state_keeper.py, Redis only).
- `ChatMaker`: makes each new chat, with what its runs share (the chat service, for its registry).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..core.deadlines import Deadline
    from .record import Chat

__all__ = [
    "ChatMaker", "DeadlineQueue", "NO_DEADLINES", "NO_RUN_WATCHER", "NO_STATE_STORE", "RunWatcher",
    "StateStore", "attached",
]


class RunWatcher(Protocol):
    def run_changed(self, chat: Chat, message_id: str) -> None:
        """`chat`'s run started (the message id it writes) or ended ("")."""
        ...


class DeadlineQueue(Protocol):
    def add(self, deadline: Deadline) -> None:
        """Keep a new deadline (or one moved: the latest of a key wins)."""
        ...

    def drop(self, key: str) -> None:
        """The call of `key` was answered before its deadline (or nothing of the chat waits any more)."""
        ...


class StateStore(Protocol):
    def save(self, chat: Chat) -> None:
        """Keep the chat's state (its machine's snapshot), in the background."""
        ...

    async def keep(self, chat: Chat) -> None:
        """`save`, waited for: returns once a write of the state as it is now has ended, or at the
        store's bound (a store down or slow leaves it as kept as `save` would)."""
        ...

    async def load(self, chat: Chat) -> dict[str, Any] | None:
        """The chat's state as last kept, or None (never kept, expired, unreadable, store down)."""
        ...


class ChatMaker(Protocol):
    def new_chat(self, agent: str, user_id: str, chat_id: str, now: float) -> Chat:
        """A new chat of `agent`, whose ADK session id is its chat id, able to run."""
        ...


class _Nothing:
    """The single replica's ports: nobody to tell, nothing kept elsewhere."""

    def run_changed(self, chat: Chat, message_id: str) -> None:
        pass

    def add(self, deadline: Deadline) -> None:
        pass

    def drop(self, key: str) -> None:
        pass

    def save(self, chat: Chat) -> None:
        pass

    async def keep(self, chat: Chat) -> None:
        pass

    async def load(self, chat: Chat) -> dict[str, Any] | None:
        return None


NO_RUN_WATCHER: RunWatcher = _Nothing()
NO_DEADLINES: DeadlineQueue = _Nothing()
NO_STATE_STORE: StateStore = _Nothing()


def attached(current: object, null: object, what: str) -> None:
    """Refuse a second `attach` of a port: one owner per seam, fixed once the object graph is built."""
    if current is not null:
        raise RuntimeError(f"{what} is attached already")
