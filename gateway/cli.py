"""The `adk-gateway` command: serve, demo, check-config.

`demo` is the one-command path of the README: it starts the bundled demo agent in the stock ADK
API server as a child process on a free loopback port, waits until it answers, then serves the
gateway in front of it. The child is tied to the gateway's life: it is terminated on exit, Ctrl-C
and SIGTERM, and the kernel kills it should the gateway die without cleaning up (Linux).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import structlog

from .app import serve
from pydantic import SecretStr

from .config import ConfigError, GatewayConfig, load_config
from .logs import configure_logging

__all__ = ["main"]

EXIT_CONFIG = 2
PLUGIN = "gateway.agent_plugin.GatewayPlugin"
DEFAULT_CONFIG = Path("config/gateway.yaml")


def _load(path: Path | None) -> GatewayConfig:
    if path is None:
        path = DEFAULT_CONFIG if DEFAULT_CONFIG.exists() else None
    if path is None:
        return GatewayConfig()
    return load_config(path)


def _with_overrides(config: GatewayConfig, args: argparse.Namespace, upstream: str | None = None) -> GatewayConfig:
    listen = config.listen
    if args.host:
        listen = listen.model_copy(update={"host": args.host})
    port = args.port if args.port is not None else os.environ.get("PORT")
    if port is not None:
        listen = listen.model_copy(update={"port": int(port)})
    update: dict[str, object] = {"listen": listen}
    upstream_update: dict[str, object] = {}
    if upstream:
        upstream_update["url"] = upstream
    if args.upstream_mode:
        upstream_update["mode"] = args.upstream_mode
    if upstream_update:
        update["upstream"] = config.upstream.model_copy(update=upstream_update)
    return config.model_copy(update=update)


def _serve(config: GatewayConfig) -> None:
    configure_logging(config.logging.level, config.logging.format)
    structlog.get_logger("adk_gateway").info("gateway_starting", upstream=config.upstream_base)
    asyncio.run(serve(config))


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    # PR_SET_PDEATHSIG: the kernel sends SIGTERM to the child if the gateway dies abruptly.
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


@contextlib.contextmanager
def demo_agent(
    port: int, *, env: dict[str, str] | None = None, extra_plugins: tuple[str, ...] = (), log_level: str = "WARNING"
) -> Iterator[str]:
    """Run the demo agent's ADK API server; yields its base URL once it answers."""
    from .demo import api_server_command

    argv = api_server_command(port, extra_plugins=extra_plugins, log_level=log_level)
    child = subprocess.Popen(
        argv, env={**os.environ, **(env or {})}, preexec_fn=_die_with_parent if sys.platform == "linux" else None
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if child.poll() is not None:
                raise SystemExit(f"the demo agent exited with code {child.returncode} before it was ready")
            try:
                with urllib.request.urlopen(f"{base}/list-apps", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the demo agent did not become ready within 120 s")
            time.sleep(0.2)
        yield base
    finally:
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def _cmd_serve(args: argparse.Namespace) -> int:
    _serve(_with_overrides(_load(args.config), args))
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    # The plugin in the agent process and the gateway share this secret; a fresh one per demo run
    # unless the operator set one.
    os.environ.setdefault("ADK_GATEWAY_SECRET", secrets.token_urlsafe(24))
    config = _load(args.config)
    # SIGTERM becomes SystemExit so the `finally` that stops the child runs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    internal = config.internal.model_copy(
        update={"port": _free_port(), "secret": SecretStr(os.environ["ADK_GATEWAY_SECRET"])}
    )
    config = config.model_copy(update={"internal": internal})
    port = _free_port()
    print(f"adk-gateway demo: starting the demo agent (stock ADK API server + gateway plugin) on 127.0.0.1:{port} ...", file=sys.stderr)
    plugin_env = {
        "ADK_GATEWAY_URL": f"http://{internal.host}:{internal.port}",
        "ADK_GATEWAY_SECRET": os.environ["ADK_GATEWAY_SECRET"],
    }
    with demo_agent(port, env=plugin_env, extra_plugins=(PLUGIN,)) as upstream:
        config = _with_overrides(config, args, upstream=upstream)
        print(
            f"adk-gateway demo: ready on http://{config.listen.host}:{config.listen.port} "
            "(POST /api/chat). Try: 'pay 50 to Hanako', 'weather in Tokyo', 'where am I', 'hello there'.",
            file=sys.stderr,
        )
        with contextlib.suppress(KeyboardInterrupt):
            _serve(config)
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    load_config(args.path)
    print(f"{args.path}: ok")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="adk-gateway", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, helptext in (("serve", "serve the gateway"), ("demo", "serve the gateway in front of the demo agent")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("--config", type=Path, help=f"YAML config (default: {DEFAULT_CONFIG} if present)")
        p.add_argument("--host", help="listen address (overrides listen.host)")
        p.add_argument("--port", type=int, help="listen port (overrides listen.port and $PORT)")
        p.add_argument(
            "--upstream-mode", choices=("sse", "live"),
            help="talk to the agent over /run_sse (a run per turn) or /run_live (a session per chat)",
        )
        p.set_defaults(func=_cmd_serve if name == "serve" else _cmd_demo)
    check = sub.add_parser("check-config", help="validate a config file and exit")
    check.add_argument("path", type=Path)
    check.set_defaults(func=_cmd_check)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())
