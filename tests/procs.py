"""Real processes for integration tests: the stock ADK API server with the demo agent, and gateways.

Both run as subprocesses on free loopback ports, the way they run in production, so that the
Node-based AI SDK clients can talk to them while pytest blocks on the client.
"""

from __future__ import annotations

import functools
import http.client
import itertools
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from gateway.demo import AGENTS_DIR, api_server_command

ROOT = Path(__file__).resolve().parents[1]


# Under pytest-xdist (`make test`) every worker takes the ports of the processes it starts from a block
# of its own, below Linux's ephemeral range (32768-60999), where neither another worker nor a
# connection's local port can take a port between its choice and its process's bind: the kernel's
# port 0 guarantees no such thing to several processes at once. Workers past PORT_BLOCKS share a
# block again (each port is still checked free).
FIRST_PORT = 12000
PORT_BLOCK = 2000
PORT_BLOCKS = 10


def free_port() -> int:
    """A loopback port free now, for a process to bind next: from this xdist worker's block
    (worker_ports); a run without workers (`make test`'s serial tests/ops, a single file) takes gw0's,
    as one worker would: the kernel's choice lies in the ephemeral range, where an outgoing
    connection could take it in the seconds before a replica started with it binds it."""
    ports = worker_ports(os.environ.get("PYTEST_XDIST_WORKER", "")) or worker_ports("gw0")
    assert ports is not None
    for _ in range(PORT_BLOCK):
        port = next(ports)
        if _bindable(port):
            return port
    raise RuntimeError(f"no free port in {os.environ.get('PYTEST_XDIST_WORKER')}'s block")


@functools.cache
def worker_ports(worker: str) -> Iterator[int] | None:
    """The ports of xdist worker `worker` ("gw3"), handed out in turn round its block: a port comes
    back only after the whole block, long after the process it went to has bound it or is gone.
    None outside xdist. The turn starts at a random place so that two runs on one machine at once
    (two checkouts) do not step through the same ports together. One per process: the process is
    the block's only user."""
    if not worker.startswith("gw") or not worker[2:].isdigit():
        return None
    first = FIRST_PORT + PORT_BLOCK * (int(worker[2:]) % PORT_BLOCKS)
    start = random.randrange(PORT_BLOCK)
    return (first + (start + turn) % PORT_BLOCK for turn in itertools.count())


def _bindable(port: int) -> bool:
    # No SO_REUSEADDR: a port with a connection still in TIME_WAIT counts as taken, which is
    # stricter than the servers' own bind.
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def wait_http(url: str, *, timeout: float, proc: subprocess.Popen[Any] | None = None, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-3000:] if log and log.exists() else ""
            raise RuntimeError(f"process exited with {proc.returncode} before {url} answered:\n{tail}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return  # it answers, even if not 200
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not answer within {timeout}s")
        time.sleep(0.1)


def stop_process(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM, then SIGKILL if it has not exited within 15 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GOOGLE_API_KEY", "GEMINI_API_KEY")}
    env["DEMO_MODEL"] = "scripted"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


class AdkServer:
    """The stock ADK API server with the demo agent on a loopback port. `kill()` then `start()`
    keeps the port, so gateways pointed at it see a crash and a restart (sessions are in memory
    unless `sessions` names another store, e.g. `gateway.demo.sqlite_uri(tmp / "sessions.db")`:
    in memory a restart loses them, as it does in production with `memory://`)."""

    def __init__(
        self, tmp: Path, *, extra_plugins: tuple[str, ...] = (), env: dict[str, str] | None = None,
        port: int | None = None, adk: Path | None = None, sessions: str = "memory://", auto_create_session: bool = False,
        agents_dir: Path = AGENTS_DIR,
    ) -> None:
        self.tmp = tmp
        self.agents_dir = agents_dir  # another agents folder than the demo's
        self.extra_plugins = extra_plugins
        self.env = env
        self.sessions = sessions
        # ADK's --auto_create_session: a run creates its missing session (ADK 1.39 and later).
        self.auto_create_session = auto_create_session
        # Another venv's `adk` command (an older ADK, gateway.demo.adk_venv); default: this venv's.
        self.adk = adk
        self.port = port or free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = tmp / f"adk-{self.port}.log"
        self.proc: subprocess.Popen[Any] | None = None

    def start(self) -> None:
        # Appended: a restart keeps the crashed process's lines for the failure message.
        with self.log.open("a") as out:
            self.proc = subprocess.Popen(
                api_server_command(
                    self.port, extra_plugins=self.extra_plugins, adk=self.adk, session_service_uri=self.sessions,
                    auto_create_session=self.auto_create_session, agents_dir=self.agents_dir,
                ), stdout=out,
                stderr=subprocess.STDOUT, env=_child_env(self.env), cwd=self.tmp,
            )
        wait_http(f"{self.base}/list-apps", timeout=90, proc=self.proc, log=self.log)

    def kill(self) -> None:
        """SIGKILL: a crash, with no shutdown of its own."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None


@contextmanager
def adk_server(
    tmp: Path, *, extra_plugins: tuple[str, ...] = (), env: dict[str, str] | None = None, port: int | None = None,
    adk: Path | None = None,
) -> Iterator[str]:
    server = AdkServer(tmp, extra_plugins=extra_plugins, env=env, port=port, adk=adk)
    try:
        server.start()
        yield server.base
    finally:
        server.stop()


@dataclass
class GatewayProcess:
    base: str
    port: int
    log: Path
    proc: subprocess.Popen[Any]
    config_path: Path

    def log_text(self) -> str:
        return self.log.read_text()

    def log_lines(self) -> list[dict[str, Any]]:
        lines = []
        for line in self.log_text().splitlines():
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError:
                lines.append({"raw": line})
        return lines


@contextmanager
def gateway_process(
    tmp: Path, upstream: str, config: str = "", env: dict[str, str] | None = None, port: int | None = None,
    upstream_mode: str = "sse", drain_timeout: str = "20s", approvals: str | None = None, code: Path = ROOT,
    auto_create_session: bool = False,
) -> Iterator[GatewayProcess]:
    """A gateway subprocess. `config` is extra YAML (whole sections) added to the test defaults; with
    an `agents:` section in it, `upstream` is unused (each agent names its own). `approvals`: the
    agent's `upstream.approvals`; None leaves it unset (what each mode waits with: ADK's confirmation
    on sse, the plugin's held request on live; the tests of the held path use `upstream_mode="live"`).
    `auto_create_session`: the agent's
    `upstream.auto_create_session`. `code`: the source tree whose `gateway` package runs
    (another release's, for the rolling upgrade test); this checkout by default."""
    port = port or free_port()
    path = tmp / f"gateway-{port}.yaml"
    path.write_text(
        f"listen:\n  host: 127.0.0.1\n  port: {port}\n  drain_timeout: {drain_timeout}\n"
        f"logging:\n  level: debug\n  format: json\n" + config
        # The tests run many chats at once as one anonymous user: the production caps would bite.
        + ("" if "limits:" in config else "limits:\n  max_streams_per_user: 500\n  rate_per_user: 1000\n  burst_per_user: 1000\n  max_chats_per_user: 5000\n"
              # Not a key of every release the rolling upgrade runs: this checkout's only.
              + ("  max_pending_approvals_per_user: 5000\n" if code == ROOT else ""))
        + ("" if "\nagents:" in "\n" + config else f"upstream:\n  url: {upstream}\n  health_interval: 200ms\n  mode: {upstream_mode}\n"
            + (f"  approvals: {approvals}\n" if approvals else "")
            + ("  auto_create_session: true\n" if auto_create_session else ""))
    )
    log = tmp / f"gateway-{port}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config", str(path)],
            stdout=out, stderr=subprocess.STDOUT, env=_child_env(env), cwd=code,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{base}/healthz", timeout=30, proc=proc, log=log)
        yield GatewayProcess(base, port, log, proc, path)
    finally:
        stop_process(proc)


@contextmanager
def make_run(tmp: Path, env: dict[str, str] | None = None, *, unset: tuple[str, ...] = ()) -> Iterator[GatewayProcess]:
    """What `make run` runs: `adk-gateway demo` with the reference config/gateway.yaml (both demo
    agents in the stock ADK API server, the page on), on a free port. `unset` leaves variables out
    of the child's environment. The agent's sessions are in a SQLite file of `tmp` (`make run`'s
    store, not its file: each test's chats are its own)."""
    port = free_port()
    child_env = _child_env({"PORT": str(port), "DEMO_SESSION_STORE": f"sqlite:{tmp / 'sessions.db'}", **(env or {})})
    for name in unset:
        child_env.pop(name, None)
    log = tmp / f"demo-{port}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "demo"], stdout=out, stderr=subprocess.STDOUT, env=child_env, cwd=ROOT
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{base}/healthz", timeout=90, proc=proc, log=log)
        yield GatewayProcess(base, port, log, proc, ROOT / "config" / "gateway.yaml")
    finally:
        stop_process(proc)


DEMO_TOOLS = """
tools:
  process_payment:
    approval: true
    timeout: {payment_timeout}
    on_timeout: {on_timeout}
    hint: Money leaves the account when you approve.
    # The demo's rules (config/gateway.yaml): the rows above pay between them, and are asked.
    rules:
      - name: small
        when: args.amount < 5
        decide: approve
      - name: too_large
        when: args.amount >= 10000
        decide: deny
        reason: Payments of 10,000 or more are refused.
  get_location:
    approval: true
    runs_in: browser
    timeout: 30s
  change_bgm:
    runs_in: browser
    timeout: 30s
"""

PLUGIN = "gateway.agent_plugin.GatewayPlugin"


@dataclass
class PluginStack:
    gateway: GatewayProcess
    adk: str
    internal: str
    secret: str
    config_path: Path


@contextmanager
def plugin_stack(
    tmp: Path, *, payment_timeout: str = "5m", on_timeout: str = "deny", extra: str = "",
    internal_port: int | None = None, adk_env: dict[str, str] | None = None, upstream_mode: str = "sse",
    adk: Path | None = None, plugin: str = PLUGIN, approvals: str | None = None, tools: str = DEMO_TOOLS,
    gateway_env: dict[str, str] | None = None, agent: Agent | None = None,
) -> Iterator[PluginStack]:
    """The demo's topology: the stock ADK API server with the gateway plugin, and a gateway with a tool policy.

    `adk`, `plugin`: another venv's `adk` command, and the plugin path it loads (see AdkServer);
    `adk_env`, `gateway_env`: more environment for each process. `agent`: a running ADK server with
    the plugin (start_agent, shared by several tests) instead of one of the stack's own; the
    gateway's internal listener goes where that plugin looks (`internal_port`, `adk*`, `plugin`
    unused)."""
    if agent is not None:
        with _policy_gateway(
            tmp, agent.server.base, agent.internal_port, agent.secret, payment_timeout, on_timeout, extra, tools,
            gateway_env, upstream_mode, approvals, auto_create_session=agent.server.auto_create_session,
        ) as stack:
            yield stack
        return
    internal_port = internal_port or free_port()
    secret = "test-secret-" + os.urandom(6).hex()
    env = {"ADK_GATEWAY_URL": f"http://127.0.0.1:{internal_port}", "ADK_GATEWAY_SECRET": secret, **(adk_env or {})}
    with adk_server(tmp, extra_plugins=(plugin,), env=env, adk=adk) as adk_base, _policy_gateway(
        tmp, adk_base, internal_port, secret, payment_timeout, on_timeout, extra, tools, gateway_env, upstream_mode,
        approvals,
    ) as stack:
        yield stack


@contextmanager
def _policy_gateway(
    tmp: Path, adk_base: str, internal_port: int, secret: str, payment_timeout: str, on_timeout: str, extra: str,
    tools: str, gateway_env: dict[str, str] | None, upstream_mode: str, approvals: str | None,
    auto_create_session: bool = False,
) -> Iterator[PluginStack]:
    internal = f"http://127.0.0.1:{internal_port}"
    config = (
        tools.format(payment_timeout=payment_timeout, on_timeout=on_timeout)
        + f"internal:\n  port: {internal_port}\n  secret: {secret}\n  policy_refresh: 1s\n" + extra
    )
    with gateway_process(
        tmp, adk_base, config, env=gateway_env, upstream_mode=upstream_mode, approvals=approvals,
        auto_create_session=auto_create_session,
    ) as gw:
        yield PluginStack(gw, adk_base, internal, secret, gw.config_path)


@dataclass(frozen=True)
class Ledger:
    """The agent's ledger of real tool executions (the demo's DEMO_TOOL_LEDGER) as one test sees it:
    the lines written after the first `skip`, so that an agent several tests share shows each test
    only its own calls' (the tests run one at a time)."""

    path: Path
    skip: int = 0

    def runs(self) -> list[dict[str, Any]]:
        lines = self.path.read_text().splitlines() if self.path.exists() else []
        return [json.loads(line) for line in lines[self.skip:]]

    def from_now(self) -> Ledger:
        return Ledger(self.path, self.skip + len(self.runs()))


@dataclass
class Agent:
    """An ADK API server several tests share (its start is most of such a test's time), with the
    ledger of its real tool executions. With the gateway plugin, the plugin reaches the internal
    listener at `internal_port` with `secret`: each test starts its own gateway there."""

    server: AdkServer
    ledger: Ledger
    internal_port: int = 0
    secret: str = ""

    def internal_config(self) -> str:
        """The gateway YAML that puts a gateway's internal listener where the plugin looks."""
        return f"internal:\n  port: {self.internal_port}\n  secret: {self.secret}\n  policy_refresh: 1s\n"

    def for_a_test(self) -> Agent:
        """This agent as the next test sees it: running (started again if a test before killed it),
        its ledger from now on."""
        if self.server.proc is None or self.server.proc.poll() is not None:
            self.server.stop()
            self.server.start()
        return Agent(self.server, self.ledger.from_now(), self.internal_port, self.secret)


def start_agent(
    tmp: Path, *, plugin: str | None = None, adk: Path | None = None, sessions: str = "memory://",
    env: dict[str, str] | None = None, auto_create_session: bool = False,
) -> Agent:
    """An Agent, started (the caller stops `server`). `plugin`: the gateway plugin's path, told to
    reach a free internal port with a fresh secret; none without it. `adk`, `sessions`,
    `auto_create_session`: as AdkServer's (a plugin_stack in front of it follows the last)."""
    ledger = Ledger(tmp / "ledger.jsonl")
    agent_env = {"DEMO_TOOL_LEDGER": str(ledger.path), **(env or {})}
    internal_port, secret = 0, ""
    if plugin is not None:
        internal_port, secret = free_port(), "test-secret-" + os.urandom(6).hex()
        agent_env.update({"ADK_GATEWAY_URL": f"http://127.0.0.1:{internal_port}", "ADK_GATEWAY_SECRET": secret})
    server = AdkServer(
        tmp, extra_plugins=(plugin,) if plugin else (), env=agent_env, adk=adk, sessions=sessions,
        auto_create_session=auto_create_session,
    )
    server.start()
    return Agent(server, ledger, internal_port, secret)


# ---- a tiny synchronous HTTP client for the tests --------------------------------------------


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def chunks(self) -> list[dict[str, Any]]:
        """The SSE data payloads, parsed, without [DONE]."""
        return [json.loads(p) for p in self.payloads if p != "[DONE]"]

    @property
    def payloads(self) -> list[str]:
        out = []
        for block in self.body.decode().split("\n\n"):
            data = [line[5:].lstrip(" ") for line in block.split("\n") if line.startswith("data:")]
            if data:
                out.append("\n".join(data))
        return out


def request(
    base: str, method: str, path: str, body: bytes | dict[str, Any] | None = None,
    headers: dict[str, str] | None = None, timeout: float = 30,
) -> Reply:
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    if isinstance(body, dict):
        body = json.dumps(body).encode()
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    try:
        conn.request(method, path, body=body, headers=hdrs)
        resp = conn.getresponse()
        return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


class QuietHandler(BaseHTTPRequestHandler):
    """A scripted stub's request handler that logs nothing."""

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def serve_http(handler: Callable[..., BaseHTTPRequestHandler], host_name: str = "127.0.0.1") -> Iterator[str]:
    """`handler` served on a free loopback port, a thread per request (a stub, the test's own files):
    its base URL, spelled with `host_name`, until the block ends."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host_name}:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def metric_value(base: str, name: str, labels: dict[str, str] | None = None) -> float:
    """The sum of the samples from /metrics whose labels include `labels` (0 when none), as PromQL's
    `sum(name{labels})`: a series split by a label the caller does not name (the agent) adds up."""
    text = request(base, "GET", "/metrics").body.decode()
    want = labels or {}
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        metric, _, value = line.rpartition(" ")
        if metric.split("{")[0] != name:
            continue
        found = {}
        if "{" in metric:
            for pair in metric[metric.index("{") + 1 : -1].split('",'):
                key, _, val = pair.partition("=")
                found[key] = val.strip('"')
        if all(found.get(k) == v for k, v in want.items()):
            total += float(value)
    return total


# ---- a real redis-server -------------------------------------------------------------------------


class RedisServer:
    """A redis-server on a free loopback port, without persistence (a restart loses everything,
    which is the harshest restart the gateway must survive). `restart()` keeps the port."""

    def __init__(self, tmp: Path, *, replica_of: int | None = None) -> None:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        if not Path(binary).exists():
            raise RuntimeError("redis-server is not installed: `make test` installs it (apt-get install -y redis-server)")
        self.binary = binary
        self.tmp = tmp
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[Any] | None = None
        # A replica of the redis-server on that port (`--replicaof`), for the Sentinel tests.
        self.replica_of = replica_of

    def start(self) -> None:
        # A replica's first sync starts at once (Redis 7 waits 5 s for more replicas by default).
        extra = ["--repl-diskless-sync-delay", "0"]
        if self.replica_of is not None:
            extra += ["--replicaof", "127.0.0.1", str(self.replica_of)]
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.tmp), "--logfile", str(self.tmp / f"redis-{self.port}.log"), *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )
        _wait_for_pong(self.proc, lambda: resp_command(self.port, "PING", timeout=1) == "PONG", f"redis-server on port {self.port}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def restart(self, down_for: float = 0.0) -> None:
        self.stop()
        time.sleep(down_for)
        self.start()


@contextmanager
def redis_server(tmp: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp)
    server.start()
    try:
        yield server
    finally:
        server.stop()


# ---- Redis Sentinel ------------------------------------------------------------------------------


class RedisSentinel:
    """A redis-sentinel on a free loopback port monitoring the primary on `primary_port` as
    `service`, with failure detection scaled down (`down_after_ms`, `failover_timeout_ms`) so a
    test's failover takes seconds. Its configuration file is its own (sentinels rewrite it)."""

    def __init__(
        self, tmp: Path, primary_port: int, service: str, *, quorum: int = 2, down_after_ms: int = 500,
        failover_timeout_ms: int = 2000,
    ) -> None:
        binary = shutil.which("redis-sentinel") or "/usr/bin/redis-sentinel"
        if not Path(binary).exists():
            raise RuntimeError("redis-sentinel is not installed: `make test` installs it (apt-get install -y redis-sentinel)")
        self.binary = binary
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.conf = tmp / f"sentinel-{self.port}.conf"
        self.log = tmp / f"sentinel-{self.port}.log"
        self.conf.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {tmp}\nlogfile {self.log}\n"
            f"sentinel monitor {service} 127.0.0.1 {primary_port} {quorum}\n"
            f"sentinel down-after-milliseconds {service} {down_after_ms}\n"
            f"sentinel failover-timeout {service} {failover_timeout_ms}\n"
            f"sentinel parallel-syncs {service} 1\n"
        )
        self.service = service
        self.proc: subprocess.Popen[Any] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen([self.binary, str(self.conf)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        _wait_for_pong(self.proc, lambda: self.ask("PING") == "PONG", f"redis-sentinel on port {self.port}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def ask(self, *command: str) -> Any:
        """One command's reply (RESP2, decoded: str, int, None or lists of them)."""
        return resp_command(self.port, *command)

    def primary(self) -> tuple[str, int]:
        """Who this sentinel says the primary is now."""
        host, port = self.ask("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
        return host, int(port)

    def state(self) -> dict[str, str]:
        """SENTINEL MASTER's fields (num-slaves, num-other-sentinels, flags, ...)."""
        reply = self.ask("SENTINEL", "MASTER", self.service)
        return dict(zip(reply[::2], reply[1::2]))


def _wait_for_pong(proc: subprocess.Popen[bytes], pong: Callable[[], bool], what: str) -> None:
    """Wait until `pong()` is true (a server answering PING), 10 s at most, or fail if `proc` exits."""
    deadline = time.monotonic() + 10
    while True:
        try:
            if pong():
                return
        except (OSError, RuntimeError):  # not listening yet, or an error reply such as -LOADING
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"{what} did not start")
        time.sleep(0.05)


def resp_command(port: int, *command: str, timeout: float = 5.0) -> Any:
    """Send one command to the Redis-protocol server on `port` and read its reply, with no client
    library between (what a test asks a server must not depend on the code under test)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(b"*%d\r\n" % len(command) + b"".join(b"$%d\r\n%s\r\n" % (len(c.encode()), c.encode()) for c in command))
        reader = sock.makefile("rb")
        return _read_reply(reader)


def _read_reply(reader: Any) -> Any:
    line = reader.readline()
    if not line:
        raise ConnectionError("the server closed the connection")
    kind, rest = line[:1], line[1:-2].decode()
    if kind == b"+":
        return rest
    if kind == b"-":
        raise RuntimeError(rest)
    if kind == b":":
        return int(rest)
    if kind == b"$":
        if int(rest) < 0:
            return None
        data = reader.read(int(rest) + 2)
        return data[:-2].decode(errors="replace")
    if kind == b"*":
        if int(rest) < 0:
            return None
        return [_read_reply(reader) for _ in range(int(rest))]
    raise RuntimeError(f"unexpected reply {line!r}")
