"""The application's state: one `Gateway` object hung off the aiohttp Application.

Everything that lives longer than a request (config, metrics, the registry, the upstream client,
the chat service) is reached through `request.app[GATEWAY]`; nothing is module-global.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from .auth import Authenticator
from .chats import ChatService
from .config import GatewayConfig
from .metrics import GatewayMetrics
from .registry import Registry
from .upstream import AdkClient

__all__ = ["GATEWAY", "Gateway"]


@dataclass(eq=False)
class Gateway:
    config: GatewayConfig
    metrics: GatewayMetrics
    registry: Registry
    auth: Authenticator
    upstream: AdkClient
    chats: ChatService
    upstream_up: bool = False
    draining: bool = False


GATEWAY = web.AppKey("gateway", Gateway)
