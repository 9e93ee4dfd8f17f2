"""The plugin asks again when no gateway replica decided (plugin/adk_gateway_plugin/asking.py), against
a fake internal listener that plays each request's fate: handed back by a draining replica (503
`retry_elsewhere`), cut (a killed replica), or decided."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from google.adk.tools.function_tool import FunctionTool

from adk_gateway_plugin.asking import Retries
from gateway.agent_plugin import REFUSAL_KEY, GatewayPlugin
from tests.support.fake_gateway import RUN, FakeGateway, context


def pay(amount: int) -> dict:
    """Pays."""
    return {"paid": amount}


@pytest.fixture
async def replicas(aiohttp_server: Any) -> AsyncIterator[tuple[FakeGateway, str]]:
    """The internal listener behind a balancer: each decision request meets the next of `fates`."""
    fake = FakeGateway()
    fake.fates = [RUN]
    fake.tools = {"pay": {"approval": True, "gated": True}}
    server = await aiohttp_server(fake.app())
    yield fake, str(server.make_url("")).rstrip("/")


async def decide(plugin: GatewayPlugin) -> tuple[dict[str, Any] | None, float]:
    loop = asyncio.get_running_loop()
    started = loop.time()
    ctx = context()
    answer = await asyncio.wait_for(
        plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={"amount": 5}, tool_context=ctx), 20
    )
    await plugin.close()
    return answer, loop.time() - started


@pytest.mark.parametrize("fates", [
    ["handback", "handback", RUN],
    ["drop", RUN],
    ["busy", "drop", "handback", RUN],
])
async def test_a_request_no_replica_decided_is_asked_again_as_the_same_call_until_one_does(
    replicas: tuple[FakeGateway, str], fates: list[Any],
) -> None:
    fake, url = replicas
    fake.fates = list(fates)
    answer, _ = await decide(GatewayPlugin(url=url, secret="s3cret", retry_for=10))
    assert answer is None, answer  # run: the tool runs, once
    assert len(fake.asked) == len(fates)
    # The same call each time: the replica running the chat re-attaches it to the approval it shows.
    assert all(asked == fake.asked[0] for asked in fake.asked)
    assert (fake.asked[0]["function_call_id"], fake.asked[0]["invocation_id"]) == ("call-1", "inv")
    # Each retry on a new connection: a balancer would send it down the old one's replica again.
    assert len(set(fake.ports)) == len(fates)


async def test_a_denial_after_a_handback_is_the_denial(replicas: tuple[FakeGateway, str]) -> None:
    fake, url = replicas
    denied = {"verdict": "respond", "response": {"error": "The person denied it.", REFUSAL_KEY: "denied"}}
    fake.fates = ["handback", denied]
    answer, _ = await decide(GatewayPlugin(url=url, secret="s3cret", retry_for=10))
    assert answer == denied["response"]


@pytest.mark.parametrize(("fate", "code"), [("handback", "gateway_refused"), ("drop", "gateway_unreachable")])
async def test_retries_end_with_the_window_and_the_call_is_refused(
    replicas: tuple[FakeGateway, str], fate: str, code: str
) -> None:
    fake, url = replicas
    fake.fates = [fate]
    answer, took = await decide(GatewayPlugin(url=url, secret="s3cret", retry_for=1.0))
    assert answer is not None and answer[REFUSAL_KEY] == code and "not run" in answer["error"], answer
    # Backed off (0.25, 0.5, ... s), not hammered; and given up once the window was over.
    assert 2 <= len(fake.asked) <= 5, len(fake.asked)
    assert took < 1.0 + 2.0, took


async def test_max_wait_bounds_the_retries(replicas: tuple[FakeGateway, str]) -> None:
    fake, url = replicas
    fake.fates = ["handback"]
    answer, took = await decide(GatewayPlugin(url=url, secret="s3cret", retry_for=60, max_wait=0.8))
    assert answer is not None and answer[REFUSAL_KEY] in ("gateway_refused", "max_wait"), answer
    assert took < 2.0, took


@pytest.mark.parametrize("fate", ["refuse", {"verdict": "maybe"}])
async def test_an_answer_that_is_not_a_handback_is_not_asked_again(replicas: tuple[FakeGateway, str], fate: Any) -> None:
    fake, url = replicas
    fake.fates = [fate, RUN]
    answer, _ = await decide(GatewayPlugin(url=url, secret="s3cret", retry_for=10))
    assert answer is not None and REFUSAL_KEY in answer, answer
    assert len(fake.asked) == 1


async def test_no_retries_with_a_zero_window(replicas: tuple[FakeGateway, str]) -> None:
    fake, url = replicas
    fake.fates = ["drop", RUN]
    answer, _ = await decide(GatewayPlugin(url=url, secret="s3cret", retry_for=0))
    assert answer is not None and answer[REFUSAL_KEY] == "gateway_unreachable", answer
    assert len(fake.asked) == 1


async def test_the_retry_window_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ADK_GATEWAY_RETRY_FOR", "7")
    assert GatewayPlugin(url="http://127.0.0.1:9", secret="s")._retry_for == 7  # noqa: SLF001
    monkeypatch.delenv("ADK_GATEWAY_RETRY_FOR")
    assert GatewayPlugin(url="http://127.0.0.1:9", secret="s")._retry_for == 30  # noqa: SLF001


async def test_a_cancelled_run_cancels_the_retries(replicas: tuple[FakeGateway, str]) -> None:
    """ADK cancels the tool call when its run ends (the gateway's /run_sse connection went away):
    the plugin stops asking, and lets the cancellation through."""
    fake, url = replicas
    fake.fates = ["handback"]
    plugin = GatewayPlugin(url=url, secret="s3cret", retry_for=30)
    task = asyncio.create_task(
        plugin.before_tool_callback(tool=FunctionTool(pay), tool_args={"amount": 5}, tool_context=context())
    )
    await asyncio.sleep(0.6)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    asked = len(fake.asked)
    await asyncio.sleep(0.6)
    assert len(fake.asked) == asked
    await plugin.close()


def test_the_pause_doubles_to_its_cap_and_a_retry_after_only_lengthens_it() -> None:
    retries = Retries(started=0.0, max_wait=3600, retry_for=30)
    assert [retries.next_pause(t, t, None) for t in (0.0, 1.0, 2.0, 3.0, 4.0)] == [0.25, 0.5, 1.0, 2.0, 2.0]
    fresh = Retries(started=0.0, max_wait=3600, retry_for=30)
    assert fresh.next_pause(0.0, 0.0, 1.0) == 1.0  # the gateway's Retry-After: 1
    assert fresh.next_pause(1.0, 1.0, 0.0) == 0.5  # a Retry-After: 0 does not hammer
    assert fresh.next_pause(2.0, 2.0, 60.0) == 2.0  # nor does a long one stall the call


def test_the_window_counts_from_the_first_failure_and_a_held_request_starts_a_new_one() -> None:
    retries = Retries(started=0.0, max_wait=3600, retry_for=5)
    # Held for ten minutes (a person was being asked), then handed back: five seconds from now.
    assert retries.next_pause(0.0, 600.0, None) is not None
    assert retries.next_pause(600.5, 602.0, None) is not None
    assert retries.next_pause(602.5, 605.5, None) is None  # quick failures use the window up
    # A later hand-back of a request held again opens a new window.
    assert retries.next_pause(606.0, 900.0, None) is not None


def test_no_retry_goes_past_max_wait() -> None:
    retries = Retries(started=0.0, max_wait=10, retry_for=30)
    assert retries.time_left(9.0) == 1.0
    assert retries.next_pause(9.0, 9.9, None) is None
    assert retries.time_left(11.0) == 0.0
