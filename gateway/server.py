"""The gateway process: its listeners, its signals, graceful drain and configuration reload.

- SIGTERM / SIGINT: drain. `/readyz` answers 503 at once and new work is refused; responses
  still streaming get `listen.drain_timeout` to finish; then runs are cancelled (the browser gets
  a final `error` chunk, WebSockets close with 1001 "going away", waiting approvals are recorded
  as cancelled) and the process exits 0.
- SIGHUP, or `POST /internal/v1/reload` on the internal listener: reload the config file
  (reload.py decides whether the new file may run, and applies it).
"""

from __future__ import annotations

import asyncio
import gc
import signal
import time
from pathlib import Path

import structlog
from aiohttp import WSCloseCode, web

from .app import create_app
from .config import ConfigError, GatewayConfig, load_config
from .internal import create_internal_app
from .reload import reload_config
from .state import GATEWAY, Gateway

__all__ = ["drain", "serve"]

log = structlog.get_logger("adk_gateway.server")


async def drain(gateway: Gateway) -> None:
    """Stop taking work, give running responses their time, then end what is left."""
    gateway.draining = True
    gateway.cluster.draining = True
    gateway.metrics.draining.set(1)
    deadline = time.monotonic() + gateway.config.listen.drain_timeout
    log.info("draining", streams=gateway.admission.streams_total, timeout_s=gateway.config.listen.drain_timeout)
    while gateway.admission.streams_total > 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    left = gateway.admission.streams_total
    await gateway.chats.close("The gateway is shutting down; please send your message again.")
    for ws in list(gateway.sockets):
        await ws.close(code=WSCloseCode.GOING_AWAY, message=b"going away")
    log.info("drained", cut_short=left)


async def serve(config: GatewayConfig, config_path: Path | None = None) -> None:
    """Serve until SIGTERM/SIGINT, then drain and return."""
    app = create_app(config)
    gateway = app[GATEWAY]
    gateway.config_path = config_path
    if config_path is not None:
        try:
            gateway.started_from = load_config(config_path)
        except ConfigError:
            gateway.started_from = None  # the file changed since the caller read it; compare to what runs
        gateway.metrics.config_last_reload.set(time.time())
    # auto_decompress off: aiohttp would otherwise decode (or refuse in plain text) compressed
    # bodies before the handler runs; the handler answers every Content-Encoding with a JSON 415.
    runners = [web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=5, auto_decompress=False)]
    sites = [(runners[0], config.listen.host, config.listen.port)]
    if config.internal.secret is not None and config.internal.secret.get_secret_value():
        internal = web.AppRunner(create_internal_app(app), access_log=None, handle_signals=False, shutdown_timeout=5)
        runners.append(internal)
        sites.append((internal, config.internal.host, config.internal.port))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if config_path is not None:
        loop.add_signal_handler(signal.SIGHUP, reload_config, gateway, config_path)
    else:
        # SIGHUP's default would kill the process; without a file there is nothing to reload.
        loop.add_signal_handler(signal.SIGHUP, lambda: log.warning("reload_unavailable", reason="not started from a config file"))
    try:
        for runner in runners:
            await runner.setup()
        for runner, host, port in sites:
            await web.TCPSite(runner, host, port).start()
            log.info("listening", url=f"http://{host}:{port}", internal=runner is not runners[0])
        # What start-up made (modules, classes, functions, the app: ~60k objects) lives as long as
        # the process. Frozen, full collections no longer walk it: they paused every stream for
        # ~70 ms at 200 streams on a 2-core machine (docs/performance.md).
        gc.freeze()
        await stop.wait()
        await drain(gateway)
    finally:
        # The internal listener goes last: runs being cancelled still release their plugin waits.
        for runner in runners:
            await runner.cleanup()
        log.info("stopped")
