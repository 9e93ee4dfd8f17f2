"""A relayed response cut by its relay (the shared store lost, or its owner dead) still ends as
the AI SDK expects a response to end: what was open closed, one `error`, then `finish` (found by
the Sentinel failover test, issue 28 item 2: the browser got `error` and `[DONE]`, no finish,
with a text block and a step left open)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.cluster.relay import RelayFeed
from gateway.cluster.shared import RelayEntry, SharedStateDown
from gateway.core.protocol import encode_chunk
from gateway.ops.metrics import GatewayMetrics

FRAMES = [
    {"type": "start", "messageId": "m1"},
    {"type": "start-step"},
    {"type": "text-start", "id": "t1"},
    {"type": "text-delta", "id": "t1", "delta": "You said: "},
]


class _Liveness:
    interval = 0.01

    def __init__(self, dead: bool) -> None:
        self._dead = dead

    async def dead(self, owner: str) -> bool:
        return self._dead


class _State:
    """A relay holding `frames`, then either lost (SharedStateDown) or quiet for good."""

    def __init__(self, frames: list[dict[str, Any]], *, lost: bool) -> None:
        self._entries = [RelayEntry(0, [encode_chunk(f) for f in frames])]
        self._lost = lost

    async def relay_read(self, key: str, after: str, *, timeout: float) -> tuple[str, list[RelayEntry]]:
        if self._entries:
            return "1", [self._entries.pop()]
        if self._lost:
            raise SharedStateDown("the shared session store (Redis) is unreachable")
        return after, []


async def _read(feed: RelayFeed) -> list[dict[str, Any]]:
    out = []
    async for batch in feed.follow(0):
        out += [orjson.loads(frame) for frame in batch]
    return out


@pytest.mark.parametrize("cut", ["store_lost", "owner_dead"])
async def test_a_cut_relay_closes_what_was_open_then_errors_then_finishes(cut: str) -> None:
    state = _State(FRAMES, lost=cut == "store_lost")
    feed = RelayFeed(state, _Liveness(dead=cut == "owner_dead"), GatewayMetrics(), "owner-1", "k")  # type: ignore[arg-type]
    chunks = await _read(feed)
    assert chunks[: len(FRAMES)] == FRAMES
    tail = [c["type"] for c in chunks[len(FRAMES):]]
    assert tail == ["text-end", "finish-step", "error", "finish"], chunks
    assert chunks[len(FRAMES)]["id"] == "t1"
    assert chunks[-1]["finishReason"] == "error"


async def test_a_relay_cut_after_its_response_ended_adds_nothing() -> None:
    done = [*FRAMES, {"type": "text-end", "id": "t1"}, {"type": "finish-step"}, {"type": "finish", "finishReason": "stop"}]
    chunks = await _read(RelayFeed(_State(done, lost=True), _Liveness(False), GatewayMetrics(), "o", "k"))  # type: ignore[arg-type]
    assert chunks == done
