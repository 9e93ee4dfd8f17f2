"""The standing grants' store (approvals/store.py `GrantStore`) on both backends, memory and a real
redis-server: what one replica puts another reads; uses are reserved in one step with every
replica's (never spent twice), given back, and nothing is taken from a grant that is revoked,
expired, used up, or (Redis) not sealed by a replica."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest

from gateway.approvals.grants import USER_AUTHORITY, Grant
from gateway.cluster.redis import RedisState
from gateway.cluster.shared import SharedState
from tests.procs import RedisServer
from tests.support.shared_state import pair, redis, redis_state  # noqa: F401 - fixtures


def _grant(grant_id: str = "gr-1", **changes: object) -> Grant:
    now = time.time()
    grant = Grant(
        id=grant_id, agent="agent", tool="pay", user_id="alice", chat_id="c", condition=None, expires_at=now + 60,
        uses_left=2, granted_by={"user": "alice", "auth": "api_key"}, authority=USER_AUTHORITY, created_at=now,
    )
    return replace(grant, **changes)  # type: ignore[arg-type]


async def test_a_grant_put_by_one_replica_is_listed_by_another(pair: tuple[SharedState, SharedState]) -> None:
    a, b = pair
    mine, everyone = _grant("gr-1"), _grant("gr-2", user_id=None, authority="supervisors", chat_id=None)
    other = _grant("gr-3", user_id="bob")
    for grant in (mine, everyone, other):
        await a.grants.put_grant(grant)
    assert [g.id for g in await b.grants.grants_of("alice")] == ["gr-1", "gr-2"]
    assert [g.id for g in await b.grants.grants_of("bob")] == ["gr-2", "gr-3"]
    assert [g.id for g in await b.grants.grants_by("supervisors")] == ["gr-2"]
    assert await b.grants.get_grant("gr-1") == mine


async def test_uses_are_taken_until_none_is_left_and_given_back(pair: tuple[SharedState, SharedState]) -> None:
    a, b = pair
    await a.grants.put_grant(_grant(uses_left=2))
    assert await a.grants.take_grant_use("gr-1") and await b.grants.take_grant_use("gr-1")
    assert not await a.grants.take_grant_use("gr-1")
    assert (await b.grants.get_grant("gr-1")).uses_left == 0  # type: ignore[union-attr]
    assert [g.uses_left for g in await b.grants.grants_of("alice")] == [0]
    await b.grants.give_back_grant_use("gr-1")
    assert (await a.grants.get_grant("gr-1")).uses_left == 1  # type: ignore[union-attr]
    assert await a.grants.take_grant_use("gr-1")


async def test_two_replicas_taking_at_once_never_spend_one_use_twice(pair: tuple[SharedState, SharedState]) -> None:
    a, b = pair
    await a.grants.put_grant(_grant(uses_left=5))
    taken = await asyncio.gather(*(state.grants.take_grant_use("gr-1") for _ in range(10) for state in (a, b)))
    assert sum(taken) == 5


async def test_a_grant_without_a_count_is_taken_while_it_stands(pair: tuple[SharedState, SharedState]) -> None:
    a, b = pair
    await a.grants.put_grant(_grant(uses_left=None))
    assert all([await b.grants.take_grant_use("gr-1") for _ in range(3)])
    await b.grants.give_back_grant_use("gr-1")
    assert (await a.grants.get_grant("gr-1")).uses_left is None  # type: ignore[union-attr]


async def test_nothing_is_taken_from_a_revoked_or_expired_grant(pair: tuple[SharedState, SharedState]) -> None:
    a, b = pair
    await a.grants.put_grant(_grant("gr-1"))
    await a.grants.put_grant(_grant("gr-2", expires_at=time.time() + 0.2))
    assert await b.grants.revoke_grant("gr-1")
    assert not await b.grants.revoke_grant("gr-1")
    assert not await a.grants.take_grant_use("gr-1") and await a.grants.get_grant("gr-1") is None
    await asyncio.sleep(0.3)
    assert not await a.grants.take_grant_use("gr-2") and await a.grants.get_grant("gr-2") is None
    assert await b.grants.grants_of("alice") == []
    await a.grants.give_back_grant_use("gr-1")  # gone: nothing comes back
    assert await a.grants.get_grant("gr-1") is None


async def test_a_grant_redis_holds_unsealed_is_no_grant(redis: RedisServer) -> None:  # noqa: F811
    state = redis_state(redis, "a", "forged")
    await state.start(lambda message: None, lambda: [])
    try:
        await state.grants.put_grant(_grant(uses_left=None))
        client = state._redis
        await client.hset("forged:grant:gr-1", "sealed", b"\x01" + b"0" * 32 + b'{"id": "gr-1"}')
        assert await state.grants.get_grant("gr-1") is None
        assert not await state.grants.take_grant_use("gr-1")
        assert await state.grants.grants_of("alice") == []
    finally:
        await state.close()


async def test_a_grant_redis_keeps_past_its_expiry_grants_nothing(redis: RedisServer) -> None:  # noqa: F811
    state: RedisState = redis_state(redis, "a", "persisted")
    await state.start(lambda message: None, lambda: [])
    try:
        await state.grants.put_grant(_grant(expires_at=time.time() + 0.2))
        await state._redis.persist("persisted:grant:gr-1")  # someone with Redis access keeps it
        await asyncio.sleep(0.3)
        assert not await state.grants.take_grant_use("gr-1")
        assert await state.grants.get_grant("gr-1") is None
    finally:
        await state.close()


@pytest.mark.parametrize("uses", [0, -1])
async def test_a_used_up_grant_gives_nothing(pair: tuple[SharedState, SharedState], uses: int) -> None:
    a, _ = pair
    await a.grants.put_grant(_grant(uses_left=uses))
    assert not await a.grants.take_grant_use("gr-1")
