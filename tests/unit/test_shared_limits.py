"""Per-user limits shared by the replicas: one table of cases, run against core/limits.py's pure
rules and against both shared stores (the memory hub, and the Lua scripts on a real redis-server),
so the scripts cannot drift from the rule the single-replica gateway applies."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from gateway.cluster.redis import RedisState
from gateway.cluster.shared import SharedState
from gateway.config.schema import LimitsConfig, SessionsConfig
from gateway.core.limits import Admission, Limited, take_slot, take_token
from gateway.edge import limiter as limiter_module
from gateway.edge.limiter import Limiter
from gateway.ops.metrics import GatewayMetrics
from tests.procs import RedisServer, redis_server
from tests.support.shared_state import HEARTBEAT, OWNER_TIMEOUT, pair, redis, redis_state  # noqa: F401  (fixtures)
from tests.support.logs import RecordingLog


@dataclass(frozen=True)
class TokenCase:
    name: str
    rate: float
    burst: int
    # (time in seconds, admitted, seconds until a token when refused)
    steps: list[tuple[float, bool, float | None]]


TOKEN_CASES = [
    TokenCase("burst_then_refused", 2, 3, [(0, True, None), (0, True, None), (0, True, None), (0, False, 0.5)]),
    TokenCase("refills_at_the_rate", 2, 3, [
        (0, True, None), (0, True, None), (0, True, None), (0.25, False, 0.25), (0.5, True, None), (0.5, False, 0.5),
    ]),
    TokenCase("never_above_the_burst", 10, 2, [(0, True, None), (100, True, None), (100, True, None), (100, False, 0.1)]),
    TokenCase("fractional_rate", 0.5, 1, [(0, True, None), (1, False, 1.0), (2, True, None)]),
    TokenCase("clock_backwards_refills_nothing", 1, 1, [(10, True, None), (5, False, 1.0), (11, True, None)]),
    TokenCase("refusals_spend_nothing", 1, 1, [(0, True, None), (0.5, False, 0.5), (0.9, False, 0.1), (1.0, True, None)]),
]


def _core_tokens(case: TokenCase) -> list[tuple[bool, float | None]]:
    kept: tuple[float, float] | None = None
    out = []
    for now, _, _ in case.steps:
        tokens, wait = take_token(None if kept is None else kept[0], 0.0 if kept is None else kept[1], now, case.rate, case.burst)
        kept = (tokens, now)
        out.append((wait is None, wait))
    return out


def _expected(case: TokenCase) -> list[tuple[bool, float | None]]:
    return [(admitted, wait) for _, admitted, wait in case.steps]


def _same(got: list[tuple[bool, float | None]], want: list[tuple[bool, float | None]]) -> bool:
    return all(
        g[0] == w[0] and ((g[1] is None) == (w[1] is None)) and (g[1] is None or w[1] is None or abs(g[1] - w[1]) < 1e-6)
        for g, w in zip(got, want, strict=True)
    )


@pytest.mark.parametrize("case", TOKEN_CASES, ids=lambda c: c.name)
def test_shared_limit_token_rule(case: TokenCase) -> None:
    assert _same(_core_tokens(case), _expected(case)), _core_tokens(case)


@pytest.mark.parametrize("case", TOKEN_CASES, ids=lambda c: c.name)
async def test_shared_limit_token_store(pair: tuple[SharedState, SharedState], case: TokenCase) -> None:
    """The same steps, alternating between two replicas: one bucket."""
    user = "u-" + secrets.token_hex(4)
    base = 1_000_000.0  # any origin: the store's clock is given
    got = []
    for index, (now, _, _) in enumerate(case.steps):
        wait = await pair[index % 2].take_token(user, rate=case.rate, burst=case.burst, now=base + now)
        got.append((wait is None, wait))
    assert _same(got, _expected(case)), got


@dataclass(frozen=True)
class SlotCase:
    name: str
    cap: int
    lease: float
    # (time, action, slot id, expected): action "open" (expected: taken), "close", "renew" (expected: None)
    steps: list[tuple[float, str, str, bool | None]]


SLOT_CASES = [
    SlotCase("cap_then_refused", 2, 10, [(0, "open", "a1", True), (0, "open", "b1", True), (0, "open", "a2", False)]),
    SlotCase("close_frees", 2, 10, [
        (0, "open", "a1", True), (0, "open", "b1", True), (1, "close", "a1", None), (1, "open", "b2", True),
        (1, "open", "a3", False),
    ]),
    SlotCase("lease_ends_without_renewal", 1, 3, [(0, "open", "a1", True), (2, "open", "b1", False), (3, "open", "b1", True)]),
    SlotCase("renewal_keeps_it", 1, 3, [
        (0, "open", "a1", True), (2, "renew", "a1", None), (4, "open", "b1", False), (5, "open", "b1", True),
    ]),
    SlotCase("renewal_after_close_takes_nothing", 1, 3, [
        (0, "open", "a1", True), (1, "close", "a1", None), (1, "renew", "a1", None), (1, "open", "b1", True),
    ]),
    SlotCase("same_slot_again_is_taken", 1, 3, [(0, "open", "a1", True), (0, "open", "a1", True), (0, "open", "b1", False)]),
]


def _core_slots(case: SlotCase) -> list[bool | None]:
    held: dict[str, float] = {}
    out: list[bool | None] = []
    for now, action, slot, _ in case.steps:
        if action == "open":
            if slot in held:
                held[slot] = now + case.lease
                out.append(True)
                continue
            expired, fits = take_slot(held, now, case.cap)
            for gone in expired:
                del held[gone]
            if fits:
                held[slot] = now + case.lease
            out.append(fits)
        elif action == "close":
            held.pop(slot, None)
            out.append(None)
        else:
            if slot in held:
                held[slot] = now + case.lease
            out.append(None)
    return out


@pytest.mark.parametrize("case", SLOT_CASES, ids=lambda c: c.name)
def test_shared_limit_slot_rule(case: SlotCase) -> None:
    assert _core_slots(case) == [want for *_, want in case.steps]


@pytest.mark.parametrize("case", SLOT_CASES, ids=lambda c: c.name)
async def test_shared_limit_slot_store(pair: tuple[SharedState, SharedState], case: SlotCase) -> None:
    """Slots named a... are replica a's, b... replica b's: one count for the user on both."""
    user = "u-" + secrets.token_hex(4)
    base = 1_000_000.0
    got: list[bool | None] = []
    for now, action, slot, _ in case.steps:
        replica = pair[0] if slot.startswith("a") else pair[1]
        if action == "open":
            got.append(await replica.open_slot(user, slot, cap=case.cap, lease=case.lease, now=base + now))
        elif action == "close":
            await replica.close_slot(user, slot)
            got.append(None)
        else:
            await replica.renew_slots({user: [slot]}, lease=case.lease, now=base + now)
            got.append(None)
    assert got == [want for *_, want in case.steps]


# A streamed request's token and slot in one step: (time, "both" or "close", slot, (wait, taken)).
BOTH_STEPS: list[tuple[float, str, str, tuple[float | None, bool] | None]] = [
    (0, "both", "a1", (None, True)),
    (0, "both", "b1", (None, False)),  # over the cap: refused, its token spent (as with one replica)
    (0, "both", "a2", (1.0, False)),  # no token: no slot tried
    (1, "close", "a1", None),
    (1, "both", "b2", (None, True)),
    (1, "both", "a3", (1.0, False)),
]
BOTH_RATE, BOTH_BURST, BOTH_CAP, BOTH_LEASE = 1.0, 2, 1, 10.0


def _core_both() -> list[tuple[float | None, bool] | None]:
    bucket: tuple[float, float] | None = None
    held: dict[str, float] = {}
    out: list[tuple[float | None, bool] | None] = []
    for now, action, slot, _ in BOTH_STEPS:
        if action == "close":
            held.pop(slot, None)
            out.append(None)
            continue
        tokens, wait = take_token(None if bucket is None else bucket[0], 0.0 if bucket is None else bucket[1], now, BOTH_RATE, BOTH_BURST)
        bucket = (tokens, now)
        if wait is not None:
            out.append((wait, False))
            continue
        expired, fits = take_slot(held, now, BOTH_CAP)
        for gone in expired:
            del held[gone]
        if fits:
            held[slot] = now + BOTH_LEASE
        out.append((None, fits))
    return out


def test_shared_limit_token_and_slot_rule() -> None:
    assert _core_both() == [want for *_, want in BOTH_STEPS]


async def test_shared_limit_token_and_slot_store(pair: tuple[SharedState, SharedState]) -> None:
    user = "u-" + secrets.token_hex(4)
    base = 1_000_000.0
    got: list[tuple[float | None, bool] | None] = []
    for now, action, slot, _ in BOTH_STEPS:
        replica = pair[0] if slot.startswith("a") else pair[1]
        if action == "close":
            await replica.close_slot(user, slot)
            got.append(None)
        else:
            got.append(await replica.take_token_and_slot(
                user, slot, rate=BOTH_RATE, burst=BOTH_BURST, cap=BOTH_CAP, lease=BOTH_LEASE, now=base + now,
            ))
    assert got == [want for *_, want in BOTH_STEPS]


async def test_shared_limit_redis_clock_and_expiry(pair: tuple[SharedState, SharedState]) -> None:
    """On the store's own clock (Redis's TIME in the script): a bucket refills as time passes there,
    and is forgotten once full; a slot's lease ends a lease after it was last renewed."""
    a, b = pair
    user = "u-" + secrets.token_hex(4)
    assert await a.take_token(user, rate=10, burst=1) is None
    wait = await b.take_token(user, rate=10, burst=1)
    assert wait is not None and 0 < wait <= 0.1
    await asyncio.sleep(0.15)
    assert await b.take_token(user, rate=10, burst=1) is None
    assert await a.open_slot(user, "a1", cap=1, lease=0.3)
    assert not await b.open_slot(user, "b1", cap=1, lease=0.3)
    await asyncio.sleep(0.2)
    assert await a.renew_slots({user: ["a1"]}, lease=0.3) == 1
    await asyncio.sleep(0.2)
    assert not await b.open_slot(user, "b1", cap=1, lease=0.3)  # renewed: still held
    await asyncio.sleep(0.35)
    assert await b.open_slot(user, "b1", cap=1, lease=0.3)  # a stopped renewing (it died): freed
    if isinstance(a, RedisState):
        # Idle keys go: a full bucket and a user's last slot say nothing a missing key does not.
        await b.close_slot(user, "b1")
        await asyncio.sleep(0.15)
        assert not await a._redis.exists(f"{a._prefix}:rate:{user}", f"{a._prefix}:streams:{user}")


# ---- the edge's Limiter: two replicas on one redis-server, and the fallback ---------------------

SESSIONS = SessionsConfig(heartbeat_interval=HEARTBEAT, owner_timeout=OWNER_TIMEOUT)


def _limiter(state: SharedState, **limits: object) -> tuple[Limiter, GatewayMetrics]:
    metrics = GatewayMetrics()
    return Limiter(Admission(LimitsConfig(**limits)), state, metrics, SESSIONS), metrics  # type: ignore[arg-type]


def _count(metrics: GatewayMetrics, check: str, result: str) -> float:
    return metrics.shared_limits.labels(check, result)._value.get()  # type: ignore[no-any-return]


@pytest.fixture
def own_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with redis_server(tmp_path_factory.mktemp("own-redis")) as server:
        yield server


async def _replicas(server: RedisServer) -> tuple[RedisState, RedisState]:
    prefix = "t" + secrets.token_hex(4)
    a, b = redis_state(server, "a", prefix), redis_state(server, "b", prefix)
    for state in (a, b):
        await state.start(lambda message: None, lambda: [])
    return a, b


async def test_shared_limit_two_limiters_share_one_bucket_and_one_stream_cap(own_redis: RedisServer) -> None:
    a, b = await _replicas(own_redis)
    (la, ma), (lb, mb) = _limiter(a, rate_per_user=0.01, burst_per_user=4, max_streams_per_user=2), _limiter(
        b, rate_per_user=0.01, burst_per_user=4, max_streams_per_user=2)
    la.start(), lb.start()
    try:
        admitted = 0
        for index in range(8):
            try:
                await (la if index % 2 else lb).check_rate("u", 0.0)
                admitted += 1
            except Limited as exc:
                assert exc.status == 429 and exc.code == "rate_limited" and exc.retry_after
        assert admitted == 4  # the burst, across both replicas
        assert _count(ma, "rate", "admitted") + _count(mb, "rate", "admitted") == 4
        assert _count(ma, "rate", "limited") + _count(mb, "rate", "limited") == 4
        first, second = await la.open_stream("u"), await lb.open_stream("u")
        for limiter in (la, lb):
            with pytest.raises(Limited) as refused:
                await limiter.open_stream("u")
            assert refused.value.status == 429 and refused.value.code == "too_many_streams"
        assert la.streams_total == 1 and lb.streams_total == 1  # a refused stream holds nothing here
        # Held longer than a lease: the heartbeat renews it.
        await asyncio.sleep(OWNER_TIMEOUT * 2)
        with pytest.raises(Limited):
            await lb.open_stream("u")
        first.release()
        first.release()  # idempotent
        await _until_true(lambda: _opens(lb, "u"))
        second.release()
    finally:
        for limiter, state in ((la, a), (lb, b)):
            await limiter.close()
            await state.close()


async def _opens(limiter: Limiter, user: str) -> bool:
    try:
        slot = await limiter.open_stream(user)
    except Limited:
        return False
    slot.release()
    return True


async def _until_true(probe: object, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await probe():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("fallback", ["local", "refuse"])
async def test_shared_limit_fallback_when_redis_is_down_then_recovery(
    own_redis: RedisServer, fallback: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = RecordingLog()
    monkeypatch.setattr(limiter_module, "log", log)
    a, _b = await _replicas(own_redis)
    limiter, metrics = _limiter(a, rate_per_user=1000, burst_per_user=3, max_streams_per_user=1, shared_fallback=fallback)
    limiter.start()
    try:
        await limiter.check_rate("u", 0.0)
        await asyncio.to_thread(own_redis.stop)
        # Bounded: the first check after Redis went away waits for the backend's timeout at most,
        # and the ones after it fall back at once (the backend knows Redis is down).
        started = asyncio.get_running_loop().time()
        for _ in range(5):
            if fallback == "local":
                try:
                    await limiter.check_rate("u", 0.0)  # this replica's own bucket: a burst of 3
                except Limited as exc:
                    assert exc.status == 429
            else:
                with pytest.raises(Limited) as refused:
                    await limiter.check_rate("u", 0.0)
                assert refused.value.status == 503 and refused.value.code == "limits_unavailable"
                assert refused.value.retry_after == 1
        assert asyncio.get_running_loop().time() - started < 6.0
        if fallback == "local":
            assert _count(metrics, "rate", "local") == 5
            held = await limiter.open_stream("u")
            with pytest.raises(Limited) as over:
                await limiter.open_stream("u")  # never unlimited: the cap applies on this replica
            assert over.value.status == 429
            held.release()
        else:
            assert _count(metrics, "rate", "refused") == 5
            with pytest.raises(Limited):
                await limiter.open_stream("u")
        assert len(log.named("shared_limits_unavailable")) == 1  # once per transition
        assert log.named("shared_limits_unavailable")[0]["fallback"] == fallback
        await asyncio.to_thread(own_redis.start)

        async def shared_again() -> bool:
            before = _count(metrics, "rate", "admitted")
            try:
                await limiter.check_rate("v", 0.0)
            except Limited:
                return False
            return _count(metrics, "rate", "admitted") == before + 1

        await _until_true(shared_again, timeout=10)
        assert len(log.named("shared_limits_restored")) == 1
    finally:
        await limiter.close()
        await a.close()
        await _b.close()


async def test_shared_limit_streamed_request_takes_token_and_slot_in_one_round_trip(own_redis: RedisServer) -> None:
    from tests.ops.stack import redis_calls

    a, b = await _replicas(own_redis)
    (la, ma), (lb, _mb) = (_limiter(state, rate_per_user=0.01, burst_per_user=3, max_streams_per_user=1) for state in (a, b))
    try:
        (await la.admit_stream("warm", 0.0)).release()  # the script loaded (a first EVALSHA meets NOSCRIPT)
        before = redis_calls(own_redis, "evalsha")
        held = await la.admit_stream("u", 0.0)
        assert redis_calls(own_redis, "evalsha") == before + 1  # the token and the slot: one script
        with pytest.raises(Limited) as cap:
            await lb.admit_stream("u", 0.0)  # the cap, on the other replica: its token is spent
        assert cap.value.status == 429 and cap.value.code == "too_many_streams"
        await lb.check_rate("u", 0.0)  # the third and last token
        with pytest.raises(Limited) as rate:
            await la.admit_stream("u", 0.0)
        assert rate.value.code == "rate_limited" and la.streams_total == 1  # no slot taken for it
        assert _count(ma, "rate", "admitted") == 2 and _count(ma, "stream", "admitted") == 2
        assert _count(ma, "rate", "limited") == 1 and _count(ma, "stream", "limited") == 0
        held.release()
        assert la.streams_total == 0
    finally:
        for limiter, state in ((la, a), (lb, b)):
            await limiter.close()
            await state.close()


async def test_shared_limit_a_hanging_redis_holds_admission_two_seconds_at_most(own_redis: RedisServer) -> None:
    """A Redis that stops answering (SIGSTOP: connections stay open, nothing comes back): the first
    check falls back after the limit timeout (a connect's 2 s, not a command's 5 s and its retry),
    the next ones at once, as the backend then knows Redis is down."""
    import os
    import signal

    a, _b = await _replicas(own_redis)
    limiter, metrics = _limiter(a, rate_per_user=1000, burst_per_user=10)
    assert own_redis.proc is not None
    try:
        await limiter.check_rate("u", 0.0)
        os.kill(own_redis.proc.pid, signal.SIGSTOP)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await limiter.check_rate("u", 0.0)  # local fallback (the default)
        first = loop.time() - started
        started = loop.time()
        slot = await limiter.admit_stream("u", 0.0)
        second = loop.time() - started
        slot.release()
        assert 1.5 <= first <= 3.0 and second < 0.5, (first, second)
        assert _count(metrics, "rate", "local") == 2 and _count(metrics, "stream", "local") == 1
    finally:
        os.kill(own_redis.proc.pid, signal.SIGCONT)
        await limiter.close()
        await a.close()
        await _b.close()
