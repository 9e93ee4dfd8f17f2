"""The directory of pending approvals (cluster/shared.py `put_approval`, `get_approval`,
`drop_approval`, `list_approvals`, `vote_approval`), held against both backends: a `MemoryHub`, and
a real redis-server (tests/procs.py).

Every test gets two replicas on one store: what one puts, the other reads and votes on. An approval
is kept until its TTL or until dropped; listings are of pending approvals, oldest first, filtered by
agent and tool; a vote is counted in one step with every other (quorum, one deny decides, one vote
per user, nothing after the decision), so two votes at once never both decide.
The Redis-only tests at the end: what a party who can write to Redis but holds no secret writes
there (a record, a vote, a decision) is not read as the gateway's, and is logged without its content;
every key has a TTL; a Redis that is down is said at once (SharedStateDown), never read as "no approval".
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis

from gateway.cluster import redis_approvals as approvals_module
from gateway.cluster.memory import MemoryHub
from gateway.cluster.redis import RedisState
from gateway.approvals.votes import count_vote, needed
from gateway.cluster.shared import SharedState, SharedStateDown
from tests.procs import RedisServer
from tests.support.shared_state import pair, redis, redis_state  # noqa: F401 - fixtures
from tests.support.logs import RecordingLog

TTL = 60.0


@pytest.fixture
async def forger(redis: RedisServer) -> AsyncIterator[tuple[RedisState, RedisState, aioredis.Redis, str]]:
    """Two replicas on Redis, and a client that writes to Redis without holding the secret."""
    prefix = "t" + secrets.token_hex(4)
    a, b = redis_state(redis, "a", prefix), redis_state(redis, "b", prefix)
    for state in (a, b):
        await state.start(lambda message: None, lambda: [])
    client = aioredis.Redis.from_url(redis.url)
    try:
        yield a, b, client, prefix
    finally:
        await client.aclose()
        for state in (a, b):
            await state.close()


def approval(
    approval_id: str, created: float, *, agent: str = "support_agent", tool: str = "issue_refund", quorum: int = 1,
) -> dict[str, Any]:
    """An approval as the API shows it, plus its owner (the contract's `A`)."""
    return {
        "id": approval_id, "state": "pending", "agent": agent, "app_name": agent, "tool": tool,
        "tool_call_id": f"adk-{approval_id}", "chat_id": "chat-1", "requester": "alice",
        "args": {"order_id": "1234", "amount": 250, "currency": "USD", "iban": "DE89-SECRET"},
        "rule": "large_refund", "hint": "The customer's card is credited when you approve.",
        "approvers": "supervisors", "self_approval": False, "quorum": quorum, "votes": [],
        "created": created, "deadline": created + 300, "owner": "a",
    }


async def ids(state: SharedState, **query: Any) -> list[str]:
    return [a["id"] for a in await state.list_approvals(**query)]


# ---- put, get, drop, list ----------------------------------------------------------------------


async def test_an_approval_put_by_one_replica_is_read_whole_by_another(pair: tuple[SharedState, SharedState]) -> None:
    a, b = pair
    record = approval("gw-1", time.time())
    await a.put_approval(record, ttl=TTL)
    assert await b.get_approval("gw-1") == record
    assert await b.list_approvals() == [record]
    assert await b.get_approval("gw-unknown") is None


async def test_a_dropped_approval_is_gone_from_every_replica(pair: tuple[SharedState, SharedState]) -> None:
    a, b = pair
    now = time.time()
    await a.put_approval(approval("gw-1", now), ttl=TTL)
    await a.put_approval(approval("gw-2", now + 1), ttl=TTL)
    await b.drop_approval("gw-1")
    await b.drop_approval("gw-unknown")  # nothing to drop: no error
    assert await a.get_approval("gw-1") is None
    assert await ids(a) == ["gw-2"]
    assert (await a.vote_approval("gw-1", "supervisor", True, 1)).state == "gone"


async def test_listings_are_oldest_first_filtered_and_limited(pair: tuple[SharedState, SharedState]) -> None:
    a, b = pair
    base = time.time() - 100
    # Put out of order: the listing orders by `created`, not by when they were put.
    await a.put_approval(approval("refund-2", base + 5), ttl=TTL)
    await a.put_approval(approval("pay-1", base + 1, agent="demo_agent", tool="process_payment"), ttl=TTL)
    await b.put_approval(approval("refund-1", base + 2), ttl=TTL)
    await b.put_approval(approval("lookup-1", base + 4, tool="lookup_order"), ttl=TTL)
    await a.put_approval(approval("pay-2", base + 3, agent="demo_agent", tool="process_payment"), ttl=TTL)
    assert await ids(b) == ["pay-1", "refund-1", "pay-2", "lookup-1", "refund-2"]
    assert await ids(b, agent="support_agent") == ["refund-1", "lookup-1", "refund-2"]
    assert await ids(b, tool="issue_refund") == ["refund-1", "refund-2"]
    assert await ids(b, agent="support_agent", tool="lookup_order") == ["lookup-1"]
    assert await ids(b, agent="demo_agent", tool="issue_refund") == []
    assert await ids(b, agent="nobody") == []
    assert await ids(b, limit=2) == ["pay-1", "refund-1"]
    assert await ids(b, agent="support_agent", limit=2) == ["refund-1", "lookup-1"]


async def test_a_listing_scans_past_many_approvals_that_do_not_match(pair: tuple[SharedState, SharedState]) -> None:
    a, b = pair
    base = time.time() - 1000
    for i in range(250):
        await a.put_approval(approval(f"pay-{i}", base + i, agent="demo_agent", tool="process_payment"), ttl=TTL)
    await a.put_approval(approval("refund", base + 300), ttl=TTL)
    assert await ids(b, tool="issue_refund") == ["refund"]
    assert len(await b.list_approvals(limit=1000)) == 251


async def test_a_second_put_replaces_the_record_and_keeps_its_votes_and_place(pair: tuple[SharedState, SharedState]) -> None:
    a, b = pair
    now = time.time()
    await a.put_approval(approval("gw-1", now, quorum=2), ttl=TTL)
    await a.put_approval(approval("gw-2", now + 1), ttl=TTL)
    assert (await b.vote_approval("gw-1", "sup-1", True, 2)).state == "counted"
    changed = approval("gw-1", now + 5, quorum=2) | {"hint": "changed"}
    await a.put_approval(changed, ttl=TTL)
    got = await b.get_approval("gw-1")
    assert got is not None and got["hint"] == "changed"
    assert got["votes"] == [{"user": "sup-1", "approved": True}]
    assert await ids(b) == ["gw-1", "gw-2"]


async def test_a_requesters_kept_approvals_are_counted_as_the_cap_counts_them(pair: tuple[SharedState, SharedState]) -> None:
    """What an ask about an ADK confirmation for approvers is held to before it is listed."""
    a, b = pair
    now = time.time()
    await a.put_approval(approval("gw-1", now), ttl=TTL)
    await a.put_approval(approval("gw-2", now), ttl=0.2)
    await a.put_approval(approval("gw-3", now) | {"requester": "bob"}, ttl=TTL)
    assert (await b.pending_approvals("alice"), await b.pending_approvals("bob"), await b.pending_approvals("x")) == (2, 1, 0)
    # The cap of put counts the same.
    assert not await b.put_approval(approval("gw-4", now), ttl=TTL, cap=2)
    await asyncio.sleep(0.3)
    assert await a.pending_approvals("alice") == 1
    await b.drop_approval("gw-1")
    assert await a.pending_approvals("alice") == 0


async def test_an_approval_expires_with_its_ttl_and_leaves_the_listing(pair: tuple[SharedState, SharedState]) -> None:
    a, b = pair
    now = time.time()
    await a.put_approval(approval("short", now), ttl=0.3)
    await a.put_approval(approval("long", now + 1), ttl=TTL)
    assert await ids(b) == ["short", "long"]
    await asyncio.sleep(0.5)
    assert await b.get_approval("short") is None
    assert await ids(b) == ["long"]
    assert (await b.vote_approval("short", "supervisor", True, 1)).state == "gone"
    # A put again (the owner renews it) brings a fresh one back.
    await a.put_approval(approval("short", now), ttl=TTL)
    assert await ids(b) == ["short", "long"]


# ---- votes ---------------------------------------------------------------------------------------


async def test_quorum_one_one_approval_decides(pair: tuple[SharedState, SharedState]) -> None:
    a, b = pair
    await a.put_approval(approval("gw-1", time.time()), ttl=TTL)
    tally = await b.vote_approval("gw-1", "supervisor", True, 1)
    assert tally.state == "decided_approved"
    assert tally.approval is not None
    assert tally.approval["state"] == "decided" and tally.approval["outcome"] == "approved"
    assert tally.approval["votes"] == [{"user": "supervisor", "approved": True}]
    assert tally.approval["args"]["amount"] == 250
    # Kept as decided until its owner drops it; not pending any more, so not listed.
    got = await a.get_approval("gw-1")
    assert got is not None and (got["state"], got["outcome"]) == ("decided", "approved")
    assert await ids(a) == []


async def test_quorum_two_needs_two_distinct_users(pair: tuple[SharedState, SharedState]) -> None:
    a, b = pair
    await a.put_approval(approval("gw-1", time.time(), quorum=2), ttl=TTL)
    first = await a.vote_approval("gw-1", "sup-1", True, 2)
    assert first.state == "counted"
    assert first.approval is not None and first.approval["state"] == "pending"
    assert first.approval["votes"] == [{"user": "sup-1", "approved": True}]
    # The same user again, on any replica and whatever the answer: nothing changes.
    assert (await b.vote_approval("gw-1", "sup-1", True, 2)).state == "already"
    assert (await b.vote_approval("gw-1", "sup-1", False, 2)).state == "already"
    assert await ids(b) == ["gw-1"]
    second = await b.vote_approval("gw-1", "sup-2", True, 2)
    assert second.state == "decided_approved"
    assert second.approval is not None and second.approval["votes"] == [
        {"user": "sup-1", "approved": True}, {"user": "sup-2", "approved": True},
    ]


async def test_a_deny_decides_at_once_whatever_the_quorum(pair: tuple[SharedState, SharedState]) -> None:
    a, b = pair
    await a.put_approval(approval("gw-1", time.time(), quorum=3), ttl=TTL)
    assert (await a.vote_approval("gw-1", "sup-1", True, 3)).state == "counted"
    tally = await b.vote_approval("gw-1", "sup-2", False, 3)
    assert tally.state == "decided_denied"
    assert tally.approval is not None and tally.approval["outcome"] == "denied"
    got = await a.get_approval("gw-1")
    assert got is not None and got["outcome"] == "denied"


async def test_a_vote_after_the_decision_is_gone_and_says_what_was_decided(pair: tuple[SharedState, SharedState]) -> None:
    a, b = pair
    await a.put_approval(approval("gw-1", time.time()), ttl=TTL)
    assert (await a.vote_approval("gw-1", "sup-1", False, 1)).state == "decided_denied"
    for user, approved in (("sup-2", True), ("sup-1", False), ("sup-3", False)):
        late = await b.vote_approval("gw-1", user, approved, 1)
        assert late.state == "gone"
        # The decided approval, for the API's 409 `already_decided`.
        assert late.approval is not None and late.approval["outcome"] == "denied"
        assert late.approval["votes"] == [{"user": "sup-1", "approved": False}]
    unknown = await b.vote_approval("gw-unknown", "sup-1", True, 1)
    assert unknown.state == "gone" and unknown.approval is None


async def test_two_votes_at_once_never_both_decide(pair: tuple[SharedState, SharedState]) -> None:
    a, b = pair
    for n in range(20):
        await a.put_approval(approval(f"gw-{n}", time.time()), ttl=TTL)
        # Approve and approve, or approve and deny: exactly one decides, the other finds it gone.
        second = n % 2 == 0
        tallies = await asyncio.gather(
            a.vote_approval(f"gw-{n}", "sup-1", True, 1), b.vote_approval(f"gw-{n}", "sup-2", second, 1),
        )
        states = sorted(t.state for t in tallies)
        assert states[0].startswith("decided_") and states[1] == "gone", states
        decided = next(t for t in tallies if t.state != "gone")
        gone = next(t for t in tallies if t.state == "gone")
        assert gone.approval is not None and gone.approval["outcome"] == decided.approval["outcome"]  # type: ignore[index]
    # Quorum 2, two approvals at once: both counted, exactly one of them the decision.
    await a.put_approval(approval("gw-q", time.time(), quorum=2), ttl=TTL)
    await a.vote_approval("gw-q", "sup-0", True, 2)
    tallies = await asyncio.gather(a.vote_approval("gw-q", "sup-1", True, 2), b.vote_approval("gw-q", "sup-2", True, 2))
    assert sorted(t.state for t in tallies) == ["decided_approved", "gone"]


def test_the_vote_rule_sans_io() -> None:
    assert count_vote("pending", [], "u", True, 1) == ("decided_approved", "approved", [{"user": "u", "approved": True}])
    assert count_vote("pending", [], "u", True, 2)[:2] == ("counted", "pending")
    one = [{"user": "u", "approved": True}]
    assert count_vote("pending", one, "u", True, 2) == ("already", "pending", one)
    assert count_vote("pending", one, "v", False, 2)[:2] == ("decided_denied", "denied")
    assert count_vote("approved", one, "v", True, 2) == ("gone", "approved", one)


def test_a_quorum_counts_distinct_voters_even_from_a_list_that_repeats_one() -> None:
    """One person never makes two of a quorum: a copy of a vote in the stored list (what a Redis
    writer can add, tag and all) is the same voter."""
    twice = [{"user": "u", "approved": True}, {"user": "u", "approved": True}]
    assert count_vote("pending", twice, "v", True, 3)[:2] == ("counted", "pending")
    assert count_vote("pending", twice, "v", True, 2)[:2] == ("decided_approved", "approved")


def test_votes_that_no_longer_count_raise_what_the_store_needs() -> None:
    votes = [{"user": "gone", "approved": True}, {"user": "kept", "approved": True}, {"user": "no", "approved": False}]
    assert needed(votes, 2, lambda voter: voter != "gone") == 3
    assert needed([*votes, {"user": "gone", "approved": True}], 2, lambda voter: voter != "gone") == 3
    assert needed(votes, 2, lambda voter: True) == 2
    # Quorum 2: "gone" approved, then left the group; the next approval is the first that counts, not the second.
    state, _, counted = count_vote("pending", votes[:1], "next", True, needed(votes[:1], 2, lambda v: v != "gone"))
    assert state == "counted"
    assert count_vote("pending", counted, "last", True, needed(counted, 2, lambda v: v != "gone"))[0] == "decided_approved"


# ---- Redis only: what a writer without the secret puts there -----------------------------------


async def test_a_record_written_to_redis_without_the_seal_is_not_read(
    forger: tuple[RedisState, RedisState, aioredis.Redis, str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, b, client, prefix = forger
    log = RecordingLog()
    monkeypatch.setattr(approvals_module, "log", log)
    now = time.time()
    await a.put_approval(approval("gw-1", now), ttl=TTL)
    # Not sealed at all, and listed in the index.
    forged = approval("gw-forged", now + 1) | {"args": {"amount": 1}}
    await client.hset(f"{prefix}:approval:gw-forged", mapping={"sealed": orjson.dumps(forged), "state": "pending", "votes": "[]"})
    await client.zadd(f"{prefix}:approvals", {"gw-forged": now + 1})
    # A genuine record copied under another id.
    copied = await client.hget(f"{prefix}:approval:gw-1", "sealed")
    await client.hset(f"{prefix}:approval:gw-copy", mapping={"sealed": copied, "state": "pending", "votes": "[]"})
    await client.zadd(f"{prefix}:approvals", {"gw-copy": now + 2})
    # The genuine record changed in place.
    await a.put_approval(approval("gw-2", now + 3), ttl=TTL)
    sealed = await client.hget(f"{prefix}:approval:gw-2", "sealed")
    await client.hset(f"{prefix}:approval:gw-2", "sealed", sealed.replace(b'"amount":250', b'"amount":999'))
    assert await b.get_approval("gw-forged") is None
    assert await b.get_approval("gw-copy") is None
    assert await b.get_approval("gw-2") is None
    assert await ids(b) == ["gw-1"]
    for approval_id in ("gw-forged", "gw-copy", "gw-2"):
        assert (await b.vote_approval(approval_id, "sup-1", True, 1)).state == "gone"
    tampered = log.named("approval_record_tampered")
    assert {t["approval_id"] for t in tampered} == {"gw-forged", "gw-copy", "gw-2"}
    assert all(t == {"replica": "b", "approval_id": t["approval_id"]} for t in tampered)
    assert "SECRET" not in repr(log.events) and "amount" not in repr(log.events)


async def test_forged_votes_are_not_counted_and_a_forged_decision_is_none(
    forger: tuple[RedisState, RedisState, aioredis.Redis, str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The votes and the decision sit beside the seal (the Lua script counts them): a vote written
    there without a replica's tag neither shows nor decides, and a decision the genuine votes do not
    make reads as no approval at all (it times out: fail closed)."""
    a, b, client, prefix = forger
    log = RecordingLog()
    monkeypatch.setattr(approvals_module, "log", log)
    now = time.time()
    key = f"{prefix}:approval:gw-1"
    await a.put_approval(approval("gw-1", now, quorum=2), ttl=TTL)
    assert (await a.vote_approval("gw-1", "sup-1", True, 2)).state == "counted"
    votes = orjson.loads(await client.hget(key, "votes"))
    # A second approval slipped in, with a made-up tag and with sup-1's tag.
    forged = [*votes, {"user": "mallory", "approved": True, "tag": "00" * 32}]
    await client.hset(key, "votes", orjson.dumps(forged))
    got = await b.get_approval("gw-1")
    assert got is not None and got["votes"] == [{"user": "sup-1", "approved": True}]
    assert (await b.vote_approval("gw-1", "sup-3", False, 2)).state == "decided_denied"

    await a.put_approval(approval("gw-2", now + 1, quorum=3), ttl=TTL)
    await a.vote_approval("gw-2", "sup-1", True, 3)
    key2 = f"{prefix}:approval:gw-2"
    votes = orjson.loads(await client.hget(key2, "votes"))
    await client.hset(key2, "votes", orjson.dumps([*votes, {"user": "mallory", "approved": True, "tag": votes[0]["tag"]}]))
    # The forged vote (sup-1's tag does not cover mallory) makes Lua's count 3 with sup-2's vote,
    # the genuine votes 2: the replica does not take that decision.
    assert (await b.vote_approval("gw-2", "sup-2", True, 3)).state == "gone"
    assert await b.get_approval("gw-2") is None

    # A genuine vote repeated, tag and all: still one voter, so two more approvals are needed, not one.
    await a.put_approval(approval("gw-4", now + 3, quorum=3), ttl=TTL)
    await a.vote_approval("gw-4", "sup-1", True, 3)
    key4 = f"{prefix}:approval:gw-4"
    votes = orjson.loads(await client.hget(key4, "votes"))
    await client.hset(key4, "votes", orjson.dumps(votes * 2))
    assert (await b.vote_approval("gw-4", "sup-2", True, 3)).state == "counted"
    assert (await b.vote_approval("gw-4", "sup-3", True, 3)).state == "decided_approved"

    # A decision written straight into the state field.
    await a.put_approval(approval("gw-3", now + 2), ttl=TTL)
    await client.hset(f"{prefix}:approval:gw-3", "state", "approved")
    assert await b.get_approval("gw-3") is None
    assert (await b.vote_approval("gw-3", "sup-1", True, 1)).state == "gone"
    assert len(log.named("approval_vote_tampered")) >= 2
    assert {d["approval_id"] for d in log.named("approval_decision_tampered")} == {"gw-2", "gw-3"}


async def test_every_key_has_a_ttl(forger: tuple[RedisState, RedisState, aioredis.Redis, str]) -> None:
    a, _, client, prefix = forger
    await a.put_approval(approval("gw-1", time.time()), ttl=30)
    await a.put_approval(approval("gw-2", time.time()), ttl=120)
    await a.put_approval(approval("gw-3", time.time()), ttl=60)
    await a.vote_approval("gw-1", "sup-1", True, 1)
    keys = [k async for k in client.scan_iter(f"{prefix}:*") if not k.endswith(b":epoch") and b":replica:" not in k]
    ttls = {k.decode().removeprefix(prefix): await client.pttl(k) for k in keys}
    indexes = {k for k in ttls if k.startswith(":approvals")}
    # Every approval, the agent's, the audience's, the audience's of the agent; the requester's count.
    assert len(indexes) == 5 and len([k for k in indexes if k.startswith(":approvals:user:")]) == 1
    assert set(ttls) == {":approval:gw-1", ":approval:gw-2", ":approval:gw-3", ":beats", *indexes}
    assert 0 < ttls[":approval:gw-1"] <= 30_000
    assert 0 < ttls[":beats"] <= 3_600_000  # the heartbeat's record of the last beat, kept an hour
    # The indexes and the count live as long as their longest-lived approval.
    assert all(60_000 < ttls[k] <= 120_000 for k in indexes)


async def test_with_redis_down_every_method_says_so_at_once_and_works_again_after(tmp_path: Path) -> None:
    """A replica that cannot reach the directory answers SharedStateDown (503), never "no approval"
    nor "gone" (a vote that seems gone would read as decided elsewhere)."""
    server = RedisServer(tmp_path)
    server.start()
    state = redis_state(server, "a", "down-approvals")
    try:
        await state.start(lambda message: None, lambda: [])
        await state.put_approval(approval("gw-1", time.time()), ttl=TTL)
        await asyncio.to_thread(server.stop)
        calls = [
            lambda: state.put_approval(approval("gw-2", time.time()), ttl=TTL),
            lambda: state.get_approval("gw-1"),
            lambda: state.list_approvals(),
            lambda: state.vote_approval("gw-1", "sup-1", True, 1),
            lambda: state.drop_approval("gw-1"),
        ]
        for call in calls:
            started = time.perf_counter()
            with pytest.raises(SharedStateDown):
                await call()
            assert time.perf_counter() - started < 3.0
        assert not state.available
        # Back, empty (no persistence): what was pending is gone with it, and the directory works.
        await asyncio.to_thread(server.start)
        deadline = time.monotonic() + 5
        while not state.available:
            assert time.monotonic() < deadline, "the replica did not see Redis come back"
            await asyncio.sleep(0.05)
        assert await state.get_approval("gw-1") is None
        await state.put_approval(approval("gw-3", time.time()), ttl=TTL)
        assert (await state.vote_approval("gw-3", "sup-1", True, 1)).state == "decided_approved"
    finally:
        await state.close()
        server.stop()


async def test_a_listing_forgets_the_ids_whose_approval_expired(forger: tuple[RedisState, RedisState, aioredis.Redis, str]) -> None:
    a, b, client, prefix = forger
    now = time.time()
    await a.put_approval(approval("short", now), ttl=0.2)
    await a.put_approval(approval("long", now + 1), ttl=TTL)
    await asyncio.sleep(0.4)
    listed = [p.partition(b"|")[2] for p in await client.zrange(f"{prefix}:approvals", 0, -1)]
    assert listed == [b"short", b"long"]  # Redis expired the hash only
    assert await ids(b) == ["long"]
    assert [p.partition(b"|")[2] for p in await client.zrange(f"{prefix}:approvals", 0, -1)] == [b"long"]
    await b.drop_approval("long")
    # Dropped from every index and from its requester's count: nothing of it is left ("short" is
    # left in the indexes no listing read yet, and goes with their TTL or the next listing of each).
    left = [m async for k in client.scan_iter(f"{prefix}:approvals*") for m in await client.zrange(k, 0, -1)]
    assert left and not any(m.endswith(b"long") for m in left)
