"""The audit trail's shared store (cluster/shared.py `audit_append`, `audit_read`), held against
both backends: a `MemoryHub`, and a real redis-server (tests/procs.py).

Every test gets two replicas on one store: what one appends, the other reads. The store keeps one
record per approval id, the newest `keep`, none placed more than `max_age` ago; reads are oldest
first, filtered by place (since/until), agent and tool, and paged with the last record's cursor.
The Redis-only tests at the end: a new client (a restarted gateway) reads what the old one wrote,
and an entry written to Redis without the seal is not read as a record.
"""

from __future__ import annotations

import re
import secrets
import time
from typing import Any

import pytest

from gateway.cluster.memory import MemoryHub
from gateway.cluster.shared import AuditEntry, AuditQuery, SharedState
from tests.procs import RedisServer
from tests.support.shared_state import pair, redis, redis_state  # noqa: F401 - fixtures

KEEP = 1000
MAX_AGE = 30 * 86400.0


def entry(approval_id: str, at: float, *, agent: str = "demo_agent", tool: str = "process_payment") -> AuditEntry:
    record: dict[str, Any] = {
        "kind": "decided", "approval_id": approval_id, "agent": agent, "tool": tool, "at": at,
        "source": "person", "outcome": "approved", "approvers": [{"user": "alice", "auth": "none"}],
    }
    return AuditEntry(approval_id, at, record)


async def append(state: SharedState, *entries: AuditEntry, keep: int = KEEP, max_age: float = MAX_AGE) -> list[bool]:
    return [await state.audit_append(e, keep=keep, max_age=max_age) for e in entries]


async def ids(state: SharedState, max_age: float = MAX_AGE, **query: Any) -> list[str]:
    return [r["approval_id"] for r in await state.audit_read(AuditQuery(**query), max_age=max_age)]


async def test_a_record_appended_by_one_replica_is_read_by_another_whole_with_its_cursor(
    pair: tuple[SharedState, SharedState],
) -> None:
    a, b = pair
    now = time.time()
    assert await append(a, entry("ap-1", now)) == [True]
    (record,) = await b.audit_read(AuditQuery(), max_age=MAX_AGE)
    cursor = record.pop("cursor")
    assert record == entry("ap-1", now).record
    # Placed at the decision's time, in ms: the same form on both backends (a Redis stream id).
    assert re.fullmatch(r"\d+-\d+", cursor) and int(cursor.split("-")[0]) == int(now * 1000)


async def test_a_second_record_for_the_same_approval_is_ignored_on_every_replica(
    pair: tuple[SharedState, SharedState],
) -> None:
    a, b = pair
    now = time.time()
    assert await append(a, entry("ap-1", now)) == [True]
    assert await append(a, entry("ap-1", now + 1)) == [False]
    assert await append(b, entry("ap-1", now + 2)) == [False]
    assert await append(b, entry("ap-2", now + 3)) == [True]
    assert await ids(a) == ["ap-1", "ap-2"]
    (first, _) = await a.audit_read(AuditQuery(), max_age=MAX_AGE)
    assert first["at"] == now  # the first one's, not a later duplicate's


async def test_the_store_keeps_the_newest_records_up_to_keep(pair: tuple[SharedState, SharedState]) -> None:
    a, b = pair
    now = time.time()
    await append(a, *(entry(f"ap-{i}", now + i) for i in range(5)), keep=3)
    assert await ids(b) == ["ap-2", "ap-3", "ap-4"]
    await append(b, entry("ap-5", now + 5), keep=2)  # a reload lowered `keep`: applied at the next append
    assert await ids(a) == ["ap-4", "ap-5"]


async def test_the_store_drops_records_older_than_max_age(pair: tuple[SharedState, SharedState]) -> None:
    a, b = pair
    now = time.time()
    await append(a, entry("old", now - 100), entry("recent", now - 10))
    # Hidden from a read at once, even before an append trims them...
    assert await ids(b, max_age=50) == ["recent"]
    assert await ids(b) == ["old", "recent"]
    # ...and gone at the next append.
    await append(b, entry("new", now), max_age=50)
    assert await ids(a) == ["recent", "new"]


async def test_records_are_placed_in_append_order_even_when_a_decision_is_older(
    pair: tuple[SharedState, SharedState],
) -> None:
    """A record stored late (the store was down) is placed after those stored before it: a cursor
    never skips a record that arrives after the page it follows."""
    a, b = pair
    now = time.time()
    await append(a, entry("ap-1", now))
    page = await b.audit_read(AuditQuery(), max_age=MAX_AGE)
    await append(b, entry("late", now - 5))
    assert await ids(a, after=page[-1]["cursor"]) == ["late"]
    records = await a.audit_read(AuditQuery(), max_age=MAX_AGE)
    assert [r["approval_id"] for r in records] == ["ap-1", "late"]
    assert records[1]["at"] == now - 5  # the record still says when it was decided


async def test_reads_filter_by_agent_tool_and_time(pair: tuple[SharedState, SharedState]) -> None:
    a, b = pair
    base = time.time() - 1000
    await append(
        a,
        entry("pay-1", base + 1),
        entry("refund-1", base + 2, agent="support_agent", tool="issue_refund"),
        entry("pay-2", base + 3),
        entry("lookup-1", base + 4, agent="support_agent", tool="lookup_order"),
        entry("refund-2", base + 5, agent="support_agent", tool="issue_refund"),
    )
    assert await ids(b, agent="support_agent") == ["refund-1", "lookup-1", "refund-2"]
    assert await ids(b, tool="issue_refund") == ["refund-1", "refund-2"]
    assert await ids(b, agent="demo_agent", tool="issue_refund") == []
    assert await ids(b, since=base + 2, until=base + 4) == ["refund-1", "pay-2", "lookup-1"]
    assert await ids(b, since=base + 4.5) == ["refund-2"]
    assert await ids(b, until=base + 1) == ["pay-1"]
    assert await ids(b, agent="nobody") == []


async def test_reads_page_oldest_first_with_the_last_cursor(pair: tuple[SharedState, SharedState]) -> None:
    a, b = pair
    base = time.time() - 1000
    # Two records in the same millisecond: the cursor tells them apart.
    await append(a, *(entry(f"ap-{i}", base + i // 2) for i in range(7)))
    pages: list[list[str]] = []
    after = None
    while True:
        page = await b.audit_read(AuditQuery(limit=3, after=after), max_age=MAX_AGE)
        if not page:
            break
        pages.append([r["approval_id"] for r in page])
        after = page[-1]["cursor"]
    assert pages == [["ap-0", "ap-1", "ap-2"], ["ap-3", "ap-4", "ap-5"], ["ap-6"]]
    # Paging with a filter: the cursor is the last record returned, whatever was skipped.
    page = await b.audit_read(AuditQuery(limit=2, since=base + 1), max_age=MAX_AGE)
    assert [r["approval_id"] for r in page] == ["ap-2", "ap-3"]
    assert await ids(b, limit=2, since=base + 1, after=page[-1]["cursor"]) == ["ap-4", "ap-5"]


async def test_a_filtered_read_scans_past_many_records_that_do_not_match(pair: tuple[SharedState, SharedState]) -> None:
    a, b = pair
    base = time.time() - 1000
    await append(a, *(entry(f"pay-{i}", base + i / 1000) for i in range(1200)), entry("refund", base + 2, tool="issue_refund"))
    assert await ids(b, tool="issue_refund") == ["refund"]


# ---- Redis only ----------------------------------------------------------------------------------


async def test_the_records_outlive_the_gateway_that_wrote_them(redis: RedisServer) -> None:
    prefix = "t" + secrets.token_hex(4)
    first = redis_state(redis, "a", prefix)
    await first.start(lambda message: None, lambda: [])
    now = time.time()
    await append(first, entry("ap-1", now), entry("ap-2", now + 1))
    await first.close()
    restarted = redis_state(redis, "a2", prefix)
    await restarted.start(lambda message: None, lambda: [])
    try:
        assert await ids(restarted) == ["ap-1", "ap-2"]
        assert await append(restarted, entry("ap-1", now + 2)) == [False]  # still recorded
    finally:
        await restarted.close()


async def test_an_entry_written_to_redis_without_the_seal_is_not_read(redis: RedisServer) -> None:
    import orjson
    import redis.asyncio as aioredis

    prefix = "t" + secrets.token_hex(4)
    state = redis_state(redis, "a", prefix)
    await state.start(lambda message: None, lambda: [])
    client = aioredis.Redis.from_url(redis.url)
    try:
        now = time.time()
        await append(state, entry("ap-1", now))
        forged = orjson.dumps(entry("forged", now + 1).record)
        await client.xadd(f"{prefix}:audit", {"a": "demo_agent", "t": "process_payment", "s": b"\x01" + b"0" * 32 + forged})
        await append(state, entry("ap-2", now + 2))
        assert await ids(state) == ["ap-1", "ap-2"]
    finally:
        await client.aclose()
        await state.close()


async def rebuild(client: Any, stream: str, change: Any) -> None:
    """What a party who can write to Redis (but holds no secret) can do to the stream: read it,
    delete it and write it back in any order, any entry at any id, with any clear fields."""
    entries = await client.xrange(stream)
    await client.delete(stream)
    for entry_id, fields in change(entries):
        await client.xadd(stream, fields, id=entry_id)


async def test_a_genuine_record_appended_again_elsewhere_in_the_stream_is_not_read(redis: RedisServer) -> None:
    """Each record is sealed for its place: a copy of a genuine one at another place (a replay
    that would show an approval given twice, or again after the first was trimmed) does not open."""
    import redis.asyncio as aioredis

    prefix = "t" + secrets.token_hex(4)
    state = redis_state(redis, "a", prefix)
    await state.start(lambda message: None, lambda: [])
    client = aioredis.Redis.from_url(redis.url)
    try:
        now = time.time() - 10
        await append(state, entry("ap-1", now), entry("ap-2", now + 1))

        def replayed(entries: list[Any]) -> list[Any]:
            (first_id, first), (second_id, second) = entries
            ms = int(second_id.decode().split("-")[0])
            return [(first_id, first), (second_id, second), (f"{ms + 1}-0", first), (f"{ms + 2}-0", first)]

        await rebuild(client, f"{prefix}:audit", replayed)
        assert await ids(state) == ["ap-1", "ap-2"]

        def moved(entries: list[Any]) -> list[Any]:
            # The original gone, its copy placed later: the copy does not stand in for it.
            (_, first), (second_id, second) = entries[0], entries[1]
            return [(second_id, second), (f"{int(second_id.decode().split('-')[0]) + 5}-0", first)]

        await rebuild(client, f"{prefix}:audit", moved)
        assert await ids(state) == ["ap-2"]
    finally:
        await client.aclose()
        await state.close()


async def test_reads_select_on_the_sealed_record_not_on_fields_beside_it(redis: RedisServer) -> None:
    """A filter on the agent or tool reads them inside the seal: fields written beside it in clear,
    and changed, neither hide a record from a filtered read nor put one into another's."""
    import redis.asyncio as aioredis

    prefix = "t" + secrets.token_hex(4)
    state = redis_state(redis, "a", prefix)
    await state.start(lambda message: None, lambda: [])
    client = aioredis.Redis.from_url(redis.url)
    try:
        now = time.time() - 10
        await append(state, entry("pay-1", now), entry("refund-1", now + 1, agent="support_agent", tool="issue_refund"))

        def relabelled(entries: list[Any]) -> list[Any]:
            return [(i, {**fields, b"a": b"demo_agent", b"t": b"process_payment"}) for i, fields in entries]

        await rebuild(client, f"{prefix}:audit", relabelled)
        assert await ids(state, tool="issue_refund") == ["refund-1"]
        assert await ids(state, agent="support_agent") == ["refund-1"]
        assert await ids(state, tool="process_payment") == ["pay-1"]
    finally:
        await client.aclose()
        await state.close()
