"""The gateway's listeners as `serve` sets them up: what every connection to them is held to."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from aiohttp import web

from gateway.edge.app import create_app
from gateway.config.schema import ConfigError, parse_config
from gateway.edge.server import listeners
from gateway.edge.state import GATEWAY

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


async def trickle(port: int, within: float, *, every: float = 0.2, read_late: float = 0.0) -> bytes:
    """A request head sent one header line `every` seconds, never finished; what came back.
    `read_late`: the client reads nothing for that long (what came waits in its kernel)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def lines() -> None:
        writer.write(b"GET /healthz HTTP/1.1\r\n")
        for i in range(100):
            await asyncio.sleep(every)
            writer.write(b"X-Slow-%d: 1\r\n" % i)

    sending = asyncio.create_task(lines())
    try:
        if read_late:
            writer.transport.pause_reading()
            await asyncio.sleep(read_late)
            writer.transport.resume_reading()
        return await asyncio.wait_for(reader.read(), within)
    finally:
        sending.cancel()
        writer.close()


async def test_both_listeners_cut_heads_that_do_not_arrive_in_time_and_count_them() -> None:
    async with serving() as (app, ports):
        assert len(ports) == 2
        assert limited(app, "header_timeout") == 0  # exported from the start
        loop = asyncio.get_running_loop()
        started = loop.time()
        answers = await asyncio.gather(*(trickle(port, 3) for port in ports for _ in range(10)))
        assert loop.time() - started < 1.5
        for answer in answers:
            assert answer.startswith(b"HTTP/1.1 408 "), answer
        assert limited(app, "header_timeout") == 20
        # A whole request within the bound is served as before.
        assert (await exchange(ports[0], b"GET /healthz HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n", 3)).startswith(
            b"HTTP/1.1 200 "
        )


async def test_a_head_cut_for_time_reaches_a_client_still_sending_and_slow_to_read() -> None:
    """The 408 must reach a client that is still sending its head when it is cut and reads late
    (a loaded machine, a busy client). Closed at once, the gateway's kernel answered the client's
    next line with a reset, and the reset threw away the 408 the client had not read yet (the
    trickle row above failed so, now and then, under load)."""
    async with serving() as (_, (public, _internal)):
        # Past the 500 ms bound by a second, the client still writing a line every 20 ms.
        answer = await trickle(public, 3, every=0.02, read_late=1.0)
        assert answer.startswith(b"HTTP/1.1 408 "), answer


async def get(port: int, path: str, headers: str = "") -> tuple[int, bytes]:
    answer = await exchange(port, f"GET {path} HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n{headers}\r\n".encode(), 3)
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


async def test_metrics_are_on_the_public_listener_by_default() -> None:
    async with serving() as (_, (public, internal)):
        status, body = await get(public, "/metrics")
        assert status == 200 and b"adk_gateway_http_requests_total" in body
        assert (await get(internal, "/metrics"))[0] == 401


async def test_metrics_on_the_internal_listener_without_the_secret_and_not_on_the_public_one() -> None:
    async with serving("metrics: {listener: internal}\n") as (_, (public, internal)):
        assert (await get(public, "/metrics"))[0] == 404
        status, body = await get(internal, "/metrics")
        assert status == 200 and b"adk_gateway_limited_total" in body
        # The plugin's routes still need the secret.
        assert (await get(internal, "/internal/v1/policy"))[0] == 401
        assert (await get(internal, "/internal/v1/policy", f"Authorization: Bearer {SECRET}\r\n"))[0] == 200


async def test_metrics_on_the_internal_listener_start_it_without_a_secret_that_opens_nothing() -> None:
    config = parse_config(
        "internal: {port: 0}\nmetrics: {listener: internal, path: /prometheus}\n"
        "upstream: {url: 'http://127.0.0.1:9', health_interval: 1h}\n", env={},
    )
    app = create_app(config)
    sites = listeners(app, config)
    assert len(sites) == 2
    internal, _, _ = sites[1]
    try:
        await internal.setup()
        await web.TCPSite(internal, "127.0.0.1", 0).start()
        port = internal.addresses[0][1]
        assert (await get(port, "/prometheus"))[0] == 200
        assert (await get(port, "/internal/v1/policy", "Authorization: Bearer \r\n"))[0] == 401
    finally:
        await internal.cleanup()


def test_the_plugin_routes_stay_the_plugins() -> None:
    with pytest.raises(ConfigError, match="metrics.path"):
        parse_config("metrics: {listener: internal, path: /internal/v1/policy}\n", env={})
