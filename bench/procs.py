"""Processes under test: starting them on free loopback ports, and their CPU time and RSS from /proc.

CPU time is the sum of every thread's run time from /proc/<pid>/task/*/schedstat (nanoseconds,
so short runs are still measured precisely), over the process and its children (nginx's worker).
RSS is VmRSS from /proc/<pid>/status, summed the same way.
"""

from __future__ import annotations

import os
import resource
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 65536, hard))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            text = Path(f"/proc/{pid}/task/{tid}/children").read_text()
        except OSError:
            continue
        for child in text.split():
            out.append(int(child))
            out += _children(int(child))
    return out


def cpu_ns(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                pass
    return total


def minor_faults(pids: list[int]) -> int:
    """Minor page faults so far (a heap growing page by page shows up here, as system time)."""
    total = 0
    for pid in pids:
        try:
            total += int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])
        except (OSError, ValueError, IndexError):
            pass
    return total


def rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[Any]
    base: str
    log: Path
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def pids(self) -> list[int]:
        return [self.popen.pid, *_children(self.popen.pid)]

    def cpu_ns(self) -> int:
        return cpu_ns(self.pids)

    def rss(self) -> int:
        return rss_bytes(self.pids)

    def minor_faults(self) -> int:
        return minor_faults(self.pids)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self) -> None:
        """Stop at once: nothing a benchmark process holds needs a graceful drain. nginx gets
        SIGTERM (its fast shutdown, which also ends its worker); Python processes SIGKILL."""
        if self.popen.poll() is None:
            if self.extra.get("graceful"):
                self.popen.terminate()
            else:
                self.popen.kill()
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log.read_text()[-n:]
        except OSError:
            return ""


def wait_http(proc: Proc, path: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    url = proc.base + path
    while True:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.log_tail()}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{proc.name}: {url} did not answer within {timeout}s:\n{proc.log_tail()}")
        time.sleep(0.05)


def start(
    name: str, argv: list[str], port: int, workdir: Path, *, health: str, env: dict[str, str | None] | None = None,
    wait: bool = True, graceful: bool = False,
) -> Proc:
    """Start a process; with `wait`, return once `health` answers (else call `ready()` later).
    `env` adds to this process's environment; a None value removes that variable."""
    log = workdir / f"{name}.log"
    merged = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with log.open("w") as out:
        popen = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, preexec_fn=raise_fd_limit,
            env={k: v for k, v in merged.items() if v is not None},
        )
    proc = Proc(name, popen, f"http://127.0.0.1:{port}", log, {"health": health, "graceful": graceful})
    if wait:
        ready(proc)
    return proc


def ready(*procs: Proc, timeout: float = 60.0) -> None:
    """Wait until every process answers its health URL (they start in parallel meanwhile)."""
    try:
        for proc in procs:
            wait_http(proc, proc.extra["health"], timeout)
    except BaseException:
        for proc in procs:
            proc.stop()
        raise


def start_fake(workdir: Path, name: str = "fake", *, wait: bool = True, stock_sessions: bool = False) -> Proc:
    """The fake ADK server; it creates a run's missing session, as `--auto_create_session` does,
    unless `stock_sessions` (404, as a server without the flag)."""
    port = free_port()
    argv = [sys.executable, "-m", "bench.fake_upstream", "--port", str(port), *(["--stock-sessions"] if stock_sessions else [])]
    return start(name, argv, port, workdir, health="/list-apps", wait=wait)


def start_passthrough(workdir: Path, upstream: str, name: str = "passthrough", *, wait: bool = True) -> Proc:
    port = free_port()
    argv = [sys.executable, "-m", "bench.passthrough", "--port", str(port), "--upstream", upstream]
    return start(name, argv, port, workdir, health="/list-apps", wait=wait)


# ---- the gateway ----------------------------------------------------------------------------------

# Limits that would throttle one synthetic user sending thousands of streams; set high when the
# running gateway has them (they are per user, and the benchmark is one anonymous user).
_LIMIT_OVERRIDES = {
    "max_messages": 100_000,
    "max_streams_per_user": 100_000,
    "max_streams_total": 100_000,
    "max_chats_per_user": 10_000_000,
    "max_pending_approvals_per_chat": 10_000,
    "max_pending_approvals_per_user": 10_000,
    "rate_per_user": 10_000_000.0,
    "burst_per_user": 10_000_000,
}


def gateway_yaml(port: int, upstream: str, *, mode: str = "sse", extra: str = "", auto_create_session: bool | None = True) -> str:
    """A bench config, like tests/procs.py writes: loopback, the fake upstream, warning logs.
    `auto_create_session`: the gateway leaves new chats' sessions to the upstream (the fake
    creates them, as the recommended deployment's ADK does), where the running gateway has the
    setting; False: it creates each one first, as in front of a stock ADK server; None: the
    setting is not written (a gateway from before it)."""
    from gateway.config.agent import UpstreamConfig
    from gateway.config.schema import GatewayConfig

    text = (
        f"listen:\n  host: 127.0.0.1\n  port: {port}\n"
        f"logging:\n  level: warning\n  format: json\n"
        f"upstream:\n  url: {upstream}\n  mode: {mode}\n  max_connections: 20000\n"
    )
    if auto_create_session is not None and "auto_create_session" in UpstreamConfig.model_fields:
        text += f"  auto_create_session: {'true' if auto_create_session else 'false'}\n"
    limits = GatewayConfig.model_fields.get("limits")
    if limits is not None:
        known = getattr(limits.annotation, "model_fields", {})
        chosen = {k: v for k, v in _LIMIT_OVERRIDES.items() if k in known}
        if chosen:
            text += "limits:\n" + "".join(f"  {k}: {v}\n" for k, v in chosen.items())
    return text + extra


def start_gateway(
    workdir: Path, upstream: str, *, name: str = "gateway", mode: str = "sse", extra: str = "", wait: bool = True,
    env: dict[str, str | None] | None = None, auto_create_session: bool = True,
) -> Proc:
    port = free_port()
    path = workdir / f"{name}.yaml"
    path.write_text(gateway_yaml(port, upstream, mode=mode, extra=extra, auto_create_session=auto_create_session))
    argv = [sys.executable, "-m", "gateway", "serve", "--config", str(path)]
    return start(name, argv, port, workdir, health="/healthz", wait=wait, env=env)


# ---- nginx -------------------------------------------------------------------------------------------

NGINX_CONF = """\
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/nginx-error.log warn;
worker_rlimit_nofile 30000;
events {{ worker_connections 20000; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body;
  proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/fastcgi;
  uwsgi_temp_path {dir}/uwsgi;
  scgi_temp_path {dir}/scgi;
  map $http_upgrade $connection_upgrade {{ default upgrade; '' ''; }}
  upstream fake {{ server 127.0.0.1:{upstream_port}; keepalive 1024; }}
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    location / {{
      proxy_pass http://fake;
      proxy_http_version 1.1;
      proxy_set_header Upgrade $http_upgrade;
      proxy_set_header Connection $connection_upgrade;
      proxy_buffering off;
      proxy_read_timeout 3600s;
      proxy_send_timeout 3600s;
    }}
  }}
}}
"""


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)


def start_nginx(workdir: Path, upstream: str, name: str = "nginx", *, wait: bool = True) -> Proc:
    binary = nginx_binary()
    if binary is None:
        raise RuntimeError("nginx is not installed (make bench installs it: apt-get install -y nginx)")
    directory = workdir / name
    directory.mkdir(exist_ok=True)
    port = free_port()
    upstream_port = int(upstream.rsplit(":", 1)[1])
    conf = directory / "nginx.conf"
    conf.write_text(NGINX_CONF.format(dir=directory, port=port, upstream_port=upstream_port))
    argv = [binary, "-p", str(directory), "-c", str(conf), "-e", str(directory / "nginx-error.log")]
    return start(name, argv, port, workdir, health="/list-apps", wait=wait, graceful=True)
