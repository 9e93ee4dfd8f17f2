"""The life of a gated call: every path ends in exactly one verdict."""

from __future__ import annotations

import pytest

from gateway.core.approvals import REFUSAL_KEY, CallState, GatedCall, Outcome, refusal_code
from gateway.config.schema import ToolPolicy


def make(approval: bool = True, runs_in: str = "server", timeout: float = 10, on_timeout: str = "deny") -> GatedCall:
    policy = ToolPolicy(approval=approval, runs_in=runs_in, timeout=timeout, on_timeout=on_timeout)
    return GatedCall.open(
        user_id="u", chat_id="c", session_id="c", tool_call_id="t1", tool="tool", args={"a": 1}, policy=policy, now=100.0
    )


def test_ids_are_unguessable_and_prefixed() -> None:
    a, b = make(), make()
    assert a.id.startswith("gw-") and a.id != b.id and len(a.id) > 20


def test_approve_lets_a_server_tool_run() -> None:
    call = make()
    assert call.state is CallState.AWAITING_APPROVAL
    assert call.decide(True, now=101)
    assert call.released and call.outcome is Outcome.APPROVED and call.verdict.run


def test_deny_answers_the_call_with_the_reason() -> None:
    call = make()
    assert call.decide(False, now=101, reason="too much")
    assert call.outcome is Outcome.DENIED and not call.verdict.run
    assert "rejected" in call.verdict.response["error"] and "too much" in call.verdict.response["error"]
    assert call.shown_as_denied


def test_only_the_first_decision_counts() -> None:
    call = make()
    call.decide(True, now=101)
    assert not call.decide(False, now=102)
    assert not call.expire(now=1000)
    assert not call.cancel("late")
    assert call.outcome is Outcome.APPROVED


def test_approved_browser_tool_then_waits_for_output_with_a_fresh_deadline() -> None:
    call = make(runs_in="browser")
    call.decide(True, now=105)
    assert call.state is CallState.AWAITING_OUTPUT and call.deadline == 115 and not call.released
    assert call.deliver_output({"lat": 1})
    assert call.verdict.response == {"lat": 1} and call.outcome is Outcome.OUTPUT


def test_browser_output_that_is_not_an_object_is_wrapped() -> None:
    call = make(approval=False, runs_in="browser")
    assert call.state is CallState.AWAITING_OUTPUT
    call.deliver_output([1, 2])
    assert call.verdict.response == {"result": [1, 2]}


def test_browser_error_becomes_an_error_response() -> None:
    call = make(approval=False, runs_in="browser")
    call.deliver_output(error_text="denied by the OS")
    assert call.outcome is Outcome.OUTPUT_ERROR and call.verdict.response == {"error": "denied by the OS"}
    assert not call.shown_as_denied


def test_output_before_approval_is_ignored() -> None:
    call = make(runs_in="browser")
    assert not call.deliver_output({"x": 1})
    assert call.state is CallState.AWAITING_APPROVAL


@pytest.mark.parametrize(("on_timeout", "denied"), [("deny", True), ("error", False)])
def test_timeout_follows_the_policy(on_timeout: str, denied: bool) -> None:
    call = make(on_timeout=on_timeout)
    assert not call.expire(now=109.9)
    assert call.expire(now=110)
    assert call.outcome is Outcome.TIMEOUT and not call.verdict.run
    assert call.shown_as_denied is denied


def test_cancel_is_a_denial_the_browser_sees_as_denied() -> None:
    call = make()
    assert call.cancel("the user moved on")
    assert call.outcome is Outcome.CANCELLED and call.shown_as_denied and "moved on" in call.verdict.response["error"]


def test_verdict_json() -> None:
    call = make()
    call.decide(True, now=101)
    assert call.verdict.as_json() == {"verdict": "run"}
    denied = make()
    denied.decide(False, now=101)
    assert denied.verdict.as_json()["verdict"] == "respond"


def test_abandoned_call_is_released_once_and_later_answers_change_nothing() -> None:
    # The plugin stopped waiting (its long poll ended) and answered ADK itself: nobody will take a verdict.
    call = make()
    assert call.abandon("max_wait")
    assert call.released and call.outcome is Outcome.ABANDONED and not call.verdict.run
    assert not call.shown_as_denied  # the browser sees the plugin's error, not a person's denial
    assert not call.decide(True, now=101) and not call.expire(now=1000) and not call.cancel("late")
    assert not call.abandon("again")
    assert call.outcome is Outcome.ABANDONED


def test_abandon_after_a_verdict_changes_nothing() -> None:
    call = make()
    call.decide(False, now=101)
    assert not call.abandon("max_wait")
    assert call.outcome is Outcome.DENIED


@pytest.mark.parametrize(
    ("end", "code"),
    [
        (lambda c: c.decide(False, now=101), "denied"),
        (lambda c: c.expire(now=1000), "timeout"),
        (lambda c: c.cancel("moved on"), "cancelled"),
        (lambda c: c.abandon("max_wait"), "abandoned"),
    ],
)
def test_every_refusal_carries_the_marker_so_it_is_never_taken_for_a_tool_result(end, code: str) -> None:
    call = make()
    end(call)
    assert refusal_code(call.verdict.response) == code
    assert call.verdict.response[REFUSAL_KEY] == code and isinstance(call.verdict.response["error"], str)


def test_browser_results_are_not_refusals() -> None:
    output, failed = make(approval=False, runs_in="browser"), make(approval=False, runs_in="browser")
    output.deliver_output({"lat": 1})
    failed.deliver_output(error_text="denied by the OS")
    assert refusal_code(output.verdict.response) is None and refusal_code(failed.verdict.response) is None
    assert refusal_code({"error": "a tool's own error"}) is None and refusal_code([1]) is None
    assert refusal_code({"error": "x", REFUSAL_KEY: 3}) is None  # not the contract's shape
