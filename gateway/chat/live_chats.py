"""A live chat's own requests: realtime audio, and the browser socket that drove the chat going away.

In live upstream mode (`upstream.mode: live`) a chat holds an ADK live session (upstream/live.py):
audio is relayed into it, or starts a turn by itself (the person just speaks), and the session is
closed when the browser that drove it left and no turn needs it any more.
"""

from __future__ import annotations

from collections.abc import Callable

from ..config.schema import GatewayConfig
from ..core.chat_events import AudioHeard, RunStarts, SocketClosed
from ..core.chat_outputs import Admission
from ..core.chat_request import InvalidRequest
from ..core.protocol import ClientVersion
from ..upstream.agents import Agent, Agents
from ..upstream.idle_reader import WaitSignal
from .agent_runs import AgentRuns
from .attachment import Attachment
from .chunk_log import Run
from .record import Chat
from .registry import Registry
from .run_tasks import RunTasks

__all__ = ["LiveChats"]

# How long a socket that closes waits for the turn it cancels to end.
_CANCEL_TIMEOUT = 2.0


class LiveChats:
    """The chat service's live requests. `chat`: the chat of (agent, user, chat id), made if new
    (the service's, which applies the per-user cap); `abort`: the service's abort."""

    def __init__(
        self, *, agents: Agents, registry: Registry, runs: AgentRuns, tasks: RunTasks, config: Callable[[], GatewayConfig],
        clock: Callable[[], float], new_id: Callable[[], str], chat: Callable[[Agent, str, str], Chat],
        abort: Callable[[str, str, str], bool],
    ) -> None:
        self._agents = agents
        self._registry = registry
        self._runs = runs
        self._tasks = tasks
        self._config = config
        self._clock = clock
        self._new_id = new_id
        self._chat = chat
        self._abort = abort

    async def send_audio(
        self, agent_name: str, user_id: str, chat_id: str, mime_type: str, data: str, version: ClientVersion
    ) -> Attachment | None:
        """Realtime audio for the chat's live session.

        Audio may start a turn by itself (the person just speaks): then the answer streams into a
        new assistant message, returned here for the caller to follow. During a turn, audio is
        only relayed and None is returned.
        """
        agent = self._agents.need(agent_name)
        if not agent.live:
            raise InvalidRequest("audio needs an agent in live mode (upstream.mode: live)")
        chat = self._chat(agent, user_id, chat_id)
        if chat.machine.settled:
            await self._runs.take_upstream(chat, agent)
        link = await self._runs.live_link(chat)
        blob = {"blob": {"mimeType": mime_type, "data": data}}
        [heard] = chat.handle(AudioHeard(link.in_turn))
        assert isinstance(heard, Admission)
        if heard.action == "relay":
            await link.send(blob)
            return None
        run = Run(self._new_id(), limit=self._config().chat.run_buffer_chunks)
        start = RunStarts(run.message_id, self._clock(), version=version, policy=agent.config.tool_policy)
        return self._tasks.launch(chat, run, start, self._runs.audio_turn(chat, blob), WaitSignal())

    async def socket_closed(self, agent: str, user_id: str, chat_id: str) -> None:
        """The browser socket that drove this chat went away (on this replica or another).

        A live chat's session is a model connection paid for while it is open, so it is not kept
        for a browser that left; but a turn under way outlives the socket, as over `/run_sse`, so
        that a resume on a new socket reads it and an approval it waits on stays answerable: the
        session closes when that turn ends, unless a request of the chat comes first. With
        `chat.on_disconnect: cancel` the turn is cancelled (an `abort` chunk) and the session closed.
        """
        chat = self._registry.find_session(user_id, chat_id)
        if chat is None or chat.agent != agent or not self._runs.live(chat):
            return
        [closed] = chat.handle(SocketClosed(self._config().chat.on_disconnect == "cancel"))
        assert isinstance(closed, Admission)
        if closed.action == "abort":
            self._abort(agent, user_id, chat_id)
            await chat.ended(_CANCEL_TIMEOUT)
            [closed] = chat.handle(SocketClosed(cancel=False))  # a run stuck past the wait closes the session at its end
            assert isinstance(closed, Admission)
        if closed.action == "wait":
            chat.browser_left = True
            return
        await self._runs.close_live(chat)

