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

__all__ = ["RETRY_CAP", "RETRY_FIRST", "NoVerdict", "Retries", "Send", "ask"]

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


@dataclass(frozen=True)
class _Undecided:
    """An attempt no replica decided: asked again, or refused with `refusal` once retries run out."""

    refusal: NoVerdict
    # The gateway's Retry-After, in seconds, if it said one.
    retry_after: float | None = None


@dataclass
class Retries:
    """When to ask again (sans-IO: the caller gives the times)."""

    started: float
    max_wait: float
    retry_for: float
    pause: float = RETRY_FIRST
    window_ends: float | None = None

    def time_left(self, now: float) -> float:
        return max(self.started + self.max_wait - now, 0.0)

    def next_pause(self, attempted: float, now: float, retry_after: float | None) -> float | None:
        """How long to wait before asking again after an attempt started at `attempted` failed at
        `now`; None when the retries have run out."""
        if self.window_ends is None or now - attempted >= HELD:
            self.window_ends = now + self.retry_for
        # The gateway's Retry-After may lengthen the pause, never shorten it.
        delay = min(max(retry_after or 0.0, self.pause), RETRY_CAP)
        if now + delay > min(self.window_ends, self.started + self.max_wait):
            return None
        self.pause = min(self.pause * 2, RETRY_CAP)
        return delay


async def ask(
    send: Send, *, tool: str, call_id: str, max_wait: float, retry_for: float, connect_timeout: float,
) -> dict[str, Any] | NoVerdict:
    """The gateway's answer to the decision request `send` makes (its JSON object; {} if it is
    none), or why there is none."""
    loop = asyncio.get_running_loop()
    retries = Retries(loop.time(), max_wait, retry_for)
    client: httpx.AsyncClient | None = None
    try:
        while True:
            attempted = loop.time()
            outcome = await _attempt(send, client, tool, timeout=retries.time_left(attempted), max_wait=max_wait)
            if not isinstance(outcome, _Undecided):
                return outcome
            delay = retries.next_pause(attempted, loop.time(), outcome.retry_after)
            if delay is None:
                logger.warning("no gateway replica decided %s (call %s) within ADK_GATEWAY_RETRY_FOR (%g s); "
                               "refusing the call", tool, call_id, retry_for)
                return outcome.refusal
            logger.info("asking the gateway again about %s (call %s) in %.2g s", tool, call_id, delay)
            await asyncio.sleep(delay)
            if client is None:
                # A new connection for every retry: a balancer keeps a connection on the replica it
                # chose, which may be the one that is stopping.
                client = httpx.AsyncClient(
                    timeout=httpx.Timeout(None, connect=connect_timeout),
                    limits=httpx.Limits(max_connections=None, max_keepalive_connections=0),
                    trust_env=False,
                )
    finally:
        if client is not None:
            await client.aclose()


async def _attempt(
    send: Send, client: httpx.AsyncClient | None, tool: str, *, timeout: float, max_wait: float,
) -> dict[str, Any] | NoVerdict | _Undecided:
    """One decision request: the answer, a refusal, or an attempt to repeat."""
    try:
        resp = await asyncio.wait_for(send(client), timeout=timeout)
    except httpx.HTTPError as exc:
        # Could not connect (a connect timeout too), or the connection closed while waiting.
        logger.warning("gateway unreachable while deciding %s: %r", tool, exc)
        return _Undecided(NoVerdict(
            "The approval gateway went away before anyone decided; the call was not run.", "gateway_unreachable",
        ))
    except asyncio.TimeoutError:  # noqa: UP041 - not the builtin TimeoutError before Python 3.11 (ADK 1.x runs on 3.10)
        logger.warning("no decision on %s within ADK_GATEWAY_MAX_WAIT (%s s)", tool, max_wait)
        return NoVerdict(
            f"Nobody decided within the plugin's longest wait (ADK_GATEWAY_MAX_WAIT, {max_wait:g} s); the call was not run.",
            "max_wait",
        )
    if resp.status_code == 200:
        return _json_object(resp)
    refused = NoVerdict(f"The approval gateway refused to decide (HTTP {resp.status_code}); the call was not run.",
                        "gateway_refused")
    if resp.status_code not in RETRY_STATUSES:
        logger.warning("gateway refused the decision request: HTTP %s", resp.status_code)
        return refused
    logger.info("no gateway replica decided %s: HTTP %s", tool, resp.status_code)
    return _Undecided(refused, _retry_after(resp))


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
