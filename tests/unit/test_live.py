"""A chat's live session: events reach the turn in progress, and a turn ends at the right turnComplete."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.live import LiveLink
from gateway.upstream import UpstreamError
from tests.unit.fixtures import LIVE_FOLDERS, ROOT, events


class FakeConnection:
    def __init__(self) -> None:
        self.inbox: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.sent: list[dict[str, Any]] = []
        self.close_reason = "closed"

    async def send(self, request: dict[str, Any]) -> None:
        self.sent.append(request)

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        while (event := await self.inbox.get()) is not None:
            yield event

    async def messages(self) -> AsyncIterator[str]:
        async for event in self.events():
            yield json.dumps(event)

    async def close(self) -> None:
        self.inbox.put_nowait(None)


def model(text: str) -> dict[str, Any]:
    return {"content": {"role": "model", "parts": [{"text": text}]}}


CALL = {"content": {"role": "model", "parts": [{"functionCall": {"id": "c", "name": "t"}}]}}
RESULT = {"content": {"role": "user", "parts": [{"functionResponse": {"id": "c", "name": "t", "response": {}}}]}}
DONE = {"turnComplete": True}


async def play(link: LiveLink, conn: FakeConnection, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for event in events:
        conn.inbox.put_nowait(event)
    return [e async for e in link.turn({"content": {"role": "user", "parts": [{"text": "hi"}]}})]


async def test_a_turn_ends_at_turn_complete_and_sends_its_request_first() -> None:
    conn = FakeConnection()
    link = LiveLink(conn)  # type: ignore[arg-type]
    got = await play(link, conn, [model("a"), DONE, model("next turn")])
    assert got == [model("a"), DONE]
    assert conn.sent == [{"content": {"role": "user", "parts": [{"text": "hi"}]}}]
    await link.close()


async def test_turn_complete_right_after_tool_results_does_not_end_the_turn() -> None:
    conn = FakeConnection()
    link = LiveLink(conn)  # type: ignore[arg-type]
    got = await play(link, conn, [CALL, RESULT, DONE, model("answer"), DONE])
    assert got == [CALL, RESULT, DONE, model("answer"), DONE]
    await link.close()


async def test_events_between_turns_are_dropped_and_counted() -> None:
    conn = FakeConnection()
    closed: list[bool] = []
    link = LiveLink(conn, on_closed=lambda: closed.append(True))  # type: ignore[arg-type]
    conn.inbox.put_nowait(model("unprompted"))
    await asyncio.sleep(0.01)
    assert link.dropped == 1
    await link.close()
    assert closed == [True] and not link.alive


async def test_socket_closing_mid_turn_is_an_upstream_error() -> None:
    conn = FakeConnection()
    link = LiveLink(conn)  # type: ignore[arg-type]
    with pytest.raises(UpstreamError):
        await play(link, conn, [model("a"), None])  # type: ignore[list-item]
    with pytest.raises(UpstreamError):
        await play(link, conn, [])


# ---- recorded sessions of every supported ADK (tests/fixtures/adk_live*, tests/unit/fixtures.py) ----

def _one_turn_recordings() -> list[tuple[str, str]]:
    cases = []
    for folder in LIVE_FOLDERS:
        log = json.loads((ROOT / folder / "requests.json").read_text())
        for name, entry in log.items():
            sends = [s for s in entry["steps"] if "send" in s and s["send"] != {"close": True}]
            if len(sends) == 1 and {"awaitTurnComplete": 1} in entry["steps"]:
                cases.append((folder, name))
    return cases


@pytest.mark.parametrize(("folder", "name"), _one_turn_recordings())
async def test_a_recorded_turn_is_exactly_what_adk_sent_for_it(folder: str, name: str) -> None:
    recorded = events(name, folder)
    conn = FakeConnection()
    link = LiveLink(conn)  # type: ignore[arg-type]
    got = await play(link, conn, recorded)
    # The turn ends at the recording's last turnComplete, not at one that follows tool results.
    assert got == recorded and recorded[-1].get("turnComplete")
    await link.close()


@pytest.mark.parametrize("folder", LIVE_FOLDERS)
async def test_two_recorded_turns_split_at_their_turn_complete(folder: str) -> None:
    recorded = events("two_turns", folder)
    first_end = next(i for i, e in enumerate(recorded) if e.get("turnComplete")) + 1
    conn = FakeConnection()
    link = LiveLink(conn)  # type: ignore[arg-type]
    assert await play(link, conn, recorded[:first_end]) == recorded[:first_end]
    assert await play(link, conn, recorded[first_end:]) == recorded[first_end:]
    await link.close()
