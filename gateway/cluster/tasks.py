"""The cluster's background tasks (relay pumps, forwarded requests, verdict records, run marks),
all stopped within a bound when the replica leaves."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from ..ops.stopping import cancel_and_wait

__all__ = ["Tasks"]


class Tasks:
    def __init__(self) -> None:
        self._running: set[asyncio.Task[Any]] = set()
        # Set by close(): loops that might have lost their cancellation (see close) end on it.
        self.closed = False

    def spawn(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        # Named, so close() can say which task did not stop.
        task = asyncio.create_task(work, name=f"cluster:{work.__qualname__}")
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return task

    async def close(self, grace: float) -> None:
        """Cancel every task and wait up to `grace` seconds for them: a task that lost its
        cancellation inside a store call (wait_for, in redis-py on Python 3.11) would otherwise
        hold shutdown, and the heartbeat with it, forever."""
        self.closed = True
        await cancel_and_wait(self._running, grace, what="cluster tasks")
