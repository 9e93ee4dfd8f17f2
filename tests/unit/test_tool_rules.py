"""Rules on a tool call's arguments (config/rules.py): compiled at validation, walked per call, fail closed
(each class of unevaluable argument, and the property, in test_rules_fail_closed.py)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from gateway.config.agent import ToolPolicy
from gateway.config.rules import MAX_CONDITION_CHARS, RuleDecision, ToolRule, decide
from gateway.config.schema import ConfigError, parse_config
from gateway.core.approvals import GatedCall

PAYMENT = {
    "approval": True,
    "timeout": "5m",
    "rules": [
        {"name": "small", "when": "args.amount < 5", "decide": "approve"},
        {"name": "too_large", "when": "args.amount >= 10000", "decide": "deny",
         "reason": "Payments of 10,000 or more are refused."},
    ],
}


def policy(data: dict[str, Any] = PAYMENT) -> ToolPolicy:
    return ToolPolicy.model_validate(data)


def rules(*entries: tuple[str, str, str]) -> list[ToolRule]:
    return [ToolRule(name=name, when=when, decide=outcome, reason="why" if outcome == "deny" else None)  # type: ignore[arg-type]
            for name, when, outcome in entries]


def run(rule_list: list[ToolRule], args: dict[str, Any], *, default: str = "ask", user: str = "alice",
        claims: dict[str, Any] | None = None, tool: str = "process_payment") -> RuleDecision:
    return decide(rule_list, args=args, tool=tool, agent="payments", user=user, claims=claims or {},
                  default=default)  # type: ignore[arg-type]


def problems(tools: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config("internal: {secret: s}\ntools:\n" + tools, source="gateway.yaml", env={})
    return info.value.problems


# ---- the walk ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("amount", "outcome", "rule"), [
    (4, "approve", "small"), (4.5, "approve", "small"), (5, "ask", None), (5.0, "ask", None),
    (50, "ask", None), (9999.99, "ask", None), (10000, "deny", "too_large"), (10000.0, "deny", "too_large"),
])
def test_the_first_rule_that_holds_decides_else_the_tools_setting(amount: float, outcome: str, rule: str | None) -> None:
    # JSON numbers are ints or doubles as the model wrote them; CEL compares the two either way.
    decision = run(policy().rules, {"amount": amount})
    assert (decision.decide, decision.rule, decision.errors) == (outcome, rule, ())
    assert decision.reason == ("Payments of 10,000 or more are refused." if rule == "too_large" else None)


def test_first_match_wins_in_the_order_written() -> None:
    both = rules(("anything", "true", "approve"), ("never", "args.amount > 0", "deny"))
    assert run(both, {"amount": 1}).rule == "anything"
    assert run(list(reversed(both)), {"amount": 1}) == RuleDecision("deny", "never", "why")


def test_no_rule_matching_takes_the_default() -> None:
    assert run([], {}, default="approve") == RuleDecision("approve")
    assert run(rules(("big", "args.amount > 10", "ask")), {"amount": 1}, default="approve") == RuleDecision("approve")


@pytest.mark.parametrize(("args", "error"), [
    ({}, 'Key not found in map : "amount"'),                  # the model left the argument out
    ({"amount": "12"}, "No matching overloads found"),        # a string where a number was meant
    ({"amount": None}, "No matching overloads found"),
])
def test_a_condition_that_cannot_be_evaluated_never_falls_through_to_a_later_approval(args: dict[str, Any], error: str) -> None:
    # `later` would approve every call: `small` might have approved it too, but `too_large`, which
    # cannot read it either, might have refused it, so it is refused.
    walk = [*policy().rules, *rules(("later", "true", "approve"))]
    decision = run(walk, args, default="approve")
    assert (decision.decide, decision.rule) == ("deny", "too_large")
    assert [name for name, _ in decision.errors] == ["small", "too_large"]
    assert all(error in why for _, why in decision.errors)
    # Without the deny rule, `later` decides: what `small` could not read, it could only have approved.
    assert run([*policy().rules[:1], *rules(("later", "true", "approve"))], args).rule == "later"


def test_a_dyn_condition_that_is_not_a_bool_is_an_evaluation_error() -> None:
    flag = rules(("flag", "args.urgent", "ask"))
    assert run(flag, {"urgent": True}).decide == "ask"
    assert run(flag, {"urgent": False}, default="approve") == RuleDecision("approve")
    decision = run(flag, {"urgent": "yes"}, default="approve")
    assert decision == RuleDecision("ask", "flag", errors=(("flag", "the condition gave string, not true or false"),))


def test_arithmetic_mixing_ints_and_doubles_is_an_error_that_says_how_to_write_it() -> None:
    double = rules(("double", "args.amount * 2 > 10", "ask"))
    assert run(double, {"amount": 6}, default="approve").decide == "ask"
    decision = run(double, {"amount": 6.5}, default="approve")
    [(_, error)] = decision.errors
    assert decision.decide == "ask" and "_*_(double, int64)" in error and "double(args.amount)" in error
    assert run(rules(("fixed", "double(args.amount) * 2.0 > 10.0", "approve")), {"amount": 6}).decide == "approve"


def test_an_integer_beyond_int64_is_read_as_a_number_not_a_crash() -> None:
    decision = run(policy().rules, {"amount": 2**70})
    assert (decision.decide, decision.rule, decision.errors) == ("deny", "too_large", ())
    # A computation on it overflows no int: it is a double, and mixing it with an int is CEL's error.
    [(_, error)] = run(rules(("twice", "args.amount * 2 > 10", "ask")), {"amount": 2**70}).errors
    assert "_*_(double, int64)" in error


def test_the_user_the_claims_the_tool_and_the_agent_are_visible() -> None:
    staff = rules(("staff", '"staff" in claims.groups && user == "alice"', "approve"))
    assert run(staff, {}, claims={"groups": ["staff", "ops"]}).decide == "approve"
    assert run(staff, {}, claims={"groups": ["ops"]}).decide == "ask"
    assert run(staff, {}, user="bob", claims={"groups": ["staff"]}).decide == "ask"
    # Without JWT the claims are {}: a rule that reads one fails closed.
    assert run(staff, {}, claims={}).errors == (("staff", 'Key not found in map : "groups"'),)
    named = rules(("here", 'tool == "process_payment" && agent == "payments"', "deny"))
    assert run(named, {}).decide == "deny" and run(named, {}, tool="other").decide == "ask"


def test_nested_arguments_and_the_usual_functions_work() -> None:
    basket = rules(("pricey", "args.items.exists(i, i.price > 100) || args.to.startsWith('XX')", "deny"),
                   ("known", "has(args.note) && size(args.note) < 200", "approve"))
    assert run(basket, {"items": [{"price": 1}, {"price": 200}], "to": "DE"}).rule == "pricey"
    assert run(basket, {"items": [], "to": "XX1"}).rule == "pricey"
    assert run(basket, {"items": [], "to": "DE", "note": "rent"}).rule == "known"
    assert run(basket, {"items": [], "to": "DE"}) == RuleDecision("ask")


# ---- validation --------------------------------------------------------------------------------


def test_a_tool_with_rules_is_gated_even_without_approval() -> None:
    assert policy({"rules": [{"name": "no", "when": "true", "decide": "deny", "reason": "never"}]}).gated
    assert not policy({}).gated


def test_a_condition_that_does_not_compile_is_refused_with_the_rule_and_a_caret() -> None:
    found = problems("  pay:\n    approval: true\n    rules:\n      - {name: small, when: 'args.amount <', decide: approve}\n")
    assert len(found) == 1
    head, snippet, caret = found[0].split("\n")
    assert head.startswith("gateway.yaml: tools.pay.rules[0]: rule small: `when` does not compile: at 1:14: Syntax error")
    assert (snippet, caret) == (" | args.amount <", " | .............^")


def test_an_unknown_variable_is_refused_at_compile_time() -> None:
    found = problems("  pay:\n    rules:\n      - {name: who, when: 'amount < 5', decide: approve}\n")
    assert "rule who: `when` does not compile: at 1:1: undeclared reference to 'amount'" in found[0]


@pytest.mark.parametrize(("when", "gives"), [("args.amount + 1", "int"), ("tool", "string"), ("[1]", "list<int>")])
def test_a_condition_that_is_not_a_bool_is_refused(when: str, gives: str) -> None:
    found = problems(f"  pay:\n    rules:\n      - {{name: odd, when: '{when}', decide: approve}}\n")
    assert found == [f"gateway.yaml: tools.pay.rules[0]: rule odd: `when` must be true or false, but it gives {gives}"]


def test_a_typed_comparison_of_a_double_with_an_int_literal_is_refused_with_the_hint() -> None:
    found = problems("  pay:\n    rules:\n      - {name: odd, when: 'args.amount * 2.0 > 5', decide: approve}\n")
    assert "found no matching overload for '_>_' applied to '(double, int)'" in found[0]
    assert found[0].endswith("write 5.0 rather than 5 there, or convert with double(args.amount)")


def test_a_long_condition_is_refused() -> None:
    fits = " || ".join(["args.amount == 1"] * 100)
    assert len(fits) <= MAX_CONDITION_CHARS
    assert ToolRule(name="long", when=fits, decide="ask").name == "long"
    with pytest.raises(ValueError, match=f"rule long: `when` has 2001 characters, at most {MAX_CONDITION_CHARS}"):
        ToolRule(name="long", when="true" + " " * (MAX_CONDITION_CHARS - 3), decide="ask")


@pytest.mark.parametrize(("rule", "problem"), [
    ({"name": "no", "when": "true", "decide": "deny"}, "rule no: a deny rule needs a `reason`"),
    ({"name": "has space", "when": "true", "decide": "ask"}, "rules[0].name: String should match pattern"),
    ({"name": "x" * 65, "when": "true", "decide": "ask"}, "rules[0].name: String should match pattern"),
    ({"name": "x", "when": "", "decide": "ask"}, "rules[0].when: String should have at least 1 character"),
    ({"name": "x", "when": "true", "decide": "maybe"}, "rules[0].decide: Input should be 'approve', 'deny' or 'ask'"),
    ({"name": "x", "when": "true", "decide": "ask", "whom": ["bob"]}, "rules[0].whom: unknown key"),
    # `approvers` names one group of approvers.groups (tests/unit/test_approvers.py), not people.
    ({"name": "x", "when": "true", "decide": "ask", "approvers": ["bob"]}, "rules[0].approvers: Input should be a valid string"),
])
def test_a_malformed_rule_is_refused(rule: dict[str, Any], problem: str) -> None:
    found = problems(f"  pay:\n    rules: [{json.dumps(rule)}]\n")
    assert any(problem in line for line in found), found


def test_rule_names_are_unique_within_a_tool() -> None:
    found = problems("  pay:\n    rules:\n      - {name: a, when: 'true', decide: ask}\n"
                     "      - {name: a, when: 'false', decide: approve}\n")
    assert found == ["gateway.yaml: tools.pay: rule names must be unique within a tool: a is used more than once"]


def test_rules_on_a_browser_tool_are_refused_for_now() -> None:
    found = problems("  where:\n    runs_in: browser\n    rules:\n      - {name: a, when: 'true', decide: ask}\n")
    assert found == ["gateway.yaml: tools.where: rules on a browser tool are not supported yet (runs_in: browser)"]


def test_rules_make_the_internal_secret_required() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config("tools:\n  pay:\n    rules: [{name: a, when: 'true', decide: ask}]\n", env={})
    assert "internal.secret is required when a tool needs approval, has rules or runs in the browser" in info.value.problems[0]


# ---- a policy as data ----------------------------------------------------------------------------


def test_a_dumped_policy_validates_again_and_decides_the_same() -> None:
    """Ledger snapshots keep a gated call's policy as JSON (GatedCall.as_json) and validate it on restore."""
    again = ToolPolicy.model_validate(json.loads(json.dumps(policy().model_dump(mode="json"))))
    assert again == policy() and again.rules[1].reason == "Payments of 10,000 or more are refused."
    assert run(again.rules, {"amount": 2}).rule == "small"
    call = GatedCall.open(user_id="u", chat_id="c", session_id="c", tool_call_id="t1", tool="process_payment",
                          args={"amount": 50}, policy=policy(), now=0.0)
    restored = GatedCall.from_json(json.loads(json.dumps(call.as_json())))
    assert restored.policy == call.policy and run(restored.policy.rules, {"amount": 20000}).decide == "deny"


def test_policies_compare_and_copy_by_their_fields() -> None:
    """The compiled program is the rule's own: equal rules compare equal, and a deep copy works."""
    assert policy() == policy() and policy() != policy({**PAYMENT, "rules": PAYMENT["rules"][:1]})
    assert copy.deepcopy(policy()) == policy() and policy().model_copy(deep=True) == policy()
    assert run(copy.deepcopy(policy()).rules, {"amount": 1}).decide == "approve"
