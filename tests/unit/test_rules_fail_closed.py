"""Rules that cannot be evaluated fail closed (config/rules.py `decide`): never less authority than any
rule that could have matched decides. The arguments come from the model, so a prompt chooses them:
each class of value a condition cannot evaluate is tried against the shipped config's rules, then a
property test compares the walk on an unknown argument with the walk on every value it could have been."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.config.agent import ToolPolicy
from gateway.config.approvers import AskSpec
from gateway.config.rules import RuleDecision, ToolRule, decide
from gateway.config.schema import load_config

SHIPPED = load_config(Path(__file__).parents[2] / "config" / "gateway.yaml", env={"ADK_GATEWAY_SECRET": "s"})
PAYMENT = SHIPPED.agents["demo_agent"].tool_policy("process_payment")
REFUND = SHIPPED.agents["support_agent"].tool_policy("issue_refund")
# A deny cap written before a four-eyes rule: neither may be passed by an argument the rules cannot read.
CAPPED = ToolPolicy.model_validate({"approval": True, "rules": [
    {"name": "cap", "when": "args.amount >= 10000", "decide": "deny", "reason": "Over the cap."},
    {"name": "four_eyes", "when": "args.amount > 100", "decide": "ask", "approvers": "supervisors",
     "self_approval": False, "quorum": 2},
]})

# One of each class of value a numeric condition cannot evaluate, as the model may write it.
UNREADABLE: dict[str, dict[str, Any]] = {
    "a number written as a string": {"amount": "1000000"},
    "a list where a number is expected": {"amount": [1000000]},
    "null where a number is expected": {"amount": None},
    "a map where a number is expected": {"amount": {"value": 1000000}},
    "a bool where a number is expected": {"amount": True},
    "a missing argument": {},
}


def run(policy: ToolPolicy, args: dict[str, Any], *, user: str = "payer") -> RuleDecision:
    """The tool's rules on one call, with the tool's own setting as the default (as the gates apply them)."""
    return decide(policy.rules, args=args, tool="t", agent="a", user=user, claims={},
                  default="ask" if policy.approval else "approve", default_asks=policy.asks(None))


# ---- each class, on the shipped config ----------------------------------------------------------


@pytest.mark.parametrize("args", UNREADABLE.values(), ids=UNREADABLE.keys())
def test_a_payment_the_rules_cannot_read_is_refused_by_the_cap_never_asked_of_the_payer(args: dict[str, Any]) -> None:
    decision = run(PAYMENT, args)
    assert (decision.decide, decision.rule, decision.asks) == ("deny", "too_large", None)
    # The model and the person are told why: the rule could not be evaluated, and its own reason.
    assert decision.reason is not None and "could not be evaluated" in decision.reason
    assert "Payments of 10,000 or more are refused." in decision.reason
    # Both rules read the amount: both are named, with CEL's message, for the log.
    assert [name for name, _ in decision.errors] == ["small", "too_large"]


def test_a_payment_beyond_64_bits_is_read_as_the_number_it_is() -> None:
    # A person reads 2**70 as a huge payment: the cap refuses it by its condition, not by an error.
    assert run(PAYMENT, {"amount": 2**70}) == RuleDecision("deny", "too_large", "Payments of 10,000 or more are refused.")
    assert run(PAYMENT, {"amount": 10**400}).decide == "deny"          # past a double too: infinity
    assert run(PAYMENT, {"amount": 2**64 - 1}).decide == "deny"        # cel-cpp's uint range
    assert run(PAYMENT, {"amount": -(2**70)}) == RuleDecision("approve", "small")
    # Another argument beyond 64 bits no longer makes every condition unevaluable.
    assert run(PAYMENT, {"amount": 50, "reference": 2**70}) == RuleDecision("ask")


def test_a_string_is_never_read_as_a_number() -> None:
    # "3" is not below 5: the approve rule cannot say so, and the cap, which cannot either, refuses.
    decision = run(PAYMENT, {"amount": "3"})
    assert decision.decide == "deny" and decision.rule == "too_large"


def test_not_a_number_is_no_number() -> None:
    # JSON has no NaN, but a parser may let one through: it compares false with everything, so every
    # condition would let it pass. It is read as a value the conditions cannot evaluate.
    assert run(PAYMENT, {"amount": math.nan}).decide == "deny"


def test_a_list_past_cels_iteration_budget_cannot_slip_past_a_deny_rule() -> None:
    lines = ToolPolicy.model_validate({"approval": True, "rules": [
        {"name": "big_line", "when": "args.lines.exists(l, l >= 10000)", "decide": "deny", "reason": "A line is too big."},
    ]})
    assert run(lines, {"lines": [1] * 9_999 + [20_000]}).rule == "big_line"
    # cel-cpp stops a comprehension at 10,000 iterations: past that the condition is an error.
    decision = run(lines, {"lines": [1] * 10_001 + [20_000]})
    assert decision.decide == "deny" and "Iteration budget exceeded" in decision.errors[0][1]


@pytest.mark.parametrize("args", UNREADABLE.values(), ids=UNREADABLE.keys())
def test_a_refund_the_rules_cannot_read_goes_to_the_supervisors_four_eyes(args: dict[str, Any]) -> None:
    decision = run(REFUND, args)
    assert (decision.decide, decision.rule) == ("ask", "large_refund")
    assert decision.asks == AskSpec("supervisors", self_approval=False, quorum=1)
    # A refund the rule can read and is small stays with the chatting user, as before.
    assert run(REFUND, {"amount": 20}) == RuleDecision("ask")


@pytest.mark.parametrize("args", UNREADABLE.values(), ids=UNREADABLE.keys())
def test_a_deny_cap_before_a_four_eyes_rule_refuses_what_neither_can_read(args: dict[str, Any]) -> None:
    assert run(CAPPED, args).decide == "deny"
    assert run(CAPPED, {"amount": 500}) == RuleDecision("ask", "four_eyes", asks=AskSpec("supervisors", False, 2))


def test_an_unevaluable_approve_rule_never_approves() -> None:
    decision = run(PAYMENT.model_copy(update={"rules": PAYMENT.rules[:1]}), {"amount": "3"})
    assert (decision.decide, decision.rule, decision.asks) == ("ask", None, None)
    assert [name for name, _ in decision.errors] == ["small"]


# ---- the walk's definition ------------------------------------------------------------------------


def policy(*rules: dict[str, Any], approval: bool = True, **tool: Any) -> ToolPolicy:
    return ToolPolicy.model_validate({"approval": approval, **tool, "rules": [
        {"reason": "No." if rule["decide"] == "deny" else None, **rule} for rule in rules]})


def test_the_walk_ends_at_the_first_rule_that_holds_and_an_error_before_it_counts() -> None:
    walk = policy({"name": "odd", "when": "args.note.size() > 3", "decide": "ask", "approvers": "g"},
                  {"name": "any", "when": "true", "decide": "approve"},
                  {"name": "never", "when": "args.amount > 0", "decide": "deny"})
    # `odd` cannot read a missing note: it might have matched, so its approvers answer, not `any`.
    decision = run(walk, {"amount": 5})
    assert (decision.decide, decision.rule, decision.asks) == ("ask", "odd", AskSpec("g"))
    assert decision.errors == (("odd", 'Key not found in map : "note"'),)
    # `never`, after the rule that held, is not evaluated at all.
    assert run(walk, {"amount": 5, "note": "hi"}) == RuleDecision("approve", "any")


def test_the_tools_own_approvers_answer_what_the_tool_asks() -> None:
    tool = policy({"name": "small", "when": "args.amount < 5", "decide": "approve"}, approvers="g", self_approval=False)
    assert run(tool, {"amount": 50}) == RuleDecision("ask", asks=AskSpec("g", False, 1))
    assert run(tool, {"amount": "50"}).asks == AskSpec("g", False, 1)
    assert run(tool, {"amount": 1}).decide == "approve"


def test_several_approver_candidates_take_the_first_group_and_the_strictest_keys() -> None:
    tool = policy(
        {"name": "a", "when": "args.x > 1", "decide": "ask", "approvers": "first", "quorum": 2},
        {"name": "b", "when": "args.y > 1", "decide": "ask", "approvers": "second", "self_approval": False, "quorum": 5},
        {"name": "c", "when": "args.z > 1", "decide": "ask", "approvers": "first", "quorum": 3},
        {"name": "d", "when": "true", "decide": "ask"},
    )
    decision = run(tool, {})
    # The first candidate's group; four-eyes if any candidate says so; the largest quorum of that group.
    assert (decision.decide, decision.rule, decision.asks) == ("ask", "a", AskSpec("first", False, 3))
    assert [name for name, _ in decision.errors] == ["a", "b", "c"]


def test_a_deny_candidate_outranks_approvers_and_the_first_deny_decides() -> None:
    tool = policy({"name": "a", "when": "args.x > 1", "decide": "ask", "approvers": "g"},
                  {"name": "b", "when": "args.y > 1", "decide": "deny", "reason": "B."},
                  {"name": "c", "when": "true", "decide": "deny", "reason": "C."})
    decision = run(tool, {})
    assert (decision.decide, decision.rule) == ("deny", "b") and "B." in (decision.reason or "")
    assert run(tool, {"x": 0, "y": 0}) == RuleDecision("deny", "c", "C.")


# ---- the property: never less authority than any value of the unknown argument ---------------------

# Authority, weakest first: what a call's decision lets through.
_APPROVE, _USER, _APPROVERS, _DENY = range(4)


def authority(decision: RuleDecision) -> int:
    if decision.decide == "deny":
        return _DENY
    if decision.decide == "approve":
        return _APPROVE
    return _APPROVERS if decision.asks is not None else _USER


def first_match(rules: list[ToolRule], amount: float, default: str, default_asks: AskSpec | None) -> RuleDecision:
    """The walk on a value every condition can read: the first rule that holds, else the tool's setting."""
    data = {"args": {"amount": amount}, "tool": "t", "agent": "a", "user": "payer", "claims": {}}
    for rule in rules:
        if rule.matches(data) is True:
            return RuleDecision(rule.decide, rule.name, rule.reason, rule.ask_spec)
    return RuleDecision(default, asks=default_asks if default == "ask" else None)  # type: ignore[arg-type]


_OPS = st.sampled_from(["<", "<=", ">", ">="])
_RULE = st.tuples(
    st.sampled_from(["deny", "approvers", "user", "approve"]), _OPS, st.integers(-3, 3) | st.just(None),
    st.sampled_from(["g1", "g2"]), st.booleans(), st.integers(1, 3),
)
_UNREADABLE = st.sampled_from([v["amount"] for v in UNREADABLE.values() if "amount" in v] + ["2", "", math.nan]) | st.text(max_size=3)
_NUMBER = st.integers(-5, 5) | st.floats(-5, 5) | st.integers(2**63, 2**80) | st.integers(-(2**80), -(2**63) - 1)


def _rules(drawn: list[tuple[Any, ...]]) -> list[ToolRule]:
    rules = []
    for at, (kind, op, bound, group, self_approval, quorum) in enumerate(drawn):
        when = "true" if bound is None else f"args.amount {op} {bound}"
        keys: dict[str, Any] = {"decide": "ask" if kind in ("approvers", "user") else kind}
        if kind == "deny":
            keys["reason"] = f"deny {at}"
        if kind == "approvers":
            keys |= {"approvers": group, "self_approval": self_approval, "quorum": quorum}
        rules.append(ToolRule(name=f"r{at}", when=when, **keys))
    return rules


# Every region of the number line these conditions tell apart: each bound, either side of it, and beyond all.
_WITNESSES = [-math.inf, math.inf, *(b + d for b in range(-3, 4) for d in (-0.5, 0, 0.5))]


# As the fuzz suite's profiles (tests/fuzz/harness.py): `ci` (the default) the same 400 cases every run,
# `HYPOTHESIS_PROFILE=full` 5,000 random ones.
_FULL = os.environ.get("HYPOTHESIS_PROFILE") == "full"


@settings(max_examples=5000 if _FULL else 400, deadline=None, derandomize=not _FULL, database=None)
@given(
    drawn=st.lists(_RULE, max_size=5), approval=st.booleans(), tool_group=st.sampled_from([None, "g1", "g2"]),
    value=_UNREADABLE | _NUMBER, missing=st.booleans(),
)
def test_the_requester_never_decides_what_any_value_would_have_denied_or_sent_to_approvers(
    drawn: list[tuple[Any, ...]], approval: bool, tool_group: str | None, value: Any, missing: bool,
) -> None:
    rules = _rules(drawn)
    default = "ask" if approval else "approve"
    default_asks = AskSpec(tool_group) if tool_group and approval else None
    args = {} if missing else {"amount": value}
    decision = decide(rules, args=args, tool="t", agent="a", user="payer", claims={}, default=default,  # type: ignore[arg-type]
                      default_asks=default_asks)
    readable = not missing and isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
    if readable:
        # Nothing unevaluable: exactly the first match, as always (an int beyond 64 bits read as a number).
        assert decision == first_match(rules, float(value), default, default_asks) and not decision.errors
        return
    for witness in _WITNESSES:
        could = first_match(rules, witness, default, default_asks)
        assert authority(decision) >= authority(could), (witness, could, decision)
        if could.asks is not None and decision.asks is not None:
            assert could.asks.self_approval or not decision.asks.self_approval, (witness, could, decision)
            if could.asks.group == decision.asks.group:
                assert decision.asks.quorum >= could.asks.quorum, (witness, could, decision)
    if decision.decide == "approve":
        assert all(first_match(rules, w, default, default_asks).decide == "approve" for w in _WITNESSES)
