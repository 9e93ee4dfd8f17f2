"""The plugin's side of a gated tool call: opened here, shown by the chat's turn, waited on here.

The gateway's ADK plugin asks before a gated tool runs (DESIGN.md decision 3b; edge/internal.py takes
the request, cluster/ sends it to the replica that runs the chat). `Gates` hands the ask to the
chat as `ToolAsked`; the chat's machine has the approvals room decide it (approvals/decision.py:
run, refused, decided by a rule, ADK's confirmation, or a `GatedCall` that waits here, recorded in
the chat's ledger) and `Gates` carries that out: logs, metrics, notices, the approvals index, the
call shown to the browser. It holds the plugin's request on a call that waits until the chat's
machine releases it (the person, the browser, a deadline or the end of the run decide:
core/chat_machine.py) and its verdict comes back here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import structlog

from ..config.agent import ToolPolicy
from ..upstream.agents import Agents
from ..core.approvals import CallState, GatedCall, Verdict
from ..core.chat_events import ApproversDecided, CallCancelled, GateOpened, ToolAsked
from ..core.chat_outputs import GateDecided
from ..approvals.decision import decide_ask, may_be_listed, refuse_ask
from ..approvals.grants import GRANT_RULE_PREFIX, Grant
from ..approvals.ports import GrantScope
from ..approvals.reports import Notices
from .record import Chat
from ..config.schema import GatewayConfig
from ..ops.metrics import GatewayMetrics
from .registry import Registry

__all__ = ["Gates"]

log = structlog.get_logger("adk_gateway.chat.gates")


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

    def timeout(self, app_name: str, tool: str) -> float:
        """How long a call of `tool` of ADK app `app_name` may wait (its policy's timeout)."""
        agent = self._agents.for_app(app_name)
        return (agent.tool_policy(tool) if agent is not None else ToolPolicy()).timeout

    def may_be_listed(self, app_name: str, tool: str, *, confirm: bool) -> bool:
        """Whether the plugin's ask could be listed for the approvals API (approvals/decision.py
        `may_be_listed`): only then does the caller read its user's count for `open`."""
        agent = self._agents.for_app(app_name)
        return agent is not None and may_be_listed(agent.tool_policy(tool), mode=agent.config.upstream.mode, confirm=confirm)

    def runs_here(self, user_id: str, session_id: str) -> bool:
        """Whether this process is running the chat behind an ADK session right now."""
        chat = self._registry.find_session(user_id, session_id)
        return chat is not None and not chat.machine.settled

    def open(
        self, *, app_name: str, user_id: str, session_id: str, tool_call_id: str, tool: str, args: dict[str, Any],
        announce: bool = True, confirm: bool = False, approvers: bool = False, user_waiting: int | None = None,
        grants: tuple[Grant, ...] = (),
    ) -> GatedCall | Verdict:
        """The plugin of ADK app `app_name` asks about a call: a stored call to wait on, or an immediate verdict.

        The chat's machine has the approvals room decide (approvals/decision.py: the tool's rules,
        who answers, the upstream mode); this carries it out. `confirm`: the plugin asks ADK's confirmation in
        confirm mode; `approvers`: it marks that confirmation with who answers (plugin 0.3);
        `user_waiting`: how many approvals the user has listed (the store's count; None: not read);
        `grants`: standing grants that could decide it, a use of each reserved by the caller. With `announce` false the browser is not told yet: the caller records the call somewhere
        first, then calls `announce`.
        """
        agent = self._agents.for_app(app_name)
        if agent is None:
            # An app this gateway does not serve: nobody here can answer for it.
            return refuse_ask("unknown_agent", f"The gateway serves no agent for ADK app {app_name!r}; the call was not run.")
        chat = self._chat_of(agent.name, user_id, session_id)
        ask = ToolAsked(
            tool_call_id=tool_call_id, tool=tool, args=args, policy=agent.tool_policy(tool), agent=agent.name,
            user_id=user_id, chat_id=chat.chat_id if chat is not None else "", session_id=session_id, now=self._clock(),
            claims=chat.claims if chat is not None else {}, confirm=confirm, approvers=approvers,
            mode=agent.config.upstream.mode, max_pending=self._config().max_pending_approvals_per_chat(agent.name),
            user_waiting=user_waiting, max_pending_user=self._config().max_pending_approvals_per_user(agent.name),
            grants=grants,
        )
        # No chat here, no machine to ask: the decision alone (run, or refused: nobody could answer).
        [decided, *_] = chat.handle(ask) if chat is not None else [decide_ask(ask, None)]
        assert isinstance(decided, GateDecided)
        return self._carry_out(decided, ask, chat, announce)

    def _carry_out(self, decided: GateDecided, ask: ToolAsked, chat: Chat | None, announce: bool) -> GatedCall | Verdict:
        """What the machine decided, done: logged (a refusal past the user's cap counted too), and a
        call that waits now indexed, counted, notified and (with `announce`) shown."""
        for rule, error in decided.rule_failed:
            log.warning("rule_failed", rule=rule, error=error, decided=decided.ruled, by=decided.by_rule)
        agent = ask.agent
        for finding in decided.shadow:
            # Never enforced: what the shadow rule would have decided, beside what was (config/shadow_rules.py).
            log.info("policy_shadow", tool=ask.tool, tool_call_id=ask.tool_call_id, rule=finding["rule"],
                     would_decide=finding["would_decide"], decided=decided.ruled, by=decided.by_rule,
                     agreement=finding["agreement"])
            self._metrics.policy_shadow.labels(agent, ask.tool, finding["rule"], finding["agreement"]).inc()
        if decided.verdict is not None and decided.verdict.reason == "too_many_pending_user":
            self._metrics.approvals_over_user_cap.labels(agent).inc()
            log.warning("approval_over_user_cap", tool_call_id=ask.tool_call_id, tool=ask.tool)
        call = decided.call
        if decided.action == "rule":
            assert call is not None and decided.verdict is not None
            log.info("gate_decided_by_rule", approval_id=call.id, tool=call.tool, rule=call.rule, approved=call.approved)
            if call.rule is not None and call.rule.startswith(GRANT_RULE_PREFIX):
                self._metrics.grant_decisions.labels(agent).inc()
            return decided.verdict
        if decided.action != "wait":
            assert decided.verdict is not None
            return decided.verdict
        assert call is not None and chat is not None
        if decided.again:
            return call
        self._registry.index_approval(call.id, chat)
        if call.state is CallState.AWAITING_APPROVAL:
            self._metrics.approvals_pending.labels(agent).inc()
            self._notices.call_waiting(agent, call, chat.span)
        log.info("gate_opened", approval_id=call.id, tool=call.tool, tool_call_id=call.tool_call_id, state=call.state.value)
        if announce:
            self.announce(call)
        return call

    def find(self, *, app_name: str, user_id: str, session_id: str, tool_call_id: str) -> GatedCall | None:
        """The call the plugin of ADK app `app_name` already asked about for this tool call, if any:
        a repeated ask (the plugin asking again after a replica handed its request back, or after
        its connection was cut) is the same call, not a new one."""
        agent = self._agents.for_app(app_name)
        chat = self._chat_of(agent.name, user_id, session_id) if agent is not None else None
        return chat.ledger.call(tool_call_id) if chat is not None else None

    def grant_scope(self, app_name: str, user_id: str, session_id: str) -> GrantScope | None:
        """Where a call of this session stands for its standing grants: its agent, its chat and the
        chatting user's claims (None: no chat here has it, and no grant could decide for it)."""
        agent = self._agents.for_app(app_name)
        chat = self._chat_of(agent.name, user_id, session_id) if agent is not None else None
        return GrantScope(chat.agent, chat.chat_id, chat.claims, self._config().approvers) if chat is not None else None

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
