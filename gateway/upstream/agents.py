"""The agents this gateway serves, as they run: each one's config, its ADK client and its health.

`Agents` is built from the config's `agents:` section (config/schema.py) and changed in place by a reload:
an added agent gets a client and a health probe; a removed one's probe stops and its client closes
once none of its runs streams through it (the reload ends those runs: chat/service.py); an agent whose
upstream changed gets a new client, which its chats take at their next turn, and the old client
closes the same way. Requests name an agent by its route (`/agents/{name}/...`, or the default
agent's `/api/chat`), the ADK plugin by its app name.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from ..config.agent import AgentConfig, ToolPolicy
from ..config.schema import GatewayConfig
from ..core.refusals import Refusal
from ..ops.stopping import cancel_and_wait
from .client import AdkClient

__all__ = ["Agent", "AgentChanges", "Agents", "ClientUsers", "UnknownAgent"]

log = structlog.get_logger("adk_gateway.upstream.agents")

# How often a retired client checks whether a run still streams through it.
_RETIRE_POLL = 1.0
# The longest a retired client stays open for runs still using it (they are long only while a
# person decides; a reload that removed their agent ended them already).
_RETIRE_LIMIT = 3600.0
_CLOSE_TIMEOUT = 2.0


class ClientUsers(Protocol):
    """The upstream layer's port to whoever runs chats through its clients (the chat service)."""

    def carries_run(self, client: AdkClient) -> bool:
        """Whether a chat's run still goes through `client` (a retired one is closed after its last)."""
        ...


class _NoUsers:
    """Nothing runs chats yet: a retired client is closed at once."""

    def carries_run(self, client: AdkClient) -> bool:
        return False


_NO_USERS: ClientUsers = _NoUsers()


class UnknownAgent(Refusal):
    """No agent of this name is served here (a typo in the route, or a reload removed it)."""

    status = 404
    code = "agent_not_found"

    def public_message(self) -> str:
        return "no such agent"


@dataclass(eq=False)
class Agent:
    name: str
    config: AgentConfig
    client: AdkClient
    # The last health probe's answer; /readyz and `adk_gateway_upstream_up{agent}` report it.
    up: bool = False
    probe: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def live(self) -> bool:
        return self.config.upstream.mode == "live"

    def tool_policy(self, tool: str) -> ToolPolicy:
        return self.config.tool_policy(tool)


@dataclass(frozen=True)
class AgentChanges:
    added: list[str]
    removed: list[str]
    changed: list[str]


class Agents:
    def __init__(
        self, config: GatewayConfig, *, on_health: Callable[[str, bool], None] | None = None,
        client: Callable[[AgentConfig], AdkClient] = lambda agent: AdkClient(agent.upstream),
    ) -> None:
        self._make_client = client
        self._on_health = on_health
        self._agents = {name: Agent(name, agent, client(agent)) for name, agent in config.agents.items()}
        self._default = config.default
        self._started = False
        self._retiring: set[asyncio.Task[None]] = set()
        # Whether a client still carries a run: the chat service knows the chats (`attach`).
        self._users: ClientUsers = _NO_USERS

    def attach(self, users: ClientUsers) -> None:
        """Who says whether a retired client still carries a run; once, by the chat service."""
        if self._users is not _NO_USERS:
            raise RuntimeError("the agents' client users are attached already")
        self._users = users

    def __iter__(self) -> Iterator[Agent]:
        return iter(list(self._agents.values()))

    @property
    def default(self) -> Agent:
        return self._agents[self._default]

    def get(self, name: str) -> Agent | None:
        return self._agents.get(name)

    def need(self, name: str) -> Agent:
        """The agent, or UnknownAgent (404)."""
        agent = self._agents.get(name)
        if agent is None:
            raise UnknownAgent(name)
        return agent

    def for_app(self, app_name: str) -> Agent | None:
        """The agent whose ADK app is `app_name` (app names are unique across agents: config/schema.py)."""
        for agent in self._agents.values():
            if agent.config.upstream.app_name == app_name:
                return agent
        return None

    # ---- life ---------------------------------------------------------------------------------

    async def start(self) -> None:
        self._started = True
        for agent in self._agents.values():
            self._start(agent)

    def _start(self, agent: Agent) -> None:
        agent.client.open()
        agent.probe = asyncio.create_task(self._probe(agent), name=f"upstream-probe-{agent.name}")

    async def _probe(self, agent: Agent) -> None:
        while True:
            up = await agent.client.ping()
            if up != agent.up:
                log.info("upstream_health_changed", agent=agent.name, up=up)
            agent.up = up
            if self._on_health is not None:
                self._on_health(agent.name, up)
            await asyncio.sleep(agent.config.upstream.health_interval)

    async def close(self) -> None:
        """Stop every probe and close every client, retired ones too; bounded."""
        self._started = False
        probes = [agent.probe for agent in self._agents.values() if agent.probe is not None]
        await cancel_and_wait([*probes, *self._retiring], _CLOSE_TIMEOUT, what="agent probes")
        for agent in self._agents.values():
            await agent.client.close()

    def apply(self, config: GatewayConfig) -> AgentChanges:
        """Take the agents of a reloaded config: start the added, retire the removed and the changed
        upstreams' old clients. Policies and access change at once (they are read per request)."""
        added = [name for name in config.agents if name not in self._agents]
        removed = [name for name in self._agents if name not in config.agents]
        changed = []
        for name, new in config.agents.items():
            agent = self._agents.get(name)
            if agent is None:
                agent = self._agents[name] = Agent(name, new, self._make_client(new))
                if self._started:
                    self._start(agent)
                continue
            if new.upstream != agent.config.upstream:
                changed.append(name)
                old_client, old_probe = agent.client, agent.probe
                agent.client, agent.up = self._make_client(new), False
                agent.config = new
                if self._started:
                    self._start(agent)
                self._retire(old_client, old_probe)
            elif new != agent.config:
                changed.append(name)
                agent.config = new
        for name in removed:
            agent = self._agents.pop(name)
            self._retire(agent.client, agent.probe)
        self._default = config.default
        return AgentChanges(added, removed, changed)

    def _retire(self, client: AdkClient, probe: asyncio.Task[None] | None) -> None:
        if probe is not None:
            probe.cancel()
        task = asyncio.create_task(self._close_when_unused(client), name="retire-upstream-client")
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _close_when_unused(self, client: AdkClient) -> None:
        try:
            waited = 0.0
            while self._users.carries_run(client) and waited < _RETIRE_LIMIT:
                await asyncio.sleep(_RETIRE_POLL)
                waited += _RETIRE_POLL
        finally:
            with contextlib.suppress(Exception):
                await client.close()
