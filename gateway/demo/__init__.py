"""The bundled demo agent and how to serve it with the stock ADK API server.

This package owns the offline scripted model (`gateway.demo.model`, playing the
script of `gateway.demo.script`), the demo tools (`gateway.demo.tools`), the ADK
app folder under `AGENTS_DIR`, and the command line that starts ``adk api_server``
on it. Nothing here runs in the gateway's request path: the gateway talks to the
started server over HTTP.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

__all__ = ["AGENTS_DIR", "APP_NAME", "MEMORY", "api_server_command", "creates_sessions", "sqlite_uri"]

AGENTS_DIR: Path = Path(__file__).resolve().parent / "agents"
APP_NAME = "demo_agent"

_LAUNCHER = Path(__file__).resolve().parent / "_adk_cli.py"
# ADK's in-memory session store: a restart of the server loses every session, and with them any
# confirmation a person has not answered yet.
MEMORY = "memory://"


def sqlite_uri(path: Path) -> str:
    """ADK's session store URI for a SQLite file: ``sqlite:////abs/path`` for an absolute path.

    ADK (1.22.1, 1.39.1 and 2.13 alike) takes the URL's path and strips its first slash, so an
    absolute path needs four; its SqliteSessionService (aiosqlite, installed with google-adk) does
    not create the file's folder.
    """
    return f"sqlite:///{path.absolute()}"


def api_server_command(
    port: int,
    host: str = "127.0.0.1",
    extra_plugins: Sequence[str] = (),
    log_level: str = "WARNING",
    adk: str | Path | None = None,
    session_service_uri: str = MEMORY,
    auto_create_session: bool = False,
    agents_dir: Path = AGENTS_DIR,
) -> list[str]:
    """The argv that starts the stock ADK API server on `agents_dir` (the demo's, `AGENTS_DIR`,
    unless told).

    Sessions live where `session_service_uri` says (in memory unless told, e.g.
    `sqlite_uri(path)`; never under the agents folder, where ADK 2.x would put
    them by default), artifacts in memory; auto-reload and the web UI are off. Each entry of `extra_plugins`
    is a dotted ``module.Class`` or ``module.instance`` path; ADK 2.13 takes one
    per ``--extra_plugins`` flag (it does not split on commas, whatever its help
    says) and only logs an error when one fails to import.

    The argv runs ADK's own click CLI through a small launcher so that the
    ``gateway`` package (the demo model, and any gateway plugin) is importable
    whatever the child's working directory is.

    `adk` runs another environment's ``adk`` command instead (e.g. the
    ``bin/adk`` of a venv made by `gateway.demo.adk_venv` on an older ADK):
    the stock command, as an operator runs it. The demo agent then imports its
    own modules from this checkout (see agents/demo_agent/agent.py); they
    need google-adk only, never the gateway daemon's dependencies.

    `auto_create_session`: the server creates a run's session when it does not
    exist (``--auto_create_session``; see `creates_sessions` for whether an
    ADK has the flag), so the gateway need not create it first
    (`upstream.auto_create_session`).
    """
    launcher = [str(adk)] if adk is not None else [sys.executable, str(_LAUNCHER)]
    argv = [
        *launcher,
        "api_server",
        "--host",
        host,
        "--port",
        str(port),
        "--session_service_uri",
        session_service_uri,
        "--artifact_service_uri",
        "memory://",
        "--no-reload",
        "--log_level",
        log_level,
    ]
    if auto_create_session:
        argv.append("--auto_create_session")
    for plugin in extra_plugins:
        argv += ["--extra_plugins", plugin]
    argv.append(str(agents_dir))
    return argv


def creates_sessions(adk: str | Path | None = None) -> bool:
    """Whether the ADK that `api_server_command` would run has ``--auto_create_session`` (1.39.1
    and 2.13 do, 1.22.1 does not): its CLI's source names the flag. `adk`: another environment's
    ``adk`` command (its venv's site-packages are read), None: this environment's ADK."""
    if adk is None:
        # Located, not imported: the gateway's process never imports google-adk.
        try:
            sources = [Path(str(metadata.distribution("google-adk").locate_file("google/adk/cli/cli_tools_click.py")))]
        except metadata.PackageNotFoundError:
            return False
    else:
        venv = Path(adk).absolute().parent.parent
        sources = list(venv.glob("lib/python*/site-packages/google/adk/cli/cli_tools_click.py"))
    return any(source.is_file() and "--auto_create_session" in source.read_text(encoding="utf-8", errors="replace") for source in sources)
