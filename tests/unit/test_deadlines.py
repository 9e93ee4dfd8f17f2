"""The one deadline queue's deadlines (gateway/core/deadlines.py): the rule of ADK confirmations, a
chat's held calls' kind, and the queue. Sans-IO, so milliseconds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.core.deadlines import (
    BROWSER_TIMEOUT_ERROR,
    HELD,
    TIMEOUT_ERROR,
    Deadline,
    DeadlineQueue,
    MalformedDeadline,
    asked_at,
    due_at,
    passed,
    timeout_payload,
)

times = st.floats(min_value=1.6e9, max_value=2.2e9, allow_nan=False)
timeouts = st.floats(min_value=0.001, max_value=1e6, allow_nan=False)


def deadline(key: str = "a", due: float = 10.0) -> Deadline:
    return Deadline("pay", "u1", "chat-" + key, "adk-" + key, "call-" + key, "process_payment", due)


def test_asked_at_is_the_later_of_adk_and_first_sight() -> None:
    assert asked_at(100.0, None) == 100.0
    assert asked_at(None, 105.0) == 105.0
    assert asked_at(100.0, 105.0) == 105.0
    # ADK's clock ahead of the gateway's: ADK's time counts, the person loses nothing.
    assert asked_at(110.0, 105.0) == 110.0
    assert asked_at(None, None) is None


@given(adk=st.none() | times, seen=st.none() | times, timeout=timeouts, now=times)
def test_a_deadline_never_passes_before_the_timeout_from_either_sight(
    adk: float | None, seen: float | None, timeout: float, now: float
) -> None:
    due = due_at(asked_at(adk, seen), timeout)
    if adk is None and seen is None:
        assert due is None and not passed(due, now)
        return
    assert due is not None
    for sight in (adk, seen):
        if sight is not None and now < sight + timeout:
            assert not passed(due, now)
    assert passed(due, due) and passed(due, due + 1)


@given(asked=times, timeout=timeouts, share=st.floats(min_value=0, max_value=1), now=times)
def test_an_approved_browser_tools_deadline_gives_the_browser_the_whole_timeout(
    asked: float, timeout: float, share: float, now: float
) -> None:
    """Hold mode starts a fresh deadline for the browser's wait when the person approves: so does
    confirm mode, an approval at second 295 of 300 leaves the browser 300 s, not 5."""
    approved = asked + share * timeout
    due = due_at(asked, timeout, approved)
    assert due == approved + timeout
    assert passed(due, approved + timeout) and (now >= approved + timeout or not passed(due, now))
    # Never earlier than the wait for the approval, whichever clock ran ahead.
    assert due_at(asked, timeout, asked - 5.0) == asked + timeout
    assert due_at(None, timeout, approved) is None  # an ask of unknown time has no deadline


def test_no_timeout_no_deadline() -> None:
    assert due_at(100.0, None) is None
    assert not passed(None, 1e12)


def test_the_answer_to_a_timeout_follows_on_timeout() -> None:
    assert timeout_payload("deny") is None
    assert timeout_payload("error") == {"adk_gateway": {"error": TIMEOUT_ERROR}}
    assert TIMEOUT_ERROR.startswith("Timed out waiting for approval; ")


def test_the_timeout_of_an_approved_browser_tool_names_the_browsers_wait_as_hold_mode_does() -> None:
    assert timeout_payload("error", approved=True) == {"adk_gateway": {"error": BROWSER_TIMEOUT_ERROR}}
    assert BROWSER_TIMEOUT_ERROR == "Timed out waiting for the browser; the call was not run."
    assert timeout_payload("deny", approved=True) is None


@given(st.builds(Deadline, st.text(min_size=1), st.text(min_size=1), st.text(min_size=1), st.text(min_size=1),
                 st.text(min_size=1), st.text(min_size=1), times))
def test_a_deadline_round_trips_through_json(d: Deadline) -> None:
    assert Deadline.from_json(d.to_json()) == d


@given(st.builds(Deadline, st.text(min_size=1), st.text(min_size=1), st.text(min_size=1), st.text(min_size=1),
                 st.text(min_size=1), st.text(min_size=1), times, st.none() | times))
def test_a_deadline_keeps_its_approval_time_through_json(d: Deadline) -> None:
    """The replica that took a browser tool's approval is the only one that knows it: the stored
    deadline carries it to whichever replica answers it."""
    assert Deadline.from_json(d.to_json()) == d


@given(st.builds(Deadline, st.text(min_size=1), st.text(min_size=1), st.text(min_size=1), st.text(min_size=1),
                 st.text(min_size=1), st.text(min_size=1), times, st.none(), st.sampled_from(["confirmation", "held"])))
def test_a_deadline_keeps_its_kind_through_json(d: Deadline) -> None:
    assert Deadline.from_json(d.to_json()) == d


def test_a_stored_deadline_without_a_kind_opens_as_a_confirmation() -> None:
    """Written before held calls had their deadline in the queue (a replica of the release before,
    during a rolling upgrade): exactly what was stored then still opens, as a confirmation."""
    stored = (
        b'{"agent":"pay","user":"u1","chat":"chat-a","approval_id":"adk-a","tool_call_id":"call-a",'
        b'"tool":"process_payment","due":10.0,"approved_at":null}'
    )
    opened = Deadline.from_json(stored)
    assert opened == deadline() and opened.kind == "confirmation" and not opened.held
    assert opened.key == "chat-a/adk-a"
    assert deadline().to_json().encode() == stored  # and a confirmation is stored as it was


def test_a_chats_held_calls_have_one_deadline_keyed_by_the_chat() -> None:
    held = Deadline("pay", "u1", "chat-a", "gw-1", "call-a", "process_payment", 10.0, kind=HELD)
    later = Deadline("pay", "u1", "chat-a", "gw-2", "call-b", "process_payment", 20.0, kind=HELD)
    assert held.held and held.key == later.key == "chat-a/held" != deadline().key
    assert '"kind":"held"' in held.to_json()
    queue = DeadlineQueue()
    queue.add(held)
    queue.add(later)  # the chat's next deadline moved: it replaces the one before
    assert len(queue) == 1 and queue.next_due() == 20.0


@pytest.mark.parametrize("raw", [b"", b"[]", b"{}", b'{"agent":"a"}', b"not json",
                                 deadline().to_json().replace('"pay"', '""').encode(),
                                 deadline().to_json().replace("10.0", '"10"').encode(),
                                 deadline().to_json().replace("10.0", "true").encode(),
                                 deadline().to_json().replace('"approved_at":null', '"approved_at":"5"').encode(),
                                 deadline().to_json().replace("}", ',"kind":"sometimes"}').encode(),
                                 deadline().to_json().replace("}", ',"kind":null}').encode()])
def test_a_malformed_deadline_is_refused_whole(raw: bytes) -> None:
    with pytest.raises(MalformedDeadline):
        Deadline.from_json(raw)


def test_the_queue_pops_what_passed_earliest_first() -> None:
    queue = DeadlineQueue()
    assert queue.next_due() is None and queue.pop_due(1e12) == []
    queue.add(deadline("b", 20.0))
    queue.add(deadline("a", 10.0))
    queue.add(deadline("c", 30.0))
    assert queue.next_due() == 10.0
    assert queue.pop_due(9.9) == []
    assert [d.key for d in queue.pop_due(20.0)] == ["chat-a/adk-a", "chat-b/adk-b"]
    assert queue.next_due() == 30.0 and len(queue) == 1


def test_a_dropped_or_moved_deadline_does_not_fire() -> None:
    queue = DeadlineQueue()
    queue.add(deadline("a", 10.0))
    queue.add(deadline("b", 15.0))
    assert queue.drop("chat-a/adk-a") is not None
    assert queue.drop("chat-a/adk-a") is None
    queue.add(deadline("b", 40.0))  # the latest add wins
    assert queue.next_due() == 40.0
    assert queue.pop_due(39.0) == []
    assert [d.due for d in queue.pop_due(40.0)] == [40.0]
    assert len(queue) == 0 and queue.next_due() is None


@given(st.lists(st.tuples(st.sampled_from("abcdef"), st.floats(0, 100), st.booleans()), max_size=40), st.floats(0, 100))
def test_the_queue_pops_exactly_the_live_deadlines_that_passed(ops: list[tuple[str, float, bool]], now: float) -> None:
    queue = DeadlineQueue()
    live: dict[str, float] = {}
    for name, due, drop in ops:
        if drop:
            queue.drop(f"chat-{name}/adk-{name}")
            live.pop(name, None)
        else:
            queue.add(deadline(name, due))
            live[name] = due
    popped = queue.pop_due(now)
    assert sorted(d.key for d in popped) == sorted(f"chat-{n}/adk-{n}" for n, due in live.items() if due <= now)
    assert [d.due for d in popped] == sorted(d.due for d in popped)
    assert queue.pop_due(now) == []
    assert len(queue) == sum(1 for due in live.values() if due > now)


def test_a_claim_leases_what_passed_and_only_that_claim_settles_it() -> None:
    queue = DeadlineQueue()
    queue.add(deadline("a", 10.0))
    queue.add(deadline("b", 20.0))
    with pytest.raises(ValueError):
        queue.claim(10.0, 10.0)
    [first] = queue.claim(15.0, 45.0)
    assert first.key == "chat-a/adk-a" and first.due == 10.0 and first.leased_until == 45.0
    assert queue.get(first.key) == deadline("a", 10.0) and len(queue) == 2  # kept, not popped
    assert "leased_until" not in first.to_json()  # the claim's, not the deadline's: never stored
    assert queue.next_due() == 20.0 and [d.key for d in queue.claim(44.0, 74.0)] == ["chat-b/adk-b"]
    [second] = queue.claim(45.0, 75.0)  # the first claim lapsed
    assert not queue.settle(first, 50.0) and not queue.settle(first, None)
    assert queue.settle(second, 60.0) and not queue.settle(second, None)
    assert queue.get(first.key) == deadline("a", 60.0) and queue.get(first.key).leased_until is None
    [third] = queue.claim(60.0, 90.0, limit=1)
    queue.add(deadline("a", 100.0))  # replaced meanwhile: the claim ends
    assert not queue.settle(third, None) and queue.next_due() == 74.0
    assert queue.claim(1e9, 2e9, limit=0) == []
