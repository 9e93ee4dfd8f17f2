"""Per-user limits shared by the replicas: one table of cases, run against core/limits.py's pure
rules and against both shared stores (the memory hub, and the Lua scripts on a real redis-server),
so the scripts cannot drift from the rule the single-replica gateway applies."""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass

import pytest

from gateway.cluster.shared import SharedState
from gateway.core.limits import take_slot, take_token
from tests.unit.shared_pair import pair, redis  # noqa: F401  (fixtures)


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
