"""Waiting on another replica without hanging on it: whether it is dead for sure, and the one wait
for an answer from it, which ends when the answer comes, when the replica dies or when time runs out.

A replica is dead when its heartbeat is gone (`sessions.owner_timeout` after its last one). A wait
polls: every heartbeat interval without an answer, it looks where else the answer may be found (a
gated call's record) and whether the replica still lives.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..core.refusals import HttpError
from .shared import SharedState, SharedStateBusy, SharedStateDown

__all__ = ["Liveness", "OwnerDied", "OwnerLost", "OwnerSilent"]

T = TypeVar("T")


class OwnerLost(HttpError):
    """The replica that ran the chat died, and what the request needs died with it."""


class OwnerDied(Exception):
    """The replica a wait was for is dead."""


class OwnerSilent(Exception):
    """The replica a wait was for lives, but gave no answer in the wait's time."""


class Liveness:
    """Whether other replicas are alive, as seen through the shared state's heartbeats."""

    def __init__(self, state: SharedState, interval: float) -> None:
        self._state = state
        # sessions.heartbeat_interval: how often a wait looks again.
        self.interval = interval

    async def dead(self, replica_id: str) -> bool:
        """Dead for sure: no heartbeat now, nor one heartbeat interval later."""
        if await self._state.alive(replica_id):
            return False
        await asyncio.sleep(self.interval)
        return not await self._state.alive(replica_id)

    async def wait(
        self, future: asyncio.Future[T], replica_id: str, *, timeout: float,
        check: Callable[[], Awaitable[T | None]] | None = None, through_outages: bool = False,
    ) -> T:
        """The result of `future`, which `replica_id` settles; or what `check` finds first.

        Raises OwnerDied when the replica is dead, OwnerSilent after `timeout` seconds. The shared
        state being down raises SharedStateDown, unless `through_outages`: then the wait goes on
        (the answer may still come through the inbox). A replica too busy to ask (SharedStateBusy)
        learnt nothing: the wait goes on.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            _resume_lost_cancellation()
            if await _settled(future, self.interval):
                return future.result()
            try:
                found = await check() if check is not None else None
                if found is not None:
                    return found
                if await self.dead(replica_id):
                    raise OwnerDied(replica_id)
            except SharedStateBusy:
                pass
            except SharedStateDown:
                if not through_outages:
                    raise
            if loop.time() >= deadline:
                raise OwnerSilent(replica_id)


def _resume_lost_cancellation() -> None:
    """Raise the cancellation of this task if a call below lost it, for a loop that would otherwise
    go on: on Python 3.11, wait_for (redis-py sends every command with it) returns a result that
    arrived with the cancellation and drops the cancellation. The task still counts it."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def _settled(future: asyncio.Future[Any], timeout: float) -> bool:
    """Whether `future` is done within `timeout`, leaving it alone either way.

    Not wait_for: on Python 3.11 it can swallow a cancellation that arrives as the wait ends,
    and a task that cannot be cancelled hangs shutdown.
    """
    await asyncio.wait((future,), timeout=timeout)
    return future.done()
