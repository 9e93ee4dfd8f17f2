"""`Presence`: whether the browser of a request that reads a response is still there.

The transports implement it (edge/sse.py, edge/ws.py) and hand it to the reader they open
(`Reader.watch`, `RelayFeed.watch`). A port of its own module, importing nothing of the chat layer,
so the readers that take it (chat/response.py, cluster/relay.py) import no more than this.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["Presence"]


class Presence(Protocol):
    def connected(self) -> bool:
        """Whether the request's browser is still there."""
        ...
