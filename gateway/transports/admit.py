"""What every browser request passes before it reaches a chat, whatever its transport.

Identity (auth), the page's origin, the drain state and the user's request rate, in that order,
each refused with its own status and JSON reason and counted in `adk_gateway_limited_total`.
"""

from __future__ import annotations

from typing import Final

import structlog
from aiohttp import web

from ..errors import HttpError
from ..limits import Limited
from ..state import GATEWAY

__all__ = ["admit", "count_refusal"]

# What a request refused while draining is told to wait, in seconds: long enough for a balancer
# polling `/readyz` (503 `draining` from the first moment) to stop routing here, so the retry lands
# on another instance; short enough that a person retrying by hand hardly notices.
_DRAINING_RETRY_AFTER: Final = "5"


def count_refusal(request: web.Request, reason: str) -> None:
    request.app[GATEWAY].metrics.limited.labels(reason).inc()


def admit(request: web.Request, *, new_work: bool = True) -> str:
    """The caller's user id, once they may proceed; `new_work` requests are refused while draining."""
    gateway = request.app[GATEWAY]
    try:
        user_id = gateway.auth.user_id(request)
        gateway.auth.check_origin(request)
    except HttpError as exc:
        count_refusal(request, exc.code if exc.status == 403 else "unauthorized")
        raise
    structlog.contextvars.bind_contextvars(user_id=user_id)
    if new_work and gateway.draining:
        count_refusal(request, "draining")
        raise HttpError(503, "draining", "the gateway is shutting down; retry on another instance", {"Retry-After": _DRAINING_RETRY_AFTER})
    try:
        gateway.admission.check_rate(user_id, gateway.clock())
    except Limited as exc:
        count_refusal(request, exc.code)
        raise
    return user_id
