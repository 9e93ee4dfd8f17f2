"""The owner's side of standing grants (cluster/grant_uses.py): a use is reserved before the chat's
machine decides, kept only when the grant decided the call, given back otherwise; a store that
cannot answer grants nothing (the call is asked as without grants)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from gateway.approvals.grants import USER_AUTHORITY, Grant, grant_rule
from gateway.approvals.ports import GrantScope
from gateway.cluster.grant_uses import GrantUses
from gateway.cluster.memory import MemoryState
from gateway.cluster.messages import Gate
from gateway.cluster.shared import SharedStateDown
from gateway.core.approvals import GatedCall
from gateway.config.schema import ToolPolicy, parse_config

# The supervisors as the config is now: the approver key `boss`, not `gone` (a reload took them out).
APPROVERS = parse_config(
    "approvers:\n  api_keys: [{id: boss, key: k-boss}, {id: gone, key: k-gone}]\n  groups: {supervisors: {users: [boss]}}\n",
    env={},
).approvers
GATE = Gate(app="app", user="alice", session="s", tool_call_id="t1", tool="pay", args={"amount": 50})


class _Calls:
    """The chats as grant_uses sees them: chat c of agent `agent`, and the call its machine opened."""

    def __init__(self) -> None:
        self.call: GatedCall | None = None

    def grant_scope(self, app_name: str, user_id: str, session_id: str) -> GrantScope | None:
        return GrantScope("agent", "c", {}, APPROVERS) if session_id == "s" else None

    def find(self, **_: Any) -> GatedCall | None:
        return self.call


def _grant(grant_id: str = "gr-1", **changes: Any) -> Grant:
    now = time.time()
    grant = Grant(
        id=grant_id, agent="agent", tool="pay", user_id="alice", chat_id="c", condition=None, expires_at=now + 60,
        uses_left=1, granted_by={"user": "alice", "auth": "api_key"}, authority=USER_AUTHORITY, created_at=now,
    )
    return replace(grant, **changes)


def _call(rule: str | None) -> GatedCall:
    call = GatedCall.open(user_id="alice", chat_id="c", session_id="s", tool_call_id="t1", tool="pay", args={},
                          policy=ToolPolicy(approval=True), now=1.0)
    call.decide_by_rule(True, rule, None)
    return call


async def test_a_use_is_kept_when_the_grant_decided_and_given_back_otherwise() -> None:
    state, calls = MemoryState("a"), _Calls()
    uses = GrantUses(state.grants, calls)  # type: ignore[arg-type]
    await state.grants.put_grant(_grant(uses_left=1))
    reserved = await uses.reserve(GATE)
    assert reserved is not None and reserved.id == "gr-1"
    assert await uses.reserve(GATE) is None  # its one use is reserved: no second call gets it
    calls.call = _call("small")  # a rule decided first
    await uses.settle(reserved, GATE, opened=True)
    assert (await state.grants.get_grant("gr-1")).uses_left == 1  # type: ignore[union-attr]
    reserved = await uses.reserve(GATE)
    calls.call = _call(grant_rule("gr-1"))
    await uses.settle(reserved, GATE, opened=True)
    assert (await state.grants.get_grant("gr-1")).uses_left == 0  # type: ignore[union-attr]
    assert await uses.reserve(GATE) is None


async def test_a_repeated_ask_gives_the_use_back() -> None:
    state, calls = MemoryState("a"), _Calls()
    uses = GrantUses(state.grants, calls)  # type: ignore[arg-type]
    await state.grants.put_grant(_grant(uses_left=1))
    reserved = await uses.reserve(GATE)
    calls.call = _call(grant_rule("gr-1"))  # decided by it before: this ask re-attaches
    await uses.settle(reserved, GATE, opened=False)
    assert (await state.grants.get_grant("gr-1")).uses_left == 1  # type: ignore[union-attr]


async def test_the_next_candidate_is_tried_when_one_is_used_up_and_none_outside_the_chat() -> None:
    state, calls = MemoryState("a"), _Calls()
    uses = GrantUses(state.grants, calls)  # type: ignore[arg-type]
    await state.grants.put_grant(_grant("gr-1", uses_left=1, created_at=1.0))
    await state.grants.put_grant(_grant("gr-2", uses_left=None, created_at=2.0))
    assert await state.grants.take_grant_use("gr-1")  # another call took it meanwhile
    reserved = await uses.reserve(GATE)
    assert reserved is not None and reserved.id == "gr-2"
    assert await uses.reserve(replace(GATE, session="elsewhere")) is None


async def test_a_group_grant_whose_granter_left_the_group_decides_nothing() -> None:
    state, calls = MemoryState("a"), _Calls()
    uses = GrantUses(state.grants, calls)  # type: ignore[arg-type]
    group = {"user_id": None, "chat_id": None, "authority": "supervisors", "uses_left": None}
    await state.grants.put_grant(_grant("gr-gone", **group, granted_by={
        "user": "gone", "auth": "approver_key", "principal": "approver_key:gone"}))
    assert await uses.reserve(GATE) is None
    await state.grants.put_grant(_grant("gr-boss", **group, granted_by={
        "user": "boss", "auth": "approver_key", "principal": "approver_key:boss"}))
    reserved = await uses.reserve(GATE)
    assert reserved is not None and reserved.id == "gr-boss"


class _Down:
    async def grants_of(self, user_id: str) -> list[Grant]:
        raise SharedStateDown("redis is down")

    async def give_back_grant_use(self, grant_id: str) -> None:
        raise SharedStateDown("redis is down")


async def test_a_store_that_cannot_answer_grants_nothing() -> None:
    uses = GrantUses(_Down(), _Calls())  # type: ignore[arg-type]
    assert await uses.reserve(GATE) is None
    await uses.settle(_grant(), GATE, opened=True)  # nothing to give back to: logged, not raised
