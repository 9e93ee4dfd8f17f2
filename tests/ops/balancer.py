"""A round-robin TCP balancer on a loopback port, in a thread of the test process: what an SRE puts
in front of the replicas' internal listeners (docs/scaling.md), for the plugin, and in front of
their public ports, for browsers."""

from __future__ import annotations

import asyncio
import collections
import threading

from tests.procs import free_port

__all__ = ["Balancer"]


class Balancer:
    """A TCP balancer on a loopback port, in a thread of the test process.

    Each new connection goes to the next backend in turn; one that refuses the connection is
    skipped (a health check in miniature), so a killed replica stops getting the plugin's requests
    as soon as its port closes. `prefer` names a backend that gets every new connection while it
    accepts them: the scenarios that depend on which replica holds the plugin's request choose it.
    A connection ends as a whole when either side ends it (HTTP peers do not half-close), so the
    replica sees the plugin give up, and the plugin sees the replica die. `route` swaps the
    backends on a running balancer: an ADK server whose plugin reaches it serves one pair of
    replicas after another (stack.Upstream); with none, a new connection is closed at once, as a
    real balancer with no backend up does.
    """

    def __init__(self, backends: dict[str, int], *, prefer: str | None = None) -> None:
        self._lock = threading.Lock()
        self.backends: dict[str, int] = {}
        self.prefer: str | None = None
        self.route(backends, prefer=prefer)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.connections: collections.Counter[str] = collections.Counter()
        self._turn = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="balancer", daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self._open: set[asyncio.StreamWriter] = set()

    def route(self, backends: dict[str, int], *, prefer: str | None = None) -> None:
        """From the next connection on, balance over `backends` (name -> port), preferring `prefer`."""
        if prefer is not None and prefer not in backends:
            raise ValueError(f"prefer={prefer!r} is not one of {sorted(backends)}")
        with self._lock:  # the balancer's thread reads both in _order
            self.backends, self.prefer = dict(backends), prefer
            self.connections = collections.Counter()

    def start(self) -> None:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", self.port), self._loop
        )
        self._server = future.result(timeout=10)

    def stop(self) -> None:
        async def close() -> None:
            assert self._server is not None
            self._server.close()
            for writer in list(self._open):
                writer.close()

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    def _order(self) -> list[tuple[str, int]]:
        with self._lock:
            names = list(self.backends)
            if not names:
                return []
            start = self._turn % len(names)
            self._turn += 1
            order = names[start:] + names[:start]
            if self.prefer is not None:
                order.remove(self.prefer)
                order.insert(0, self.prefer)
            return [(name, self.backends[name]) for name in order]

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self._open.add(client_writer)
        try:
            for name, port in self._order():
                try:
                    backend_reader, backend_writer = await asyncio.wait_for(
                        asyncio.open_connection("127.0.0.1", port), 2
                    )
                except (OSError, asyncio.TimeoutError):
                    continue
                self.connections[name] += 1
                break
            else:
                return  # no backend up: the client sees its connection closed, as behind a real balancer
            self._open.add(backend_writer)
            pipes = [
                asyncio.create_task(_pipe(client_reader, backend_writer)),
                asyncio.create_task(_pipe(backend_reader, client_writer)),
            ]
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
            for pipe in pipes:
                pipe.cancel()
            backend_writer.close()
            self._open.discard(backend_writer)
        finally:
            client_writer.close()
            self._open.discard(client_writer)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
