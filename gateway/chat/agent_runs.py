"""How a chat's runs reach ADK: the event stream of one turn, over `/run_sse` or the chat's live session.

`AgentRuns` makes sure the chat's ADK session exists on its agent's upstream, re-creates it once if
the upstream lost it (a restart), and keeps each chat's live session (`/run_live`, upstream/live.py) open
across its turns, while a browser is there to take them: a session whose browser socket closed
mid-turn is closed when that turn ends (a live model connection is paid for while it is open),
and the next turn opens another. The chat reads the events as a list per upstream read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from typing import Any, Final

import structlog

from ..upstream.agents import Agent, Agents
from .record import Batches
from .record import Chat
from ..upstream.idle_reader import WaitSignal
from ..upstream.live import LiveLink
from ..core.chat_request import ApprovalAnswer, confirmation_message
from ..core.rebuild import message_id_state
from ..ops.metrics import GatewayMetrics
from ..upstream.client import AdkClient, SessionConfirmations, UpstreamError
from ..upstream.cut_runs import settle_cut

__all__ = ["AgentRuns"]

log = structlog.get_logger("adk_gateway.chat.agent_runs")

# Upstream errors after which ADK runs nothing of the request: no cut to wait for.
_NOT_RUNNING: Final = frozenset({"session_missing", "connect", "http", "reset"})
# How long the next live turn waits for the end of one that was stopped (the model finishing its
# answer, unread) before it gives up that live session for a new one.
_LIVE_CUT_SECONDS: Final = 10.0


class AgentRuns:
    def __init__(self, agents: Agents, metrics: GatewayMetrics, clock: Callable[[], float]) -> None:
        self._agents = agents
        self.metrics = metrics
        self._clock = clock

    def _client(self, chat: Chat) -> AdkClient:
        if chat.upstream is None:
            chat.upstream = self._agents.need(chat.agent).client
        return chat.upstream

    async def take_upstream(self, chat: Chat, agent: Agent) -> None:
        """Before a turn: move the chat to its agent's current upstream client if a reload changed
        it (the session is checked again there, a live session reopened)."""
        if chat.upstream is agent.client:
            return
        if chat.upstream is not None:
            chat.session_ready = False
            await self.close_live(chat)
        chat.upstream = agent.client

    async def ensure_session(self, chat: Chat) -> None:
        if not chat.session_ready:
            await self._client(chat).ensure_session(chat.user_id, chat.session_id)
            chat.session_ready = True

    async def before_turn(self, chat: Chat) -> None:
        """Before a turn: the chat's ADK session created, unless its upstream creates it with the
        run (`upstream.auto_create_session`; `/run_sse` only, a live session is created first).
        A create that fails here is the request's 502; skipped, a failure to reach the upstream
        is the run's `error` chunk instead."""
        if chat.session_ready or (self._client(chat).auto_creates_sessions and not self.live(chat)):
            return
        await self.ensure_session(chat)

    async def confirmations(self, chat: Chat) -> SessionConfirmations:
        """The native confirmations ADK's session asked and holds answers to (a round trip)."""
        return await self._client(chat).confirmations(chat.user_id, chat.session_id)

    def live(self, chat: Chat) -> bool:
        """Whether the chat's turns run over a live session (its agent is in live mode)."""
        agent = self._agents.get(chat.agent)
        return agent is not None and agent.live

    def turn(
        self, chat: Chat, message: dict[str, Any] | None, native: list[ApprovalAnswer], wait: WaitSignal,
        message_id: str | None = None,
    ) -> Batches:
        """The events of the turn that sends `message` (None: the native answers alone) and writes
        the assistant message `message_id`. Over `/run_sse` ADK's session keeps that id with the
        run (core/rebuild.py reads it back); a live session has no such field, and no rebuild."""
        if self.live(chat):
            return self._live_events(chat, message if message is not None else confirmation_message(native))
        state = None if message_id is None else message_id_state(message_id)
        if native and message is not None:
            return self._after_drain(chat, confirmation_message(native), message, wait, state)
        # No wrapper generator for the usual turn: a held run keeps every frame it stacks.
        return self._events(chat, message if message is not None else confirmation_message(native), wait, state)

    async def _after_drain(
        self, chat: Chat, answers: dict[str, Any], message: dict[str, Any], wait: WaitSignal,
        state: dict[str, Any] | None,
    ) -> Batches:
        # The person typed instead of answering: settle ADK's paused calls first, out of sight.
        await self._drain(chat, answers)
        del answers
        async for batch in self._events(chat, message, wait, state):
            yield batch
            batch = None  # type: ignore[assignment]  # a held run keeps no spent batch

    async def _events(
        self, chat: Chat, message: dict[str, Any], wait: WaitSignal | None, state: dict[str, Any] | None = None,
    ) -> Batches:
        """The run's events, a list per upstream read, re-creating the ADK session once if the
        upstream lost it (a restart). `state`: the run's `state_delta`. Not before ADK finished
        writing the chat's previous run, if the gateway cut that one (upstream/cut_runs.py); a
        stream this run leaves before its end is such a cut."""
        if chat.upstream_cut:
            await self._after_cut(chat)
        started = self._clock()
        first = True
        for attempt in (1, 2):
            ended = False
            try:
                async for batch in self._client(chat).run_sse_batches(
                    user_id=chat.user_id, session_id=chat.session_id, new_message=message, wait=wait,
                    state_delta=state,
                ):
                    if first:
                        self.metrics.upstream_first_event.labels(chat.agent).observe(self._clock() - started, self.metrics.exemplar())
                        first = False
                        message = {}  # never sent again once events came: a held run keeps no message
                        chat.session_ready = True  # created here, or by the server with the run
                    yield batch
                    batch = None  # type: ignore[assignment]  # a held run keeps no spent batch
                ended = True
                return
            except UpstreamError as exc:
                # ADK never ran what it refused before streaming, nor what it reset itself.
                ended = exc.kind in _NOT_RUNNING
                if exc.kind != "session_missing" or attempt == 2 or not first:
                    raise
                self.metrics.upstream_errors.labels(chat.agent, exc.kind).inc()
                client = self._client(chat)
                if not chat.session_ready and client.auto_creates_sessions:
                    # The session was left to the server, which did not create it: it runs without
                    # `--auto_create_session`. Its chats create their sessions first from now on.
                    client.auto_creates_sessions = False
                    log.warning(
                        "upstream_does_not_create_sessions",
                        reason="upstream.auto_create_session is set but the ADK server answered 404; sessions are created first from now on",
                    )
                else:
                    log.info("session_recreated", reason="upstream lost the session")
                chat.session_ready = False
                await self.ensure_session(chat)
            finally:
                # Cancelled, timed out, a bad event: the stream was left open, ADK's run goes on
                # until it notices, and then writes its end into the session.
                chat.upstream_cut = chat.upstream_cut or not ended

    async def _after_cut(self, chat: Chat) -> None:
        """Wait (bounded) until ADK has finished writing the run the gateway cut; then the next may go."""
        # The loop's clock, not the service's: this wait is real time, whatever clock deadlines read.
        client, clock = self._client(chat), asyncio.get_running_loop().time
        started = clock()
        try:
            settled = await settle_cut(partial(client.session, chat.user_id, chat.session_id), clock=clock)
        except UpstreamError as exc:
            # Unreachable, or answering errors: the run that follows meets it and says so.
            log.warning("previous_run_unsettled", reason=f"the session could not be read: {exc}")
        else:
            waited = round(clock() - started, 3)
            if settled:
                log.info("previous_run_settled", waited_s=waited)
            else:
                log.warning("previous_run_unsettled", reason="ADK was still writing the cut run", waited_s=waited)
        chat.upstream_cut = False

    async def _drain(self, chat: Chat, message: dict[str, Any]) -> None:
        async for batch in self._events(chat, message, None):
            for event in batch:
                if "error" in event and "author" not in event:
                    log.warning("implicit_rejection_failed", reason=str(event.get("error")))
                usage = event.get("usageMetadata")
                if usage and not event.get("partial"):
                    # The model answers the rejections out of sight, but its tokens are spent all the same.
                    self.metrics.count_tokens(chat.agent, event.get("modelVersion") or "", usage)

    async def _live_events(self, chat: Chat, message: dict[str, Any] | None) -> Batches:
        """One live turn's events, a list per wake-up; `message` is the user's content (None: the
        turn is already under way)."""
        link = await self._settled_link(chat)
        started = self._clock()
        first = True
        try:
            async for batch in link.turn_batches({"content": message} if message is not None else None):
                if first:
                    self.metrics.upstream_first_event.labels(chat.agent).observe(self._clock() - started, self.metrics.exemplar())
                    first = False
                yield batch
        finally:
            await self._turn_ended(chat)

    async def audio_turn(self, chat: Chat, blob: dict[str, Any]) -> Batches:
        """The live turn that the person's speech starts."""
        link = await self._settled_link(chat)
        try:
            async for batch in link.turn_batches(blob):
                yield batch
        finally:
            await self._turn_ended(chat)

    async def _turn_ended(self, chat: Chat) -> None:
        # The browser left during the turn and has not come back: the session was kept only so the
        # turn (and any approval it waited on) could end and be resumed; nobody is there to speak next.
        if chat.browser_left:
            chat.browser_left = False
            await self.close_live(chat)
            log.info("live_session_released", reason="the browser socket closed during the turn")

    async def _settled_link(self, chat: Chat) -> LiveLink:
        """The chat's live session, once a turn left before its end there has ended (upstream/live.py);
        one that does not end in time is closed and another opened: the next answer is its own."""
        link = await self.live_link(chat)
        if not await link.settle(_LIVE_CUT_SECONDS):
            log.warning("live_turn_unsettled", reason="the stopped live turn did not end; the live session is opened again")
            await self.close_live(chat)
            link = await self.live_link(chat)
        return link

    async def live_link(self, chat: Chat) -> LiveLink:
        if chat.live is not None and chat.live.alive:
            return chat.live
        await self.ensure_session(chat)
        modalities = list(self._agents.need(chat.agent).config.upstream.live_modalities)
        connection = await self._client(chat).open_live(
            user_id=chat.user_id, session_id=chat.session_id, modalities=modalities
        )
        sessions = self.metrics.live_sessions.labels(chat.agent)
        sessions.inc()
        chat.live = LiveLink(connection, on_closed=sessions.dec)
        log.info("live_session_opened")
        return chat.live

    async def close_live(self, chat: Chat) -> None:
        link, chat.live = chat.live, None
        if link is not None:
            await link.close()
            log.info("live_session_closed", dropped_events=link.dropped)
