"""The contract of the state that gateway replicas share, and what every backend raises.

A backend owns these things, and nothing about runs, chunks or HTTP (router.py and the modules it
drives do that):

- the chat directory: which user and which agent a chat id belongs to (chat ids are global, so
  one id is one chat of one agent), which replica runs the chat, and which run (message id) is
  going on there, if any;
- replica liveness: each replica's heartbeat; a replica silent for `owner_timeout` is dead, and
  the next request for one of its chats moves the chat to the replica that received it;
- inboxes: one-way messages from a replica to another (forwarded requests, their replies and
  verdicts: messages.py), carried as JSON objects;
- relays: the chunks of one response, appended by the replica running it and read by the
  replica holding the browser's connection;
- gated-call records: every gated call with its chat, owner and (once released) verdict, kept
  for the call's deadline;
- WebSocket tickets: short-lived, single-use credentials for a socket's handshake (access/tickets.py),
  so a ticket issued by one replica opens a socket on any;
- the one deadline queue (core/deadlines.py: ADK confirmations' and chats' held calls'): ordered by
  due time, each claimed by exactly one replica at a time once it passed, for a lease
  (deadline_timer.py; deadline_answers.py answers it on the chat's owner);
- chat states: each chat's approvals as its machine last saved them (core/chat_machine.py), so that
  the replica that takes a chat over, or a restarted one, starts from them; kept under the chat's
  user, and read back under that user only;
- the audit trail's store: one record per decided approval (approvals/audit_trail.py makes them), appended once
  per approval id and read back oldest first by any replica, bounded by a count and an age;
- the directory of pending approvals: each approval that waits for someone (its record, as the
  approvals API shows it, plus the replica running its chat), listed and read by any replica, and
  the approvers' votes on it, counted in one step so that two replicas voting at once never both
  decide; each kept until its deadline (plus a margin) or until dropped;
- per-user limits (Redis only: `shares_limits`): each user's token bucket and stream slots, counted
  by every replica together (core/limits.py's rules, redis_limits.py's scripts).

`MemoryState` (memory.py) keeps them in a `MemoryHub` in this process: the default, one replica
(several only in tests). `RedisState` (redis.py) keeps them in Redis for replicas on several
hosts, sealed (sealing.py): what another party wrote there reads as absent. tests/unit/test_cluster_state.py holds both to this contract.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.deadlines import Deadline
from ..approvals.store import AUDIT_CURSOR, ApprovalStore, AuditEntry, AuditQuery, StoreDown, audit_position

__all__ = [
    "AUDIT_CURSOR", "DEADLINE_LEASE", "AuditEntry", "AuditQuery", "Claim", "LocalChat", "RelayEntry", "SharedState",
    "SharedStateBusy", "SharedStateDown", "Inbox", "Reassert", "audit_position",
]

# How long a claim on a passed confirmation deadline holds (seconds) before another replica may
# claim it again. Above the longest one answer takes with the default settings: the chat's claim
# and kept state (Redis commands, 5 s each at most), ADK's session read (the agent's
# connect_timeout + 30 s, 35 s by default) and the start of the run that answers it. Its cost: a
# replica that dies holding a claim delays that timeout's answer by up to this much (a person's
# answer meanwhile is still judged late from ADK's timestamps: docs/approvals.md).
DEADLINE_LEASE = 60.0

# A message from another replica: a JSON object.
Inbox = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class LocalChat:
    """A chat this replica owns, as the directory records it: written back after Redis lost its data."""

    user: str
    chat: str
    agent: str
    # The run going on there (its message id), or "".
    run: str


# After the shared state was lost (Redis restarted empty): the local chats to write back.
Reassert = Callable[[], list[LocalChat]]


class SharedStateDown(StoreDown):
    """The shared state cannot be reached (or is recovering): the request is answered 503
    (`sessions_unavailable`, the approvals store's `StoreDown`, which it is to the approvals room)."""


class SharedStateBusy(SharedStateDown):
    """The shared state is up, but this replica had no free connection to it in time: overloaded.
    A SharedStateDown, so every caller fails closed as it does then; answered with its own code."""

    code = "gateway_overloaded"


@dataclass(frozen=True)
class Claim:
    """Where a chat runs, as seen by the replica that asked."""

    owner: str
    local: bool
    # The chat was taken from a dead replica that was running this message: that run is lost.
    orphaned_run: str | None = None


@dataclass(frozen=True)
class RelayEntry:
    """One append to a relay: `frames` (encoded chunks) numbered from `seq`, or its end."""

    seq: int
    frames: list[bytes] = field(default_factory=list)
    # None while the response goes on; "done" at its end, "lagged" if the writer fell behind the
    # response's bounded log.
    end: str | None = None


class SharedState(ApprovalStore, abc.ABC):
    """What replicas share. Every method may raise SharedStateDown.

    The approvals room's data (its directory of pending approvals, its audit trail) are declared by
    the room's port, approvals/store.py `ApprovalStore`, which this contract inherits."""

    # Whether what is shared outlives this process (Redis): only then is a chat's state worth
    # keeping after each run (the memory backend's replicas are this process, gone with it).
    outlives_process = False

    def __init__(self, replica_id: str) -> None:
        self.replica_id = replica_id
        # False while the backend cannot reach its store; /readyz reports it.
        self.available = True

    @property
    def restoring(self) -> bool:
        """Whether the store lost its data and the replicas are writing their chats back: for that
        while, claims of chats the store does not know are refused (503, retry) so that no replica
        takes a chat before its owner has written it back. /readyz reports it."""
        return False

    @abc.abstractmethod
    async def start(self, inbox: Inbox, reassert: Reassert) -> None:
        """Join: start heartbeats and deliver messages for this replica to `inbox`."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Leave: stop heartbeats, so other replicas see this one as dead (at once if the store
        can be told). Returns within a bound whatever the store does: shutdown waits for it."""

    # ---- the chat directory ----------------------------------------------------------------

    @abc.abstractmethod
    async def claim(
        self, user_id: str, chat_id: str, *, agent: str, default_agent: str, ttl: float, create: bool = True
    ) -> Claim:
        """The chat's owner; this replica becomes it if nobody (alive) is.

        Raises ChatNotFound (chat/registry.py) when the chat id belongs to another user or another agent
        (a record written before agents existed is `default_agent`'s). The record lives
        `ttl` seconds after the last claim. With `create` false an unknown chat is answered as local
        without being recorded (a resume of a chat that never ran must not take its id).
        """

    @abc.abstractmethod
    async def owner(self, user_id: str, chat_id: str) -> str | None:
        """The live replica that owns the chat, or None (unknown chat, another user's, or a dead owner)."""

    @abc.abstractmethod
    async def mark_run(self, user_id: str, chat_id: str, message_id: str) -> None:
        """Record the run going on in a chat this replica owns ("" once it ended)."""

    @abc.abstractmethod
    async def release(self, user_id: str, chat_id: str) -> None:
        """Forget a chat this replica owns (it went idle)."""

    # ---- replicas --------------------------------------------------------------------------

    @abc.abstractmethod
    async def alive(self, replica_id: str) -> bool:
        """Whether the replica's heartbeat is current."""

    @abc.abstractmethod
    async def send(self, replica_id: str, message: dict[str, Any]) -> None:
        """Deliver a message to a replica's inbox (lost if that replica is gone)."""

    # ---- relays ----------------------------------------------------------------------------

    @abc.abstractmethod
    async def relay_append(self, key: str, entry: RelayEntry) -> None:
        """Append to a relay (created on first append; dropped a while after its last)."""

    @abc.abstractmethod
    async def relay_read(self, key: str, after: str, *, timeout: float) -> tuple[str, list[RelayEntry]]:
        """Entries after position `after` ("" for the start), waiting up to `timeout` seconds
        for the first; returns the new position and the entries (none on timeout)."""

    # ---- gated calls -----------------------------------------------------------------------

    @abc.abstractmethod
    async def put_call(self, call_id: str, record: dict[str, str], *, ttl: float) -> None:
        """Store (or update fields of) a gated call's record for `ttl` seconds."""

    @abc.abstractmethod
    async def get_call(self, call_id: str) -> dict[str, str] | None:
        """A gated call's record, or None."""

    # ---- the deadline queue ------------------------------------------------------------------

    @abc.abstractmethod
    async def add_deadline(self, deadline: Deadline) -> None:
        """Keep a deadline until it is dropped or its claim settles it (one per key: the latest
        add wins, and ends any claim on the one it replaces)."""

    @abc.abstractmethod
    async def drop_deadline(self, key: str) -> None:
        """Forget a deadline (its call was answered), claimed or not."""

    @abc.abstractmethod
    async def claim_deadlines(self, now: float, *, limit: int = 100, lease: float = DEADLINE_LEASE) -> list[Deadline]:
        """Deadlines due at `now` (wall clock), each leased to the caller until `now + lease` in the
        same step: kept, due when the lease ends, so that another replica claims it again only if
        the caller did not settle it by then (it died or hangs). Returned with `leased_until` set;
        while a lease holds, nobody else claims the deadline (each claim goes to one caller)."""

    @abc.abstractmethod
    async def settle_deadline(self, claimed: Deadline, again: float | None) -> bool:
        """The end of a claim (`claimed` as claim_deadlines returned it): drop the deadline
        (`again` None: answered, or moot) or keep it due `again` (try again then), only if this
        claim still holds it; once its lease ended and someone claimed it again, or it was dropped
        or replaced meanwhile, nothing changes (what the claimer learnt is older). Returns whether
        it did."""

    @abc.abstractmethod
    async def next_deadline(self) -> float | None:
        """When the earliest deadline kept is due, or None."""

    # ---- chat states -----------------------------------------------------------------------

    @abc.abstractmethod
    async def put_chat_state(self, user_id: str, chat_id: str, state: dict[str, Any], *, ttl: float) -> None:
        """Store a chat's state (a JSON object) for `ttl` seconds (the chat's idle TTL), replacing
        the one stored before."""

    @abc.abstractmethod
    async def get_chat_state(self, user_id: str, chat_id: str) -> dict[str, Any] | None:
        """The chat's state as last stored, or None: never stored, expired, or stored under another
        user (chat ids are global: one user's state is never read back under another's id; logged
        without its content)."""

    # ---- WebSocket tickets -----------------------------------------------------------------

    @abc.abstractmethod
    async def put_ticket(self, key: str, record: dict[str, str], *, ttl: float) -> None:
        """Store a ticket's record for `ttl` seconds."""

    @abc.abstractmethod
    async def take_ticket(self, key: str) -> dict[str, str] | None:
        """A ticket's record, removed in the same step (a ticket opens one socket), or None if
        unknown, taken already or expired."""


    # ---- per-user limits shared by the replicas ------------------------------------------------

    # Whether the replicas count each user's requests and streams here, together (Redis); if not,
    # each replica counts its own (core/limits.py `Admission`), as the memory backend's one replica does.
    shares_limits = False

    @abc.abstractmethod
    async def take_token(self, user_id: str, *, rate: float, burst: int, now: float | None = None) -> float | None:
        """One request from the user's token bucket, in one step with every replica's
        (core/limits.py `take_token`): None when admitted, else the seconds until a token is back.
        `now` (seconds): the store's clock unless given (the tests' table). A bucket that is full
        again is forgotten."""

    @abc.abstractmethod
    async def open_slot(
        self, user_id: str, slot_id: str, *, cap: int, lease: float, now: float | None = None,
    ) -> bool:
        """A stream slot for the user, unless they hold `cap` slots whose lease has not ended
        (core/limits.py `take_slot`; those that ended are forgotten): held for `lease` seconds
        unless renewed (renew_slots) or closed. Whether it was taken."""

    @abc.abstractmethod
    async def take_token_and_slot(
        self, user_id: str, slot_id: str, *, rate: float, burst: int, cap: int, lease: float, now: float | None = None,
    ) -> tuple[float | None, bool]:
        """take_token, then open_slot if the token was there, in one step: (None, whether the slot
        was taken), or (the seconds until a token is back, False) with no slot tried."""

    @abc.abstractmethod
    async def close_slot(self, user_id: str, slot_id: str) -> None:
        """Give a stream slot back (nothing if it is not held)."""

    @abc.abstractmethod
    async def renew_slots(self, slots: Mapping[str, Sequence[str]], *, lease: float, now: float | None = None) -> int:
        """Extend the leases of the slots this replica holds (slot ids by user) to `lease` seconds
        from now; a slot not held any more is not taken again. How many were renewed."""
