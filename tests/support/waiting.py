"""Waiting in a test for what another task does: poll a condition, bounded, never a sleep for a
fixed time."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Return once `condition()` holds, polling every 10 ms; fail after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, f"condition not reached within {timeout} s"
        await asyncio.sleep(0.01)
