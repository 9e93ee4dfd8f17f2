"""Deadlines of calls that wait for a person, in one queue: when one passes, what answers it.

Two kinds wait, one per upstream mode, and both keep their deadline here (`Deadline.kind`):

- a confirmation (`/run_sse`): the call waits in ADK's session, not in any process, so its
  `timeout` cannot be a timer in the replica that showed it: it is a deadline anyone can work out
  again. It runs from when the confirmation was asked, which is the later of two times (both wall
  clock, seconds since the epoch): the `timestamp` of ADK's event that carries the
  `adk_request_confirmation` call (in ADK's session, so known after any restart) and the gateway's
  first sight of it, when known (the person is never given less than the timeout from when the
  gateway could first show it). A browser tool's call waits twice, as on the held engine: for the
  person's approval, then for the browser to run it; once approved, its deadline runs from the
  approval (`approved_at`, kept in the stored deadline by the replica that took it), so the
  browser's wait gets the whole timeout. When it passes, the gateway answers ADK itself with the
  policy's `on_timeout`: `deny` is ADK's rejection (confirmed false, no payload: the browser sees
  tool-output-denied), `error` a rejection carrying the gateway's error (the plugin answers it as
  the call's result: tool-output-error). docs/approvals.md ("Timeouts") describes the payload.
- a held call (`/run_live`: the plugin's request held open): one deadline per chat, the chat's
  machine's next one (core/chat_machine.py `next_deadline`), kept by the chat (chat/record.py)
  and moved or dropped as that moves. When it passes, the chat's machine is told where the chat
  runs (`DeadlineReached`) and decides which calls time out. Its replica is the only one that can
  answer it (the held request is a connection of that process), so once that replica died the
  deadline is moot: whoever claims it drops it.

A stored deadline without a kind (written before held calls had theirs here) is a confirmation.

`DeadlineQueue` orders pending deadlines by due time for the one timer that waits for the next,
and leases the passed ones to whoever claims them (the same contract as the shared store's:
cluster/shared.py).

Sans-IO: no clock (callers pass `now`), no I/O.
"""

from __future__ import annotations

import heapq
import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Final, Literal

__all__ = [
    "BROWSER_TIMEOUT_ERROR", "CONFIRMATION", "HELD", "TIMEOUT_ERROR", "Deadline", "DeadlineQueue", "MalformedDeadline",
    "asked_at", "deadline_key", "due_at", "held_key", "passed", "timeout_payload",
]

# The same words as a timeout on the blocking path (approvals.py), so both modes read alike.
TIMEOUT_ERROR: Final = "Timed out waiting for approval; the call was not run."
# The second wait of an approved browser tool's call, worded as the blocking path words it.
BROWSER_TIMEOUT_ERROR: Final = "Timed out waiting for the browser; the call was not run."

# The two kinds of deadline (`Deadline.kind`): an ADK confirmation's, and a chat's held calls'.
CONFIRMATION: Final = "confirmation"
HELD: Final = "held"
Kind = Literal["confirmation", "held"]


class MalformedDeadline(ValueError):
    """A stored deadline that is not one this gateway wrote."""


def asked_at(adk_timestamp: float | None, first_seen: float | None) -> float | None:
    """When a confirmation was asked: the later of ADK's event timestamp and the gateway's first
    sight (either may be unknown; None if both are)."""
    known = [t for t in (adk_timestamp, first_seen) if t is not None]
    return max(known) if known else None


def due_at(asked: float | None, timeout: float | None, approved: float | None = None) -> float | None:
    """The deadline of a confirmation asked at `asked` for a tool with `timeout` seconds (None: no
    deadline, as for a tool the gateway does not gate, or an ask of unknown time). `approved`: when
    a person approved a browser tool's call, whose browser then gets the whole timeout from there
    (the later of the two counts, whichever clock ran ahead)."""
    if asked is None or timeout is None:
        return None
    return max(asked, approved if approved is not None else asked) + timeout


def deadline_key(chat_id: str, approval_id: str) -> str:
    """A confirmation's deadline's key: ADK's approval ids are unique per session, chat ids global."""
    return f"{chat_id}/{approval_id}"


def held_key(chat_id: str) -> str:
    """The key of a chat's held calls' deadline: one per chat (its machine's next deadline). No
    ADK approval id is `held` (ADK's are `adk-<uuid>`), so it never meets a confirmation's key."""
    return f"{chat_id}/{HELD}"


def passed(due: float | None, now: float) -> bool:
    return due is not None and now >= due


def timeout_payload(on_timeout: Literal["deny", "error"], *, approved: bool = False) -> dict[str, Any] | None:
    """The confirmation payload that answers a timeout (confirmed is always false): none for
    `deny` (ADK's own rejection), the gateway's error for `error`, which names the wait that timed
    out (`approved`: a browser tool's call the person approved waited for the browser)."""
    if on_timeout == "error":
        return {"adk_gateway": {"error": BROWSER_TIMEOUT_ERROR if approved else TIMEOUT_ERROR}}
    return None


@dataclass(frozen=True, slots=True)
class Deadline:
    """One deadline, with what a replica needs to answer it: the chat (agent, user, chat id) and the
    call (a confirmation's ADK approval id, the original call and its tool; for a held deadline,
    the chat's earliest waiting call's, which names it in logs), and, for a browser tool's call a
    person approved, when (wall clock): only the replica that took the approval knows it otherwise.
    `kind` says which of the two it is (module docstring).

    `leased_until` is set on a deadline a replica claimed: when its claim ends (wall clock), which
    is also the claim's token (only the claim that set it settles the deadline). It is not part of
    the deadline: neither compared nor stored."""

    agent: str
    user: str
    chat: str
    approval_id: str
    tool_call_id: str
    tool: str
    due: float
    approved_at: float | None = None
    kind: Kind = CONFIRMATION
    leased_until: float | None = field(default=None, compare=False)

    @property
    def held(self) -> bool:
        return self.kind == HELD

    @property
    def key(self) -> str:
        return held_key(self.chat) if self.held else deadline_key(self.chat, self.approval_id)

    def to_json(self) -> str:
        data = asdict(self)
        del data["leased_until"]
        if not self.held:
            del data["kind"]  # a confirmation's stays as it was stored before kinds existed
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> Deadline:
        try:
            data = json.loads(raw)
            fields = {name: data[name] for name in ("agent", "user", "chat", "approval_id", "tool_call_id", "tool")}
            if not all(isinstance(v, str) and v for v in fields.values()):
                raise MalformedDeadline("a deadline's names must be non-empty strings")
            due = data["due"]
            if isinstance(due, bool) or not isinstance(due, (int, float)):
                raise MalformedDeadline("a deadline's due time must be a number")
            approved = data.get("approved_at")
            if approved is not None and (isinstance(approved, bool) or not isinstance(approved, (int, float))):
                raise MalformedDeadline("a deadline's approval time must be a number")
            kind = data.get("kind", CONFIRMATION)
            if kind not in (CONFIRMATION, HELD):
                raise MalformedDeadline("a deadline's kind is a confirmation or held")
            return cls(**fields, due=float(due), approved_at=None if approved is None else float(approved), kind=kind)
        except (ValueError, TypeError, KeyError) as exc:
            raise MalformedDeadline(type(exc).__name__) from None


@dataclass(eq=False, slots=True)
class _Kept:
    deadline: Deadline
    # When it is due in the queue: its own due time, or the end of the lease of whoever claimed it.
    at: float
    lease: float | None = None


class DeadlineQueue:
    """Pending deadlines by due time; one per key, the latest `add` wins. A claimed deadline stays,
    due again when its lease ends, until the claim settles it (drops it or keeps it due later)."""

    __slots__ = ("_by_key", "_heap", "_puts")

    def __init__(self) -> None:
        self._by_key: dict[str, _Kept] = {}
        # (at, key, put number, entry); entries dropped, replaced or claimed since are skipped
        # lazily. The put number orders two entries of one key due at once (entries do not compare).
        self._heap: list[tuple[float, str, int, _Kept]] = []
        self._puts = 0

    def __len__(self) -> int:
        return len(self._by_key)

    def add(self, deadline: Deadline) -> None:
        """Keep `deadline`, replacing the one of its key (and any claim on it)."""
        self._put(_Kept(replace(deadline, leased_until=None), deadline.due))

    def drop(self, key: str) -> Deadline | None:
        kept = self._by_key.pop(key, None)
        return kept.deadline if kept is not None else None

    def get(self, key: str) -> Deadline | None:
        kept = self._by_key.get(key)
        return kept.deadline if kept is not None else None

    def next_due(self) -> float | None:
        """When the earliest pending deadline (or lease) passes; None if none is pending."""
        self._skip_stale()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> list[Deadline]:
        """Remove and return every deadline that passed at `now`, earliest first."""
        out = [kept.deadline for kept in self._take_due(now, None)]
        for deadline in out:
            del self._by_key[deadline.key]
        return out

    def claim(self, now: float, until: float, limit: int | None = None) -> list[Deadline]:
        """The deadlines (or leases) passed at `now`, earliest first, at most `limit`, each leased
        until `until` (> now): kept due then, returned with `leased_until` set."""
        if until <= now:
            raise ValueError("a lease ends after it starts")
        out = []
        for kept in self._take_due(now, limit):
            self._put(_Kept(kept.deadline, until, until))
            out.append(replace(kept.deadline, leased_until=until))
        return out

    def settle(self, claimed: Deadline, again: float | None) -> bool:
        """A claim's end: drop the deadline (`again` None) or keep it due `again`, if the claim
        still holds it (nobody claimed, dropped or replaced it since). Returns whether it did."""
        kept = self._by_key.get(claimed.key)
        if kept is None or claimed.leased_until is None or kept.lease != claimed.leased_until:
            return False
        if again is None:
            del self._by_key[claimed.key]
        else:
            self.add(replace(kept.deadline, due=again))
        return True

    def _put(self, kept: _Kept) -> None:
        self._by_key[kept.deadline.key] = kept
        self._puts += 1
        heapq.heappush(self._heap, (kept.at, kept.deadline.key, self._puts, kept))

    def _take_due(self, now: float, limit: int | None) -> list[_Kept]:
        """Off the heap (still in `_by_key`): the entries due at `now`, earliest first."""
        out: list[_Kept] = []
        while limit is None or len(out) < limit:
            self._skip_stale()
            if not self._heap or self._heap[0][0] > now:
                break
            out.append(heapq.heappop(self._heap)[3])
        return out

    def _skip_stale(self) -> None:
        heap = self._heap
        while heap and self._by_key.get(heap[0][1]) is not heap[0][3]:
            heapq.heappop(heap)
