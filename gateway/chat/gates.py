"""The plugin's side of a gated tool call: opened here, shown by the chat's turn, waited on here.

The gateway's ADK plugin asks before a gated tool runs (DESIGN.md decision 3b; edge/internal.py takes
the request, cluster/ sends it to the replica that runs the chat). `Gates` answers at once when the
tool is not gated or nobody could answer, else records a `GatedCall` in the chat's ledger, has the
chat's machine show it to the browser, and holds the plugin's request until the chat's machine
releases the call (the person, the browser, a deadline or the end of the run decide:
core/chat_machine.py) and its verdict comes back here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import structlog

from ..upstream.agents import Agents
from ..config.rules import decide
from ..core.approvals import CONFIRM, REFUSAL_KEY, RUN, CallState, GatedCall, Verdict
from ..core.approver_confirmations import ApproverMark, mark
from ..core.chat_events import ApproversDecided, CallCancelled, GateOpened, PluginAsked
from ..core.chat_outputs import AskAnswered
from .notices import Notices
from .record import Chat
from ..config.schema import GatewayConfig
from ..ops.metrics import GatewayMetrics
from .registry import Registry

__all__ = ["Gates"]

log = structlog.get_logger("adk_gateway.chat.gates")


# What the plugin's ask refused at once tells the model, by the machine's reason.
_REFUSALS = {
    "no_browser": "No browser is attached to this session, so nobody can answer; the call was not run.",
    "too_many_pending": "Too many tool calls are already waiting for the user in this chat; the call was not run.",
}


def _refusal(reason: str, text: str) -> Verdict:
    return Verdict(run=False, reason=reason, response={"error": text, REFUSAL_KEY: reason})


class Gates:
    def __init__(
        self, registry: Registry, agents: Agents, metrics: GatewayMetrics, config: Callable[[], GatewayConfig],
        clock: Callable[[], float], notices: Notices,
    ) -> None:
        self._registry = registry
        self._agents = agents
        self._metrics = metrics
        self._config = config
        self._clock = clock
        self._notices = notices
        self._waiters: dict[str, list[asyncio.Future[Verdict]]] = {}

    def now(self) -> float:
        return self._clock()

    def agent_of(self, user_id: str, session_id: str) -> str:
        """The agent of the chat behind an ADK session here ("" when no chat here has it)."""
        chat = self._registry.find_session(user_id, session_id)
        return chat.agent if chat is not None else ""

    def runs_here(self, user_id: str, session_id: str) -> bool:
        """Whether this process is running the chat behind an ADK session right now."""
        chat = self._registry.find_session(user_id, session_id)
        return chat is not None and not chat.machine.settled

    def open(
        self, *, app_name: str, user_id: str, session_id: str, tool_call_id: str, tool: str, args: dict[str, Any],
        announce: bool = True, confirm: bool = False, approvers: bool = False,
    ) -> GatedCall | Verdict:
        """The plugin of ADK app `app_name` asks about a call: a stored call to wait on, or an immediate verdict.

        The tool's rules (config/rules.py) are applied first: a rule's `approve` or `deny` is the
        verdict, shown to the browser as an automatic decision. With `confirm` (the plugin asks
        ADK's confirmation in confirm mode) a person's decision is ADK's to ask: CONFIRM, and
        nothing is recorded here; with `approvers` too (the plugin asks ADK's confirmation with the
        gateway's payload), so is a call its approvers decide: CONFIRM with the mark of who answers
        (core/approver_confirmations.py). With `announce` false the browser is not told yet: the caller
        records the call somewhere first, then calls `announce`.
        """
        agent = self._agents.for_app(app_name)
        if agent is None:
            # An app this gateway does not serve: nobody here can answer for it.
            return _refusal("unknown_agent", f"The gateway serves no agent for ADK app {app_name!r}; the call was not run.")
        policy = agent.tool_policy(tool)
        if not policy.gated:
            return RUN
        chat = self._chat_of(agent.name, user_id, session_id)
        if chat is None:
            return _refusal("no_browser", _REFUSALS["no_browser"])
        opened = GatedCall.open(
            user_id=user_id, chat_id=chat.chat_id, session_id=session_id, tool_call_id=tool_call_id,
            tool=tool, args=args, policy=policy, now=self._clock(),
        )
        if chat.ledger.call(tool_call_id) is None:
            verdict = self._decide_first(opened, agent.name, chat, confirm=confirm, approvers=approvers)
            if verdict is not None:
                return verdict
        [answer, *_] = chat.handle(PluginAsked(opened, self._config().max_pending_approvals_per_chat(agent.name)))
        assert isinstance(answer, AskAnswered)
        if answer.call is None:
            assert answer.refused is not None
            return _refusal(answer.refused, _REFUSALS[answer.refused])
        if answer.call is not opened:
            return answer.call
        call = opened
        if call.verdict is not None:
            log.info("gate_decided_by_rule", approval_id=call.id, tool=tool, rule=call.rule, approved=call.approved)
            return replace(call.verdict, reason="rule")
        self._registry.index_approval(call.id, chat)
        if call.state is CallState.AWAITING_APPROVAL:
            self._metrics.approvals_pending.labels(agent.name).inc()
            self._notices.call_waiting(agent.name, call, chat.span)
        log.info("gate_opened", approval_id=call.id, tool=tool, tool_call_id=tool_call_id, state=call.state.value)
        if announce:
            self.announce(call)
        return call

    def _decide_first(
        self, call: GatedCall, agent: str, chat: Chat, *, confirm: bool, approvers: bool = False,
    ) -> Verdict | None:
        """The tool's rules and its own setting (config/rules.py `decide`, failing closed), then who
        answers what they ask: the call decided by a rule (released), or given its approvers;
        CONFIRM when ADK's confirmation asks instead (marked with its approvers, if any)."""
        policy = call.policy
        if not policy.rules and not policy.approval:
            return CONFIRM if confirm else None  # a browser tool that runs unasked: its output is awaited
        decision = decide(
            policy.rules, args=call.args, tool=call.tool, agent=agent, user=call.user_id, claims=chat.claims,
            default="ask" if policy.approval else "approve", default_asks=policy.asks(None),
        )
        for rule, error in decision.errors:
            log.warning("rule_failed", rule=rule, error=error, decided=decision.decide, by=decision.rule)
        if decision.decide != "ask":
            call.decide_by_rule(decision.decide == "approve", decision.rule, decision.reason)
            return None
        call.rule = decision.rule
        if (spec := decision.asks) is not None:
            if confirm and approvers:
                # ADK's confirmation, in its session, marked with who answers: durable, and the
                # chatting person's answer to it is refused (chat/confirmations.py).
                who = ApproverMark(spec.group, spec.self_approval, spec.quorum, decision.rule)
                return replace(CONFIRM, payload=mark(who))
            # A plugin that cannot mark ADK's confirmation (it does not say `approvers`), or live mode: the
            # plugin waits on this request while the chatting person's stream says whom it waits for.
            call.approvers, call.self_approval, call.quorum = spec.group, spec.self_approval, spec.quorum
            return None
        return CONFIRM if confirm else None

    def find(self, *, app_name: str, user_id: str, session_id: str, tool_call_id: str) -> GatedCall | None:
        """The call the plugin of ADK app `app_name` already asked about for this tool call, if any:
        a repeated ask (the plugin asking again after a replica handed its request back, or after
        its connection was cut) is the same call, not a new one."""
        agent = self._agents.for_app(app_name)
        chat = self._chat_of(agent.name, user_id, session_id) if agent is not None else None
        return chat.ledger.call(tool_call_id) if chat is not None else None

    def _chat_of(self, agent: str, user_id: str, session_id: str) -> Chat | None:
        chat = self._registry.find_session(user_id, session_id)
        # A session id that is another agent's chat is not this app's session.
        return chat if chat is not None and chat.agent == agent else None

    def announce(self, call: GatedCall) -> None:
        """Show the call to the browser (once), asking for approval if it needs one."""
        chat = self._registry.find_session(call.user_id, call.session_id)
        if chat is not None:
            chat.handle(GateOpened(call, self._clock()))  # the machine shows it only in a run under way

    def decide_for_approvers(
        self, *, user_id: str, session_id: str, approval_id: str, approved: bool, reason: str | None,
        deciders: list[dict[str, str]],
    ) -> str:
        """Approvers decided a call through the approvals API (their quorum reached): applied as the
        chatting person's answer would be. `decided`, `already` (released before: a deadline, the
        end of the run) or `gone` (no such call in a chat here)."""
        chat = self._registry.find_session(user_id, session_id)
        call = chat.ledger.by_approval(approval_id) if chat is not None else None
        if chat is None or call is None:
            return "gone"
        if not call.for_approver:
            return "already"
        call.decided_by, call.deciders = "approver", deciders
        chat.handle(ApproversDecided(call, approved, reason, self._clock()))
        return "decided"

    def cancel(self, call: GatedCall, why: str) -> None:
        chat = self._registry.find_session(call.user_id, call.session_id)
        if chat is not None:
            chat.handle(CallCancelled(call, why, self._clock()))

    async def wait(self, call: GatedCall) -> Verdict:
        """The call's verdict, once it is released."""
        if call.verdict is not None:
            return call.verdict
        future: asyncio.Future[Verdict] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(call.id, []).append(future)
        try:
            return await future
        finally:
            waiters = self._waiters.get(call.id)
            if waiters and future in waiters:
                waiters.remove(future)

    def release(self, call: GatedCall) -> None:
        """Deliver a released call's verdict to everyone waiting for it (the chat's machine released it)."""
        assert call.verdict is not None
        for future in self._waiters.pop(call.id, []):
            if not future.done():
                future.set_result(call.verdict)

    def forget(self, chats: list[Chat]) -> None:
        """Chats forgotten as idle: nothing of theirs is open any more."""
        for chat in chats:
            for call in chat.ledger.calls():
                self._waiters.pop(call.id, None)
