"""Runs ADK's own command line (``adk ...``) with this checkout importable.

`gateway.demo.api_server_command` starts the server as ``python <this file>
api_server ...``. Run by path, Python puts this file's folder first on
``sys.path``; we swap it for the folder that holds the ``gateway`` package, so
the demo agent and ``--extra_plugins gateway....`` import without an installed
package or a particular working directory. It also makes uvicorn's access log
follow ADK's ``--log_level`` (`quiet_access_log`).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from pathlib import Path

ACCESS_LOGGER = "uvicorn.access"


def quiet_access_log(argv: Sequence[str]) -> None:
    """Drops uvicorn's access lines when ``--log_level`` is above INFO.

    ADK's ``--log_level`` sets its own logger and the root logger, not uvicorn's: uvicorn logs
    every request at INFO whatever it says, and the gateway's health probe alone writes a
    ``GET /list-apps`` line every `health_interval` (5 s). A filter, not a level: uvicorn's
    logging config, applied after this, sets the logger's level but keeps its filters."""
    level = "INFO"
    for i, arg in enumerate(argv):
        if arg == "--log_level" and i + 1 < len(argv):
            level = argv[i + 1]
        elif arg.startswith("--log_level="):
            level = arg.split("=", 1)[1]
    threshold = logging.getLevelName(level.upper())
    if isinstance(threshold, int) and threshold > logging.INFO:
        logging.getLogger(ACCESS_LOGGER).addFilter(lambda record: record.levelno >= threshold)


def main() -> None:
    """Fixes ``sys.path`` and hands the command line to ADK's click entry point."""
    package_root = str(Path(__file__).resolve().parents[2])
    # Dropping this folder also keeps demo/model.py from shadowing a top-level "model".
    sys.path[:] = [package_root] + [p for p in sys.path[1:] if p != package_root]
    quiet_access_log(sys.argv[1:])

    from google.adk.cli.cli_tools_click import main as adk_main

    adk_main(prog_name="adk")


if __name__ == "__main__":
    main()
