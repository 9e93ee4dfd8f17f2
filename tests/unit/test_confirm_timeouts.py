"""Confirm mode's timeouts in the chat service, against a fake ADK (the real one:
tests/integration/test_confirm_timeouts.py): the deadline's answer goes to ADK once, a late answer
never goes as the person's, and the two racing still make one answer."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.chat.service import ChatService
from gateway.core.deadlines import BROWSER_TIMEOUT_ERROR, TIMEOUT_ERROR, Deadline
from gateway.chat.ports import NO_RUN_WATCHER
from gateway.cluster.memory import MemoryHub, MemoryState
from gateway.cluster.router import Cluster
from tests.support.adk import CONFIRM_ID, NativeAdk
from tests.support.chat import USER, read, request
from tests.support.clock import Clock
from tests.support.service import chat_service
from tests.unit.test_native_replay import approval_of

AGENT = "demo_agent"
ASKED_AT = 1_700_000_000.0  # ADK's event timestamp
TIMEOUT = 10.0

CONFIG = """\
internal:
  secret: s3cret
upstream:
  url: http://adk:8000
  app_name: demo_agent
  approvals: confirm
tools:
  process_payment: {{approval: true, timeout: {timeout}s, on_timeout: {on_timeout}}}
"""


def confirming() -> NativeAdk:
    """The fake ADK with what confirm mode reads: when it asked (its event's timestamp, in the
    message the run that asked told ADK as state), and the plugin's answer to a rejected call."""
    return NativeAdk(asked_at=ASKED_AT, rejects=True)


def wall_clock() -> Clock:
    return Clock(ASKED_AT + 0.5)


class _Kept:
    """The chat service's `DeadlineQueue` (gateway/chat/ports.py): keeps every deadline it is given."""

    def __init__(self, kept: list[Deadline]) -> None:
        self.kept = kept

    def add(self, deadline: Deadline) -> None:
        self.kept.append(deadline)

    def drop(self, key: str) -> None:
        pass


def service(
    adk: NativeAdk, wall: Clock, on_timeout: str = "deny", *, browser: bool = False,
) -> tuple[ChatService, list[Deadline]]:
    text = CONFIG.format(timeout=int(TIMEOUT), on_timeout=on_timeout)
    if browser:  # the same call, run by the browser once approved
        text = text.replace("{approval: true,", "{approval: true, runs_in: browser,")
    chats = chat_service(text, adk=adk, wall=wall)
    kept: list[Deadline] = []
    chats.attach(runs=NO_RUN_WATCHER, deadlines=_Kept(kept))
    return chats, kept


@contextlib.asynccontextmanager
async def two_replicas(
    adk: NativeAdk, wall: Clock, hub: MemoryHub, *, browser: bool = False,
) -> AsyncIterator[tuple[Cluster, Cluster]]:
    """Replicas A and B of one ADK, sharing `hub` (the memory backend), started and then stopped."""
    clusters = []
    for name in ("a", "b"):
        chats, _ = service(adk, wall, browser=browser)
        cluster = Cluster(MemoryState(name, hub), chats, chats.metrics)
        await cluster.start()
        clusters.append(cluster)
    try:
        yield clusters[0], clusters[1]
    finally:
        for cluster in clusters:
            await cluster.chats.close()
            await cluster.close()


def answers(adk: NativeAdk) -> list[dict[str, Any]]:
    return [
        p["functionResponse"]["response"] for m in adk.sent for p in m.get("parts", ())
        if p.get("functionResponse", {}).get("id") == CONFIRM_ID
    ]


async def ask(chats: ChatService) -> list[dict[str, Any]]:
    first = await read(await chats.submit(AGENT, "alice", request(USER)))
    await asyncio.sleep(0)  # the run's task ends: its deadline is set
    return first


async def test_a_passed_deadline_is_answered_once_and_the_late_answer_reads_it() -> None:
    adk, wall = confirming(), wall_clock()
    chats, kept = service(adk, wall)
    first = await ask(chats)
    [deadline] = kept
    # Runs from the gateway's first sight (later than ADK's timestamp here).
    assert deadline.approval_id == CONFIRM_ID and deadline.due == pytest.approx(wall.now + TIMEOUT)
    assert await chats.desk_view.expire_confirmation(deadline) == pytest.approx(wall.now + TIMEOUT)  # not yet
    assert answers(adk) == []
    wall.now += TIMEOUT
    assert await chats.desk_view.expire_confirmation(deadline) is None
    await asyncio.sleep(0.05)
    assert answers(adk) == [{"confirmed": False}]
    assert await chats.desk_view.expire_confirmation(deadline) is None  # claimed twice: answered once
    answer = approval_of(first)
    late = await read(await chats.submit(AGENT, "alice", request(USER, answer, message_id=answer["id"])))
    assert {"type": "tool-output-denied", "toolCallId": "call-1"} in late
    assert answers(adk) == [{"confirmed": False}]
    metrics = chats.metrics.render().decode()
    assert 'adk_gateway_approval_timeouts_total{agent="demo_agent",tool="process_payment"} 1.0' in metrics
    assert 'outcome="timeout",tool="process_payment"} 1.0' in metrics
    await chats.close()


async def test_on_timeout_error_sends_the_gateways_error_and_the_browser_sees_it() -> None:
    adk, wall = confirming(), wall_clock()
    chats, kept = service(adk, wall, on_timeout="error")
    first = await ask(chats)
    wall.now += TIMEOUT
    assert await chats.desk_view.expire_confirmation(kept[0]) is None
    answer = approval_of(first)
    late = await read(await chats.submit(AGENT, "alice", request(USER, answer, message_id=answer["id"])))
    assert answers(adk) == [{"confirmed": False, "payload": {"adk_gateway": {"error": TIMEOUT_ERROR}}}]
    assert {"type": "tool-output-error", "toolCallId": "call-1", "errorText": TIMEOUT_ERROR} in late
    await chats.close()


async def test_an_answer_after_the_deadline_nobody_answered_sends_the_timeout_instead() -> None:
    """The gateway was down at the deadline (a fresh service knows nothing of the chat): ADK's
    timestamp decides."""
    adk, wall = confirming(), wall_clock()
    chats, _ = service(adk, wall)
    first = await ask(chats)
    fresh, _ = service(adk, wall)
    answer = approval_of(first)
    wall.now = ASKED_AT + TIMEOUT - 0.1  # in time by ADK's clock: the person's answer goes
    # (not sent here: this is the rule's edge) ... and after the deadline it does not:
    wall.now = ASKED_AT + TIMEOUT
    late = await read(await fresh.submit(AGENT, "alice", request(USER, answer, message_id=answer["id"])))
    assert answers(adk) == [{"confirmed": False}]
    assert {"type": "tool-output-denied", "toolCallId": "call-1"} in late
    await fresh.close()
    await chats.close()


@pytest.mark.parametrize("browser_first", [False, True])
async def test_a_late_answer_racing_the_deadline_makes_one_answer_and_reads_the_timeout(browser_first: bool) -> None:
    adk, wall = confirming(), wall_clock()
    chats, kept = service(adk, wall)
    first = await ask(chats)
    wall.now += TIMEOUT
    answer = approval_of(first)
    adk.slow.clear()  # both read ADK's session at once
    if browser_first:
        answering = asyncio.create_task(chats.submit(AGENT, "alice", request(USER, answer, message_id=answer["id"])))
        await asyncio.sleep(0)
    expiring = asyncio.create_task(chats.desk_view.expire_confirmation(kept[0]))
    if not browser_first:
        await asyncio.sleep(0)
        answering = asyncio.create_task(chats.submit(AGENT, "alice", request(USER, answer, message_id=answer["id"])))
    await asyncio.sleep(0.01)
    adk.slow.set()
    again = await expiring
    late = await read(await answering)
    assert answers(adk) == [{"confirmed": False}]
    assert {"type": "tool-output-denied", "toolCallId": "call-1"} in late
    if again is not None:  # the browser's request sent the timeout first: the deadline finds it answered
        assert await chats.desk_view.expire_confirmation(kept[0]) is None
    assert answers(adk) == [{"confirmed": False}]
    await chats.close()


async def test_a_deadline_claimed_by_another_replica_is_answered_once_on_the_live_owner() -> None:
    """B claimed a deadline of a chat A runs: A answers it (an `expire` notice), and the deadline
    stays in the store until A handled it, so a notice lost with A would be claimed again."""
    adk, wall, hub = confirming(), wall_clock(), MemoryHub()
    async with two_replicas(adk, wall, hub) as (a, b):
        first = await read(await a.submit(AGENT, "alice", request(USER)))
        await asyncio.sleep(0.01)  # the run ended: A keeps its deadline in the store
        deadline = hub.deadlines.get(f"chat-1/{CONFIRM_ID}")
        assert deadline is not None
        wall.now = deadline.due
        [claimed] = await b.state.claim_deadlines(wall.now)
        assert await b._deadlines.answer(claimed) == pytest.approx(wall.now + b._deadlines._recheck)  # handed to A
        assert hub.deadlines.get(deadline.key) is not None  # in the store (leased to B) until A handled it
        async with asyncio.timeout(5):
            while hub.deadlines.get(deadline.key) is not None or not answers(adk):
                await asyncio.sleep(0.01)
        assert answers(adk) == [{"confirmed": False}]
        assert a.chats.metrics.registry.get_sample_value(
            "adk_gateway_approval_timeouts_total", {"agent": AGENT, "tool": "process_payment"},
        ) == 1
        # Claimed again anyway (a notice that looked lost): ADK's session says it was answered.
        assert await b._deadlines.answer(deadline) == pytest.approx(wall.now + b._deadlines._recheck)
        await asyncio.sleep(0.05)
        assert answers(adk) == [{"confirmed": False}]
        answer = approval_of(first)
        late = await read(await b.submit(AGENT, "alice", request(USER, answer, message_id=answer["id"])))
        assert {"type": "tool-output-denied", "toolCallId": "call-1"} in late


# ---- a browser tool's second wait ----------------------------------------------------------------


def browser_output(first: list[dict[str, Any]], output: Any) -> dict[str, Any]:
    """The assistant message a Chat sends once the browser ran the approved call (onToolCall)."""
    message = approval_of(first)
    part = message["parts"][1]
    message["parts"][1] = {**part, "state": "output-available", "output": output}
    return message


async def send_output(chats: ChatService, first: list[dict[str, Any]]) -> list[dict[str, Any]]:
    body = request(USER, browser_output(first, {"paid": 50}), message_id=first[0]["messageId"])
    return await read(await chats.submit(AGENT, "alice", body))


async def approve_in_browser(chats: ChatService, first: list[dict[str, Any]]) -> list[dict[str, Any]]:
    answer = approval_of(first)
    handed = await read(await chats.submit(AGENT, "alice", request(USER, answer, message_id=answer["id"])))
    handover = {"type": "tool-input-available", "toolCallId": "call-1", "toolName": "process_payment", "input": {"amount": 50}}
    assert handover in handed
    return handed


async def test_an_approved_browser_tool_gets_the_whole_timeout_for_the_browser_and_its_output_goes_once() -> None:
    """Approved at 0.9 of the timeout, the output at 1.5: hold mode starts a fresh deadline for the
    browser's wait, and so does confirm mode; the first deadline passing answers nothing."""
    adk, wall = confirming(), wall_clock()
    chats, kept = service(adk, wall, browser=True)
    first = await ask(chats)
    [asked] = kept
    seen = wall.now
    wall.now = seen + 0.9 * TIMEOUT
    await approve_in_browser(chats, first)
    assert answers(adk) == []  # nothing goes to ADK with the approval alone
    [_, moved] = kept  # the stored deadline is replaced: the browser's wait runs from the approval
    assert moved.key == asked.key and moved.due == pytest.approx(wall.now + TIMEOUT)
    assert moved.approved_at == pytest.approx(wall.now)
    approved = wall.now
    wall.now = seen + TIMEOUT
    # The first deadline, claimed before its replacement reached the store: not yet.
    assert await chats.desk_view.expire_confirmation(asked) == pytest.approx(approved + TIMEOUT)
    wall.now = seen + 1.5 * TIMEOUT
    assert await chats.desk_view.expire_confirmation(moved) == pytest.approx(approved + TIMEOUT)
    assert answers(adk) == []
    done = await send_output(chats, first)
    assert any(c.get("delta") == "Paid." for c in done)  # ADK ran on with the tool's result
    assert answers(adk) == [{"confirmed": True, "payload": {"adk_gateway": {"output": {"paid": 50}}}}]
    # The deadline passing afterwards finds it answered: no timeout goes out.
    wall.now = approved + TIMEOUT
    assert await chats.desk_view.expire_confirmation(moved) is None
    await asyncio.sleep(0.05)
    assert answers(adk) == [{"confirmed": True, "payload": {"adk_gateway": {"output": {"paid": 50}}}}]
    assert chats.metrics.registry.get_sample_value(
        "adk_gateway_approval_timeouts_total", {"agent": AGENT, "tool": "process_payment"},
    ) in (None, 0)
    await chats.close()


async def test_a_browser_that_never_answers_times_out_a_whole_timeout_after_the_approval() -> None:
    adk, wall = confirming(), wall_clock()
    chats, kept = service(adk, wall, on_timeout="error", browser=True)
    first = await ask(chats)
    seen = wall.now
    wall.now = seen + 0.9 * TIMEOUT
    await approve_in_browser(chats, first)
    approved, moved = wall.now, kept[-1]
    for at in (seen + TIMEOUT, approved + TIMEOUT - 0.01):
        wall.now = at
        assert await chats.desk_view.expire_confirmation(moved) == pytest.approx(approved + TIMEOUT)
        assert answers(adk) == []
    wall.now = approved + TIMEOUT
    assert await chats.desk_view.expire_confirmation(moved) is None
    await asyncio.sleep(0.05)
    # Worded as hold mode words the browser's wait timing out.
    assert answers(adk) == [{"confirmed": False, "payload": {"adk_gateway": {"error": BROWSER_TIMEOUT_ERROR}}}]
    # The browser's output after that is not the call's result: it reads the timeout.
    late = await send_output(chats, first)
    assert {"type": "tool-output-error", "toolCallId": "call-1", "errorText": BROWSER_TIMEOUT_ERROR} in late
    assert len(answers(adk)) == 1
    await chats.close()


async def test_an_output_after_the_browsers_own_deadline_sends_the_timeout_instead() -> None:
    """Nobody answered the deadline (the timer was late): the output, past approved_at + timeout,
    is replaced by the timeout's answer, as a late approval is."""
    adk, wall = confirming(), wall_clock()
    chats, _ = service(adk, wall, browser=True)
    first = await ask(chats)
    wall.now += 0.9 * TIMEOUT
    await approve_in_browser(chats, first)
    wall.now += TIMEOUT
    await send_output(chats, first)
    assert answers(adk) == [{"confirmed": False}]
    await chats.close()


async def test_the_approving_replica_moves_the_stored_deadline_so_another_replica_claims_it_late() -> None:
    """The approval is known only where it was taken: that replica replaces the deadline in the
    shared store, so no replica's timer claims the first one."""
    adk, wall, hub = confirming(), wall_clock(), MemoryHub()
    async with two_replicas(adk, wall, hub, browser=True) as (a, b):
        first = await read(await a.submit(AGENT, "alice", request(USER)))
        await asyncio.sleep(0.01)
        key = f"chat-1/{CONFIRM_ID}"
        asked = hub.deadlines.get(key)
        assert asked is not None and asked.approved_at is None
        wall.now = asked.due - 0.1 * TIMEOUT
        answer = approval_of(first)
        await read(await a.submit(AGENT, "alice", request(USER, answer, message_id=answer["id"])))
        await asyncio.sleep(0.01)
        moved = hub.deadlines.get(key)
        assert moved is not None and moved.due == pytest.approx(wall.now + TIMEOUT)
        assert moved.approved_at == pytest.approx(wall.now)
        wall.now = asked.due
        assert await b.state.claim_deadlines(wall.now) == []  # nothing due at the first deadline
        # One claimed before the move still answers nothing on the owner, and comes back at the new time.
        assert await b._deadlines.answer(asked) == pytest.approx(wall.now + b._deadlines._recheck)  # handed to the owner
        async with asyncio.timeout(5):
            while (kept := hub.deadlines.get(key)) is None or kept.due != pytest.approx(moved.due):
                await asyncio.sleep(0.01)
        assert answers(adk) == []


async def test_an_approval_whose_deadline_cannot_be_moved_still_holds_on_the_replica_that_took_it() -> None:
    """The store did not take the moved deadline (Redis unreachable at the approval): the first one
    stays, and when it passes the approving replica, which runs the chat, finds the approval in its
    ledger and puts the deadline back at approved_at + timeout. (A replica that took the chat over
    from a dead owner does not know of the approval: it answers the timeout at the first due time,
    the fallback that never runs the call unapproved or twice.)"""
    from gateway.cluster.shared import SharedStateDown

    class Flaky(MemoryState):
        down = False

        async def add_deadline(self, deadline: Deadline) -> None:
            if self.down:
                raise SharedStateDown("unreachable")
            await super().add_deadline(deadline)

    adk, wall, hub = confirming(), wall_clock(), MemoryHub()
    chats, _ = service(adk, wall, browser=True)
    state = Flaky("a", hub)
    cluster = Cluster(state, chats, chats.metrics)
    await cluster.start()
    try:
        first = await read(await cluster.submit(AGENT, "alice", request(USER)))
        await asyncio.sleep(0.01)
        key = f"chat-1/{CONFIRM_ID}"
        asked = hub.deadlines.get(key)
        assert asked is not None
        wall.now = asked.due - 0.1 * TIMEOUT
        state.down = True
        answer = approval_of(first)
        await read(await cluster.submit(AGENT, "alice", request(USER, answer, message_id=answer["id"])))
        await asyncio.sleep(0.01)
        approved = wall.now
        assert hub.deadlines.get(key) == asked  # not moved
        state.down = False
        wall.now = asked.due
        [claimed] = await state.claim_deadlines(wall.now)
        await cluster._deadlines.timer._settle(claimed)
        kept = hub.deadlines.get(key)
        assert kept is not None and kept.due == pytest.approx(approved + TIMEOUT)
        assert answers(adk) == []
    finally:
        await chats.close()
        await cluster.close()


async def test_another_replica_takes_the_browsers_output_after_the_first_deadline_from_the_kept_chat_state() -> None:
    """Approved on A, whose memory is then gone: B, where the browser's output lands past the first
    deadline but within the browser's own, knows of the approval from the chat's kept state, so the
    output goes to ADK once instead of a timeout."""
    from gateway.cluster.state_keeper import StateKeeper
    from gateway.cluster.tasks import Tasks

    adk, wall, hub = confirming(), wall_clock(), MemoryHub()
    a, _ = service(adk, wall, browser=True)
    b, _ = service(adk, wall, browser=True)
    for chats, name in ((a, "a"), (b, "b")):
        StateKeeper(MemoryState(name, hub), chats, Tasks(), timeout=1.0)
    first = await ask(a)
    seen = wall.now
    wall.now = seen + 0.9 * TIMEOUT
    await approve_in_browser(a, first)
    await asyncio.sleep(0.01)  # the kept state is written in the background
    await a.close()

    wall.now = seen + 1.5 * TIMEOUT
    done = await send_output(b, first)
    assert any(c.get("delta") == "Paid." for c in done)
    assert answers(adk) == [{"confirmed": True, "payload": {"adk_gateway": {"output": {"paid": 50}}}}]
    await b.close()


async def test_a_deadline_answered_where_the_chat_never_ran_continues_the_message_the_browser_holds() -> None:
    """B never ran the chat (its owner is gone): the timeout's run continues the message the gateway
    told ADK it was writing when ADK asked, not a new one a stock client would show twice."""
    adk, wall = confirming(), wall_clock()
    a, kept = service(adk, wall)
    first = await ask(a)
    [deadline] = kept
    await a.close()
    b, _ = service(adk, wall)
    wall.now = deadline.due
    assert await b.desk_view.expire_confirmation(deadline) is None
    chat = b._registry.find(AGENT, "alice", "chat-1")  # noqa: SLF001 - the run the timeout started
    assert chat is not None and chat.run is not None
    assert chat.run.message_id == first[0]["messageId"]
    await asyncio.sleep(0.05)
    assert answers(adk) == [{"confirmed": False}]
    await b.close()


async def test_a_browser_tools_approval_read_from_adks_session_is_kept_for_an_output_that_carries_none() -> None:
    """A asked, and is gone with nothing kept (killed before its chat's state was written): B hands
    the call to the browser on the person's approval, which only ADK's session confirms, and must
    record that approval, deadline included: an AG-UI client's tool message carries the output
    alone (no approval beside it, as an AI SDK part has), so B's ledger is the only witness."""
    adk, wall = confirming(), wall_clock()
    a, _ = service(adk, wall, browser=True)
    b, kept = service(adk, wall, browser=True)
    first = await ask(a)
    await a.close()
    answer = approval_of(first)
    handed = await read(await b.submit(AGENT, "alice", request(USER, answer, message_id=answer["id"])))
    assert [c["toolCallId"] for c in handed if c["type"] == "tool-input-available"] == ["call-1"], handed
    [deadline] = kept
    assert deadline.approval_id == CONFIRM_ID and deadline.approved_at == pytest.approx(wall.now)
    # Counted as waiting here once learnt, and counted down by the approval: not below zero.
    pending = b.metrics.registry.get_sample_value("adk_gateway_approvals_pending", {"agent": AGENT})
    assert pending == 0, pending
    output = browser_output(first, {"paid": 50})
    del output["parts"][1]["approval"]
    done = await read(await b.submit(AGENT, "alice", request(USER, output, message_id=first[0]["messageId"])))
    assert any(c.get("delta") == "Paid." for c in done)
    assert answers(adk) == [{"confirmed": True, "payload": {"adk_gateway": {"output": {"paid": 50}}}}]
    await b.close()


async def test_a_browser_tools_hand_over_ends_only_once_the_approval_is_kept() -> None:
    """The hand-over's response ends after the chat's state holding the approval is written: the
    replica may die the moment the browser reads that end (an AG-UI client's tool message carries
    no approval, so the kept state is then its only record)."""
    from gateway.cluster.state_keeper import StateKeeper
    from gateway.cluster.tasks import Tasks

    adk, wall, hub = confirming(), wall_clock(), MemoryHub()
    chats, _ = service(adk, wall, browser=True)
    StateKeeper(MemoryState("a", hub), chats, Tasks(), timeout=1.0)
    first = await ask(chats)
    answer = approval_of(first)
    handed = await chats.submit(AGENT, "alice", request(USER, answer, message_id=answer["id"]))
    kept = await MemoryState("b", hub).get_chat_state("alice", "chat-1")  # nothing awaited in between
    assert kept is not None, "the hand-over returned before its state was kept"
    [confirmation] = kept["ledger"]["confirmations"]
    assert confirmation["approval_id"] == CONFIRM_ID and confirmation["approved_at"] is not None, confirmation
    assert {"type": "tool-input-available", "toolCallId": "call-1"}.items() <= next(
        c for c in await read(handed) if c["type"] == "tool-input-available").items()
    await chats.close()
