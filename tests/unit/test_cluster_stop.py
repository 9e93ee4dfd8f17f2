"""Stop, then the next message, when the chat runs on another replica (issue 24, defect 10).

Two replicas on one in-process hub (the memory backend's shared state), ADK scripted: the chat is
owned by "a"; the browser's requests land on "b", which forwards them and follows the relay. A
browser that stopped reading its relayed response must not leave the owner's response read: the
next message is taken (the old run ends first); one still read through a relay is busy.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from gateway.chat.service import Attachment, ChatBusy
from gateway.cluster.memory import MemoryHub, MemoryState
from gateway.cluster.router import Cluster
from gateway.config.schema import parse_config
from gateway.core.refusals import HttpError
from gateway.ops.metrics import GatewayMetrics
from tests.support.adk import ScriptedAdk
from tests.support.chat import USER, text_events
from tests.unit.test_chat_service import NEW_MESSAGE, body, text_of
from tests.support.service import GONE, chat_service

AGENT = "demo_agent"
CONFIG = """
sessions:
  heartbeat_interval: 50ms
  owner_timeout: 1s
"""


@dataclass
class Pair:
    adk: ScriptedAdk
    owner: Cluster
    here: Cluster

    def says(self, *pieces: str, final: bool = True) -> None:
        events = text_events(*pieces)
        for event in events if final else events[:-1]:
            self.adk.reads.put_nowait([event])

    def runs(self, outcome: str) -> float:
        registry = self.owner.metrics.registry
        return registry.get_sample_value("adk_gateway_runs_total", {"agent": AGENT, "outcome": outcome}) or 0.0


@pytest.fixture
async def pair() -> AsyncIterator[Pair]:
    adk = ScriptedAdk()
    hub = MemoryHub()
    clusters = []
    for name in ("a", "b"):
        config = parse_config(CONFIG, env={})
        metrics = GatewayMetrics()
        chats = chat_service(config, adk=adk, metrics=metrics)
        cluster = Cluster(MemoryState(name, hub), chats, metrics)
        await cluster.start()
        clusters.append(cluster)
    owner, here = clusters
    try:
        yield Pair(adk, owner, here)
    finally:
        for cluster in clusters:
            await cluster.chats.close()
            await cluster.close()


async def read_all(attachment: Attachment) -> list[dict[str, Any]]:
    frames: list[bytes] = []

    async def follow() -> None:
        async for batch in attachment.response.follow():
            frames.extend(batch)

    try:
        await asyncio.wait_for(follow(), 5)
    finally:
        attachment.response.close()
    return [orjson.loads(f) for f in frames]


async def reading(attachment: Attachment, until_text: str) -> asyncio.Task[None]:
    """A browser reading the (relayed) response, until it has seen `until_text`; it goes on reading."""
    seen = asyncio.Event()
    text = ""

    async def follow() -> None:
        nonlocal text
        async for batch in attachment.response.follow():
            text += text_of([orjson.loads(f) for f in batch if f.startswith(b'{"type":"text-delta"')])
            if until_text in text:
                seen.set()

    task = asyncio.create_task(follow())
    await asyncio.wait_for(seen.wait(), 5)
    return task


async def stop(browser: asyncio.Task[None], attachment: Attachment) -> None:
    """The AI SDK's stop(): the request goes, as the transport ends it (its follow ends, the feed closes)."""
    browser.cancel()
    await asyncio.gather(browser, return_exceptions=True)
    attachment.response.close()


async def owned_by_a(pair: Pair) -> None:
    first = await pair.owner.submit(AGENT, "u", body(USER))
    pair.says("Hello.")
    pair.adk.reads.put_nowait(None)
    assert text_of(await read_all(first)) == "Hello."


async def test_a_message_after_a_stopped_relayed_response_is_taken_and_the_old_run_ends(pair: Pair) -> None:
    await owned_by_a(pair)
    relayed = await pair.here.submit(AGENT, "u", body(USER, NEW_MESSAGE))
    assert relayed.run is None  # read through the relay from "a"
    pair.says("Once ", "upon ", final=False)
    browser = await reading(relayed, "upon ")
    await stop(browser, relayed)

    nxt = {**NEW_MESSAGE, "id": "u3"}
    after = await asyncio.wait_for(pair.here.submit(AGENT, "u", body(USER, NEW_MESSAGE, nxt)), 5)
    assert pair.runs("cancelled") == 1
    pair.says("Short.")
    pair.adk.reads.put_nowait(None)
    chunks = await read_all(after)
    assert text_of(chunks) == "Short." and chunks[-1]["type"] == "finish"


async def test_a_message_while_the_relayed_response_is_still_read_is_busy(pair: Pair) -> None:
    await owned_by_a(pair)
    relayed = await pair.here.submit(AGENT, "u", body(USER, NEW_MESSAGE))
    pair.says("Once ", "upon ", final=False)
    browser = await reading(relayed, "upon ")

    with pytest.raises((ChatBusy, HttpError)) as refused:
        await asyncio.wait_for(pair.here.submit(AGENT, "u", body(USER, NEW_MESSAGE, {**NEW_MESSAGE, "id": "u3"})), 5)
    assert refused.value.status == 409 and refused.value.code == "chat_busy"
    assert pair.runs("cancelled") == 0
    pair.adk.reads.put_nowait(None)
    await asyncio.wait_for(browser, 5)


async def test_a_relayed_browser_that_left_while_the_run_is_quiet_is_seen_gone_without_a_write(pair: Pair) -> None:
    await owned_by_a(pair)
    relayed = await pair.here.submit(AGENT, "u", body(USER, NEW_MESSAGE))
    pair.says("Once ", "upon ", final=False)
    browser = await reading(relayed, "upon ")
    relayed.response.watch(GONE)  # the connection dropped; nothing was written since

    # The relay's next poll sees it, as a failed write would have.
    with pytest.raises(ConnectionResetError):
        await asyncio.wait_for(browser, 2)
    relayed.response.close()
    after = await asyncio.wait_for(pair.here.submit(AGENT, "u", body(USER, NEW_MESSAGE, {**NEW_MESSAGE, "id": "u3"})), 5)
    assert pair.runs("cancelled") == 1
    pair.adk.reads.put_nowait(None)
    await read_all(after)
