"""The upstream client's idle connections end before the ADK server ends them.

uvicorn (ADK's API server) closes a keep-alive connection idle for `timeout_keep_alive` (5 s by
default); aiohttp's client keeps one for 15 s by default. A request sent on a connection the server
is closing fails with ClientOSError before ADK sees it: a burst of approvals (each chat's connection
idle while its person answers) lost runs that way. Read off a real client, against uvicorn's own default.
"""

from __future__ import annotations

import uvicorn

from gateway.config.schema import parse_config
from gateway.upstream.client import AdkClient


async def test_idle_upstream_connections_are_dropped_before_uvicorn_closes_them() -> None:
    config = parse_config("{}", env={})
    client = AdkClient(config.agents[config.default].upstream)
    client.open()
    try:
        connector = client._http.connector  # type: ignore[attr-defined]
        server_keepalive = uvicorn.Config(app=None).timeout_keep_alive
        assert connector is not None and connector._keepalive_timeout < server_keepalive  # type: ignore[attr-defined]
    finally:
        await client.close()
