"""WebSocket tickets: short-lived, single-use credentials for one socket's handshake.

Browsers cannot set headers on a WebSocket handshake, and a long-lived token in its URL outlives
the socket in proxy logs and browser histories. A page that holds a credential (a JWT from its
identity provider, an API key) trades it, in a header, for a ticket at `POST .../api/chat/ws-ticket`
and opens the socket with `?ticket=<ticket>`. A ticket

- opens one socket: the handshake takes it out of the shared store as it is checked (on any
  replica: cluster/shared.py), so a ticket copied from a log is worth nothing;
- lives `auth.ws_ticket_ttl` (30 s), and never past the expiry of the token it was issued for;
- acts as the user (and token claims) it was issued to, on the agent whose route issued it, from
  the page Origin that asked for it (when one did), under the auth settings it was issued under (a
  reload that changes them voids the tickets outstanding);
- is stored as its SHA-256 only, so the store holds nothing that opens a socket.

The ai 7 `WebSocketChatTransport` resolves its `params` option at every connection it opens, so a
`params` function that fetches a ticket gives every reconnect a fresh one.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol

import orjson

from .auth import Identity
from ..core.refusals import HttpError

__all__ = ["QUERY_PARAMETER", "Ticket", "TicketStore", "Tickets"]

# The query parameter a socket's URL carries the ticket in.
QUERY_PARAMETER: Final = "ticket"
_PREFIX: Final = "wst_"
_MAX_LENGTH: Final = 128


@dataclass(frozen=True)
class Ticket:
    value: str
    # Seconds it may still be used (whole seconds, as an OAuth `expires_in`).
    expires_in: int


def _refused(message: str) -> HttpError:
    return HttpError(401, "unauthorized", message, {"WWW-Authenticate": 'Bearer realm="adk-gateway"'})


def _key(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


class TicketStore(Protocol):
    """Where tickets are kept: the shared state (cluster/shared.py `SharedState`, memory or Redis),
    which raises SharedStateDown when it cannot be asked. A port, so access/ does not import the cluster."""

    async def put_ticket(self, key: str, record: dict[str, str], *, ttl: float) -> None: ...

    async def take_ticket(self, key: str) -> dict[str, str] | None: ...


class Tickets:
    """Issues tickets into the shared store and redeems them from it."""

    def __init__(self, store: TicketStore, clock: Callable[[], float] = time.time) -> None:
        self._store = store
        # Wall-clock seconds: a token's `exp` is one.
        self._clock = clock

    async def issue(self, identity: Identity, *, agent: str, origin: str | None, fingerprint: str, ttl: float) -> Ticket:
        """A ticket for a socket on `agent`'s route acting as `identity`. Raises SharedStateDown."""
        lifetime = ttl
        token_expiry = identity.claims.get("exp")
        if isinstance(token_expiry, int | float) and not isinstance(token_expiry, bool):
            lifetime = min(lifetime, token_expiry - self._clock())
        if lifetime <= 0:
            raise _refused("token expired")
        value = _PREFIX + secrets.token_urlsafe(32)
        record = {
            "user": identity.user_id,
            "claims": orjson.dumps(dict(identity.claims)).decode(),
            "agent": agent,
            "origin": origin.rstrip("/") if origin else "",
            "auth": fingerprint,
        }
        await self._store.put_ticket(_key(value), record, ttl=lifetime)
        return Ticket(value, math.ceil(lifetime))

    async def redeem(self, value: str, *, agent: str, origin: str | None, fingerprint: str) -> Identity:
        """Who the socket acts as; raises HttpError(401) for a ticket that cannot open it (and
        SharedStateDown when the store cannot be asked). A ticket is spent by any attempt."""
        if not value.startswith(_PREFIX) or len(value) > _MAX_LENGTH:
            raise _refused("invalid ticket")
        record = await self._store.take_ticket(_key(value))
        if record is None:
            raise _refused("unknown, used or expired ticket: get a new one from POST .../api/chat/ws-ticket for each connection")
        if record.get("auth") != fingerprint:
            raise _refused("the ticket was issued under other auth settings: get a new one")
        if record.get("agent") != agent:
            raise _refused("the ticket was issued for another agent's socket")
        if record.get("origin") and record.get("origin") != (origin or "").rstrip("/"):
            raise _refused("the ticket was issued to a page on another origin")
        return Identity(record["user"], orjson.loads(record.get("claims") or "{}"))
