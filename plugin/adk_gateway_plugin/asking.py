"""The plugin's blocking path: asking the gateway about a gated call, and asking again when no
replica decided.

One decision request (`POST /internal/v1/tool-calls`) is held by the gateway until a person, the
browser or a deadline decides. With several replicas behind a balancer the replica holding it may
stop first: a replica that drains hands it back (503 `retry_elsewhere`, the chat runs on another
replica), a killed one cuts the connection, a balancer with no replica left answers 502/503/504.
None of these decided anything, so the same call (same function_call_id and invocation) is asked
again through ADK_GATEWAY_URL on a new connection, after a pause that doubles from `RETRY_FIRST`
to `RETRY_CAP` (longer if the gateway's Retry-After says so, within the cap), for up to ADK_GATEWAY_RETRY_FOR
seconds and never past ADK_GATEWAY_MAX_WAIT. The replica running the chat takes the repeated ask
as the call it already shows, and answers a call it already released with the same verdict.

Fails closed: when the retries run out the call is refused (`NoVerdict`), as a request that failed
outright always was; nothing here raises but cancellation.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

__all__ = ["RETRY_CAP", "RETRY_FIRST", "NoVerdict", "Send", "ask"]

logger = logging.getLogger("adk_gateway.plugin")

RETRY_FIRST = 0.25
RETRY_CAP = 2.0
# A failed attempt that lasted this long had reached a replica that held the call (a person was
# being asked): its failure opens a new retry window instead of using up what is left of an old one.
HELD = 10.0
# A balancer's "no replica answered" and a replica's "ask elsewhere": nothing was decided.
RETRY_STATUSES = frozenset({502, 503, 504})

# Sends the decision request through the client given (None: the plugin's shared one).
Send = Callable[[httpx.AsyncClient | None], Awaitable[httpx.Response]]


@dataclass(frozen=True)
class NoVerdict:
    """No verdict came: the call is refused with this text and refusal code (docs/approvals.md)."""

    text: str
    code: str


async def ask(
    send: Send, *, tool: str, call_id: str, max_wait: float, retry_for: float, connect_timeout: float,
) -> dict[str, Any] | NoVerdict:
    """The gateway's answer to the decision request `send` makes (its JSON object; {} if it is
    none), or why there is none."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    window_ends: float | None = None
    pause = RETRY_FIRST
    retry: httpx.AsyncClient | None = None
    try:
        while True:
            attempted = loop.time()
            wait: float | None = None
            try:
                resp = await asyncio.wait_for(send(retry), timeout=max(started + max_wait - attempted, 0.0))
            except httpx.HTTPError as exc:
                # Could not connect (a connect timeout too), or the connection closed while waiting.
                logger.warning("gateway unreachable while deciding %s: %r", tool, exc)
                failed = NoVerdict("The approval gateway went away before anyone decided; the call was not run.",
                                   "gateway_unreachable")
            except asyncio.TimeoutError:  # noqa: UP041 - not the builtin TimeoutError before Python 3.11 (ADK 1.x runs on 3.10)
                logger.warning("no decision on %s within ADK_GATEWAY_MAX_WAIT (%s s)", tool, max_wait)
                return NoVerdict(
                    f"Nobody decided within the plugin's longest wait (ADK_GATEWAY_MAX_WAIT, {max_wait:g} s); "
                    "the call was not run.",
                    "max_wait",
                )
            else:
                if resp.status_code == 200:
                    return _json_object(resp)
                failed = NoVerdict(f"The approval gateway refused to decide (HTTP {resp.status_code}); the call was not run.",
                                   "gateway_refused")
                if resp.status_code not in RETRY_STATUSES:
                    logger.warning("gateway refused the decision request: HTTP %s", resp.status_code)
                    return failed
                logger.info("no gateway replica decided %s: HTTP %s", tool, resp.status_code)
                wait = _retry_after(resp)
            now = loop.time()
            if window_ends is None or now - attempted >= HELD:
                window_ends = now + retry_for
            # The gateway's Retry-After may lengthen the pause, never shorten it.
            delay = min(max(wait or 0.0, pause), RETRY_CAP)
            if now + delay > min(window_ends, started + max_wait):
                if retry_for > 0:
                    logger.warning("no gateway replica decided %s within ADK_GATEWAY_RETRY_FOR (%g s) of asking "
                                   "again; refusing the call", tool, retry_for)
                else:
                    logger.warning("no gateway replica decided %s; refusing the call", tool)
                return failed
            logger.info("asking the gateway again about %s (call %s) in %.2g s", tool, call_id, delay)
            await asyncio.sleep(delay)
            pause = min(pause * 2, RETRY_CAP)
            if retry is None:
                # A new connection for every retry: a balancer keeps a connection on the replica it
                # chose, which may be the one that is stopping.
                retry = httpx.AsyncClient(
                    timeout=httpx.Timeout(None, connect=connect_timeout),
                    limits=httpx.Limits(max_connections=None, max_keepalive_connections=0),
                    trust_env=False,
                )
    finally:
        if retry is not None:
            await retry.aclose()


def _retry_after(resp: httpx.Response) -> float | None:
    """The gateway's Retry-After in seconds (it sends whole seconds), if it sent one."""
    value = resp.headers.get("Retry-After", "")
    return float(value) if value.isascii() and value.isdigit() else None


def _json_object(resp: httpx.Response) -> dict[str, Any]:
    try:
        verdict = resp.json()
    except ValueError:
        return {}  # not JSON: answered as unexpected
    return verdict if isinstance(verdict, dict) else {}
