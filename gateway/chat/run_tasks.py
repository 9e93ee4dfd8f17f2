"""The chat runs going on in this replica, each an asyncio task driving its turn: started, and every way one ends early.

A run outlives the browser request that started it (chat/driver.py). `RunTasks` starts its task
(`launch`), tells the chat service when it ends, and ends runs before their time: the browser's
abort, a new message in a chat whose response nobody reads any more (`stop_unread`, as an abort)
or whose run waits for a person (`settle`: what it waits for is released, then up to 10 s for it
to end), an agent a reload removed (`end_agent`), a shutdown (`close`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from ..core.approvals import GatedCall
from ..core.chat_request import ApprovalAnswer
from ..ops.stopping import cancel_and_wait
from .agent_runs import Batches
from .attachment import Attachment
from .chunk_log import Reader
from .driver import RunDriver
from .record import Chat
from .response import Response

__all__ = ["RunTasks"]

log = structlog.get_logger("adk_gateway.chat.run_tasks")

# How long a new message waits for the previous run to wind down after its calls were cancelled.
_SETTLE_SECONDS = 10.0
# How often a new message looks again whether a relayed reader of the chat's response left.
_READER_POLL = 0.05
# How long a shutdown waits for cancelled runs to publish their last chunks.
_CLOSE_TIMEOUT = 2.0


class RunTasks:
    """The run tasks going on, and whose. `started` is told a chat's run started (its message
    id), `ended` that it ended; `heartbeat`: the cluster's heartbeat interval (how long a relayed
    reader is given to say it left)."""

    def __init__(
        self,
        *,
        clock: Callable[[], float],
        heartbeat: Callable[[], float],
        started: Callable[[Chat, str], None],
        ended: Callable[[Chat], None],
    ) -> None:
        self._clock = clock
        self._heartbeat = heartbeat
        self._started = started
        self._ended = ended
        # Each tells the cluster when its run ends.
        self._tasks: dict[asyncio.Task[None], Chat] = {}
        self._closing_reason = "This response was cancelled."

    def __len__(self) -> int:
        return len(self._tasks)

    def launch(self, chat: Chat, driver: RunDriver, batches: Batches, reader: Reader | None = None) -> Attachment:
        """Make `driver` the chat's run and start its task; the run outlives the request, which
        reads its first response through `reader` (one is taken if not given)."""
        chat.run = driver.run
        chat.driver = driver
        driver.task = asyncio.create_task(driver.drive(batches, lambda: self._closing_reason))
        # One bound callback, not a coroutine around the drive or a closure: a held run keeps them.
        self._tasks[driver.task] = chat
        driver.task.add_done_callback(self._run_done)
        self._started(chat, driver.run.message_id)
        return Attachment(driver.run, reader or driver.run.current.reader())

    def _run_done(self, task: asyncio.Task[None]) -> None:
        chat = self._tasks.pop(task, None)
        if chat is not None:
            self._ended(chat)

    @staticmethod
    def abort(chat: Chat) -> bool:
        """The browser stopped the response: cancel the agent run behind it. True if one was running."""
        if not chat.running or chat.driver is None or chat.driver.task is None:
            return False
        chat.driver.aborting = True
        chat.driver.task.cancel()
        log.info("run_aborted", chat_id=chat.chat_id)
        return True

    @staticmethod
    def end_agent(chats: list[Chat], agent: str, reason: str) -> int:
        """End the runs of `agent` among `chats`: each ends with an error chunk saying `reason`.
        Returns how many."""
        ended = 0
        loop = asyncio.get_running_loop()
        for chat in chats:
            if chat.agent == agent and chat.running and chat.driver is not None and chat.driver.task is not None:
                chat.driver.closing_reason = reason
                # After the task's first step, not now: a run admitted a moment ago has not started
                # yet, and a task cancelled before its first step never writes its response's end.
                loop.call_soon(chat.driver.task.cancel)
                ended += 1
        return ended

    async def nobody_reads(self, response: Response) -> bool:
        """Whether nobody reads `response` any more. A relay to another replica's browser is given
        the time that replica takes to notice its browser left and say so (cluster/relay.py): the
        same browser's next message may well arrive before that notice does."""
        if response.read_here:
            return False
        if not response.read:
            return True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 2 * self._heartbeat()
        while response.read and not response.closed:
            if response.read_here or loop.time() >= deadline:
                return False
            await asyncio.sleep(_READER_POLL)
        return True

    async def stop_unread(self, driver: RunDriver) -> None:
        """End the run whose response nobody reads, as a WebSocket `abort` does, and wait for it:
        its response ends with `abort`, a call it had open is cancelled, its upstream request is
        closed (ADK then cancels its invocation: docs/protocol.md says what the session keeps)."""
        task = driver.task
        assert task is not None
        driver.aborting = True
        task.cancel()
        log.info("run_aborted", reason="a new message came and nobody reads the response")
        await asyncio.wait((task,), timeout=_CLOSE_TIMEOUT)
        if not task.done():
            log.warning("previous_run_stuck", reason="it did not end after it was cancelled")
        if driver.run.streaming:
            # Its task was cancelled before its first step, or is stuck: nothing else would end the
            # response, and an open response keeps the chat busy for ever.
            now = self._clock()
            driver.apply(driver.turn.abort(now))
            driver.apply(driver.turn.end(now))

    async def settle(self, chat: Chat, answers: list[tuple[ApprovalAnswer, GatedCall]]) -> None:
        """The person typed instead of answering: release what the chat's run waits for, let it end."""
        driver = chat.driver
        if driver is None or driver.task is None:
            return
        # The person did decide where an answer is not implicit; the message carrying it just never went out on its own.
        decided = [(call, answer.approved, answer.reason) for answer, call in answers if not answer.implicit]
        driver.apply(driver.turn.settle(decided, self._clock()))
        try:
            await asyncio.wait_for(asyncio.shield(driver.task), _SETTLE_SECONDS)
        except TimeoutError:
            log.warning("previous_run_cancelled", reason="it did not end after its calls were cancelled")
            driver.task.cancel()
            await asyncio.gather(driver.task, return_exceptions=True)

    async def close(self, reason: str) -> None:
        """Cancel every run still going, each ending with an error chunk saying `reason` (shutdown)."""
        self._closing_reason = reason
        await cancel_and_wait(list(self._tasks), _CLOSE_TIMEOUT, what="runs")
