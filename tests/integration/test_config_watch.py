"""The config watcher in a real gateway process: a ConfigMap-style symlink swap reloads it without a
SIGHUP, a bad file is refused once and the old config kept, and SIGTERM still stops it promptly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.ops.stack import wait_until
from tests.procs import ROOT, free_port, metric_value, request, stop_process, wait_http

pytestmark = pytest.mark.integration

CONFIG = """\
listen:
  host: 127.0.0.1
  port: {port}
logging:
  level: debug
  format: json
reload:
  watch_interval: 100ms
upstream:
  url: http://127.0.0.1:9
limits:
  max_messages: {max_messages}
"""


def _version(volume: Path, name: str, text: str) -> None:
    """What the kubelet does on a ConfigMap update: a new directory, `..data` swapped to it."""
    (volume / name).mkdir()
    (volume / name / "gateway.yaml").write_text(text)
    (volume / "..data_tmp").symlink_to(name)
    os.replace(volume / "..data_tmp", volume / "..data")


def test_a_configmap_update_reloads_the_running_gateway_without_a_sighup(tmp_path: Path) -> None:
    port = free_port()
    volume = tmp_path / "config"
    volume.mkdir()
    _version(volume, "..v1", CONFIG.format(port=port, max_messages=50))
    (volume / "gateway.yaml").symlink_to("..data/gateway.yaml")
    log = tmp_path / "gateway.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config", str(volume / "gateway.yaml")],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{base}/healthz", timeout=30, proc=proc, log=log)

        def reloads(result: str) -> float:
            return metric_value(base, "adk_gateway_config_reloads_total", {"result": result})

        _version(volume, "..v2", CONFIG.format(port=port, max_messages=1))
        wait_until(lambda: reloads("success") == 1, "the reload after the ConfigMap update")
        two = request(base, "POST", "/api/chat", {"id": "c1", "messages": [
            {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "a"}]},
            {"id": "m2", "role": "user", "parts": [{"type": "text", "text": "b"}]},
        ]})
        assert two.status == 413, two.body  # limits.max_messages: 1 applies

        _version(volume, "..v3", CONFIG.format(port=port, max_messages="lots"))
        wait_until(lambda: reloads("failure") == 1, "the refusal of the bad update")
        time.sleep(1.0)  # ten more looks at the same bad content
        assert reloads("failure") == 1 and reloads("success") == 1
        refused = [line for line in log.read_text().splitlines() if '"config_reload_failed"' in line]
        assert len(refused) == 1 and "max_messages" in refused[0], refused

        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert time.monotonic() - began < 10
    finally:
        stop_process(proc)
