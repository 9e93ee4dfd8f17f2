"""A scenario per test, and one AI SDK check per module of every response its scenarios read."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from tests.scenarios.recordings import Recordings
from tests.scenarios.runner import Scenario, SdkCheck
from tests.support.clock import Clock
from tests.support.recordings import SSE_FOLDERS

# config/gateway.yaml as shipped: the demo's topology, whose policy answered the plugin's recorded asks.
SHIPPED = (Path(__file__).resolve().parents[2] / "config" / "gateway.yaml").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def sdk() -> Iterator[SdkCheck]:
    """Gathers the module's responses; at its end, one batched Node call checks them all."""
    check = SdkCheck()
    yield check
    check.verify()


@pytest.fixture
async def scenarios(sdk: SdkCheck, request: pytest.FixtureRequest) -> AsyncIterator[Callable[..., Scenario]]:
    """`scenarios(recordings=Recordings(folder), config=yaml, env=..., clock=Clock())`: a gateway in front of replayed ADK
    (tests/scenarios/runner.py); each is closed when the test ends."""
    made: list[Scenario] = []

    def make(
        recordings: Recordings | None = None, config: str = "", env: dict[str, str] | None = None, clock: Clock | None = None,
    ) -> Scenario:
        scenario = Scenario(sdk, request.node.nodeid, recordings, config, env, clock)
        made.append(scenario)
        return scenario

    yield make
    for scenario in made:
        await scenario.close()


@pytest.fixture(params=SSE_FOLDERS)
def recordings(request: pytest.FixtureRequest) -> Recordings:
    """Each supported ADK's `/run_sse` recordings in turn (a test asking for it runs once per set)."""
    return Recordings(request.param)


@pytest.fixture
def sc(scenarios: Callable[..., Scenario], recordings: Recordings) -> Scenario:
    """A gateway with no tool policy (ADK's own confirmations only) in front of each supported ADK's
    recordings; a module with a policy overrides it."""
    return scenarios(recordings)


@pytest.fixture
def shipped(scenarios: Callable[..., Scenario], recordings: Recordings) -> Scenario:
    """A gateway with config/gateway.yaml's policy (confirm mode, its rules) in front of each supported
    ADK's recordings, its time a Clock the test moves (`shipped.clock`)."""
    return scenarios(recordings, SHIPPED, {"ADK_GATEWAY_SECRET": "s3cret"}, Clock())


@pytest.fixture
async def scenario(scenarios: Callable[..., Scenario]) -> Scenario:
    """A gateway with no tool policy (ADK's own confirmations only) in front of the newest ADK's recordings."""
    return scenarios()
