"""Runs ADK's own command line (``adk ...``) with this checkout importable.

`gateway.demo.api_server_command` starts the server as ``python <this file>
api_server ...``. Run by path, Python puts this file's folder first on
``sys.path``; we swap it for the folder that holds the ``gateway`` package, so
the demo agent and ``--extra_plugins gateway....`` import without an installed
package or a particular working directory.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main() -> None:
    """Fixes ``sys.path`` and hands the command line to ADK's click entry point."""
    package_root = str(Path(__file__).resolve().parents[2])
    # Dropping this folder also keeps demo/model.py from shadowing a top-level "model".
    sys.path[:] = [package_root] + [p for p in sys.path[1:] if p != package_root]

    from google.adk.cli.cli_tools_click import main as adk_main

    adk_main(prog_name="adk")


if __name__ == "__main__":
    main()
