"""What the two recorders of ADK's answers share (tests/fixtures/adk/record.py, `/run_sse`;
tests/fixtures/adk_live/record.py, `/run_live`): which ADK they record and the plugin inside it,
the stock ADK API server started offline on a free port and awaited, the stand-in for the
gateway's internal listener that the plugin asks (FakeGateway, on loopback), and the file that
says which google-adk answered. Scripts, not tests: they run from the project venv."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
from aiohttp import web

from gateway.demo import APP_NAME, api_server_command
from gateway.demo.adk_venv import ensure as ensure_adk_venv
from tests.procs import free_port
from tests.support.fake_gateway import FakeGateway

# The plugin as this checkout's venv names it, and as an operator's agent venv (the plugin
# distribution only, no gateway package) does.
PLUGIN = "gateway.agent_plugin.GatewayPlugin"
DISTRIBUTED_PLUGIN = "adk_gateway_plugin.GatewayPlugin"
VERSION_FILE = "adk_version.json"


def recorded_adk(adk_version: str | None) -> tuple[Path | None, str]:
    """The `adk` command of `.venv-adk-VERSION` (built or reused, the plugin distribution installed as
    an operator does) and its plugin; without a version, the project venv's (None) and this checkout's."""
    if not adk_version:
        return None, PLUGIN
    return ensure_adk_venv(adk_version) / "bin" / "adk", DISTRIBUTED_PLUGIN


def offline_env() -> dict[str, str]:
    """This process's environment for an ADK server on the demo's scripted model: recordings must not
    depend on whether the recording machine has a Gemini key, nor on the demo's own switches."""
    hidden = ("GOOGLE_API_KEY", "GEMINI_API_KEY", "DEMO_CHUNK_DELAY", "DEMO_NATIVE_CONFIRMATION")
    return {**{k: v for k, v in os.environ.items() if k not in hidden}, "DEMO_MODEL": "scripted"}


def write_adk_version(out: Path, adk_version: str | None) -> None:
    """Which google-adk answered (tests/scenarios/test_recordings.py checks it is supported):
    `--adk`'s (adk_venv.ensure checked the venv holds it), else this venv's, whose `adk` command
    api_server_command runs."""
    version = adk_version or importlib.metadata.version("google-adk")
    (out / VERSION_FILE).write_text(json.dumps({"google-adk": version}) + "\n")


async def wait_ready(http: aiohttp.ClientSession, base: str, server: subprocess.Popen[bytes], timeout: float) -> float:
    """Seconds until the ADK server at `base` lists the demo app; fails if it exits or takes `timeout`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if server.poll() is not None:
            raise RuntimeError(f"ADK API server exited with {server.returncode}")
        try:
            async with http.get(f"{base}/list-apps") as response:
                if response.status == 200 and APP_NAME in await response.json():
                    return time.monotonic() - started
        except aiohttp.ClientConnectionError:
            pass
        await asyncio.sleep(0.05)
    raise TimeoutError(f"ADK API server not ready after {timeout}s")


@asynccontextmanager
async def api_server(
    adk: Path | None, env: dict[str, str], plugins: tuple[str, ...] = (), *,
    cwd: Path | None = None, ready_timeout: float = 60.0, stop_timeout: float = 10.0,
) -> AsyncIterator[tuple[aiohttp.ClientSession, str]]:
    """The stock ADK API server on a free port, and a client session to it. Its output (access log,
    tracebacks) goes to a log file, so the recorder's summary stays readable; it runs in `cwd`, or in
    a scratch directory so that nothing lands in the checkout. Stopped with SIGTERM, killed after
    `stop_timeout`."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    workdir = Path(tempfile.mkdtemp(prefix="adk-record-"))
    log_path = workdir / "adk.log"
    with log_path.open("wb") as log_file:
        server = subprocess.Popen(
            api_server_command(port, extra_plugins=plugins, adk=adk), env=env, cwd=cwd or workdir,
            stdout=log_file, stderr=subprocess.STDOUT,
        )
    print(f"ADK API server log: {log_path}")
    try:
        async with aiohttp.ClientSession() as http:
            ready = await wait_ready(http, base, server, ready_timeout)
            print(f"ADK API server ready after {ready:.2f}s on port {port}")
            yield http, base
    finally:
        server.terminate()
        try:
            server.wait(timeout=stop_timeout)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@asynccontextmanager
async def internal_listener(gateway: FakeGateway) -> AsyncIterator[str]:
    """`gateway` served on a free loopback port: its URL, the plugin's `ADK_GATEWAY_URL`."""
    runner = web.AppRunner(gateway.app())
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
