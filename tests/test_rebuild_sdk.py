"""A message rebuilt from ADK's session (issue 25, item 5) as the stock AI SDK (ai 6 and ai 7) parses
and assembles it: each chunk passes the SDK's schema, and the message it assembles is the one a live
page shows. A message over two ADK runs (an answered confirmation, then another asked) replays as
one stream (protocol.md 1.8): the answered call's output, and the approval still requested."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.chat.service import ChatService
from tests.jsdriver import check_streams
from tests.unit.test_rebuild import _answered_then_asked, sessions
from tests.support.adk import SessionStoreAdk
from tests.unit.test_resume_rebuild import AGENT, service

pytestmark = pytest.mark.js


async def _replayed(chats: ChatService) -> list[dict[str, Any]]:
    attachment = await chats.resume_waiting(AGENT, "alice", "chat-1")
    assert attachment is not None
    frames: list[bytes] = []
    async for batch in attachment.response.follow():
        frames.extend(batch)
    await chats.close()
    return [orjson.loads(frame) for frame in frames]


def _tools(message: dict[str, Any]) -> list[str]:
    return [p["state"] for p in message["parts"] if p["type"].startswith("tool-")]


@pytest.mark.parametrize("version", [6, 7])
async def test_the_rebuilt_message_is_what_the_sdk_assembles_for_a_live_page(version: int) -> None:
    cases = []
    for label in ("newest", "1.22.1"):
        for scenario in ("confirm_pay", "confirm_two", "native_pay"):
            chunks = await _replayed(service(SessionStoreAdk(sessions(label)[scenario])))
            cases.append({"version": version, "chunks": chunks})
        yaml = f"chat:\n  default_protocol: {version}\n"
        chunks = await _replayed(service(SessionStoreAdk(_answered_then_asked(label, approved=True)), yaml=yaml))
        cases.append({"version": version, "chunks": chunks})
    results = check_streams(cases)
    for case, result in zip(cases, results):
        assert not result["schemaErrors"] and not result["streamError"], result
        assert result["message"]["id"] == case["chunks"][0]["messageId"]
    states = [_tools(r["message"]) for r in results]
    assert states[0::4] == [["approval-requested"]] * 2
    assert states[1::4] == [["approval-requested", "approval-requested"]] * 2
    assert states[2::4] == [["approval-requested"]] * 2
    # Over two runs: the paid call's output, then the new request.
    assert states[3::4] == [["output-available", "approval-requested"]] * 2
