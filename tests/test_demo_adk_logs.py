"""What the demo's ADK API server writes to the terminal `make run` runs in: its own warnings, not
a line per request (uvicorn's access log), which the gateway's health probe alone would make one
of every 5 s. The real server, started as the demo starts it (gateway.demo.api_server_command)."""

from __future__ import annotations

import urllib.request
from pathlib import Path

from tests.procs import AdkServer


def test_the_demo_adk_server_logs_no_access_lines_at_its_warning_level(tmp_path: Path) -> None:
    server = AdkServer(tmp_path)
    server.start()  # waits for GET /list-apps to answer, as the gateway's probe asks it
    try:
        for _ in range(3):
            with urllib.request.urlopen(f"{server.base}/list-apps", timeout=10) as response:
                assert response.status == 200
    finally:
        server.stop()
    log = server.log.read_text()
    assert "Uvicorn running on" in log, log  # uvicorn's own lines reach this log: the check below can fail
    assert "GET /list-apps" not in log, log
