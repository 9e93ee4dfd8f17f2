"""A chat's state kept outside this process: saved when it changes in a way worth keeping, and read
once, before this replica first acts on a chat's approvals.

The chat's machine writes its state as plain JSON (`ChatMachine.snapshot`: its ledger); with
`sessions.backend: redis` the cluster keeps it in the shared store (cluster/shared.py
`put_chat_state`) for the chat's idle TTL. (The memory backend's replicas are this process, gone
with it: nothing is kept there, and `adopt` reads nothing.) It is saved when a run ends and
when a browser tool's approval is handed to the browser (the one change no run carries to ADK;
that response ends only once the state is written, or at the store's bound: `keep`). The
replica that next acts on the chat's approvals (its owner died, drained, or restarted) starts from
it, so what became of them (answered, timed out, approved and waiting for the browser's output)
outlives the process that saw it.

ADK's session stays the authority on what ADK still waits for: every answer is still checked
against it, so a stale or replayed state can make the gateway ask ADK once more, never run a tool
twice or skip an approval. A state that does not validate is refused and the chat starts empty.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import structlog

from ..core.chat_events import StateRestored
from ..core.chat_machine import MachineError
from ..core.ledger_snapshot import MalformedLedger
from ..ops.metrics import GatewayMetrics
from .ports import NO_STATE_STORE, StateStore, attached
from .record import Chat

__all__ = ["KeptStates"]

log = structlog.get_logger("adk_gateway.chat.kept_states")


class KeptStates:
    """The chat service's side of kept chat states; the cluster keeps them (`attach`, chat/ports.py)."""

    def __init__(self, metrics: GatewayMetrics, clock: Callable[[], float]) -> None:
        self._metrics = metrics
        self._clock = clock
        # Where states are kept (`save` in the background, `load`): nowhere unless the cluster attaches its store.
        self._store: StateStore = NO_STATE_STORE
        # Chats whose state is being read: a second request of the chat waits for the same read.
        self._reading: dict[tuple[str, str], asyncio.Future[None]] = {}

    def attach(self, store: StateStore) -> None:
        """The store that keeps the chats' states (cluster/state_keeper.py); once."""
        attached(self._store, NO_STATE_STORE, "the kept states' store")
        self._store = store

    @property
    def store(self) -> StateStore:
        return self._store

    def changed(self, chat: Chat) -> None:
        self._store.save(chat)

    async def keep(self, chat: Chat) -> None:
        """`changed`, waited for (bounded): for a change that a response must not report before it
        is kept, because nothing else records it."""
        await self._store.keep(chat)

    async def adopt(self, chat: Chat, *, needed: bool = True) -> None:
        """Before this replica first acts on `chat`'s approvals: start from its kept state, if
        any. `needed` false (a request that answers nothing): the chat starts from what this
        replica knows, and what it keeps from now on replaces the older state."""
        if chat.adopted:
            return
        key = (chat.user_id, chat.chat_id)
        reading = self._reading.get(key)
        if reading is not None:
            await asyncio.shield(reading)
            return
        if not needed:
            chat.adopted = True
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._reading[key] = done
        try:
            state = await self._store.load(chat)
            # Checked after the read: what this replica recorded meanwhile is newer than any kept state.
            if state is not None and chat.ledger.empty:
                self._restore(chat, state)
        finally:
            chat.adopted = True
            del self._reading[key]
            done.set_result(None)

    def _restore(self, chat: Chat, state: dict[str, Any]) -> None:
        try:
            chat.handle(StateRestored(state, self._clock()))
        except (MalformedLedger, MachineError) as exc:
            log.warning("chat_state_refused", chat_id=chat.chat_id, reason=str(exc))
            return
        # The approvals that wait count here now (answered here, they are counted down here).
        waiting = [c for c in chat.ledger.pending_native() if c.approval and c.approved_at is None]
        if waiting:
            self._metrics.approvals_pending.labels(chat.agent).inc(len(waiting))
        log.info("chat_state_restored", chat_id=chat.chat_id, pending=len(chat.ledger.pending_native()))
