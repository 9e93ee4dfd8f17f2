"""Bounded stops: cancelling tasks and awaiting close-downs without ever waiting forever.

Every stop path of the gateway (the drain, the chat service's and the cluster's close, the
listeners' cleanup) goes through here, so a task that swallows its cancellation (Python 3.11's
`asyncio.wait_for` can, inside a Redis call) or a peer that never answers a close costs at most
the bound, and is logged by name instead of hanging the process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Collection
from typing import Any

import structlog

__all__ = ["cancel_and_wait", "drain", "pause", "within"]

log = structlog.get_logger("adk_gateway.ops.stopping")


async def cancel_and_wait(tasks: Collection[asyncio.Task[Any]], timeout: float, *, what: str) -> set[asyncio.Task[Any]]:
    """Cancel `tasks` and wait up to `timeout` for them to end; return (and log) those that did not.

    asyncio.wait, not gather: gather on a cancelled task that refuses to end waits with it.
    """
    pending = {task for task in tasks if not task.done()}
    for task in pending:
        task.cancel()
    if pending:
        _, pending = await asyncio.wait(pending, timeout=timeout)
    if pending:
        log.error("stop_overran", what=what, timeout_s=timeout, stuck=sorted(t.get_name() for t in pending))
    return pending


async def within(work: Awaitable[Any], timeout: float, *, what: str) -> bool:
    """Run `work` for at most `timeout` seconds (then cancel it, and leave it if it will not end).

    True when it finished in time. Its exceptions are logged, not raised: a stop step that fails
    must not keep the next one from running.
    """
    task = asyncio.ensure_future(work)
    done, _ = await asyncio.wait((task,), timeout=timeout)
    if not done:
        await cancel_and_wait((task,), 1.0, what=what)
        log.error("stop_step_timed_out", what=what, timeout_s=timeout)
        return False
    if not task.cancelled() and task.exception() is not None:
        log.error("stop_step_failed", what=what, error=repr(task.exception()))
        return False
    return True


async def pause(delay: float, stopping: asyncio.Event) -> None:
    """Wait `delay` seconds, or less once `stopping` is set: a retry between attempts (webhooks,
    Slack, approval mails) makes its last attempt as soon as a stop asks, not after its backoff."""
    try:
        await asyncio.wait_for(stopping.wait(), delay)
    except TimeoutError:
        pass


async def drain(tasks: Collection[asyncio.Task[Any]], timeout: float, *, what: str) -> None:
    """Give `tasks` most of `timeout` to end on their own, then cancel those left within the rest."""
    # Most of the bound for the work to finish; the rest for cancelling what did not.
    flush = timeout * 0.8
    pending = set(tasks)
    if pending:
        _, pending = await asyncio.wait(pending, timeout=flush)
    if pending:
        await cancel_and_wait(pending, timeout - flush, what=what)
