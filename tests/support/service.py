"""The chat service of a unit test, built in one place: `chat_service` with what the test varies
(config, the fake ADK, clocks, ids, registry, metrics), the configs they share (as shipped, the
held engine), and a browser gone away."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.chat.registry import Registry
from gateway.chat.service import ChatService
from gateway.config.schema import AgentConfig, GatewayConfig, load_config, parse_config
from gateway.ops.metrics import GatewayMetrics
from gateway.ops.tracing import Tracing
from gateway.upstream.agents import Agents
from tests.support.adk import ScriptedAdk


def chat_service(
    config: GatewayConfig | str = "",
    *,
    adk: Any = None,
    clients: Callable[[AgentConfig], Any] | None = None,
    registry: Registry | None = None,
    metrics: GatewayMetrics | None = None,
    clock: Callable[[], float] | None = None,
    wall: Callable[[], float] | None = None,
    new_id: Callable[[], str] | str | None = None,
    tracing: Tracing | None = None,
) -> ChatService:
    """A ChatService of `config` (YAML text is parsed with no environment). Its agents reach `adk` (one
    fake for every agent) or `clients(agent)`; with neither, the real AdkClient, which such a test
    never reaches. The registry caps chats per user as the config says (as the app builds it).
    `new_id`: a function, or one id for every message. Unset clocks are the service's own."""
    if isinstance(config, str):
        config = parse_config(config, env={})
    if clients is None and adk is not None:
        clients = lambda _agent: adk  # noqa: E731
    extra: dict[str, Any] = {}
    if clock is not None:
        extra["clock"] = clock
    if wall is not None:
        extra["wall"] = wall
    if new_id is not None:
        extra["new_id"] = (lambda: new_id) if isinstance(new_id, str) else new_id
    return ChatService(
        agents=Agents(config) if clients is None else Agents(config, client=clients),
        registry=registry if registry is not None else Registry(config.limits.max_chats_per_user),
        metrics=metrics or GatewayMetrics(), config=config, tracing=tracing, **extra,
    )


def shipped_config() -> GatewayConfig:
    """config/gateway.yaml as shipped (both demo agents, confirm mode), with a secret."""
    return load_config(Path(__file__).resolve().parents[2] / "config" / "gateway.yaml", env={"ADK_GATEWAY_SECRET": "s"})


def shipped_service() -> tuple[ScriptedAdk, ChatService]:
    """A ChatService of config/gateway.yaml as shipped (confirm mode) on the scripted ADK; every
    message id is msg-1."""
    adk = ScriptedAdk()
    return adk, chat_service(shipped_config(), adk=adk, new_id="msg-1")


def held_engine(config: GatewayConfig) -> GatewayConfig:
    """`config` with every agent's gated calls on the held engine (the plugin's held request, `gw-`
    ids), live mode's one way to wait, driven here through the scripted `/run_sse` upstream (tests/unit
    has no scripted live one). No file can say this (config/agent.py refuses hold on sse; the internal
    listener refuses a held ask about an sse agent, tests/unit/test_plugin_too_old.py); the chat's
    held engine does not look at the mode."""
    agents = {
        name: agent.model_copy(update={"upstream": agent.upstream.model_copy(update={"approvals": "hold"})})
        for name, agent in config.agents.items()
    }
    return config.model_copy(update={"agents": agents})


class _Gone:
    """A reader's `Presence` (gateway/chat/presence.py) whose browser went away."""

    def connected(self) -> bool:
        return False


GONE = _Gone()
