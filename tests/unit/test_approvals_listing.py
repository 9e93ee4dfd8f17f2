"""Listing pending approvals by who may decide them (approvals/index.py, `page_approvals`),
and the per-user cap on listed approvals (`put_approval(cap=)`), held against both backends (a
`MemoryHub`, and a real redis-server) as tests/unit/test_approvals_directory.py holds the rest of
the directory.

A listing reads only the indexes of the audiences it names (a group's members, or a requester for
their own calls without a group), in position order, a page at a time after a cursor; however many
approvals one user has waiting, another audience's page is not filled with them. A requester's
approvals are counted in the store, by every replica together.
"""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any

import pytest

from gateway.approvals.index import (
    ApprovalQuery, InvalidCursor, decode_cursor, encode_cursor, group_audience, position, requester_audience,
)
from gateway.cluster.shared import SharedState
from tests.support.shared_state import pair, redis  # noqa: F401 - fixtures
from tests.unit.test_approvals_directory import TTL, approval

SUPERVISORS = group_audience("supervisors")


def asked(approval_id: str, created: float, *, requester: str, approvers: str | None = "supervisors", **more: Any) -> dict[str, Any]:
    return {**approval(approval_id, created, **more), "requester": requester, "approvers": approvers}


async def page_ids(state: SharedState, *audiences: str, **query: Any) -> tuple[list[str], str | None]:
    page = await state.page_approvals(ApprovalQuery(audiences=audiences, **query))
    return [a["id"] for a in page.approvals], page.next


async def test_one_users_thousand_approvals_do_not_hide_a_new_refund_from_the_supervisors(
    pair: tuple[SharedState, SharedState],
) -> None:
    """The issue's case: 1,024 pending approvals of one chat user (that user decides them: no
    group) put before another user's refund; the supervisors' first page has the refund."""
    a, b = pair
    base = time.time() - 2000
    for i in range(1024):
        await a.put_approval(asked(f"own-{i:04d}", base + i, requester="mallory", approvers=None), ttl=TTL)
    await b.put_approval(asked("refund", base + 1500, requester="bob"), ttl=TTL)
    assert await page_ids(b, SUPERVISORS, limit=100) == (["refund"], None)
    assert await page_ids(a, SUPERVISORS, requester_audience("bob"), agent="support_agent") == (["refund"], None)
    # Mallory's own, a page at a time, every one once.
    seen: list[str] = []
    after = None
    while True:
        found, after = await page_ids(a, requester_audience("mallory"), limit=300, after=after)
        seen += found
        if after is None:
            break
    assert seen == [f"own-{i:04d}" for i in range(1024)]


async def test_pages_follow_the_cursor_and_stay_stable_under_inserts(pair: tuple[SharedState, SharedState]) -> None:
    a, b = pair
    base = time.time() - 100
    for i in (1, 2, 3, 4, 5):
        await a.put_approval(asked(f"r{i}", base + i, requester="bob"), ttl=TTL)
    first, cursor = await page_ids(b, SUPERVISORS, limit=2)
    assert first == ["r1", "r2"] and cursor is not None
    # Added meanwhile: before the cursor (not listed again later), and after it (listed in order).
    await b.put_approval(asked("early", base + 1.5, requester="carol"), ttl=TTL)
    await b.put_approval(asked("late", base + 4.5, requester="carol"), ttl=TTL)
    second, cursor = await page_ids(a, SUPERVISORS, limit=2, after=cursor)
    assert second == ["r3", "r4"]
    third, cursor = await page_ids(a, SUPERVISORS, limit=2, after=cursor)
    assert third == ["late", "r5"] and cursor is not None
    assert await page_ids(a, SUPERVISORS, limit=2, after=cursor) == ([], None)
    # An approval dropped between pages is simply not there; the cursor still resumes after its place.
    _, cursor = await page_ids(a, SUPERVISORS, limit=1)
    await a.drop_approval("r1")
    assert (await page_ids(a, SUPERVISORS, limit=1, after=cursor))[0] == ["early"]


async def test_a_caller_of_several_audiences_reads_them_merged_in_order(pair: tuple[SharedState, SharedState]) -> None:
    a, b = pair
    base = time.time() - 1000
    # More than one batch of the Redis reader (100) in each, interleaved.
    for i in range(130):
        await a.put_approval(asked(f"s{i:03d}", base + 2 * i, requester="bob"), ttl=TTL)
        await a.put_approval(asked(f"f{i:03d}", base + 2 * i + 1, requester="bob", approvers="finance", agent="demo_agent"), ttl=TTL)
    await a.put_approval(asked("other", base + 5, requester="bob", approvers="legal"), ttl=TTL)
    everything, _ = await page_ids(b, SUPERVISORS, group_audience("finance"), limit=1000)
    assert everything == [x for i in range(130) for x in (f"s{i:03d}", f"f{i:03d}")]
    assert (await page_ids(b, SUPERVISORS, group_audience("finance"), agent="demo_agent", limit=3))[0] == ["f000", "f001", "f002"]
    assert (await page_ids(b, SUPERVISORS, group_audience("finance"), tool="nothing"))[0] == []
    # The same audience named twice lists each approval once.
    assert (await page_ids(b, SUPERVISORS, SUPERVISORS, limit=3))[0] == ["s000", "s001", "s002"]


async def test_what_the_caller_would_not_show_does_not_cut_a_page_short(pair: tuple[SharedState, SharedState]) -> None:
    a, b = pair
    base = time.time() - 1000
    for i in range(150):
        await a.put_approval(asked(f"mine-{i:03d}", base + i, requester="alice"), ttl=TTL)
    await a.put_approval(asked("theirs", base + 500, requester="bob"), ttl=TTL)
    page = await b.page_approvals(ApprovalQuery(
        audiences=(SUPERVISORS,), limit=1, accept=lambda record: record["requester"] != "alice",
    ))
    assert [x["id"] for x in page.approvals] == ["theirs"]


async def test_a_requesters_listed_approvals_are_capped_across_replicas(pair: tuple[SharedState, SharedState]) -> None:
    a, b = pair
    now = time.time()
    assert await a.put_approval(asked("m1", now, requester="mallory"), ttl=TTL, cap=3)
    assert await b.put_approval(asked("m2", now, requester="mallory", approvers=None), ttl=TTL, cap=3)
    assert await a.put_approval(asked("m3", now, requester="mallory", agent="demo_agent"), ttl=TTL, cap=3)
    assert not await b.put_approval(asked("m4", now, requester="mallory"), ttl=TTL, cap=3)
    assert await b.get_approval("m4") is None and "m4" not in await ids_all(b)
    # Put again (the owner renews one) is not a new one; another user has their own count.
    assert await b.put_approval(asked("m1", now, requester="mallory"), ttl=TTL, cap=3)
    assert await a.put_approval(asked("b1", now, requester="bob"), ttl=TTL, cap=1)
    # Answered and dropped: its place is free again.
    await a.drop_approval("m2")
    assert await b.put_approval(asked("m4", now, requester="mallory"), ttl=TTL, cap=3)
    assert not await a.put_approval(asked("m5", now, requester="mallory"), ttl=TTL, cap=3)


async def test_an_expired_approval_no_longer_counts_under_the_cap(pair: tuple[SharedState, SharedState]) -> None:
    a, b = pair
    now = time.time()
    assert await a.put_approval(asked("short", now, requester="mallory"), ttl=0.2, cap=1)
    assert not await b.put_approval(asked("next", now, requester="mallory"), ttl=TTL, cap=1)
    await asyncio.sleep(0.4)
    assert await b.put_approval(asked("next", now, requester="mallory"), ttl=TTL, cap=1)


async def ids_all(state: SharedState) -> list[str]:
    return [x["id"] for x in await state.list_approvals(limit=1000)]


# ---- the cursor ----------------------------------------------------------------------------------


def test_a_cursor_is_opaque_and_decodes_to_the_position_it_was_made_of() -> None:
    place = position({"id": "gw-3f2a", "created": 1764547200.25})
    assert place == "00001764547200250000|gw-3f2a"  # microseconds, then the id: ordered as text
    cursor = encode_cursor(place)
    assert "gw-3f2a" not in cursor and decode_cursor(cursor) == place


@pytest.mark.parametrize("cursor", [
    "", "!!!!", "x" * 301, "²", base64.urlsafe_b64encode(b"hello").decode(),
    base64.urlsafe_b64encode(b"123|gw-1").decode(), base64.urlsafe_b64encode(b"%020d|" % 5 + b"a b").decode(),
    base64.urlsafe_b64encode(b"%020d|" % 5 + b"x" * 201).decode(),
])
def test_a_cursor_the_gateway_did_not_hand_out_is_refused(cursor: str) -> None:
    with pytest.raises(InvalidCursor, match="cursor"):
        decode_cursor(cursor)
