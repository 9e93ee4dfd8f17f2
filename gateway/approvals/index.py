"""Where the directory lists a pending approval, in what order, and the listing's cursor: the same
for both backends (cluster/memory_approvals.py's `ApprovalTable`, cluster/redis_approvals.py).

An approval is decided by one audience: the members of its approver group (`approvers`), or,
without a group, its requester alone (access/approvers.py `may_decide`). The directory indexes it
under its audience and under its audience and agent (and under every approval, and the agent's,
for listings without a caller), so that a caller's listing reads only the indexes of the audiences
they belong to: however many approvals one user has waiting, they are not in a supervisor's
indexes unless the supervisors decide them, and never fill another audience's page.

Within an index, approvals are ordered by `position`: `created` in microseconds, zero-padded, then
the id. It is a total order (two approvals created in the same microsecond are ordered by id) that
does not move when approvals are added, so a cursor (the last position a page returned) resumes
exactly after it: what was added after it in order is listed on a later page, nothing twice.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = [
    "ALL", "ApprovalPage", "ApprovalQuery", "Index", "InvalidCursor", "audience_of", "decode_cursor", "encode_cursor",
    "group_audience", "indexes_of", "position", "requester_audience", "wanted_indexes",
]

# Every audience, or every agent: the index of all approvals, or all of one agent's.
ALL: Final = "*"
# A position: 20 digits of microseconds, "|", the approval id (printable ASCII, as ids are).
_POSITION = re.compile(r"\d{20}\|[!-~]{1,200}")
# A cursor longer than any position's encoding is refused before it is decoded.
_MAX_CURSOR: Final = 300

Index = tuple[str, str]


class InvalidCursor(ValueError):
    """A cursor this gateway did not hand out (or one that was cut or changed)."""


@dataclass(frozen=True)
class ApprovalQuery:
    """A listing of pending approvals: of the `audiences` given (None: all), of `agent` and `tool`
    when given, after the position `after`, at most `limit`; `accept` (when given) drops what the
    caller would not show, without ending the page early."""

    audiences: tuple[str, ...] | None = None
    agent: str | None = None
    tool: str | None = None
    after: str | None = None
    limit: int = 100
    accept: Callable[[dict[str, Any]], bool] | None = field(default=None, compare=False)

    def matches(self, view: dict[str, Any]) -> bool:
        if self.tool is not None and view.get("tool") != self.tool:
            return False
        return self.accept is None or self.accept(view)


@dataclass(frozen=True)
class ApprovalPage:
    """A page of a listing, and the position to list after for the next one (None: no more)."""

    approvals: list[dict[str, Any]]
    next: str | None


def group_audience(group: str) -> str:
    return f"g:{group}"


def requester_audience(user: str) -> str:
    return f"u:{user}"


def audience_of(record: dict[str, Any]) -> str:
    """Who decides the approval: its group's members, or without a group its requester."""
    group = record.get("approvers")
    return group_audience(str(group)) if group is not None else requester_audience(str(record.get("requester", "")))


def indexes_of(record: dict[str, Any]) -> list[Index]:
    """The indexes that list the approval."""
    audience, agent = audience_of(record), str(record.get("agent", ""))
    return [(ALL, ALL), (ALL, agent), (audience, ALL), (audience, agent)]


def wanted_indexes(query: ApprovalQuery) -> list[Index]:
    """The indexes a listing reads: one per audience (deduplicated, so nothing is listed twice)."""
    agent = query.agent if query.agent is not None else ALL
    audiences = (ALL,) if query.audiences is None else tuple(dict.fromkeys(query.audiences))
    return [(audience, agent) for audience in audiences]


def position(record: dict[str, Any]) -> str:
    """The approval's place in every index that lists it."""
    micros = max(int(float(record["created"]) * 1_000_000), 0)
    return f"{min(micros, 10**20 - 1):020d}|{record['id']}"


def encode_cursor(place: str) -> str:
    """The cursor the API hands out for a position: opaque to the caller."""
    return base64.urlsafe_b64encode(place.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> str:
    """The position a cursor stands for; raises InvalidCursor."""
    if len(cursor) > _MAX_CURSOR or not cursor.isascii():
        raise InvalidCursor("cursor: not one this gateway handed out")
    try:
        place = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
    except (binascii.Error, ValueError):
        raise InvalidCursor("cursor: not one this gateway handed out") from None
    if _POSITION.fullmatch(place) is None:
        raise InvalidCursor("cursor: not one this gateway handed out")
    return place

