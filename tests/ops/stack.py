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

What does not depend on the replicas' config (Redis, the ADK server, the ledger, the plugin's
balancer) is an `Upstream`, which many tests' pairs of replicas can run on in turn
(`replicas(on=...)`, tests/ops/conftest.py): the ADK server's start is most of a stack's.
"""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tests.ops.balancer import Balancer
from tests.ops.checks import Ledger
from gateway.demo import MEMORY, adk_venv, sqlite_uri
from tests.procs import (
    DEMO_TOOLS, PLUGIN, ROOT, AdkServer, GatewayProcess, RedisServer, free_port, gateway_process, redis_server,
    request, resp_command,
)

__all__ = [
    "HEARTBEAT", "OWNER_TIMEOUT", "Balancer", "Replicas", "Upstream", "adk_events", "ops_adk", "payment_responses",
    "redis_calls", "replicas", "upstream", "wait_ready", "wait_until",
]

HEARTBEAT = "200ms"
KEY_PREFIX = "gw-test"
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


def ops_adk() -> Path | None:
    """OPS_ADK_VERSION's `adk` command (its venv built once by gateway.demo.adk_venv); this venv's without it."""
    version = os.environ.get("OPS_ADK_VERSION")
    if not version:
        return None
    try:
        return adk_venv.ensure(version) / "bin" / "adk"
    except adk_venv.VenvError as exc:
        raise RuntimeError(f"OPS_ADK_VERSION={version}: {exc}") from exc


# ---- what the replicas of many tests share ------------------------------------------------------


@dataclass
class Upstream:
    """Redis, the ADK server with the plugin and its ledger, and how the plugin reaches the replicas:
    what `replicas(on=...)` starts a pair of replicas on, one pair after another.

    Starting the ADK server is most of a stack's start, so the rows that may share one do
    (tests/ops/conftest.py); each row still gets its own replicas, and `reset` (at the next pair's
    start) takes away what a row left: Redis's keys and command counts, the ledger's lines, a
    killed ADK server or a stopped Redis. The ADK server keeps the sessions of the chats before,
    which no later row names (chat ids are random)."""

    redis: RedisServer
    agent: AdkServer
    ledger: Ledger
    secret: str
    # The `sessions` lines that reach Redis.
    reach: str
    # The plugin's balancer over each pair's internal listeners in turn (None: the plugin goes
    # straight to `ports[plugin_via]`, the internal ports every pair binds).
    balancer: Balancer | None
    ports: dict[str, int]
    # The ADK server's start, running while the first pair's replicas start.
    starting: Future[None]
    pairs: int = 0
    busy: bool = False

    def reset(self) -> None:
        """What the last pair left gone (called with no replica running)."""
        if self.agent.proc is None or self.agent.proc.poll() is not None:
            self.agent.start()
        if self.redis.proc is None or self.redis.proc.poll() is not None:
            self.redis.start()
        else:
            assert resp_command(self.redis.port, "FLUSHALL") == "OK"
            assert resp_command(self.redis.port, "CONFIG", "RESETSTAT") == "OK"
        self.ledger.path.unlink(missing_ok=True)


@contextmanager
def upstream(
    tmp: Path, *, plugin_via: str = "balancer", adk_env: dict[str, str] | None = None, adk_sessions: Path | None = None,
    adk: Path | None = None, store: tuple[RedisServer, str] | None = None,
) -> Iterator[Upstream]:
    """An `Upstream`: its ADK server starting (`replicas` waits for it), Redis up. The options are
    `replicas`'s of the same names."""
    secret = "test-secret-" + os.urandom(6).hex()
    ledger = Ledger(tmp / "ledger.jsonl")
    ports = {"a": free_port(), "b": free_port()}
    with ExitStack() as stack:
        balancer = None
        if plugin_via == "balancer":
            balancer = Balancer({})
            balancer.start()
            stack.callback(balancer.stop)
            plugin_url = balancer.url
        elif plugin_via in ports:
            plugin_url = f"http://127.0.0.1:{ports[plugin_via]}"
        else:
            raise ValueError(f"plugin_via={plugin_via!r}: 'a', 'b' or 'balancer'")
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
        # The start done (or failed) before the stop: a start still running when the stack unwinds
        # would leave its server behind.
        pool = ThreadPoolExecutor(1, thread_name_prefix="adk-start")
        stack.callback(agent.stop)
        stack.callback(pool.shutdown)
        yield Upstream(redis, agent, ledger, secret, reach, balancer, ports, pool.submit(agent.start))


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
    tmp: Path, *, on: Upstream | None = None, adk_env: dict[str, str] | None = None, drain_timeout: str = "20s",
    plugin_via: str | None = None, prefer: str | None = None, api_keys: dict[str, str] | None = None,
    payment_timeout: str = "5m", upstream_mode: str = "sse", approvals: str | None = None,
    adk_sessions: Path | None = None, idle_chat_ttl: str = "1h", adk: Path | None = None, tools: str = DEMO_TOOLS,
    extra: str = "", code: dict[str, Path] | None = None, replica_env: dict[str, dict[str, str]] | None = None,
    store: tuple[RedisServer, str] | None = None, heartbeat: str = HEARTBEAT, owner_timeout: str = OWNER_TIMEOUT,
) -> Iterator[Replicas]:
    """Redis, the ADK server with the plugin and the ledger, replicas A and B, all ready.

    `on`: an `Upstream` to start the replicas on (reset first when a pair ran on it before); a new
    one of `plugin_via`, `adk_env`, `adk_sessions`, `adk` and `store` without it (which `on` makes
    the caller's choice: giving them too is an error).
    `plugin_via`: "a" or "b" (that replica's internal listener; "b" by default) or "balancer" (a
    `Balancer` over both, sending every new connection to `prefer` while it is up). `api_keys`
    (id -> key) turns auth on; browsers then use the first key. `approvals`: the agent's
    `upstream.approvals`; None leaves it unset (confirm on sse, hold on live: the held path's
    scenarios set `upstream_mode="live"`). `adk_sessions`: a SQLite file for ADK's sessions (what
    `make run` gives it), so that an ADK restart keeps them; in memory without it.
    `idle_chat_ttl`: the replicas' `chat.idle_chat_ttl` (how long a chat nobody uses is kept, here
    and in Redis). `adk`: another venv's `adk` command (an older google-adk,
    gateway.demo.adk_venv); this venv's without it. `tools`, `extra`: the tool policy
    (procs.DEMO_TOOLS by default), and more sections of YAML. `code`: the source tree a replica
    runs ("a" or "b" -> a directory holding another release's `gateway` package: a rolling
    upgrade); this checkout without it. `replica_env`: more environment for one replica.
    `store`: a Redis the caller runs (its primary) and the `sessions` keys that reach it (the
    Sentinel test's); the stack's own redis-server and `redis_url` without it. `heartbeat`,
    `owner_timeout`: the replicas' (short by default, so that a death is seen at once).
    """
    # The secret both replicas seal what they exchange through Redis with (sessions.secret).
    sessions_secret = "sessions-" + os.urandom(16).hex()
    with ExitStack() as stack:
        if on is None:
            on = stack.enter_context(upstream(
                tmp, plugin_via=plugin_via or "b", adk_env=adk_env, adk_sessions=adk_sessions, adk=adk, store=store,
            ))
        elif plugin_via not in (None, "balancer" if on.balancer else None) or (adk_env, adk_sessions, adk, store) != (None,) * 4:
            raise ValueError("plugin_via, adk_env, adk_sessions, adk and store are the Upstream's own (`on`)")
        if prefer is not None and on.balancer is None:
            raise ValueError("prefer is the balancer's (plugin_via='balancer')")
        if on.busy:
            raise RuntimeError("another pair of replicas runs on this Upstream")
        if on.pairs:
            on.reset()
        on.pairs += 1
        on.busy = True
        stack.callback(setattr, on, "busy", False)
        ports = on.ports if on.balancer is None else {"a": free_port(), "b": free_port()}
        auth = ""
        if api_keys:
            auth = "auth:\n  mode: api_key\n  api_keys:\n" + "".join(
                f"    - id: {key_id}\n      key: {key}\n" for key_id, key in api_keys.items()
            )

        def config(name: str) -> str:
            return (
                tools.format(payment_timeout=payment_timeout, on_timeout="deny")
                + f"internal:\n  port: {ports[name]}\n  secret: {on.secret}\n  policy_refresh: 1s\n"
                + f"sessions:\n  backend: redis\n{on.reach}  key_prefix: {KEY_PREFIX}\n"
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
                tmp, on.agent.base, config(name), drain_timeout=drain_timeout, upstream_mode=upstream_mode,
                approvals=approvals, port=port, code=tree,
                # Another tree's package first, whatever PYTHONPATH the tests run with.
                env={**({"PYTHONPATH": str(tree)} if tree != ROOT else {}), **(replica_env or {}).get(name, {})},
            ))

        # Both at once, while the ADK server starts (a replica is up before its agent is).
        a, b = _together([lambda: start("a"), lambda: start("b")])
        on.starting.result()
        if on.balancer is not None:
            on.balancer.route(ports, prefer=prefer)
            # First out: the plugin's requests reach no replica of this pair once it stops.
            stack.callback(on.balancer.route, {})
        for gw in (a, b):
            wait_ready(gw)
        # Steady before a row's fault: readiness does not wait for the inboxes' subscriptions, and
        # with the replicas started together and the ADK server already up a row can reach its
        # fault within a moment of the start.
        wait_until(lambda: len(resp_command(on.redis.port, "PUBSUB", "CHANNELS", f"{KEY_PREFIX}:inbox:*")) == 2,
                   "both replicas' inboxes to subscribe", 10)
        headers, user = {}, "anonymous"
        if api_keys:
            user, key = next(iter(api_keys.items()))
            headers = {"Authorization": f"Bearer {key}"}
        again = {"a": lambda: start("a", a.port), "b": lambda: start("b", b.port)}
        internal = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
        yield Replicas(a, b, on.redis, on.agent.base, on.agent, on.ledger, on.secret, internal, on.balancer, headers, user, again)


def _together(starts: list[Callable[[], GatewayProcess]]) -> list[GatewayProcess]:
    """Each start run at once, in a thread (a start mostly waits for a process to import and
    listen). Each pushes its replica's stop onto the stack's ExitStack: a deque append, safe
    across threads, so a start that fails leaves the others to the stack."""
    with ThreadPoolExecutor(len(starts), thread_name_prefix="replica-start") as pool:
        started = [pool.submit(start) for start in starts]
    return [future.result() for future in started]


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
