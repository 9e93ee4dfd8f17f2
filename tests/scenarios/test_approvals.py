"""Answers to approvals that are not the plain round trip: the same approval sent twice, two calls
answered in one message, an answer after a pause. What the gateway does
with them is its own (the answer's owner, whether it is still pending, what reaches ADK), so they
play on ADK's native confirmation (no tool policy), from the recordings of every supported ADK; each
checks what reached ADK against what the recorder sent the real server. Moved from
tests/integration/test_gateway_approvals.py, where they ran on the held path of a live upstream
(the engines' own unit tests hold that path's bookkeeping: tests/unit). An approval of another chat
stays there: only the held path's `gw-` approvals answer it 403 `forbidden` (a native one is 410,
not pending in that chat).
"""

from __future__ import annotations

import pytest

from tests.chatflow import assistant_from, new_chat, types, user
from tests.scenarios.recordings import Recordings
from tests.scenarios.runner import Scenario
from tests.support.clock import Clock

pytestmark = pytest.mark.js

WAITS = "adk_gateway_approval_wait_seconds_count"


def text(reply) -> str:
    return "".join(c["delta"] for c in reply.chunks if c["type"] == "text-delta")


async def test_duplicate_approval_changes_nothing(sc: Scenario, recordings: Recordings) -> None:
    before = sc.metric(WAITS, {"tool": "process_payment", "outcome": "approved"})
    chat, first_message = new_chat(), user("pay 50 to Hanako")
    first = await sc.post(chat, [first_message], play="pay_hanako")
    answer = assistant_from(first, [True])
    second = await sc.post(chat, [first_message, answer], messageId=answer["id"], play="pay_hanako_approve")
    assert types(second).count("tool-output-available") == 1
    replay = await sc.post(chat, [first_message, answer], messageId=answer["id"])
    assert replay.status == 410 and replay.json()["error"]["code"] == "approval_gone"
    assert sc.metric(WAITS, {"tool": "process_payment", "outcome": "approved"}) == before + 1
    # The replay never reached ADK: the payment ran once.
    assert sc.adk.messages == [recordings.request("pay_hanako")["newMessage"], recordings.request("pay_hanako_approve")["newMessage"]]


async def test_two_parallel_approvals_approve_one_deny_the_other(sc: Scenario) -> None:
    chat, first_message = new_chat(), user("pay 10 to Alice and 20 to Bob")
    first = await sc.post(chat, [first_message], play="pay_two")
    assert types(first).count("tool-approval-request") == 2
    assert types(first)[-1] == "finish"
    answer = assistant_from(first, [True, False])
    second = await sc.post(chat, [first_message, answer], messageId=answer["id"], play="pay_two_approve_one_deny_other")
    outputs = sorted(c["type"] for c in second.chunks if c["type"].startswith("tool-output"))
    assert outputs == ["tool-output-available", "tool-output-denied"]
    assert "Alice" in text(second) and "Bob" in text(second)


async def test_approval_after_a_pause(scenarios, recordings: Recordings) -> None:
    clock = Clock()
    sc = scenarios(recordings, clock=clock)
    chat, first_message = new_chat(), user("pay 50 to Hanako")
    first = await sc.post(chat, [first_message], play="pay_hanako")
    clock.advance(2)
    answer = assistant_from(first, [True])
    second = await sc.post(chat, [first_message, answer], messageId=answer["id"], play="pay_hanako_approve")
    assert "tool-output-available" in types(second)
