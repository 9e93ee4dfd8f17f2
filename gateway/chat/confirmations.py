"""Native ADK confirmations, the chat service's bookkeeping of them: which answers still go to ADK, and what each one answered.

A native confirmation ends ADK's run; the person's answer, forwarded in the next run's message,
continues it (DESIGN.md decision 3). Before an answer goes out, `NativeConfirmations` checks it
against the chat's ledger and, for anything not answered here, ADK's session (`unanswered`: a
replay is left out, one ADK lost in a restart is settled here as cancelled); when it goes out, it
records it in the ledger with its wait's metric and log line (`record_answers`). Confirm mode's
browser tools (`upstream.approvals: confirm`) answer theirs with their output (`browser_outputs`),
and an approval alone is handed to the browser to run the tool, with nothing sent to ADK
(`hand_over`): the browser's wait gets its own deadline, the whole timeout from the approval. A
person's answer given after the gateway answered the deadline's reads what followed (`late`).
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from ..config.schema import GatewayConfig
from ..core.browser_confirmations import NAMESPACE, BrowserCalls, handover_chunks, output_answers
from ..core.chat_events import BrowserToolApproved, NativeAnswered
from ..core.chat_request import ApprovalAnswer, ToolOutput, TurnPlan
from ..core.deadlines import Deadline, deadline_key
from ..core.ledger import NativeConfirmation
from ..core.protocol import ClientVersion, encode_chunks
from ..core.chat_outputs import BrowserApproved, NativeSettled, Output
from ..ops.metrics import GatewayMetrics
from ..upstream.agents import Agent, Agents
from ..upstream.client import SessionConfirmations
from .agent_runs import AgentRuns
from .answers import LOST_APPROVAL, NOT_PENDING, ForApprovers, Gone
from .attachment import Attachment, ChatBusy, browser_added, message_so_far
from .chunk_log import Run
from .confirm_timeouts import ConfirmTimeouts
from ..approvals.reports import Notices
from .record import Chat

__all__ = ["NativeConfirmations"]

log = structlog.get_logger("adk_gateway.chat.confirmations")



def settled(outputs: list[Output]) -> NativeConfirmation | None:
    """The confirmation a `NativeAnswered` settled, if it was pending in the chat."""
    return next((o.confirmation for o in outputs if isinstance(o, NativeSettled)), None)

def _refuse_for_approvers(chat: Chat, answers: list[ApprovalAnswer], held: SessionConfirmations | None = None) -> None:
    """Four-eyes and quorums hold only if the chat cannot answer for the approvers: an answer to a
    confirmation its approvers decide (as the chat's ledger or, on a replica that never saw it,
    ADK's session says) is refused whole, whatever else the request carries."""
    for answer in answers:
        known = chat.ledger.native(answer.approval_id)
        asked = held.calls.get(answer.approval_id) if held is not None else None
        if (known is not None and known.for_approvers) or (asked is not None and asked.for_approvers):
            who = known.mark if known is not None and known.mark else asked.mark if asked is not None else None
            log.warning("approval_for_approvers", approval_id=answer.approval_id, approvers=who and who.approvers)
            group = f" ({who.approvers})" if who is not None else ""
            raise ForApprovers(f"this approval is decided by its approvers{group} through the approvals API")


class NativeConfirmations:
    """The native confirmations' side of admission, for the chat service. `settled` is told the
    deadline key of each confirmation answered (the cluster drops its deadline), `kept` the new
    deadline of each browser tool's call approved (the cluster replaces the stored one)."""

    def __init__(
        self,
        *,
        agents: Agents,
        runs: AgentRuns,
        metrics: GatewayMetrics,
        timeouts: ConfirmTimeouts,
        config: Callable[[], GatewayConfig],
        clock: Callable[[], float],
        new_id: Callable[[], str],
        settled: Callable[[str], None],
        kept: Callable[[Deadline], None],
        notices: Notices,
    ) -> None:
        self._agents = agents
        self._runs = runs
        self._metrics = metrics
        self._timeouts = timeouts
        self._config = config
        self._clock = clock
        self._new_id = new_id
        self._settled = settled
        self._kept = kept
        self._notices = notices

    async def unanswered(
        self, chat: Chat, answers: list[ApprovalAnswer], *, strict: bool, held: SessionConfirmations | None = None,
    ) -> list[ApprovalAnswer]:
        """The answers to native confirmations that nobody gave before and ADK still waits for.

        Answered here: left out without asking ADK. Anything else, pending here or unknown (this
        replica restarted, or never ran the chat): ADK's session says, a round trip, as only it knows
        whether it still holds the paused call. An ADK that restarted on in-memory sessions does not,
        and an answer forwarded then fails inside ADK's run; such an answer is refused (`strict`:
        the request carries nothing else to go on with) or left out (a new message, or other
        answers, ride along), and the approval is settled here as cancelled. `held`: ADK's session,
        if the caller fetched it already.
        """
        ledger = chat.ledger
        open_ = [a for a in answers if not ledger.native_answered(a.approval_id)]
        _refuse_for_approvers(chat, open_)
        if held is None:
            held = await self._runs.confirmations(chat) if open_ else SessionConfirmations()
        _refuse_for_approvers(chat, open_, held)
        missing = [a for a in open_ if a.approval_id not in held.asked and a.approval_id not in held.answered]
        # One this chat asked and ADK no longer holds was lost by ADK (a restart on in-memory
        # sessions); one it never asked (another chat's id, or made up) was never this chat's.
        lost = [a for a in missing if ledger.native_pending(a.approval_id)]
        if lost:
            self._lose(chat, lost)
        for answer in missing:
            if not ledger.native_pending(answer.approval_id) and answer not in lost:
                log.warning("native_approval_unknown", approval_id=answer.approval_id, reason="not in the agent's session")
        if missing and strict:
            raise Gone(LOST_APPROVAL if lost else NOT_PENDING)
        # Not answered here meanwhile either (the deadline's answer may have gone while ADK was asked).
        fresh = [
            a for a in open_
            if a.approval_id in held.asked and a.approval_id not in held.answered and not ledger.native_answered(a.approval_id)
        ]
        # Given after the deadline, which nobody answered (the gateway was down then): the timeout's answer goes instead.
        return self._timeouts.too_late(self._agents.need(chat.agent), chat, fresh, held)

    def _lose(self, chat: Chat, answers: list[ApprovalAnswer]) -> None:
        now = self._clock()
        for answer in answers:
            pending = settled(chat.handle(NativeAnswered(answer.approval_id)))
            if pending is not None:
                self.observe_cancelled(chat, pending, now)
            log.warning("native_approval_lost", approval_id=answer.approval_id, reason="not in the agent's session")

    def record_answers(self, chat: Chat, answers: list[ApprovalAnswer]) -> None:
        """The answers going out to ADK now, recorded in the chat's ledger and observed."""
        now = self._clock()
        for answer in answers:
            self._settled(deadline_key(chat.chat_id, answer.approval_id))
            event = NativeAnswered(answer.approval_id, answer.tool_call_id, timed_out=answer.timed_out)
            pending = settled(chat.handle(event))
            if answer.timed_out:
                self._metrics.approval_timeouts.labels(chat.agent, answer.tool_name).inc()
                log.info("approval_timed_out", approval_id=answer.approval_id, tool=answer.tool_name, payload=answer.payload is not None)
            if pending is None:
                # Unknown here (e.g. the gateway restarted): ADK still holds the paused call, so the
                # answer is forwarded anyway; ADK matches it against its own session.
                continue
            if not answer.timed_out and (answer.payload is not None or pending.awaits_output):
                self._record_browser_answer(chat, pending, answer, now)
                continue
            outcome = "timeout" if answer.timed_out else "cancelled" if answer.implicit else ("approved" if answer.approved else "denied")
            self.observe_native(chat, pending, outcome, now, answer.reason, answer.deciders)
            log.info("approval_answered", approval_id=answer.approval_id, tool=pending.tool, outcome=outcome)

    def _record_browser_answer(self, chat: Chat, pending: NativeConfirmation, answer: ApprovalAnswer, now: float) -> None:
        """A browser tool's confirmation answered: by its output or error, or rejected unrun."""
        if answer.payload is None:
            self._observe_browser(chat.agent, pending, "cancelled", now)
            return
        if pending.approval and pending.approved_at is None:
            # Approved where this replica did not see it (the part shows the approval): counted now.
            self.observe_native(chat, pending, "approved", now)
            pending.approved_at = now
        outcome = "error" if "error" in answer.payload.get(NAMESPACE, {}) else "output"
        self._observe_browser(chat.agent, pending, outcome, now)
        log.info("browser_tool_answered", approval_id=answer.approval_id, tool=pending.tool, outcome=outcome)

    def _observe_browser(self, agent: str, confirmation: NativeConfirmation, outcome: str, now: float) -> None:
        # A browser tool's wait for its output, timed as hold mode times it.
        since = confirmation.approved_at or confirmation.asked_at or now
        self._metrics.browser_tool_wait.labels(agent, confirmation.tool, outcome).observe(now - since)

    def observe_cancelled(self, chat: Chat, confirmation: NativeConfirmation, now: float) -> None:
        if confirmation.awaits_output:
            self._observe_browser(chat.agent, confirmation, "cancelled", now)
        else:
            self.observe_native(chat, confirmation, "cancelled", now)

    def observe_native(
        self, chat: Chat, confirmation: NativeConfirmation, outcome: str, now: float, reason: str | None = None,
        deciders: tuple[tuple[str, str], ...] = (),
    ) -> None:
        """A confirmation's approval was decided (the person, its deadline, or nobody any more)."""
        waited = now - (confirmation.asked_at or now)
        self._metrics.approvals_pending.labels(chat.agent).dec()
        metrics = self._metrics
        metrics.approval_wait.labels(chat.agent, confirmation.tool, outcome).observe(waited, metrics.approval_exemplar(confirmation.approval_id))
        self._notices.native_decided(chat.agent, chat.chat_id, chat.user_id, confirmation, outcome, waited, reason, deciders)

    async def browser_outputs(
        self, chat: Chat, agent: Agent, plan: TurnPlan, native: list[ApprovalAnswer], browser: BrowserCalls,
    ) -> tuple[list[ApprovalAnswer], list[ToolOutput], SessionConfirmations | None]:
        """Confirm mode: the browser tools' outputs as answers to their ADK confirmations, with the
        request's other native answers, and the outputs they carry. ADK's session is asked (and
        returned, for the answers' check) only when the chat's ledger does not know a browser
        tool's call or approval the request names (the gateway restarted, or never ran the chat)."""
        mine = [o for o in plan.outputs if chat.ledger.call(o.tool_call_id) is None]  # not a held gate's
        held = None
        if agent.config.upstream.approvals == "confirm" and browser.need_session(mine, native):
            held = await self._runs.confirmations(chat)
            browser.originals = held.originals
        answers, carried = output_answers(mine, browser.of_output)
        if not answers:
            return native, [], held
        taken = {a.approval_id for a in answers}
        return [*answers, *(a for a in native if a.approval_id not in taken)], carried, held

    def hand_over(
        self, chat: Chat, plan: TurnPlan, answers: list[ApprovalAnswer], calls: list[NativeConfirmation],
        version: ClientVersion,
    ) -> Attachment:
        """Approved browser tools go to the browser to run, as hold mode hands them over; ADK hears
        of the approval with their output, so nothing is sent to it and nothing runs meanwhile."""
        free = chat.wanted(free=True, claim=False)  # it replaces the run log, and starts no run
        if free.action != "start":
            raise ChatBusy(free.text)
        message_id = plan.continue_message_id or self._new_id()
        run = Run(message_id, limit=self._config().chat.run_buffer_chunks, earlier=message_so_far(chat, message_id))
        handed = {c.approval_id for c in calls}
        run.browser_added(browser_added(version, [a for a in answers if a.approval_id in handed], []))
        reader = run.current.reader()
        run.publish(encode_chunks(handover_chunks(message_id, calls, version)))
        now = self._clock()
        run.end_response(now)
        chat.run = run
        for call in calls:
            for approved in chat.handle(BrowserToolApproved(call.approval_id, now, self._timeouts.wall(), call)):
                assert isinstance(approved, BrowserApproved)
                pending = approved.confirmation
                if approved.learnt:  # waiting here now, as a restored one is; counted down just below
                    self._metrics.approvals_pending.labels(chat.agent).inc()
                self.observe_native(chat, pending, "approved", now)
                log.info("approval_answered", approval_id=call.approval_id, tool=call.tool, outcome="approved")
                deadline = self._timeouts.approved(chat, pending)
                if deadline is not None:
                    self._kept(deadline)
        return Attachment(run, reader)

    @staticmethod
    def late(chat: Chat) -> Attachment:
        """A person's answer after the gateway answered its confirmation's timeout: as a late
        answer on the blocking path, it reads what followed the timeout if nobody read it yet."""
        run = chat.run
        unread = run.unread() if run is not None else None
        if run is None or unread is None:
            raise Gone("this approval timed out and the agent went on; send a new message to go on")
        return Attachment(run, unread.reader())
