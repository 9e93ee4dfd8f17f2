"""A chat's ledger as plain JSON and back (core/ledger.py `snapshot`/`restore`, core/ledger_snapshot.py).

Property-tested: random runs of the ledger's own operations, over a few ids so that they collide,
leave a ledger whose snapshot survives orjson and `restore` unchanged; the restored ledger answers
every question as the original does, shares its calls and confirmations between its maps as the
original does, and goes on in step with it under further operations. Whatever `restore` is given
that `snapshot` could not have written raises `MalformedLedger`, and nothing else, or is a ledger
as coherent as one `snapshot` wrote. Sans-IO: the whole file runs in about a second.
"""

from __future__ import annotations

import math
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.config.agent import ToolPolicy
from gateway.core.approvals import CallState, GatedCall, Outcome, Verdict
from gateway.core.ledger import Ledger, MalformedLedger, NativeConfirmation
from gateway.core.ledger_snapshot import MAX_DEPTH

CALLS = ("t1", "t2")  # tool call ids, few: operations on the same one meet
APPROVALS = ("a1", "a2", "a3")
# Answers name these and two more: answering every id the run could ask would leave none to ask.
ANSWERED = (*APPROVALS, "a4", "a5")
FEW = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

times = st.floats(min_value=0, max_value=2e9, allow_nan=False)
scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=4)
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3), max_leaves=6,
)
json_objects = st.dictionaries(st.text(max_size=3), json_values, max_size=3)
policies = st.builds(
    ToolPolicy, approval=st.booleans(), runs_in=st.sampled_from(["server", "browser"]),
    timeout=st.floats(min_value=0.001, max_value=1e6), on_timeout=st.sampled_from(["deny", "error"]),
    hint=st.none() | st.text(max_size=4), non_blocking=st.booleans(),
)
# The operations take their policies and arguments from a few (drawing them whole costs most of
# the time); `test_a_call_comes_back_exactly` draws them whole.
some_policies = st.sampled_from([
    ToolPolicy(approval=approval, runs_in=runs_in, on_timeout=on_timeout, timeout=timeout, hint=hint)
    for approval in (True, False) for runs_in in ("server", "browser") for on_timeout, timeout, hint in (
        ("deny", 300.0, None), ("error", 0.1 + 0.2, "h\u00e9"),
    )
])
some_args = st.sampled_from([{}, {"amount": 12.5, "to": ["x", None, True]}, {"n": -(2**63), "deep": {"a": [{"b": 1e-300}]}}])
calls, approvals, answered = st.sampled_from(CALLS), st.sampled_from(APPROVALS), st.sampled_from(ANSWERED)
words = st.none() | st.text(max_size=4)

# One operation of the ledger (or of one of its calls or confirmations): a tuple, applied by `apply`;
# with a weight, so that what makes something to act on (a call, a confirmation) is drawn more
# often than what ends it: a run of uniform draws ends nearly every call before it is shown.
WEIGHTED = (
    (3, st.tuples(st.just("add"), calls, approvals, some_policies, some_args, times)),
    (3, st.tuples(st.just("shown"), calls)),
    (2, st.tuples(st.just("expect"), calls, st.booleans())),
    (3, st.tuples(
        st.just("ask"), approvals, calls, st.text(max_size=3), st.booleans(), st.booleans(), st.none() | some_args,
        st.none() | times, st.none() | times,
    )),
    (2, st.tuples(st.just("settle_asked"), times)),
    (2, st.tuples(st.just("approve_in_browser"), approvals, times)),
    (2, st.tuples(st.just("decide"), calls, st.booleans(), times, words)),
    (1, st.tuples(st.just("begin_run"), st.lists(calls, max_size=2), st.lists(calls, max_size=2))),
    (1, st.tuples(st.just("closed"), calls)),
    (1, st.tuples(st.just("answered_unexpectedly"), calls)),
    (1, st.tuples(st.just("deliver_output"), calls, st.none() | st.integers(-(2**63), 2**63) | some_args, words)),
    (1, st.tuples(st.just("expire"), calls, times)),
    (1, st.tuples(st.just("cancel"), calls, st.text(max_size=4))),
    (1, st.tuples(st.just("abandon"), calls, words)),
    (1, st.tuples(st.just("answer_native"), answered, calls)),
    # The same two, of a confirmation that is pending (the n-th, if any): what the person answers.
    (2, st.tuples(st.just("approve_pending"), st.integers(0, 3), times)),
    (1, st.tuples(st.just("answer_pending"), st.integers(0, 3), calls)),
    (1, st.tuples(st.just("time_out_native"), answered)),
)
operations = st.sampled_from([op for weight, op in WEIGHTED for _ in range(weight)]).flatmap(lambda op: op)
runs = st.lists(operations, min_size=8, max_size=40)
short_runs = st.lists(operations, min_size=4, max_size=15)
TRANSITIONS = ("decide", "deliver_output", "expire", "cancel", "abandon")  # of a GatedCall


def apply(ledger: Ledger, op: tuple[Any, ...]) -> None:
    """One operation, as the turn and the chat service make it: a call's transition that releases
    it is followed by `closed`; a call is shown only as the ledger holds it."""
    name, *args = op
    if name == "begin_run":
        ledger.begin_run(denied=args[0], delivered=args[1])
    elif name == "add":
        tool_call_id, approval_id, policy, call_args, now = args
        ledger.add(GatedCall.open(
            user_id="u", chat_id="c", session_id="s", tool_call_id=tool_call_id, tool="pay", args=call_args,
            policy=policy, now=now, approval_id=approval_id,
        ))
    elif name == "expect":
        ledger.expect(args[0], confirmed_by_adk=args[1])
    elif name in ("closed", "answered_unexpectedly"):
        getattr(ledger, name)(args[0])
    elif name == "ask":
        approval_id, tool_call_id, tool, in_browser, approval, native_args, seen_at, approved_wall = args
        ledger.ask(NativeConfirmation(
            approval_id, tool_call_id, tool, in_browser=in_browser, approval=approval, args=native_args, seen_at=seen_at,
            approved_wall=approved_wall,
        ))
    elif name in ("approve_pending", "answer_pending"):
        pending = ledger.pending_native()
        if pending:
            method = ledger.approve_in_browser if name == "approve_pending" else ledger.answer_native
            method(pending[args[0] % len(pending)].approval_id, args[1])
    elif name in ("shown", *TRANSITIONS):
        call = ledger.call(args[0])
        if call is None:
            return
        if name == "shown":
            ledger.shown(call)
        elif getattr(call, name)(*args[1:]) and call.released:
            ledger.closed(call.tool_call_id)
    else:
        getattr(ledger, name)(*args)


def built(ops: list[tuple[Any, ...]]) -> Ledger:
    ledger = Ledger()
    for op in ops:
        apply(ledger, op)
    return ledger


def round_trip(ledger: Ledger) -> Ledger:
    return Ledger.restore(orjson.loads(orjson.dumps(ledger.snapshot())))


def _json(obj: GatedCall | NativeConfirmation | None) -> dict[str, Any] | None:
    return None if obj is None else obj.as_json()


def answers(ledger: Ledger) -> dict[str, Any]:
    """Every question the chat asks of its ledger, over the ids the operations use."""
    found: dict[str, Any] = {
        "waiting": ledger.waiting_for_person, "gates_open": ledger.gates_open, "asking": ledger.asking,
        "unreleased": [c.tool_call_id for c in ledger.unreleased()], "calls": [c.as_json() for c in ledger.calls()],
        "pending": [c.as_json() for c in ledger.pending_native()],
        "awaits_output": [c.awaits_output for c in ledger.pending_native()],
    }
    for t in CALLS:
        call = ledger.call(t)
        found[t] = (
            ledger.concerns(t), ledger.expected(t), ledger.is_open(t), ledger.shown_as_denied(t),
            ledger.answered_in_browser(t), ledger.confirming(t), ledger.answered_of_call(t),
            _json(ledger.native_of_call(t)), _json(call), call is not None and ledger.of_current_run(call),
        )
    for a in ANSWERED:
        found[a] = (
            ledger.knows_native(a), ledger.native_pending(a), ledger.native_answered(a), ledger.native_timed_out(a),
            _json(ledger.by_approval(a)), _json(ledger.native(a)),
        )
    return found


def sharing(ledger: Ledger) -> tuple[Any, ...]:
    """Which maps of the ledger hold the same object: what a copy per map would lose."""
    calls = ledger._calls
    native = ledger._native
    return (
        all(call is calls[t] for t, call in ledger._open.items()),
        all(call is calls[call.tool_call_id] for call in ledger._by_approval.values()),
        [next((a for a, c in native.items() if c is asked), None) for asked in ledger._asking.values()],
        len({id(c) for c in (*ledger._asking.values(), *native.values())}),
    )


def is_plain(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, str)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(is_plain(v) for v in value)
    return isinstance(value, dict) and all(isinstance(k, str) and is_plain(v) for k, v in value.items())


# ---- the round trip ------------------------------------------------------------------------


@FEW
@given(ops=runs)
def test_a_snapshot_is_plain_json_and_restores_to_the_same_ledger(ops: list[tuple[Any, ...]]) -> None:
    ledger = Ledger()
    for op in ops:  # checked after every step: a run ends most of what it starts
        apply(ledger, op)
        snapshot = ledger.snapshot()
        assert is_plain(snapshot)
        assert orjson.loads(orjson.dumps(snapshot)) == snapshot
        restored = round_trip(ledger)
        assert restored.snapshot() == snapshot
        assert answers(restored) == answers(ledger)
        assert sharing(restored) == sharing(ledger)


@FEW
@given(ops=runs, further=runs)
def test_a_restored_ledger_goes_on_in_step_with_the_original(
    ops: list[tuple[Any, ...]], further: list[tuple[Any, ...]]
) -> None:
    ledger = built(ops)
    restored = round_trip(ledger)
    for op in further:
        apply(ledger, op)
        apply(restored, op)
        assert restored.snapshot() == ledger.snapshot()
    assert answers(restored) == answers(ledger)
    assert sharing(restored) == sharing(ledger)


def test_a_restored_ledger_shares_its_calls_and_confirmations_between_its_maps() -> None:
    ledger = Ledger()
    call = ledger.add(GatedCall.open(
        user_id="u", chat_id="c", session_id="s", tool_call_id="t1", tool="pay", args={}, policy=ToolPolicy(approval=True),
        now=1.0, approval_id="a1",
    ))
    ledger.shown(call)
    asked = NativeConfirmation("n1", "t2", "pay", in_browser=True)
    ledger.ask(asked)
    ledger.settle_asked(2.0)  # pending now, and still asked by this run: one object in both maps
    restored = round_trip(ledger)
    assert restored._open["t1"] is restored._calls["t1"] is restored._by_approval["a1"]
    assert restored._asking["t2"] is restored._native["n1"]
    # What moves through one map is seen through the others, as in the original.
    assert restored.approve_in_browser("n1", 3.0) is restored._asking["t2"]
    assert restored._asking["t2"].approved_at == 3.0
    restored.call("t1").decide(False, 4.0)  # type: ignore[union-attr]
    assert restored._open["t1"].released and restored.by_approval("a1").outcome is Outcome.DENIED  # type: ignore[union-attr]


def test_a_ledger_makes_its_maps_at_first_use_and_a_new_run_starts_its_own_empty() -> None:
    # Most chats never gate a call; each kept 13 empty dicts for as long as it was remembered
    # (docs/performance.md, idle SSE stream).
    ledger = Ledger()

    def made() -> set[str]:
        return {name for name in Ledger.__slots__ if _is_made(ledger, name)}

    assert made() == set() and ledger.empty and ledger.next_deadline() is None
    ledger.begin_run(denied=["t9"])
    assert made() == {"_calls", "_native", "_answered", "_timed_out", "_denied"}  # read by `empty`, and the denied
    call = ledger.add(GatedCall.open(
        user_id="u", chat_id="c", session_id="s", tool_call_id="t1", tool="pay", args={}, policy=ToolPolicy(approval=True),
        now=1.0, approval_id="a1",
    ))
    assert ledger.of_current_run(call) and ledger.call("t1") is call
    ledger.begin_run()
    assert not {"_current", "_denied"} & made()
    assert not ledger.of_current_run(call) and ledger.call("t1") is call  # the chat's maps stay
    assert round_trip(ledger).snapshot() == ledger.snapshot()


def _is_made(ledger: Ledger, name: str) -> bool:
    try:
        object.__getattribute__(ledger, name)
    except AttributeError:
        return False
    return True


def test_the_bounded_answers_keep_their_order_and_forget_the_oldest_first_after_a_restore() -> None:
    ledger = Ledger()
    for n in range(300):
        ledger.time_out_native(f"old-{n}")
    restored = round_trip(ledger)
    assert restored.snapshot() == ledger.snapshot()
    assert restored.native_answered("old-44") and not restored.native_answered("old-43")
    for the_ledger in (ledger, restored):
        the_ledger.answer_native("new", "t1")
    assert restored.snapshot() == ledger.snapshot()
    assert not restored.native_answered("old-44") and restored.answered_of_call("t1") == "new"


verdicts = st.builds(Verdict, run=st.booleans(), response=st.none() | json_objects, reason=words)


@FEW
@given(policy=policies, now=times, call_args=json_objects, released=st.none() | st.tuples(verdicts, st.sampled_from(Outcome)))
def test_a_call_comes_back_exactly(
    policy: ToolPolicy, now: float, call_args: dict[str, Any], released: tuple[Verdict, Outcome] | None
) -> None:
    call = GatedCall.open(
        user_id="u", chat_id="c", session_id="s", tool_call_id="t", tool="pay", args=call_args, policy=policy, now=now,
    )
    if released is not None:  # a verdict as the plugin's side may make it too (with a reason)
        call.state, (call.verdict, call.outcome) = CallState.RELEASED, released
    back = GatedCall.from_json(orjson.loads(orjson.dumps(call.as_json())))
    assert (back.created, back.deadline, back.waiting_since, back.policy) == (call.created, call.deadline, call.waiting_since, policy)
    assert (back.state, back.outcome, back.verdict) == (call.state, call.outcome, call.verdict)
    assert back.as_json() == call.as_json()


# ---- what restore refuses ------------------------------------------------------------------


def _valid() -> dict[str, Any]:
    ops: list[tuple[Any, ...]] = [
        ("add", "t1", "a1", ToolPolicy(approval=True), {"x": 1}, 1.0), ("shown", "t1"),
        ("add", "t2", "a2", ToolPolicy(runs_in="browser"), {}, 1.0), ("decide", "t2", True, 2.0, None),
        ("deliver_output", "t2", {"ok": True}, None),
        ("ask", "n1", "t3", "pay", False, True, None, 5.0, 7.0), ("settle_asked", 6.0),
        ("ask", "n2", "t3", "pay", False, True, None, None, None),
        ("answer_native", "n9", "t9"), ("time_out_native", "n8"),
    ]
    return orjson.loads(orjson.dumps(built(ops).snapshot()))


def _set(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    data = _valid()
    target = data
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return data


def _without(*path: Any) -> dict[str, Any]:
    data = _valid()
    target = data
    for step in path[:-1]:
        target = target[step]
    del target[path[-1]]
    return data


MALFORMED = {
    "not an object": [],
    "no version": _without("v"),
    "another version": _set(("v",), 2),
    "a version that is true": _set(("v",), True),
    "a version as text": _set(("v",), "1"),
    "a key missing": _without("seen"),
    "an unknown key": _set(("extra",), []),
    "calls not a list": _set(("calls",), {}),
    "a call missing a field": _without("calls", 0, "deadline"),
    "an unknown state": _set(("calls", 0, "state"), "paused"),
    "an unknown outcome": _set(("calls", 1, "outcome"), "maybe"),
    "released without a verdict": _set(("calls", 1, "verdict"), None),
    "a verdict while waiting": _set(("calls", 0, "verdict"), {"run": True, "response": None, "reason": None}),
    "a policy that does not validate": _set(("calls", 0, "policy", "timeout"), -1),
    "a policy with an unknown key": _set(("calls", 0, "policy", "color"), "red"),
    "a policy that is a list": _set(("calls", 0, "policy"), []),
    "a deadline that is text": _set(("calls", 0, "deadline"), "soon"),
    "a deadline that is true": _set(("calls", 0, "deadline"), True),
    "a deadline that is not finite": _set(("calls", 0, "deadline"), math.inf),
    "args that are a list": _set(("calls", 0, "args"), [1]),
    "args holding a set": _set(("calls", 0, "args"), {"x": {1}}),
    "args holding a non-text key": _set(("calls", 0, "args"), {"x": {1: 2}}),
    "args nested too deep": _set(("calls", 0, "args"), {"x": orjson.loads("[" * MAX_DEPTH + "]" * MAX_DEPTH)}),
    "a call twice": _set(("calls", 1), _valid()["calls"][0]),
    "an open call that is not there": _set(("open",), ["t7"]),
    "an approval naming no call": _set(("by_approval",), ["t1", "t7"]),
    "a current call that is not there": _set(("current",), ["t7"]),
    "a name twice": _set(("seen",), ["t1", "t1"]),
    "a name that is a number": _set(("denied",), [1]),
    "a confirmation position out of range": _set(("asking",), [5]),
    "a confirmation position that is true": _set(("asking",), [True]),
    "a confirmation held by nothing": _set(("asking",), []),
    "a confirmation asked twice": _set(("asking",), [0, 0]),
    "a confirmation pending twice": _set(("native",), [1, 1]),
    "a confirmation missing a field": _without("confirmations", 0, "in_browser"),
    "a confirmation flag that is a number": _set(("confirmations", 0, "approval"), 1),
    "an answer that is not a pair": _set(("answered",), [["n9"]]),
    "an answer twice": _set(("answered",), [["n9", "t1"], ["n9", "t2"]]),
    "more timeouts than are kept": _set(("timed_out",), [f"n{n}" for n in range(257)]),
}


def test_the_valid_snapshot_the_cases_spoil_restores() -> None:
    data = _valid()
    assert data["calls"][1]["outcome"] == "output" and data["asking"] == [0] and data["native"] == [1]
    assert Ledger.restore(data).snapshot() == data


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_snapshot_is_refused(case: str) -> None:
    with pytest.raises(MalformedLedger) as refused:
        Ledger.restore(MALFORMED[case])
    assert isinstance(refused.value, ValueError) and str(refused.value)


REPLACEMENTS = st.sampled_from([
    None, True, False, 0, 1, -1, 2, 1.5, math.nan, math.inf, 10**30, "", "t1", "a1", "released", "output", [], [0], [None],
    ["t1"], {}, {"k": None}, {1: 2}, {"x"},
])


@st.composite
def spoilt(draw: st.DrawFn) -> Any:
    """A valid snapshot with one spot changed: a key dropped, added, a value replaced, a list item
    repeated or dropped; anywhere in the tree."""
    data = orjson.loads(orjson.dumps(built(draw(short_runs)).snapshot()))
    spots: list[Any] = []

    def walk(node: Any) -> None:
        if isinstance(node, (dict, list)):
            spots.append(node)
            for child in node.values() if isinstance(node, dict) else node:
                walk(child)

    walk(data)
    node = draw(st.sampled_from(spots))
    keys = list(node) if isinstance(node, dict) else list(range(len(node)))
    how = draw(st.sampled_from(["drop", "replace", "add", "repeat"]))
    if how == "add" or not keys:
        if isinstance(node, dict):
            node[draw(st.sampled_from(["v", "extra", "id", "open"]))] = draw(REPLACEMENTS)
        else:
            node.append(draw(REPLACEMENTS))
    else:
        key = draw(st.sampled_from(keys))
        if how == "drop":
            del node[key]
        elif how == "replace":
            node[key] = draw(REPLACEMENTS)
        elif isinstance(node, list):
            node.append(node[key])
        else:
            node[key] = [node[key], node[key]]
    return data


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=spoilt())
def test_a_spoilt_snapshot_is_refused_or_restores_to_a_coherent_ledger(data: Any) -> None:
    try:
        restored = Ledger.restore(data)
    except MalformedLedger:
        return
    # Accepted (a value the ledger could hold, a name that is there): then it is a ledger whose
    # snapshot is plain JSON, restores again, and answers every question.
    again = round_trip(restored)
    assert again.snapshot() == restored.snapshot()
    assert answers(again) == answers(restored)
