"""Writing chats' states to the shared store and reading them back, for the chat service (chat/kept_states.py).

A save is a background write of the chat's machine snapshot, one at a time per chat: a save asked
for while one is being written is folded into one more write of the newest state, so the store
never ends up with an older state written last. Reads and writes are bounded by the forwarding
timeout; a write to a store that is down is tried again for about 10 s (after Redis lost its data,
the router asks every local chat's state to be written back just before the store serves again);
a store that cannot be reached costs a warning, not a request: ADK's session stays the authority
on what waits (kept_states.py says why that is safe).
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from ..chat.record import Chat
from ..chat.service import ChatService
from .shared import SharedState, SharedStateDown
from .tasks import Tasks

__all__ = ["StateKeeper"]

log = structlog.get_logger("adk_gateway.cluster.state_keeper")

# A store that is down is tried again this often, this many times in all (about 10 s).
_RETRY = 0.5
_ATTEMPTS = 20


class StateKeeper:
    """Keeps the states of `chats`' chats (their states' `StateStore`, chat/ports.py), each
    for the chat's idle TTL as configured when it is written."""

    def __init__(self, state: SharedState, chats: ChatService, tasks: Tasks, *, timeout: float) -> None:
        self._state = state
        self._tasks = tasks
        self._ttl = lambda: chats.config.chat.idle_chat_ttl
        self._timeout = timeout
        chats.states.attach(self)
        # Chats with a write under way, and whether another was asked for meanwhile.
        self._writing: dict[tuple[str, str], bool] = {}
        # Who waits (`keep`) for a chat's writes under way to end.
        self._waiting: dict[tuple[str, str], list[asyncio.Future[None]]] = {}

    def save(self, chat: Chat) -> None:
        key = (chat.user_id, chat.chat_id)
        if key in self._writing:
            self._writing[key] = True
            return
        self._writing[key] = False
        self._tasks.spawn(self._write(chat, key))

    async def keep(self, chat: Chat) -> None:
        # The write `save` starts, or the one more it asks of the write under way, takes its
        # snapshot after this call: when the chat's writing ends, the state as it is now is kept.
        key = (chat.user_id, chat.chat_id)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(key, []).append(done)
        self.save(chat)
        try:
            await asyncio.wait_for(asyncio.shield(done), self._timeout)
        except TimeoutError:
            log.warning("chat_state_not_kept_in_time", chat_id=chat.chat_id)

    async def _write(self, chat: Chat, key: tuple[str, str]) -> None:
        try:
            again = True
            while again:
                self._writing[key] = False
                await self._put(chat)
                again = self._writing[key]
        finally:
            del self._writing[key]
            for done in self._waiting.pop(key, []):
                if not done.done():
                    done.set_result(None)

    async def _put(self, chat: Chat) -> None:
        # A store that is down (or restoring after it lost its data) is tried again a few times:
        # the write that puts a state back after such a loss comes just before it serves again.
        for attempt in range(_ATTEMPTS):
            snapshot = chat.machine.snapshot()  # the newest, taken when it is written
            try:
                await asyncio.wait_for(
                    self._state.put_chat_state(chat.user_id, chat.chat_id, snapshot, ttl=self._ttl()), self._timeout,
                )
                return
            except SharedStateDown:
                if attempt + 1 < _ATTEMPTS and not self._tasks.closed:
                    await asyncio.sleep(_RETRY)
                    continue
                log.warning("chat_state_not_kept", chat_id=chat.chat_id, error="SharedStateDown")
            except Exception as exc:  # noqa: BLE001 - the store's failure is logged; the chat goes on
                log.warning("chat_state_not_kept", chat_id=chat.chat_id, error=type(exc).__name__)
            return

    async def load(self, chat: Chat) -> dict[str, Any] | None:
        try:
            return await asyncio.wait_for(self._state.get_chat_state(chat.user_id, chat.chat_id), self._timeout)
        except Exception as exc:  # noqa: BLE001 - read as absent: the chat starts from ADK's session
            log.warning("chat_state_not_read", chat_id=chat.chat_id, error=type(exc).__name__)
            return None
