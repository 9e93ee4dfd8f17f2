"""The gateway's listeners as `serve` sets them up: what every connection to them is held to."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web

from gateway.app import create_app
from gateway.config import parse_config
from gateway.server import listeners
from gateway.state import GATEWAY

SECRET = "internal-secret-0123456789"


@asynccontextmanager
async def serving(extra: str = "") -> AsyncIterator[tuple[web.Application, list[int]]]:
    """The gateway's listeners on free loopback ports (public first): its app, and their ports."""
    config = parse_config(
        f"listen: {{port: 0, header_timeout: 500ms}}\ninternal: {{port: 0, secret: {SECRET}}}\n"
        "upstream: {url: 'http://127.0.0.1:9', health_interval: 1h}\n" + extra, env={},
    )
    app = create_app(config)
    sites = listeners(app, config)
    try:
        ports = []
        for runner, host, _ in sites:
            await runner.setup()
            await web.TCPSite(runner, host, 0).start()
            ports.append(runner.addresses[0][1])
        yield app, ports
    finally:
        for runner, _, _ in reversed(sites):
            await runner.cleanup()


def limited(app: web.Application, reason: str) -> float:
    value = app[GATEWAY].metrics.registry.get_sample_value("adk_gateway_limited_total", {"reason": reason})
    return value or 0.0


async def exchange(port: int, data: bytes, within: float) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        return await asyncio.wait_for(reader.read(), within)
    finally:
        writer.close()


async def test_both_listeners_cut_a_head_that_does_not_arrive_in_time_and_count_it() -> None:
    async with serving() as (app, ports):
        assert len(ports) == 2
        assert limited(app, "header_timeout") == 0  # exported from the start
        loop = asyncio.get_running_loop()
        started = loop.time()
        answers = await asyncio.gather(*(exchange(port, b"GET /healthz HTTP/1.1\r\nHost: gw\r\n", 3) for port in ports))
        assert loop.time() - started < 1.5
        for answer in answers:
            assert answer.startswith(b"HTTP/1.1 408 "), answer
        assert limited(app, "header_timeout") == 2
        # A whole request within the bound is served as before.
        assert (await exchange(ports[0], b"GET /healthz HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n", 3)).startswith(
            b"HTTP/1.1 200 "
        )
