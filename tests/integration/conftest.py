"""ADK servers the integration tests share: one per kind (its plugin, its ADK release, its session
store), started by the first test that asks for it and stopped when this package's tests are done.

An ADK server's start is most of the time of a test that starts its own; each test still gets its
own gateway, its own chats and its own view of the agent's ledger (procs.Agent.for_a_test), and a
test that kills the agent finds it started again by the next one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from gateway.demo import sqlite_uri
from tests.procs import PLUGIN, Agent, PluginStack, plugin_stack, start_agent

# The ADK session stores the lifecycle tests run on: ADK's in-memory store, and its database store
# on SQLite as `make run` starts it (with --auto_create_session), which refuses a write from a run
# whose session went stale.
STORES = ("memory", "sqlite")


class SharedAgents:
    def __init__(self, tmp_path_factory: pytest.TempPathFactory, stack: ExitStack) -> None:
        self._tmp = tmp_path_factory
        self._stack = stack
        self._agents: dict[str, Agent] = {}

    def get(self, name: str, start: Callable[..., Agent]) -> Agent:
        """The agent called `name`, started by `start(tmp)` the first time; as the asking test sees it."""
        if name not in self._agents:
            agent = start(self._tmp.mktemp("agent-" + "".join(c if c.isalnum() else "-" for c in name)))
            self._stack.callback(agent.server.stop)
            self._agents[name] = agent
        return self._agents[name].for_a_test()


# Package scope: the agents stop when the integration tests are done, not idle through the rest.
@pytest.fixture(scope="package")
def shared_agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedAgents]:
    with ExitStack() as stack:
        yield SharedAgents(tmp_path_factory, stack)


def plugin_agent(agents: SharedAgents, *, chunk_delay: str | None = None, store: str = "memory") -> Agent:
    """The stock ADK API server with the gateway plugin (procs.plugin_stack's), shared by the stacks
    that would each start the same one: `plugin_stack(..., agent=plugin_agent(...))`. `chunk_delay`:
    the demo's DEMO_CHUNK_DELAY (seconds between streamed chunks), for the tests that need a reply
    still streaming. `store`: ADK's session store, one of STORES. One gateway at a time may stand in
    front of each."""
    assert store in STORES, store
    env = {"DEMO_CHUNK_DELAY": chunk_delay} if chunk_delay else {}

    def start(tmp: Path) -> Agent:
        if store == "memory":
            return start_agent(tmp, plugin=PLUGIN, env=env)
        return start_agent(tmp, plugin=PLUGIN, env=env, sessions=sqlite_uri(tmp / "sessions.db"), auto_create_session=True)

    name = f"plugin-delay-{chunk_delay or 0}" + ("" if store == "memory" else f"-{store}")
    return agents.get(name, start)


# Module scope, each store once: a module's lifecycle tests share a gateway per store, and every
# module shares the two ADK servers (the package's shared agents).
@pytest.fixture(scope="module", params=STORES)
def lifecycle_stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, shared_agents: SharedAgents
) -> Iterator[PluginStack]:
    """The demo's topology (procs.plugin_stack) on each of ADK's session stores (STORES), for the
    tests of a chat's life: stop, resume, reload, concurrent sends."""
    agent = plugin_agent(shared_agents, store=request.param)
    with plugin_stack(tmp_path_factory.mktemp(f"lifecycle-{request.param}"), agent=agent) as stack:
        yield stack
