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
from pathlib import Path

__all__ = ["AGENTS_DIR", "APP_NAME", "api_server_command"]

AGENTS_DIR: Path = Path(__file__).resolve().parent / "agents"
APP_NAME = "demo_agent"

_LAUNCHER = Path(__file__).resolve().parent / "_adk_cli.py"


def api_server_command(
    port: int,
    host: str = "127.0.0.1",
    extra_plugins: Sequence[str] = (),
    log_level: str = "WARNING",
    adk: str | Path | None = None,
) -> list[str]:
    """The argv that starts the stock ADK API server on `AGENTS_DIR`.

    Sessions and artifacts live in memory (nothing is written under the agents
    folder), auto-reload and the web UI are off. Each entry of `extra_plugins`
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
        "memory://",
        "--artifact_service_uri",
        "memory://",
        "--no-reload",
        "--log_level",
        log_level,
    ]
    for plugin in extra_plugins:
        argv += ["--extra_plugins", plugin]
    argv.append(str(AGENTS_DIR))
    return argv
