"""The gateway process: its listeners, its signals, graceful drain and a bounded stop.

- SIGTERM / SIGINT: drain. `/readyz` answers 503 at once and new work is refused; responses
  still streaming, here or relayed to another replica's browser, get `listen.drain_timeout` to
  finish; then runs are cancelled (the browser gets a final `error` chunk, WebSockets close with
  1001 "going away", waiting approvals are recorded as cancelled) and the process exits 0. The
  whole stop is bounded: each step after the drain's wait has its own limit, and past
  `drain_timeout` + STOP_GRACE (+2 s) a watchdog thread ends the process (exit 1) whatever its
  tasks do.
- SIGHUP, or `POST /internal/v1/reload` on the internal listener: reload the config file
  (edge/reload.py decides whether the new file may run, and applies it). With `reload.watch` on,
  a change of the file's content does the same (edge/config_watch.py).

Both listeners hold each request's head (request line and headers) to `listen.header_timeout`:
aiohttp has no such bound, so a client trickling header lines held a connection indefinitely.
"""

from __future__ import annotations

import asyncio
import faulthandler
import gc
import os
import signal
import sys
import threading
import time
from pathlib import Path

import structlog
from aiohttp import WSCloseCode, web

from .app import create_app
from ..access.auth import warn_token_in_url
from ..config.schema import ConfigError, GatewayConfig, load_config
from .internal import create_internal_app
from ..ops.logs import LogScrubber
from .config_watch import ConfigWatcher
from .reload import reload_config, warn_previous_secret
from .state import GATEWAY, Gateway
from ..ops.stopping import within
from .aiohttp_raw import GuardedAppRunner, HeadGuard

__all__ = ["STOP_GRACE", "StopWatchdog", "drain", "listeners", "serve", "stop_listeners"]

_GC_YOUNG_THRESHOLD = 10_000

log = structlog.get_logger("adk_gateway.edge.server")


# Once the drain's own time is up, how long the rest of the stop may take (ending runs, letting
# relays write their ends, closing sockets, the listeners, Redis) before the process exits anyway.
STOP_GRACE = 10.0
# Each step of that rest gets at most this much, so one stuck step leaves time for the others.
_STEP = 3.0
_SHUTDOWN_REASON = "The gateway is shutting down; please send your message again."
# How often the drain looks whether responses are still streaming: short beside any drain_timeout.
_DRAIN_POLL = 0.05
# aiohttp's wait for handlers of open connections when a listener is cleaned up (its default is
# 60 s). The drain has already ended every response, so what is left is idle keep-alives.
_LISTENER_SHUTDOWN = 5.0


async def drain(gateway: Gateway) -> None:
    """Stop taking work, give running responses their time, then end what is left.

    Responses count wherever their browser reads them: a local stream, or a relay that another
    replica streams to its browser (docs/scaling.md). Every step after the wait is bounded.
    """
    gateway.draining = True
    gateway.cluster.draining = True
    gateway.metrics.draining.set(1)
    timeout = gateway.config.listen.drain_timeout
    deadline = time.monotonic() + timeout
    log.info("draining", streams=gateway.admission.streams_total, relayed=gateway.cluster.relays_active, timeout_s=timeout)
    while _in_flight(gateway) and time.monotonic() < deadline:
        await asyncio.sleep(_DRAIN_POLL)
    local, relayed = gateway.admission.streams_total, gateway.cluster.relays_active
    # Ending the runs ends their responses (an error chunk); the relays then write their ends, so
    # a browser reading through another replica gets that one terminal sequence and no more.
    await within(gateway.chats.close(_SHUTDOWN_REASON), _STEP, what="runs")
    await within(gateway.cluster.end_relays(), _STEP, what="relays")
    await within(_close_sockets(gateway), _STEP, what="websockets")
    log.info("drained", cut_short=local + relayed, relayed_cut_short=relayed)


def _in_flight(gateway: Gateway) -> bool:
    return gateway.admission.streams_total > 0 or gateway.cluster.relays_active > 0


async def _close_sockets(gateway: Gateway) -> None:
    await asyncio.gather(
        *(ws.close(code=WSCloseCode.GOING_AWAY, message=b"going away") for ws in list(gateway.sockets)),
        return_exceptions=True,
    )


class StopWatchdog:
    """Ends the process when a stop overruns its bound, whatever its tasks do.

    A thread, not a loop timer: the event loop may be the thing that is stuck. Exiting with
    os._exit releases the ports at once and lets the Redis heartbeat lapse, so a restart binds
    and the other replicas take the chats over.
    """

    def __init__(self, seconds: float, *, exit_code: int = 1) -> None:
        self._timer = threading.Timer(seconds, self._expire, args=(seconds, exit_code))
        self._timer.daemon = True

    def start(self) -> None:
        self._timer.start()

    @staticmethod
    def _expire(seconds: float, exit_code: int) -> None:
        log.error("stop_forced", reason=f"the stop took longer than {seconds:g}s; exiting without finishing it")
        faulthandler.dump_traceback(all_threads=True)
        sys.stderr.flush()
        os._exit(exit_code)


async def stop_listeners(runners: list[web.AppRunner], deadline: float) -> None:
    """Clean up each runner in order, each within what is left of the bound."""
    loop = asyncio.get_running_loop()
    for runner in runners:
        await within(runner.cleanup(), max(deadline - loop.time(), 0.5), what="listener")


def listeners(app: web.Application, config: GatewayConfig) -> list[tuple[web.AppRunner, str, int]]:
    """The runners to serve, each with its host and port: the public listener, then the internal
    one when it runs (with internal.secret set, or to serve the metrics). Both bound the time a
    request's head may take (`listen.header_timeout`)."""
    metrics = app[GATEWAY].metrics

    def guard(listener: str) -> HeadGuard:
        def timed_out() -> None:
            metrics.limited.labels("header_timeout").inc()
            log.info("header_timeout", listener=listener, timeout_s=config.listen.header_timeout)

        return HeadGuard(config.listen.header_timeout, timed_out, app[GATEWAY].timers)

    # auto_decompress off: aiohttp would otherwise decode (or refuse in plain text) compressed
    # bodies before the handler runs; the handler answers every Content-Encoding with a JSON 415.
    public = GuardedAppRunner(
        app, guard=guard("public"), access_log=None, handle_signals=False, shutdown_timeout=_LISTENER_SHUTDOWN,
        auto_decompress=False,
    )
    sites = [(public, config.listen.host, config.listen.port)]
    has_secret = config.internal.secret is not None and bool(config.internal.secret.get_secret_value())
    if has_secret or (config.metrics.enabled and config.metrics.listener == "internal"):
        internal = GuardedAppRunner(
            create_internal_app(app), guard=guard("internal"), access_log=None, handle_signals=False,
            shutdown_timeout=_LISTENER_SHUTDOWN,
        )
        sites.append((internal, config.internal.host, config.internal.port))
    return sites


def _handle_signals(
    loop: asyncio.AbstractEventLoop, gateway: Gateway, config_path: Path | None, stop: asyncio.Event,
) -> ConfigWatcher | None:
    """SIGINT and SIGTERM set `stop`; SIGHUP reloads the file, and so does a change of its content
    (the watcher returned, started by the caller once serving) when `reload.watch` is on."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if config_path is None:
        # SIGHUP's default would kill the process; without a file there is nothing to reload.
        loop.add_signal_handler(signal.SIGHUP, lambda: log.warning("reload_unavailable", reason="not started from a config file"))
        return None
    loop.add_signal_handler(signal.SIGHUP, reload_config, gateway, config_path)
    watcher = ConfigWatcher(
        config_path, config=lambda: gateway.config, seen=lambda: gateway.config_seen,
        reload=lambda: reload_config(gateway, config_path),
    )
    gateway.config_seen = watcher.digest()
    return watcher


async def serve(
    config: GatewayConfig, config_path: Path | None = None, upstream_mode: str | None = None,
    *, log_scrubber: LogScrubber | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT, then drain and return. `upstream_mode` (`--upstream-mode`)
    stays applied on reloads; `log_scrubber` then masks the secrets of the config that runs."""
    app = create_app(config)
    gateway = app[GATEWAY]
    if log_scrubber is not None:
        log_scrubber.follow(lambda: gateway.config)
    warn_token_in_url(config.auth)
    warn_previous_secret(config.internal)
    gateway.config_path = config_path
    gateway.upstream_mode = upstream_mode
    if config_path is not None:
        try:
            gateway.started_from = load_config(config_path)
        except ConfigError:
            gateway.started_from = None  # the file changed since the caller read it; compare to what runs
        gateway.metrics.config_last_reload.set(time.time())
    sites = listeners(app, config)
    runners = [runner for runner, _, _ in sites]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    watcher = _handle_signals(loop, gateway, config_path, stop)
    stop_by: float | None = None  # set once a stop begins: when it must be over
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
        # A young collection every 10,000 net allocations instead of 700: a turn's objects (its
        # run, turn, converter, tasks, parsed events) then mostly die before any collection sees
        # them, instead of being promoted and making full collections walk every idle chat. Bench
        # (bench.variants, 50 browsers, interleaved): new-chat turns 710 -> 495 us of CPU, warm
        # turns 509 -> 410, tool-heavy turns of 303 events 9.6 -> 7.9 us an event, long streams
        # 5.2 -> 5.0; collections still run, each at most ~10,000 young objects.
        gc.set_threshold(_GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
        if watcher is not None:
            watcher.start()
        await stop.wait()
        if watcher is not None:
            await watcher.stop()  # no reload starts during the drain
        bound = config.listen.drain_timeout + STOP_GRACE
        StopWatchdog(bound + 2.0).start()  # the backstop, should the bounded steps themselves hang
        stop_by = loop.time() + bound
        await drain(gateway)
    finally:
        if watcher is not None:
            await watcher.stop()  # bounded; already stopped unless the start failed
        # The internal listener goes last: runs being cancelled still release their plugin waits.
        await stop_listeners(runners, stop_by if stop_by is not None else loop.time() + STOP_GRACE)
        log.info("stopped")
