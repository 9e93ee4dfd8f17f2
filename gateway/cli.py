"""The `adk-gateway` command: serve, demo, check-config, policy replay (gateway/policy_cli.py).

`demo` is the one-command path of the README: it starts the bundled demo agent in the stock ADK
API server as a child process on a free loopback port, waits until it answers, then serves the
gateway in front of it. The child is tied to the gateway's life: it is terminated on exit, Ctrl-C
and SIGTERM, and the kernel kills it should the gateway die without cleaning up (Linux). The
agent keeps its ADK sessions in a SQLite file (`--session-store`), so a restart of the agent keeps
the confirmations a person has not answered yet.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib.util
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
import yaml
from pydantic import SecretStr, ValidationError

from .config.schema import ConfigError, GatewayConfig, load_config
from .ops.logs import configure_logging
from .edge import event_loop
from .edge.server import serve
from .policy_cli import add_policy_commands

__all__ = ["main"]

EXIT_CONFIG = 2
# The plugin's own distribution (plugin/, adk-gateway-plugin); gateway.agent_plugin.GatewayPlugin
# is an alias of it for agents set up before it had one.
PLUGIN = "adk_gateway_plugin.GatewayPlugin"
DEFAULT_CONFIG = Path("config/gateway.yaml")
# The reference config of a source checkout, so `adk-gateway demo` works from any directory.
CHECKOUT_CONFIG = Path(__file__).resolve().parents[1] / "config" / "gateway.yaml"
# `adk-gateway demo --session-store`'s default, when the flag is not given.
SESSION_STORE_ENV = "DEMO_SESSION_STORE"
# The demo supervisor's approver key (config/gateway.yaml `approvers.api_keys`): `demo` sets a fixed,
# documented one when the operator set none, and only where chats need no credential either.
SUPERVISOR_KEY_ENV = "SUPERVISOR_API_KEY"
DEMO_SUPERVISOR_KEY = "demo-supervisor"


def _config_path(path: Path | None) -> Path | None:
    """The config file to use: the one given, else config/gateway.yaml here, else the checkout's."""
    if path is not None:
        return path
    for candidate in (DEFAULT_CONFIG, CHECKOUT_CONFIG):
        if candidate.exists():
            return candidate
    return None


def _load(path: Path | None) -> GatewayConfig:
    return GatewayConfig() if path is None else load_config(path)


def _with_overrides(
    config: GatewayConfig, args: argparse.Namespace, upstream: str | None = None, auto_create_session: bool = False,
) -> GatewayConfig:
    """The config with command-line overrides applied, validated like the file itself.
    `upstream`, `auto_create_session`: the demo's ADK server, for every agent."""
    data = config.model_dump()
    listen = data["listen"]
    if args.host:
        listen["host"] = args.host
    port = args.port if args.port is not None else os.environ.get("PORT")
    if port is not None:
        listen["port"] = port
    # The demo's ADK server serves every agent of the demo config; --upstream-mode is every agent's.
    for name, agent in data["agents"].items():
        if upstream:
            agent["upstream"]["url"] = upstream
            agent["upstream"]["auto_create_session"] = auto_create_session
        if args.upstream_mode:
            agent["upstream"]["mode"] = args.upstream_mode
            if not config.agents[name].upstream.approvals_explicit:
                # Left unset in the file: the new mode's default (hold on live), not sse's confirm.
                del agent["upstream"]["approvals"]
    try:
        return GatewayConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError([f"command line / $PORT: {problem}" for problem in _problems(exc)]) from None


def _problems(exc: ValidationError) -> list[str]:
    return [f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg'].removeprefix('Value error, ')}" for e in exc.errors()]


def _serve(config: GatewayConfig, path: Path | None, upstream_mode: str | None = None) -> None:
    logs = config.logging
    key = logs.user_id_key.get_secret_value() if logs.user_id_key is not None else None
    scrubber = configure_logging(logs.level, logs.format, user_ids=logs.user_id, user_id_key=key)
    scrubber.follow(lambda: config)
    try:
        loop = event_loop.choose(config.listen.event_loop)
    except ValueError as exc:
        raise ConfigError([str(exc)]) from None
    structlog.get_logger("adk_gateway").info(
        "gateway_starting", agents={name: agent.upstream_base for name, agent in config.agents.items()},
        default_agent=config.default, event_loop=loop,
    )
    event_loop.run(serve(config, path, upstream_mode, log_scrubber=scrubber), loop)


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
    port: int, *, env: dict[str, str] | None = None, extra_plugins: tuple[str, ...] = (), log_level: str = "WARNING",
    adk: Path | None = None, session_service_uri: str = "memory://", auto_create_session: bool = False,
) -> Iterator[str]:
    """Run the demo agent's ADK API server; yields its base URL once it answers.

    `adk`: another environment's ``adk`` command (default: this environment's ADK)."""
    from .demo import api_server_command

    argv = api_server_command(
        port, extra_plugins=extra_plugins, log_level=log_level, adk=adk, session_service_uri=session_service_uri,
        auto_create_session=auto_create_session,
    )
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
    path = _config_path(args.config)
    _serve(_with_overrides(_load(path), args), path, args.upstream_mode)
    return 0


def _agent_adk(venv: Path | None) -> Path | None:
    """The `adk` command of --agent-venv, checked before anything starts."""
    if venv is None:
        missing = [name for name in ("google.adk", "adk_gateway_plugin") if not _importable(name)]
        if missing:
            raise ConfigError([
                f"adk-gateway demo runs the demo agent here, which needs {' and '.join(missing)}: "
                "pip install './plugin' 'adk-gateway[demo]' (make run does), or give --agent-venv"
            ])
        return None
    adk = venv / "bin" / "adk"
    if not adk.exists():
        raise ConfigError([
            f"--agent-venv {venv}: no {adk} (make one with `python -m gateway.demo.adk_venv VERSION`, "
            "or `make run-adk ADK=VERSION`)"
        ])
    return adk.absolute()


def _state_dir() -> Path:
    """Where the demo keeps its agent's sessions: `.adk-gateway/` in a source checkout (git ignores
    it), else `$XDG_STATE_HOME/adk-gateway` (by default ~/.local/state/adk-gateway)."""
    checkout = CHECKOUT_CONFIG.parents[1]
    if (checkout / "pyproject.toml").is_file() and CHECKOUT_CONFIG.is_file():
        return checkout / ".adk-gateway"
    state_home = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state_home) / "adk-gateway"


def session_store(choice: str | None, agent_venv: Path | None = None) -> tuple[str, str]:
    """ADK's session store URI for `--session-store` (or $DEMO_SESSION_STORE), and how to say it.

    `memory`: in memory, lost when the agent restarts. `sqlite` (the default): a file in the demo's
    state folder, one per ADK environment (each release keeps its own schema). `sqlite:PATH`: that
    file. The file's folder is made here: ADK does not make it.
    """
    from .demo import MEMORY, sqlite_uri

    choice = choice or os.environ.get(SESSION_STORE_ENV) or "sqlite"
    if choice == "memory":
        return MEMORY, "in memory (an agent restart loses them)"
    if choice == "sqlite":
        name = "sessions.db" if agent_venv is None else f"sessions-{agent_venv.absolute().name.lstrip('.')}.db"
        path = _state_dir() / name
    elif choice.startswith("sqlite:") and choice.removeprefix("sqlite:"):
        path = Path(choice.removeprefix("sqlite:")).expanduser()
    else:
        raise ConfigError([f"--session-store {choice!r}: expected memory, sqlite or sqlite:PATH"])
    try:
        path.absolute().parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError([f"--session-store: cannot make the folder of {path}: {exc.strerror}"]) from None
    return sqlite_uri(path), f"in {path.absolute()}"


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package (google) is missing
        return False


def _cmd_demo(args: argparse.Namespace) -> int:
    adk = _agent_adk(args.agent_venv)
    sessions, sessions_where = session_store(args.session_store, args.agent_venv)
    # The plugin in the agent process and the gateway share this secret; a fresh one per demo run
    # unless the operator set one.
    os.environ.setdefault("ADK_GATEWAY_SECRET", secrets.token_urlsafe(24))
    # The demo is where one looks at a turn's trace: every one is kept (the gateway's own default
    # keeps one in ten); the agent's ADK, which inherits this, follows the gateway's decision.
    os.environ.setdefault("OTEL_TRACES_SAMPLER", "parentbased_always_on")
    path = _config_path(args.config)
    config = _with_demo_supervisor(path, _load(path))
    # SIGTERM becomes SystemExit so the `finally` that stops the child runs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    internal = config.internal.model_copy(
        update={"port": _free_port(), "secret": SecretStr(os.environ["ADK_GATEWAY_SECRET"])}
    )
    config = config.model_copy(update={"internal": internal, "demo": config.demo.model_copy(update={"page": True})})
    port = _free_port()
    where = f", from {args.agent_venv}" if adk is not None else ""
    print(
        f"adk-gateway demo: starting the demo agent (stock ADK API server + gateway plugin{where}) on 127.0.0.1:{port}, "
        f"its sessions {sessions_where} ...",
        file=sys.stderr,
    )
    plugin_env = {
        "ADK_GATEWAY_URL": f"http://{internal.host}:{internal.port}",
        "ADK_GATEWAY_SECRET": os.environ["ADK_GATEWAY_SECRET"],
    }
    from .demo import creates_sessions

    # An ADK that creates a run's session itself saves every new chat a round trip (1.22.1 cannot).
    auto_create = creates_sessions(adk)
    with demo_agent(
        port, env=plugin_env, extra_plugins=(PLUGIN,), adk=adk, session_service_uri=sessions, auto_create_session=auto_create,
    ) as upstream:
        config = _with_overrides(config, args, upstream=upstream, auto_create_session=auto_create)
        print(
            f"adk-gateway demo: ready on http://{config.listen.host}:{config.listen.port} "
            "(POST /api/chat). Try: 'pay 50 to Hanako', 'weather in Tokyo', 'where am I', 'hello there'.",
            file=sys.stderr,
        )
        with contextlib.suppress(KeyboardInterrupt):
            # No reload in the demo: its ports and secret are made up at start, not in the file.
            _serve(config, None)
    return 0


def _with_demo_supervisor(path: Path | None, config: GatewayConfig) -> GatewayConfig:
    """The config again with $SUPERVISOR_API_KEY set to the demo's well-known key, when it is unset
    and the gateway lets every caller chat anyway (auth.mode none, which only a loopback listener
    allows): the demo's second user, who answers large refunds on the inbox page. A gateway that
    authenticates its callers never gets a key anyone could read in the docs."""
    if config.auth.mode != "none" or os.environ.get(SUPERVISOR_KEY_ENV):
        return config
    os.environ[SUPERVISOR_KEY_ENV] = DEMO_SUPERVISOR_KEY
    print(
        f"adk-gateway demo: the supervisor signs in with the approver key {DEMO_SUPERVISOR_KEY} "
        f"(${SUPERVISOR_KEY_ENV}; Authorization: Bearer {DEMO_SUPERVISOR_KEY} on /api/approvals)",
        file=sys.stderr,
    )
    return _load(path)


def _cmd_check(args: argparse.Namespace) -> int:
    config = load_config(args.path)
    print(f"{args.path}: ok")
    for line in describe_agents(config, single_agent_keys=_single_agent_keys(args.path)):
        print(line)
    return 0


def _single_agent_keys(path: Path) -> bool:
    with contextlib.suppress(OSError, yaml.YAMLError):
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        return isinstance(raw, dict) and bool({"upstream", "tools"} & raw.keys())
    return False


def describe_agents(config: GatewayConfig, *, single_agent_keys: bool) -> list[str]:
    """What check-config says of the agents: their routes, and how single-agent keys map."""
    lines = []
    for name, agent in config.agents.items():
        default = " (default: also /api/chat)" if name == config.default else ""
        gated = ", ".join(agent.gated_tools) or "none"
        lines.append(
            f"agent {name}{default}: /agents/{name}/api/chat -> {agent.upstream_base} app {agent.upstream.app_name} "
            f"({agent.upstream.mode}, approvals {agent.upstream.approvals}); gated tools: {gated}"
        )
    if single_agent_keys:
        name = config.default
        lines.append(
            f"the top-level upstream: and tools: keys are the single agent {name!r}; the same in the agents: form "
            "(replacing those two keys):"
        )
        agent = config.agents[name].model_dump(mode="json", exclude_unset=True, include={"upstream", "tools"})
        lines += ["  " + line for line in yaml.safe_dump({"agents": {name: agent}}, sort_keys=False).splitlines()]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="adk-gateway", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, helptext in (("serve", "serve the gateway"), ("demo", "serve the gateway in front of the demo agent")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("--config", type=Path, help=f"YAML config (default: {DEFAULT_CONFIG}, or the checkout's)")
        p.add_argument("--host", help="listen address (overrides listen.host)")
        p.add_argument("--port", type=int, help="listen port (overrides listen.port and $PORT)")
        p.add_argument(
            "--upstream-mode", choices=("sse", "live"),
            help="talk to the agent over /run_sse (a run per turn) or /run_live (a session per chat)",
        )
        if name == "demo":
            p.add_argument(
                "--agent-venv", type=Path, metavar="DIR",
                help="run the demo agent with DIR/bin/adk (a venv holding google-adk and adk-gateway-plugin, "
                "e.g. from `python -m gateway.demo.adk_venv 1.22.1`) instead of this environment's ADK",
            )
            p.add_argument(
                "--session-store", metavar="STORE",
                help="where the demo agent keeps its ADK sessions: sqlite (the default: .adk-gateway/sessions.db "
                f"in a source checkout), sqlite:PATH, or memory (an agent restart loses them); default ${SESSION_STORE_ENV}",
            )
        p.set_defaults(func=_cmd_serve if name == "serve" else _cmd_demo)
    check = sub.add_parser("check-config", help="validate a config file and exit")
    check.add_argument("path", type=Path)
    check.set_defaults(func=_cmd_check)
    add_policy_commands(sub)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())
