"""The bare aiohttp passthrough proxy: the floor of any Python hop, for the gateway to be compared with.

It forwards every HTTP request to the upstream and streams the answer back as it arrives, bytes
unchanged (no parsing, no conversion), and splices WebSocket upgrades frame for frame. It uses the
same aiohttp server and client the gateway does, one pooled client session, and nothing else.

Run: `python -m bench.passthrough --port 8081 --upstream http://127.0.0.1:8000`.
"""

from __future__ import annotations

import argparse
import asyncio

import aiohttp
from aiohttp import web

UPSTREAM = web.AppKey("upstream", str)
CLIENT = web.AppKey("client", aiohttp.ClientSession)


async def proxy(request: web.Request) -> web.StreamResponse:
    url = request.app[UPSTREAM] + request.path_qs
    if request.headers.get("Upgrade", "").lower() == "websocket":
        return await splice(request, url.replace("http", "ws", 1))
    headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
    async with request.app[CLIENT].request(request.method, url, data=await request.read(), headers=headers) as up:
        response = web.StreamResponse(status=up.status, headers={"Content-Type": up.content_type})
        await response.prepare(request)
        async for data in up.content.iter_any():
            await response.write(data)
        await response.write_eof()
        return response


async def splice(request: web.Request, url: str) -> web.WebSocketResponse:
    ws = web.WebSocketResponse(max_msg_size=0)
    await ws.prepare(request)
    async with request.app[CLIENT].ws_connect(url, max_msg_size=0) as up:

        async def downstream() -> None:
            async for msg in up:
                if msg.type is aiohttp.WSMsgType.TEXT:
                    await ws.send_str(msg.data)
            await ws.close()

        task = asyncio.create_task(downstream())
        async for msg in ws:
            if msg.type is aiohttp.WSMsgType.TEXT:
                await up.send_str(msg.data)
        task.cancel()
    return ws


async def _client(app: web.Application):  # type: ignore[no-untyped-def]
    app[CLIENT] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None))
    yield
    await app[CLIENT].close()


def create_app(upstream: str) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[UPSTREAM] = upstream.rstrip("/")
    app.cleanup_ctx.append(_client)
    app.router.add_route("*", "/{tail:.*}", proxy)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    args = parser.parse_args()
    web.run_app(create_app(args.upstream), host=args.host, port=args.port, access_log=None, print=None, backlog=4096)


if __name__ == "__main__":
    main()
