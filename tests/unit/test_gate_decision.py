"""Where an approval is decided (approvals/decision.py, sans-IO): what the plugin's ask comes to, by
the tool's rules, what the plugin can do, the upstream mode and what the chat holds."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gateway.config.schema import ToolPolicy
from gateway.core.approvals import CONFIRM, REFUSAL_KEY, RUN, CallState, Outcome
from gateway.core.chat_events import ToolAsked
from gateway.approvals.decision import REFUSALS, ChatView, decide_ask, may_be_listed

# A rule approves small payments, another denies huge ones; the rest the chatting user answers.
PAY = ToolPolicy.model_validate({"approval": True, "rules": [
    {"name": "small", "when": "args.amount < 5", "decide": "approve"},
    {"name": "too_large", "when": "args.amount >= 10000", "decide": "deny", "reason": "Too much."},
]})
# Large refunds wait for a supervisor who is not the requester; the rest the chatting user answers.
REFUND = ToolPolicy.model_validate({"approval": True, "rules": [
    {"name": "large_refund", "when": "args.amount > 100", "decide": "ask", "approvers": "supervisors",
     "self_approval": False},
]})
# The tool's own approvers, no rule.
WIRE = ToolPolicy.model_validate({"approval": True, "approvers": "leads", "quorum": 2})
BROWSER = ToolPolicy(runs_in="browser")
PLAIN = ToolPolicy()

RUNNING = ChatView(run_under_way=True, waiting=0)
# Who answers a large refund, as the plugin marks ADK's confirmation with it.
SUPERVISORS = {"adk_gateway": {"approvers": {
    "approvers": "supervisors", "self_approval": False, "quorum": 1, "rule": "large_refund",
}}}
LEADS = {"adk_gateway": {"approvers": {"approvers": "leads", "self_approval": True, "quorum": 2, "rule": None}}}
TOO_OLD = "This call waits for approvers, which needs adk-gateway-plugin 0.3 or newer on the agent; it was not run."

# The plugins, by what they say when they ask: 0.3 (confirm mode, marks ADK's confirmation), 0.2
# (confirm mode, cannot mark it), and one that holds (live mode; `approvals: hold`; before rules).
V03, V02, HOLDS = {"confirm": True, "approvers": True}, {"confirm": True}, {}


def ask(
    policy: ToolPolicy, amount: Any = 50, *, mode: str = "sse", max_pending: int = 16, user_waiting: int | None = None,
    **plugin: bool,
) -> ToolAsked:
    return ToolAsked(
        "t1", "tool", {"amount": amount}, policy, "agent", "requester", "c", "c", 1.0,
        mode=mode, max_pending=max_pending, user_waiting=user_waiting, max_pending_user=2, **plugin,  # type: ignore[arg-type]
    )


CASES = [
    # (why, policy, amount, plugin, mode, action, what the verdict or the call says)
    ("not gated", PLAIN, 50, V03, "sse", "run", RUN),
    ("a rule approves", PAY, 2, V03, "sse", "rule", "approved"),
    ("a rule denies", PAY, 20000, V03, "sse", "rule", "denied_by_rule"),
    ("a deny rule that cannot be evaluated denies", PAY, "lots", V03, "sse", "rule", "denied_by_rule"),
    ("a rule decides on live too", PAY, 20000, HOLDS, "live", "rule", "denied_by_rule"),
    ("no rule decides: ADK asks the chatting user", PAY, 50, V03, "sse", "confirm", CONFIRM),
    ("no rule decides, plugin 0.2: the same", PAY, 50, V02, "sse", "confirm", CONFIRM),
    ("no rule decides, a plugin that holds: held for the user", PAY, 50, HOLDS, "sse", "wait", None),
    ("approvers on sse: ADK's confirmation, marked", REFUND, 250, V03, "sse", "confirm", SUPERVISORS),
    ("an ask rule that cannot be evaluated: its approvers", REFUND, "5000", V03, "sse", "confirm", SUPERVISORS),
    ("the tool's own approvers on sse: marked", WIRE, 50, V03, "sse", "confirm", LEADS),
    ("approvers on sse, plugin 0.2: refused", REFUND, 250, V02, "sse", "refuse", "plugin_too_old"),
    ("an unevaluable ask rule, plugin 0.2: refused", REFUND, "5000", V02, "sse", "refuse", "plugin_too_old"),
    ("approvers on sse, a plugin that holds: refused", REFUND, 250, HOLDS, "sse", "refuse", "plugin_too_old"),
    ("approvers on live: held here, with them", REFUND, 250, HOLDS, "live", "wait", "supervisors"),
    ("an unevaluable ask rule on live: held for its approvers", REFUND, "5000", HOLDS, "live", "wait", "supervisors"),
    ("below the rule on live: held for the user", REFUND, 50, HOLDS, "live", "wait", None),
    ("a browser tool nobody approves, confirm mode", BROWSER, 50, V03, "sse", "confirm", CONFIRM),
    ("a browser tool nobody approves, held for its output", BROWSER, 50, HOLDS, "live", "wait", None),
]


@pytest.mark.parametrize(("why", "policy", "amount", "plugin", "mode", "action", "expected"), CASES, ids=[c[0] for c in CASES])
def test_what_an_ask_comes_to(
    why: str, policy: ToolPolicy, amount: Any, plugin: dict[str, bool], mode: str, action: str, expected: Any,
) -> None:
    decided = decide_ask(ask(policy, amount, mode=mode, **plugin), RUNNING)
    assert decided.action == action, why
    verdict, call = decided.verdict, decided.call
    if action == "run":
        assert verdict == expected and call is None
    elif action == "confirm":
        assert verdict is not None and verdict.confirm and call is None
        assert verdict.payload == (None if expected is CONFIRM else expected)
    elif action == "refuse":
        assert verdict is not None and not verdict.run and not verdict.confirm and call is None
        assert verdict.reason == expected and verdict.response == {"error": TOO_OLD, REFUSAL_KEY: expected}
    elif action == "rule":
        assert call is not None and call.released and call.decided_by == "rule"
        assert verdict is not None and verdict.reason == "rule" and verdict.run == (expected == "approved")
        if expected != "approved":
            assert verdict.response is not None and verdict.response[REFUSAL_KEY] == expected
    else:
        assert verdict is None and call is not None and not call.released and not decided.again
        assert call.approvers == expected and call.user_id == "requester"
        if expected is not None:
            # Never the requester: four-eyes as the rule says.
            assert (call.rule, call.self_approval, call.for_approver) == ("large_refund", False, True)


@pytest.mark.parametrize("plugin", [V03, V02, HOLDS], ids=["0.3", "0.2", "holds"])
@pytest.mark.parametrize("mode", ["sse", "live"])
def test_a_rule_that_cannot_be_evaluated_never_hands_the_call_to_the_requester(plugin: dict[str, bool], mode: str) -> None:
    """The security pass's worst finding lived here: whatever the plugin and the mode, a refund
    the rule cannot read is never a plain confirmation or a wait the chatting user answers."""
    decided = decide_ask(ask(REFUND, "5000", mode=mode, **plugin), RUNNING)
    assert decided.verdict != CONFIRM
    if decided.action == "confirm":
        assert decided.verdict is not None and decided.verdict.payload == SUPERVISORS
    elif decided.action == "wait":
        assert decided.call is not None and decided.call.for_approver and not decided.call.self_approval
    else:
        assert decided.action == "refuse"
    assert decided.rule_failed and decided.rule_failed[0][0] == "large_refund"
    assert (decided.ruled, decided.by_rule) == ("ask", "large_refund")


def test_rules_that_cannot_be_evaluated_come_back_as_data_whatever_the_outcome() -> None:
    denied = decide_ask(ask(PAY, "lots"), RUNNING)
    assert [rule for rule, _ in denied.rule_failed] == ["small", "too_large"]
    assert (denied.ruled, denied.by_rule) == ("deny", "too_large")
    assert decide_ask(ask(PAY, 50), RUNNING).rule_failed == ()
    # Refused later (no run to show it), the failures still come back.
    assert decide_ask(ask(PAY, "lots"), ChatView(run_under_way=False, waiting=0)).rule_failed == denied.rule_failed


def test_without_a_chat_here_a_gated_call_is_refused_and_an_ungated_one_runs() -> None:
    assert decide_ask(ask(PLAIN), None).verdict == RUN
    refused = decide_ask(ask(PAY, 2, **V03), None)
    assert refused.action == "refuse" and refused.verdict is not None and refused.verdict.reason == "no_browser"


def test_without_a_run_to_show_it_only_what_nobody_here_shows_is_answered() -> None:
    idle = ChatView(run_under_way=False, waiting=0)
    # ADK's confirmation is shown by the run that asks it: answered as on a running chat.
    assert decide_ask(ask(PAY, 50, **V03), idle).verdict == CONFIRM
    for asked in (ask(PAY, 2, **V03), ask(PAY, 50), ask(REFUND, 250, mode="live")):
        decided = decide_ask(asked, idle)
        assert decided.action == "refuse" and decided.verdict is not None and decided.verdict.reason == "no_browser"


def test_over_the_cap_a_call_that_would_wait_is_refused_and_one_a_rule_decided_is_not() -> None:
    full = ChatView(run_under_way=True, waiting=2)
    over = decide_ask(ask(PAY, 50, max_pending=2), full)
    assert over.action == "refuse" and over.verdict is not None and over.verdict.reason == "too_many_pending"
    assert over.verdict.response is not None and over.verdict.response[REFUSAL_KEY] == "too_many_pending"
    assert decide_ask(ask(PAY, 2, max_pending=2), full).action == "rule"
    assert decide_ask(ask(PAY, 50, max_pending=3), full).action == "wait"
    # ADK's confirmation the chatting user answers holds nothing here: no cap.
    assert decide_ask(ask(PAY, 50, max_pending=2, **V02), full).action == "confirm"
    # One its approvers answer fills their inboxes: it counts, with those already waiting for them.
    refused = decide_ask(ask(REFUND, 250, max_pending=2, **V03), full)
    assert refused.action == "refuse" and refused.verdict is not None and refused.verdict.reason == "too_many_pending"
    assert "waiting for approvers" in str(refused.verdict.response)
    some = ChatView(run_under_way=True, waiting=0, approvers_waiting=1)
    assert decide_ask(ask(REFUND, 250, max_pending=2, **V03), some).action == "confirm"
    assert decide_ask(ask(REFUND, 250, max_pending=1, **V03), some).action == "refuse"


def test_an_ask_about_a_call_asked_before_is_that_call_whatever_it_is_now() -> None:
    first = decide_ask(ask(PAY, 50), RUNNING).call
    assert first is not None and first.state is CallState.AWAITING_APPROVAL
    assert first.decide(False, 2.0) and first.outcome is Outcome.DENIED
    again = decide_ask(ask(PAY, 2), ChatView(run_under_way=True, waiting=0, asked_before=first))
    assert again.action == "wait" and again.again and again.call is first and again.rule_failed == ()


def test_a_call_takes_the_approval_id_it_is_given() -> None:
    asked = ToolAsked("t1", "tool", {"amount": 50}, PAY, "agent", "u", "c", "c", 1.0, approval_id="gw-fixed")
    call = decide_ask(asked, RUNNING).call
    assert call is not None and call.id == "gw-fixed" and (call.created, call.deadline) == (1.0, 1.0 + PAY.timeout)


# Asks the approvals API would list (each user's cap counts them), and what each comes to below the cap.
LISTED = [
    ("approvers on sse: ADK's confirmation, marked", ask(REFUND, 250, **V03), "confirm"),
    ("approvers on live: held here", ask(REFUND, 250, mode="live"), "wait"),
    ("held for the chatting user (live)", ask(PAY, 50, mode="live"), "wait"),
    ("held for the chatting user (a plugin that holds)", ask(PAY, 50), "wait"),
]


@pytest.mark.parametrize(("why", "asked", "action"), LISTED, ids=[c[0] for c in LISTED])
def test_past_its_users_cap_an_ask_that_would_be_listed_is_refused(why: str, asked: ToolAsked, action: str) -> None:
    """Was the shell's to decide after the machine (cluster/remote_gate.py `_over_user_cap`): the
    machine said `confirm`, and the shell then refused it."""
    refused = decide_ask(replace(asked, user_waiting=2), RUNNING)
    assert refused.action == "refuse" and refused.call is None, why
    assert refused.verdict is not None and not refused.verdict.run and not refused.verdict.confirm
    assert refused.verdict.reason == "too_many_pending_user"
    assert refused.verdict.response == {"error": REFUSALS["too_many_pending_user"], REFUSAL_KEY: "too_many_pending_user"}
    assert refused.verdict.response["error"] == (
        "The call was cancelled: too many of this user's tool calls are already waiting for approvers "
        "(limits.max_pending_approvals_per_user); the call was not run"
    )
    # Below the cap, or a count the shell could not read (the store down): what it comes to anyway.
    assert decide_ask(replace(asked, user_waiting=1), RUNNING).action == action, why
    assert decide_ask(replace(asked, user_waiting=None), RUNNING).action == action, why
    # The chat's own cap is checked first: its refusal says which cap.
    full = ChatView(run_under_way=True, waiting=16)
    assert decide_ask(replace(asked, user_waiting=2), full).verdict.reason == "too_many_pending"  # type: ignore[union-attr]


def test_past_its_users_cap_what_would_not_be_listed_is_not_refused() -> None:
    over = 5  # the cap is 2
    # ADK's confirmation the chatting user answers (not listed); a rule's decision (nobody waits).
    assert decide_ask(ask(PAY, 50, user_waiting=over, **V03), RUNNING).action == "confirm"
    assert decide_ask(ask(PAY, 2, user_waiting=over, **V03), RUNNING).action == "rule"
    assert decide_ask(ask(PAY, 2, user_waiting=over, mode="live"), RUNNING).action == "rule"
    # A browser tool held for its output (nobody approves it: not listed).
    held = decide_ask(ask(BROWSER, 50, user_waiting=over, mode="live"), RUNNING)
    assert held.action == "wait" and held.call is not None and held.call.state is CallState.AWAITING_OUTPUT
    # The plugin asking again about a call already listed: the same call, not a new listing.
    first = decide_ask(ask(REFUND, 250, mode="live"), RUNNING).call
    again = decide_ask(ask(REFUND, 250, user_waiting=over, mode="live"), ChatView(True, 0, asked_before=first))
    assert again.action == "wait" and again.again and again.call is first


@pytest.mark.parametrize(("policy", "mode", "confirm", "expected"), [
    (PLAIN, "sse", False, False),
    (BROWSER, "live", False, False),  # a browser tool nobody approves waits for its output, unlisted
    (PAY, "sse", True, False),  # the chatting user's ADK confirmations are not listed
    (PAY, "sse", False, True),  # a plugin that holds: held for a person, listed
    (PAY, "live", False, True),
    (REFUND, "sse", True, True),  # a rule names approvers
    (WIRE, "sse", True, True),  # the tool itself names them
])
def test_the_users_count_matters_only_to_an_ask_that_may_be_listed(
    policy: ToolPolicy, mode: str, confirm: bool, expected: bool,
) -> None:
    """The shell reads the user's count from the store only when this says it matters."""
    assert may_be_listed(policy, mode=mode, confirm=confirm) is expected
    # Consistent with the decision: an ask it says cannot be listed is never refused for the count.
    plugin = V03 if confirm else HOLDS
    for amount in (2, 50, 250):
        refused = decide_ask(ask(policy, amount, mode=mode, user_waiting=9, **plugin), RUNNING)
        if not expected:
            assert not (refused.verdict is not None and refused.verdict.reason == "too_many_pending_user")
