"""The production topology in miniature, for the operations fault suite and the replica tests.

Replicas A and B with `sessions.backend: redis` on one real redis-server, in front of one stock ADK
API server with the gateway plugin, which writes a ledger of real tool executions
(checks.Ledger). The plugin's `ADK_GATEWAY_URL` points at replica B's internal listener (what
tests/integration/test_replicas.py has always used), at A's, or at `Balancer`, a TCP round-robin
balancer over both internal listeners run in the test process: what an SRE puts there, and what
docs/scaling.md recommends.

Every process can be made to fail on its own: `GatewayProcess.proc` (kill -9, SIGTERM),
`RedisServer.stop()/start()` (back empty), `AdkServer.kill()/start()` (same port; sessions lost,
unless `adk_sessions` gave ADK a SQLite file), `Replicas.start_again(name)` (a replica that was killed
or stopped, on its own ports and config).
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tests.ops.checks import Ledger
from gateway.demo import MEMORY, sqlite_uri
from tests.procs import (
    DEMO_TOOLS, PLUGIN, ROOT, AdkServer, GatewayProcess, RedisServer, free_port, gateway_process, redis_server,
    request,
)

__all__ = [
    "HEARTBEAT", "OWNER_TIMEOUT", "Balancer", "Replicas", "adk_events", "payment_responses", "redis_calls", "replicas",
    "wait_ready", "wait_until",
]

HEARTBEAT = "200ms"
OWNER_TIMEOUT = "800ms"

T = TypeVar("T")


def wait_until(probe: Callable[[], T], what: str, timeout: float = 15, every: float = 0.05) -> T:
    """`probe()`'s first truthy value, polled until `timeout` (then AssertionError naming `what`)."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(every)


def wait_ready(gw: GatewayProcess, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while request(gw.base, "GET", "/readyz").status != 200:
        assert time.monotonic() < deadline, f"{gw.base} not ready: {request(gw.base, 'GET', '/readyz').body!r}"
        time.sleep(0.05)


# ---- a round-robin TCP balancer ----------------------------------------------------------------


class Balancer:
    """A TCP balancer on a loopback port, in a thread of the test process.

    Each new connection goes to the next backend in turn; one that refuses the connection is
    skipped (a health check in miniature), so a killed replica stops getting the plugin's requests
    as soon as its port closes. `prefer` names a backend that gets every new connection while it
    accepts them: the scenarios that depend on which replica holds the plugin's request choose it.
    A connection ends as a whole when either side ends it (HTTP peers do not half-close), so the
    replica sees the plugin give up, and the plugin sees the replica die.
    """

    def __init__(self, backends: dict[str, int], *, prefer: str | None = None) -> None:
        if prefer is not None and prefer not in backends:
            raise ValueError(f"prefer={prefer!r} is not one of {sorted(backends)}")
        self.backends = dict(backends)
        self.prefer = prefer
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.connections: collections.Counter[str] = collections.Counter()
        self._turn = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="balancer", daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self._open: set[asyncio.StreamWriter] = set()

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

    def _order(self) -> list[str]:
        names = list(self.backends)
        start = self._turn % len(names)
        self._turn += 1
        order = names[start:] + names[:start]
        if self.prefer is not None:
            order.remove(self.prefer)
            order.insert(0, self.prefer)
        return order

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self._open.add(client_writer)
        try:
            for name in self._order():
                try:
                    backend_reader, backend_writer = await asyncio.wait_for(
                        asyncio.open_connection("127.0.0.1", self.backends[name]), 2
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


# ---- the two-replica stack ---------------------------------------------------------------------


@dataclass
class Replicas:
    a: GatewayProcess
    b: GatewayProcess
    redis: RedisServer
    adk: str
    agent: AdkServer
    ledger: Ledger
    secret: str
    internal: dict[str, str]
    balancer: Balancer | None = None
    # What this stack's browsers send (an API key when auth is on), and the user their chats
    # run as in ADK (the key's id; "anonymous" without auth).
    headers: dict[str, str] = field(default_factory=dict)
    user: str = "anonymous"
    # What starts a replica again (start_again): its gateway_process arguments, and the stack
    # whose exit stops it.
    _start: dict[str, Callable[[], GatewayProcess]] = field(default_factory=dict)

    def internal_post(self, name: str, path: str) -> Any:
        return request(self.internal[name], "POST", path, headers={"Authorization": f"Bearer {self.secret}"})

    def replica(self, name: str) -> GatewayProcess:
        return self.a if name == "a" else self.b

    def start_again(self, name: str) -> GatewayProcess:
        """Replica `name` ("a" or "b"), killed or stopped, started again on its ports with its
        config (a new process: nothing of the old one's memory), and ready."""
        assert self.replica(name).proc.poll() is not None, f"replica {name} still runs"
        gw = self._start[name]()
        setattr(self, name, gw)
        wait_ready(gw)
        return gw


@contextmanager
def replicas(
    tmp: Path, *, adk_env: dict[str, str] | None = None, drain_timeout: str = "20s", plugin_via: str = "b",
    prefer: str | None = None, api_keys: dict[str, str] | None = None, payment_timeout: str = "5m",
    upstream_mode: str = "sse", approvals: str | None = None, adk_sessions: Path | None = None, idle_chat_ttl: str = "1h",
    adk: Path | None = None, tools: str = DEMO_TOOLS, extra: str = "", code: dict[str, Path] | None = None,
    replica_env: dict[str, dict[str, str]] | None = None, store: tuple[RedisServer, str] | None = None,
    heartbeat: str = HEARTBEAT, owner_timeout: str = OWNER_TIMEOUT,
) -> Iterator[Replicas]:
    """Redis, the ADK server with the plugin and the ledger, replicas A and B, all ready.

    `plugin_via`: "a" or "b" (that replica's internal listener) or "balancer" (a `Balancer` over
    both, sending every new connection to `prefer` while it is up). `api_keys` (id -> key) turns
    auth on; browsers then use the first key. `approvals`: the agent's `upstream.approvals`; None
    leaves it unset (confirm on sse, hold on live: the held path's scenarios set `upstream_mode="live"`). `adk_sessions`: a SQLite file for ADK's sessions (what `make run` gives it), so
    that an ADK restart keeps them; in memory without it. `idle_chat_ttl`: the replicas'
    `chat.idle_chat_ttl` (how long a chat nobody uses is kept, here and in Redis). `adk`: another
    venv's `adk` command (an older google-adk, gateway.demo.adk_venv); this venv's without it.
    `tools`, `extra`: the tool policy (procs.DEMO_TOOLS by default), and more sections of YAML.
    `code`: the source tree a replica runs ("a" or "b" -> a directory holding another release's
    `gateway` package: a rolling upgrade); this checkout without it. `replica_env`: more
    environment for one replica.
    `store`: a Redis the caller runs (its primary) and the `sessions` keys that reach it (the
    Sentinel test's); the stack's own redis-server and `redis_url` without it. `heartbeat`,
    `owner_timeout`: the replicas' (short by default, so that a death is seen at once).
    """
    secret = "test-secret-" + os.urandom(6).hex()
    # The secret both replicas seal what they exchange through Redis with (sessions.secret).
    sessions_secret = "sessions-" + os.urandom(16).hex()
    ports = {"a": free_port(), "b": free_port()}
    internal = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    ledger = Ledger(tmp / "ledger.jsonl")
    with ExitStack() as stack:
        balancer = None
        if plugin_via == "balancer":
            balancer = Balancer(ports, prefer=prefer)
            balancer.start()
            stack.callback(balancer.stop)
            plugin_url = balancer.url
        else:
            plugin_url = internal[plugin_via]
        if store is None:
            redis = stack.enter_context(redis_server(tmp))
            reach = f"  redis_url: {redis.url}\n"
        else:
            redis, reach = store
        agent = AdkServer(tmp, extra_plugins=(PLUGIN,), adk=adk, sessions=MEMORY if adk_sessions is None else sqlite_uri(adk_sessions), env={
            "ADK_GATEWAY_URL": plugin_url, "ADK_GATEWAY_SECRET": secret, "DEMO_TOOL_LEDGER": str(ledger.path),
            # This checkout's plugin first, whatever copy the venv holds.
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "plugin"), os.environ.get("PYTHONPATH")])),
            **(adk_env or {}),
        })
        stack.callback(agent.stop)
        agent.start()
        auth = ""
        if api_keys:
            auth = "auth:\n  mode: api_key\n  api_keys:\n" + "".join(
                f"    - id: {key_id}\n      key: {key}\n" for key_id, key in api_keys.items()
            )

        def config(name: str) -> str:
            return (
                tools.format(payment_timeout=payment_timeout, on_timeout="deny")
                + f"internal:\n  port: {ports[name]}\n  secret: {secret}\n  policy_refresh: 1s\n"
                + f"sessions:\n  backend: redis\n{reach}  key_prefix: gw-test\n"
                + f"  secret: {sessions_secret}\n"
                + f"  heartbeat_interval: {heartbeat}\n  owner_timeout: {owner_timeout}\n  forward_timeout: 5s\n"
                # Keep-alives rarer than the test client's 30 s read timeout: a stalled stream
                # fails the test instead of hanging it.
                + f"chat:\n  keepalive_interval: 60s\n  idle_chat_ttl: {idle_chat_ttl}\n"
                + auth + extra
            )

        def start(name: str, port: int | None = None) -> GatewayProcess:
            tree = (code or {}).get(name, ROOT)
            return stack.enter_context(gateway_process(
                tmp, agent.base, config(name), drain_timeout=drain_timeout, upstream_mode=upstream_mode,
                approvals=approvals, port=port, code=tree,
                # Another tree's package first, whatever PYTHONPATH the tests run with.
                env={**({"PYTHONPATH": str(tree)} if tree != ROOT else {}), **(replica_env or {}).get(name, {})},
            ))

        a, b = start("a"), start("b")
        for gw in (a, b):
            wait_ready(gw)
        headers, user = {}, "anonymous"
        if api_keys:
            user, key = next(iter(api_keys.items()))
            headers = {"Authorization": f"Bearer {key}"}
        again = {"a": lambda: start("a", a.port), "b": lambda: start("b", b.port)}
        yield Replicas(a, b, redis, agent.base, agent, ledger, secret, internal, balancer, headers, user, again)


# ---- what Redis served ----


def redis_calls(redis: RedisServer, command: str) -> int:
    """How many times Redis has run `command` (INFO commandstats), to tell what the replicas did."""
    with socket.create_connection(("127.0.0.1", redis.port), timeout=5) as sock:
        sock.sendall(b"INFO commandstats\r\n")
        data = b""
        while b"\r\n" not in data or len(data) < _bulk_size(data):
            piece = sock.recv(65536)
            assert piece, "redis closed the connection"
            data += piece
    for line in data.decode().splitlines():
        if line.startswith(f"cmdstat_{command.lower()}:"):
            return int(line.split("calls=")[1].split(",")[0])
    return 0


def _bulk_size(data: bytes) -> int:
    """The whole length of a RESP bulk string reply whose header `data` starts with."""
    header, _, _ = data.partition(b"\r\n")
    return len(header) + 2 + int(header[1:]) + 2


# ---- what ADK holds ----------------------------------------------------------------------------


def adk_events(adk: str, chat: str, user: str = "anonymous") -> list[dict[str, Any]]:
    """The events of the chat's ADK session ([] when ADK does not have it, e.g. after a restart)."""
    try:
        with urllib.request.urlopen(f"{adk}/apps/demo_agent/users/{user}/sessions/{chat}", timeout=10) as reply:
            return json.loads(reply.read())["events"]
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return []
        raise


def payment_responses(adk: str, chat: str, user: str = "anonymous") -> list[dict[str, Any]]:
    """What ADK recorded as the answer to each process_payment call of the chat, in order."""
    out = []
    for event in adk_events(adk, chat, user):
        for part in (event.get("content") or {}).get("parts") or []:
            response = part.get("functionResponse") or part.get("function_response")
            if response and response.get("name") == "process_payment":
                out.append(response["response"])
    return out
