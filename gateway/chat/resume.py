"""Resumes: the response a reconnecting browser replays and follows, here or rebuilt from ADK's session.

A resume (`GET /api/chat/{id}/stream`, WebSocket `resume`) reads the chat's last run, if this
replica still has it and it is resumable (chat/chunk_log.py). If it has none (it restarted, never
ran the chat, or forgot it), ADK's session may still hold a message waiting for the person's
answers to its native confirmations: that message is rebuilt (core/rebuild.py) and installed as
the chat's last run, as if its runs had ended here (protocol.md 1.8).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog

from ..config.schema import GatewayConfig
from ..core.chat_events import Resumed
from ..core.protocol import ClientVersion, encode_chunks
from ..core.rebuild import WaitingMessage, waiting_message
from ..ops.metrics import GatewayMetrics
from ..upstream.agents import Agent, Agents
from ..upstream.client import UpstreamError
from .attachment import Attachment
from .chunk_log import Run
from .record import Chat
from .registry import Registry

__all__ = ["Resumes"]

log = structlog.get_logger("adk_gateway.chat.resume")


def _may_wait_unseen(chat: Chat) -> bool:
    """Whether a resume that found nothing to replay in a chat this replica remembers should ask
    ADK's session: the chat has no run (it failed to start), or its last run ended on native
    confirmations still pending here and its message is past the replay's retention."""
    return chat.run is None or chat.machine.waiting_on_adk


class Resumes:
    """The chat service's resumes. `chat`: the chat of (agent, user, chat id), made if new (the
    service's, which applies the per-user cap)."""

    def __init__(
        self,
        *,
        registry: Registry,
        agents: Agents,
        metrics: GatewayMetrics,
        config: Callable[[], GatewayConfig],
        clock: Callable[[], float],
        chat: Callable[[Agent, str, str], Chat],
        adopt: Callable[[Chat], Awaitable[None]],
    ) -> None:
        self._registry = registry
        self._agents = agents
        self._metrics = metrics
        self._config = config
        self._clock = clock
        self._chat = chat
        self._adopt = adopt

    def resume(self, agent: str, user_id: str, chat_id: str) -> Attachment | None:
        """The response to replay and follow for a reconnecting browser; None if there is none."""
        chat = self._registry.find(agent, user_id, chat_id)
        if chat is None or chat.run is None:
            return None
        chat.browser_left = False  # a browser is back (see ChatService.socket_closed)
        # What the run wrote while a person decides is held for the next reader: this one.
        chat.handle(Resumed())
        reader = chat.run.resumable(self._clock(), self._config().chat.run_retention)
        return None if reader is None else Attachment(chat.run, reader)

    async def resume_waiting(
        self, agent_name: str, user_id: str, chat_id: str, version: ClientVersion | None = None
    ) -> Attachment | None:
        """`resume`; and if this replica has no run of the chat (it restarted, never ran it, or
        forgot it), the message ADK's session says waits for the person's answers to its
        confirmations, rebuilt (rebuild.py) for a client of `version` (default: the configured
        one) and read as that message's resume. None: nothing to read."""
        attachment = self.resume(agent_name, user_id, chat_id)
        if attachment is not None:
            return attachment
        agent = self._agents.need(agent_name)
        known = self._registry.find(agent_name, user_id, chat_id)
        seen = None if known is None else known.run
        if agent.live or (known is not None and not _may_wait_unseen(known)):
            return None  # no confirmations in live mode; a run here says all there is
        try:
            # The chat's ADK session id is its chat id, under the caller's own user (registry.py).
            session = await agent.client.session(user_id, chat_id)
        except UpstreamError as exc:
            # A resume is a page's probe at load: nothing to show beats an error on every load.
            self._metrics.upstream_errors.labels(agent.name, exc.kind).inc()
            log.warning("resume_session_unreadable", kind=exc.kind, reason=str(exc))
            return None
        message = waiting_message(session)
        if message is None:
            return None
        chat = self._chat(agent, user_id, chat_id)
        await self._adopt(chat)
        if chat.run is not seen or not chat.machine.settled:
            # A request of the chat got in while ADK answered: that is what a resume follows.
            return self.resume(agent_name, user_id, chat_id)
        return self._rebuilt_run(agent, chat, message, version or self._config().chat.default_protocol)

    def _rebuilt_run(self, agent: Agent, chat: Chat, message: WaitingMessage, version: ClientVersion) -> Attachment | None:
        """Make the rebuilt message the chat's last run, as if its runs had ended here: the
        answer that follows continues it, and a replay of that answer is refused."""
        now = self._clock()
        before = {c.approval_id for c in chat.ledger.pending_native()}
        rebuilt = chat.replay(
            message, now=now, version=version, policy=agent.config.tool_policy, confirms=agent.config.confirms,
        )
        if rebuilt is None:
            log.warning("resume_rebuild_failed", reason="the session's events did not convert")
            return None
        limit = self._config().chat.run_buffer_chunks
        run = Run(rebuilt.message_id, limit=limit)
        for index, response in enumerate(rebuilt.responses):
            if index:
                run.next_response()
            run.browser_added(encode_chunks(response.added))
            run.publish(encode_chunks(response.chunks))
            run.end_response(now)
        chat.run = run
        for pending in rebuilt.pending:
            if pending.approval_id not in before:
                self._metrics.approvals_pending.labels(agent.name).inc()
            log.info("approval_rebuilt", approval_id=pending.approval_id, tool=pending.tool, message_id=run.message_id)
        reader = run.resumable(now, self._config().chat.run_retention)
        return None if reader is None else Attachment(run, reader)
