"""A gateway's application in process for the tests of its HTTP APIs (aiohttp's test client, the
memory backend), with no ADK behind it: the agents' probes are stopped."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp.test_utils import TestClient, TestServer

from gateway.config.schema import parse_config
from gateway.edge.app import create_app
from gateway.edge.state import GATEWAY

__all__ = ["api_client"]


@asynccontextmanager
async def api_client(config: str) -> AsyncIterator[TestClient]:
    """A test client of the gateway `config` (YAML) makes, started, closed on the way out."""
    app = create_app(parse_config(config, source="gateway.yaml", env={}))
    client = TestClient(TestServer(app))
    await client.start_server()
    for agent in app[GATEWAY].agents:
        agent.probe.cancel()  # no ADK: the APIs do not need one
    try:
        yield client
    finally:
        await client.close()
