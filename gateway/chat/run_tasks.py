"""The chat runs going on in this replica, each an asyncio task driving its turn: started, and every way one ends early.

A run outlives the browser request that started it (chat/record.py). `RunTasks` starts its task
through the chat (`launch`), tells the chat service when it ends, and ends runs before their time: the browser's
abort, a new message in a chat whose response nobody reads any more (`stop_unread`, as an abort)
or whose run waits for a person (`settle`: what it waits for is released, then up to 10 s for it
to end), an agent a reload removed (`end_agent`), a shutdown (`close`). Each tells the chat's
machine how the run ends (an abort, or the gateway closing it with a sentence) before its task is
cancelled: what the cancellation then writes is the machine's (core/run_ending.py), not a flag here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from ..core.approvals import GatedCall
from ..core.chat_events import RunStarts, Settled
from ..core.chat_request import ApprovalAnswer
from ..ops.stopping import cancel_and_wait
from ..upstream.idle_reader import WaitSignal
from .record import Batches
from .attachment import Attachment
from .chunk_log import Reader, Run
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

    def __len__(self) -> int:
        return len(self._tasks)

    def launch(
        self, chat: Chat, run: Run, start: RunStarts, batches: Batches, wait: WaitSignal, reader: Reader | None = None
    ) -> Attachment:
        """Start the chat's run writing `run` (the chat has none under way): its task outlives
        the request, which reads its first response through `reader` (one is taken if not given)."""
        chat.run = run
        task = chat.start(run, start, batches, wait)
        # One bound callback, not a coroutine around the drive or a closure: a held run keeps them.
        self._tasks[task] = chat
        task.add_done_callback(self._run_done)
        self._started(chat, run.message_id)
        return Attachment(run, reader or run.current.reader())

    def _run_done(self, task: asyncio.Task[None]) -> None:
        chat = self._tasks.pop(task, None)
        if chat is not None:
            self._ended(chat)

    @staticmethod
    def abort(chat: Chat) -> bool:
        """The browser stopped the response: cancel the agent run behind it. True if one was running."""
        if not chat.abort():
            return False
        log.info("run_aborted", chat_id=chat.chat_id)
        return True

    @staticmethod
    def end_agent(chats: list[Chat], agent: str, reason: str) -> int:
        """End the runs of `agent` among `chats`: each ends with an error chunk saying `reason`.
        Returns how many."""
        return sum(1 for chat in chats if chat.agent == agent and chat.close_soon(reason))

    async def somebody_reads(self, chat: Chat) -> bool:
        """Whether somebody reads the chat's response still being written (False when none is):
        the fact the chat's machine decides busy on (`RunWanted`)."""
        run = chat.run
        if run is None or run.current.closed:
            return False
        if not await self.nobody_reads(run.current):
            return True
        # Another request took the chat while this one waited for a relayed reader: its response counts now.
        return chat.run is not run and await self.somebody_reads(chat)

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

    @staticmethod
    async def stop_unread(chat: Chat) -> None:
        """End the run whose response nobody reads, as a WebSocket `abort` does, and wait for it:
        its response ends with `abort`, a call it had open is cancelled, its upstream request is
        closed (ADK then cancels its invocation: docs/protocol.md says what the session keeps)."""
        log.info("run_aborted", reason="a new message came and nobody reads the response")
        await chat.stop(_CLOSE_TIMEOUT)

    async def settle(self, chat: Chat, answers: list[tuple[ApprovalAnswer, GatedCall]]) -> None:
        """The person typed instead of answering: release what the chat's run waits for, let it end."""
        # The person did decide where an answer is not implicit; the message carrying it just never went out on its own.
        decided = [(call, answer.approved, answer.reason) for answer, call in answers if not answer.implicit]
        chat.handle(Settled(decided, self._clock()))
        if not await chat.ended(_SETTLE_SECONDS):
            log.warning("previous_run_cancelled", reason="it did not end after its calls were cancelled")
            await chat.stop(_CLOSE_TIMEOUT, how="cancel")

    async def close(self, reason: str) -> None:
        """Cancel every run still going, each ending with an error chunk saying `reason` (shutdown)."""
        chats = list(self._tasks.values())
        for chat in chats:
            # Told first: a run already being ended (aborted, its agent removed) keeps its own end.
            chat.end_asked("cancel", reason)
        await cancel_and_wait(list(self._tasks), _CLOSE_TIMEOUT, what="runs")
        for chat in chats:
            # A task stuck past the bound: its run still ends, for its machine and its readers.
            await chat.stop(0, how="cancel", reason=reason)
