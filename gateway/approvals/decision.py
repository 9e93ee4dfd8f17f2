"""Where an approval is decided: what the plugin's ask about one tool call comes to (sans-IO).

The gateway's ADK plugin asks before a gated tool runs (DESIGN.md decision 3b). `decide_ask` takes
the ask as the shell read it (`ToolAsked`: the tool, its arguments and policy, the agent, the
chatting user and the claims of their latest request, what the plugin can do, the upstream mode)
and what the chat holds (`ChatView`), and says in one `GateDecided` what happens, in this order:

1. the tool is not gated: it runs;
2. no chat here has the session: refused (`no_browser`), nobody could answer;
3. the plugin asked about this tool call before: the same call (`wait`, `again`);
4. the tool's rules (config/rules.py `decide`, failing closed): a rule's approve or deny decides
   (`rule`), else the ask names who answers: the chatting user, or a group of approvers; a
   standing grant (`ToolAsked.grants`) of whoever that is decides it approved (`rule`
   "grant:<id>", approvals/grants.py `covers`);
5. who answers, by the upstream mode. On `/run_sse` a person's decision is ADK's confirmation
   (`confirm`), kept in ADK's session; one its approvers make carries the gateway's mark of who
   answers (core/approver_confirmations.py), and a plugin that cannot mark it (before 0.3) is
   refused (`plugin_too_old`): held in its request instead, the call would be lost with a replica
   or ADK, and confirmed unmarked, the chatting user would answer for the approvers. On `/run_live`
   (ADK has no confirmation there) the call waits here, held (`wait`), with its approvers set;
6. recording it needs a run of the chat to show it (else `no_browser`) and, unless a rule already
   released it, room under the chat's cap of waiting calls (else `too_many_pending`);
7. an ask the approvals API would list (ADK's confirmation marked for approvers; a call held here
   for a person's approval) needs room under its user's cap of listed approvals, every chat,
   agent and replica together (else `too_many_pending_user`). The shell reads that count from the
   shared store before it asks (`ToolAsked.user_waiting`), only when `may_be_listed` says the ask
   could be listed; a count it could not read (None) refuses nothing.

Rules whose conditions could not be evaluated come back as data (`rule_failed`), for the shell to
log; so does what each shadow rule of the tool would have decided (`shadow`: config/shadow_rules.py),
for the shell to log and count, and on the call (or in ADK's confirmation's payload), for its audit
record. The chat's machine (core/chat_machine.py) takes this decision through its port,
core/gate_decider.py `GateDecider`, which `DECIDER` implements: every chat's machine is handed it
(chat/record.py). The shell calls `decide_ask` alone only when no chat here has the session.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final, Literal

from ..config.agent import ToolPolicy
from ..config.rules import decide
from ..config.shadow_rules import shadowed
from ..core.approvals import CONFIRM, REFUSAL_KEY, RUN, CallState, GatedCall, Verdict
from ..core.approver_confirmations import ApproverMark, mark, marked, with_shadow
from ..core.chat_events import ToolAsked
from ..core.chat_outputs import GateDecided
from ..core.gate_decider import ChatView, GateDecider
from .grants import covers, grant_rule

__all__ = ["DECIDER", "OVER_USER_CAP", "REFUSALS", "ChatView", "decide_ask", "may_be_listed", "refuse_ask"]

# Why a call past its user's cap of listed approvals is refused (the store's own guard cancels a
# held call with it too: cluster/remote_gate.py).
OVER_USER_CAP = (
    "too many of this user's tool calls are already waiting for approvers "
    "(limits.max_pending_approvals_per_user); the call was not run"
)
# What an ask refused at once tells the model, by its reason.
REFUSALS = {
    "no_browser": "No browser is attached to this session, so nobody can answer; the call was not run.",
    "too_many_pending": "Too many tool calls are already waiting for the user in this chat; the call was not run.",
    "plugin_too_old": (
        "This call waits for approvers, which needs adk-gateway-plugin 0.3 or newer on the agent; it was not run."
    ),
    "too_many_pending_user": f"The call was cancelled: {OVER_USER_CAP}",
}


def refuse_ask(reason: str, text: str) -> Verdict:
    """The verdict of an ask refused at once: ADK's `{"error"}` with the refusal's marker."""
    return Verdict(run=False, reason=reason, response={"error": text, REFUSAL_KEY: reason})


def _refused_ask(reason: str, decided: GateDecided | None = None, text: str | None = None) -> GateDecided:
    """Refused at once for `reason`; with what the rules found on the way, if they ran (`decided`)."""
    verdict = refuse_ask(reason, text or REFUSALS[reason])
    return GateDecided("refuse", verdict) if decided is None else replace(decided, action="refuse", verdict=verdict, call=None)


def decide_ask(ask: ToolAsked, chat: ChatView | None) -> GateDecided:
    """What the plugin's `ask` comes to, given the chat that has its session (None: no chat here)."""
    if not ask.policy.gated:
        return GateDecided("run", RUN)
    if chat is None:
        return _refused_ask("no_browser")
    if chat.asked_before is not None:
        # Asked again (a replica handed the plugin's request back, or its connection was cut).
        return GateDecided("wait", call=chat.asked_before, again=True)
    call = GatedCall.open(
        user_id=ask.user_id, chat_id=ask.chat_id, session_id=ask.session_id, tool_call_id=ask.tool_call_id,
        tool=ask.tool, args=dict(ask.args), policy=ask.policy, now=ask.now, approval_id=ask.approval_id,
    )
    first = _first(ask, call)
    if first.action == "confirm" and first.verdict is not None and marked(first.verdict.payload):
        # Approvers' inboxes are the chat's cap's to protect too: what its approvers answer counts
        # with what is held here.
        if chat.waiting + chat.approvers_waiting >= ask.max_pending:
            return _refused_ask("too_many_pending", first, _OVER_CAP_FOR_APPROVERS)
        return _under_user_cap(ask, first)
    if first.action != "wait":
        return first
    if not chat.run_under_way:
        return _refused_ask("no_browser", first)
    if call.released:
        # A rule decided it: nobody waits, so no cap applies; the browser sees the decision.
        assert call.verdict is not None
        return replace(first, action="rule", verdict=replace(call.verdict, reason="rule"))
    if chat.waiting >= ask.max_pending:
        return _refused_ask("too_many_pending", first)
    if call.state is CallState.AWAITING_APPROVAL:
        # Listed for the approvals API as it opens (a browser tool's wait for its output is not).
        return _under_user_cap(ask, first)
    return first


def _under_user_cap(ask: ToolAsked, listed: GateDecided) -> GateDecided:
    """`listed`, an ask the approvals API would list, unless its user has their cap listed already.

    The count is the store's as the shell read it before asking: a parallel ask may have been
    listed since, so the store's capped put stays the guard of a held call (a confirmation is
    listed once ADK's run asked it, when it can no longer be refused: this is its only check)."""
    if ask.user_waiting is not None and ask.user_waiting >= ask.max_pending_user:
        return _refused_ask("too_many_pending_user", listed)
    return listed


def may_be_listed(policy: ToolPolicy, *, mode: str, confirm: bool) -> bool:
    """Whether an ask about a call of a tool with `policy` could be listed for the approvals API,
    so that its user's count of listed approvals matters to `decide_ask` (the shell reads it from
    the store only then): held here (live mode, or a plugin that holds) when a person may have to
    approve it; on `/run_sse` in confirm mode only when its policy names approvers (the chatting
    user's confirmations are not listed)."""
    if not (policy.approval or policy.rules):
        return False
    if mode == "live" or not confirm:
        return True
    return bool(policy.groups())


_OVER_CAP_FOR_APPROVERS = (
    "Too many tool calls are already waiting for approvers in this chat "
    "(limits.max_pending_approvals_per_chat); the call was not run."
)


@dataclass(frozen=True, slots=True)
class _Room:
    """The room's side of the machine's port: the decision above, for a chat's machine."""

    def decide(self, ask: ToolAsked, chat: ChatView) -> GateDecided:
        return decide_ask(ask, chat)


# What every chat's machine is handed (chat/record.py): a value, with nothing to change.
DECIDER: Final[GateDecider] = _Room()


def _first(ask: ToolAsked, call: GatedCall) -> GateDecided:
    """The tool's rules and its own setting, then who answers what they ask: `confirm` (ADK's
    confirmation asks), `refuse`, or `wait` with `call` to record: released by a rule, or given
    its approvers, or for the chatting user (or, a browser tool nobody approves, its output)."""
    policy = call.policy
    confirm = ask.confirm
    if not policy.rules and not policy.approval:
        return GateDecided("confirm", CONFIRM) if confirm else GateDecided("wait", call=call)
    default: Literal["approve", "ask"] = "ask" if policy.approval else "approve"
    ruling = decide(
        policy.rules, args=call.args, tool=call.tool, agent=ask.agent, user=call.user_id, claims=ask.claims,
        default=default, default_asks=policy.asks(None),
    )
    # Shadow rules are never enforced (`ruling` skipped them): what each would have decided rides
    # with the decision, for the shell to log and count and for the call's audit record.
    call.shadow = [finding.as_json() for finding in shadowed(
        policy.rules, ruling, args=call.args, tool=call.tool, agent=ask.agent, user=call.user_id, claims=ask.claims,
        default=default, default_asks=policy.asks(None),
    )]
    waits = GateDecided("wait", call=call, rule_failed=ruling.errors, ruled=ruling.decide, by_rule=ruling.rule,
                        shadow=tuple(call.shadow))
    if ruling.decide != "ask":
        call.decide_by_rule(ruling.decide == "approve", ruling.rule, ruling.reason)
        return waits
    call.rule = ruling.rule
    spec = ruling.asks
    # A plugin that marks confirmations (0.3) asks ADK's with the verdict's payload: the shadow
    # rules' findings go with it, kept in ADK's session for the confirmation's audit record.
    shadow = waits.shadow if ask.approvers else ()
    # A standing grant decides what its granter could have answered (approvals/grants.py); never a
    # browser tool's call, which a decision here cannot hand to the browser.
    grants = ask.grants if policy.runs_in == "server" else ()
    granted = next((grant for grant in grants if covers(grant, spec, call.user_id)), None)
    if granted is not None:
        call.decide_by_rule(True, grant_rule(granted.id), None)
        return waits
    if spec is None:
        confirmed = replace(CONFIRM, payload=with_shadow(None, shadow))
        return replace(waits, action="confirm", verdict=confirmed, call=None) if confirm else waits
    if ask.mode == "live":
        # ADK has no confirmation in live mode: the plugin's request holds the call, and the
        # chatting person's stream says whom it waits for.
        call.approvers, call.self_approval, call.quorum = spec.group, spec.self_approval, spec.quorum
        return waits
    if not (confirm and ask.approvers):
        return _refused_ask("plugin_too_old", waits)
    # ADK's confirmation, in its session, marked with who answers: durable, and the chatting
    # person's answer to it is refused (chat/confirmations.py).
    who = ApproverMark(spec.group, spec.self_approval, spec.quorum, ruling.rule)
    return replace(waits, action="confirm", verdict=replace(CONFIRM, payload=with_shadow(mark(who), shadow)), call=None)
