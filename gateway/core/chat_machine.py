"""One chat as a state machine: its ledger of calls that wait for a person and its current turn (sans-IO).

A `ChatMachine` is the single owner of what a chat is waiting for, and it turns the plugin's ask
about a tool call (`ToolAsked`) into a transition: what the ask comes to is decided by the approvals
room (approvals/decision.py), reached only through the machine's port, the `GateDecider` it is built
with (core/gate_decider.py); what waits is recorded here. It takes the typed events of
core/chat_events.py and returns the outputs of core/chat_outputs.py for the chat (chat/record.py, its
only caller) to carry out. Its phase is data, not the liveness of a task: NEW (no run yet), RUNNING
(a run's turn, core/turn.py, from `RunStarts` until `RunClosed` reported it), IDLE (the last run
reported how it ended; what it asked ADK to confirm waits in the ledger).

Runs are numbered (`run`): the events of a run's task name theirs, and those of a run that is not
the one under way (it was made to end) are dropped here. How a run made to end ends is decided here
too (core/run_ending.py): the shell says why it ends it (`EndAsked`), then that its task was
cancelled (`RunCancelled`). Whether a request may start a run now (`RunWanted`: busy, or the run
under way ends first), whether the chat may be forgotten or handed over (`settled`), and what a live
chat's audio and closed socket call for are the machine's answers.

`TRANSITIONS` says which events each phase takes; any other is a `MachineError` (a bug in the
caller), raised before anything changes. Within a run the turn's own table (turn.TRANSITIONS)
decides. `next_deadline` is when the machine next wants a `DeadlineReached`: the shell keeps it in
the one deadline queue (core/deadlines.py, a held one), not a sweep.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any, Final

from .approvals import CallState, GatedCall
from .chat_events import (
    Answered, AnswersGoing, AnswersSent, ApproversDecided, ConfirmationDecided, Attached, AudioHeard, BrowserAsked,
    BrowserToolApproved, CallCancelled, ChatEvent, ConfirmationsSeen, DeadlineReached, EndAsked, GateOpened,
    NativeAnswered, Resumed, RunCancelled, RunClosed, RunDropped, RunFailed, RunStarts, RunWanted, Settled,
    SocketClosed, StateRestored, ToolAsked, UpstreamRead,
)
from .ledger import Ledger
from .ledger_snapshot import MalformedLedger
from .turn import CallChanged, Output, Turn
from .chat_outputs import Admission, BrowserApproved, ConfirmationSeen, NativeSettled
from .gate_decider import ChatView, GateDecider
from .run_ending import Ending, asked, cancelled

__all__ = ["SNAPSHOT_VERSION", "TRANSITIONS", "ChatMachine", "MachineError", "Phase"]

SNAPSHOT_VERSION: Final = 1


class Phase(Enum):
    NEW = "new"
    RUNNING = "running"
    IDLE = "idle"


class MachineError(Exception):
    """An event the machine's phase does not take (a bug in the caller); nothing was changed."""


# Between runs a late answer, cancel, deadline or end reaches the last turn, which no longer
# writes but still releases a call and reports once; nothing may feed it events or attach to it.
_AFTER_RUN: Final = (
    Answered, ApproversDecided, Resumed, Settled, CallCancelled, DeadlineReached, RunFailed, RunCancelled, RunClosed, Attached,
    GateOpened,
)
# A run under way takes those, its upstream's events, and what only it can carry out or be ended by.
_RUN_EVENTS: Final = (*_AFTER_RUN, UpstreamRead, ConfirmationDecided, EndAsked)
# The events of a run's task, which name their run: a run that is not the one under way says nothing.
_OF_A_RUN: Final = frozenset({UpstreamRead, RunFailed, EndAsked, RunCancelled, RunClosed})

# ADK's confirmations are asked by one run and answered by the request that starts the next (or
# settled by a deadline, or lost): their bookkeeping is the chat's, whatever its phase. The
# plugin may ask at any time; the machine refuses what no run here can show.
_NATIVE: Final = (
    NativeAnswered, BrowserToolApproved, ConfirmationsSeen, ToolAsked, BrowserAsked, AnswersGoing, AnswersSent, RunWanted,
    RunDropped, AudioHeard, SocketClosed,
)

# (phase, event type) the machine takes. One run at a time: a run that must make way for a new
# one is ended first (EndAsked and RunCancelled, then RunClosed). The plugin asks only while a run runs.
TRANSITIONS: Final[frozenset[tuple[Phase, type]]] = frozenset(
    {(Phase.NEW, kind) for kind in (RunStarts, CallCancelled, DeadlineReached, StateRestored, Attached, Resumed, GateOpened, *_NATIVE)}
    | {(Phase.RUNNING, kind) for kind in (*_RUN_EVENTS, *_NATIVE)}
    | {(Phase.IDLE, kind) for kind in (RunStarts, *_AFTER_RUN, *_NATIVE)}
)


class ChatMachine:
    """The state of one chat's approvals and runs, changed only by `handle`."""

    __slots__ = ("answering", "claimed", "decider", "ending", "ledger", "run", "turn")

    def __init__(self, ledger: Ledger | None = None, *, decider: GateDecider) -> None:
        self.ledger = ledger if ledger is not None else Ledger()
        # Where the plugin's asks are decided: the approvals room's, handed in by the chat. No
        # default: a decider that refused everything would hide a machine built without it.
        self.decider = decider
        # Confirmations whose answer is going out to ADK now (True: the deadline's), by approval
        # id: from here until the ledger records it, no second answer to one goes out. Not state
        # to keep: it lasts one request.
        self.answering: dict[str, bool] = {}
        # The current run's turn, or the last one's once it ended (its client version, message).
        self.turn: Turn | None = None
        # The number of the current (or last) run: how many runs started in this machine.
        self.run = 0
        # A request claimed the chat for a run it is starting (`RunWanted`), not started yet.
        self.claimed = False
        # How the run under way ends once its task is cancelled, if the shell said (`EndAsked`).
        self.ending: Ending | None = None

    @property
    def phase(self) -> Phase:
        if self.turn is None:
            return Phase.NEW
        return Phase.IDLE if self.turn.reported else Phase.RUNNING

    @property
    def running(self) -> bool:
        """A run of this chat is under way."""
        return self.turn is not None and not self.turn.reported

    def under_way(self, run: int) -> bool:
        """Run number `run` is the one under way: what its task says still counts."""
        return run == self.run and self.running

    @property
    def settled(self) -> bool:
        """Nothing of this chat is under way here: no run, none being started. Only a settled
        chat is forgotten when idle, or handed to another replica, and only then may its
        upstream client change."""
        return not self.running and not self.claimed

    @property
    def waiting_on_adk(self) -> bool:
        """Between runs, with ADK confirmations pending: what the chat waits for is in ADK's session."""
        return not self.running and bool(self.ledger.pending_native())

    @property
    def waiting_for_person(self) -> bool:
        return self.running and self.ledger.waiting_for_person

    @property
    def waiting_for_decision(self) -> bool:
        """The run waits for someone's decision: the chatting person's, or approvers' elsewhere."""
        return self.running and self.ledger.gates_open

    def next_deadline(self) -> float | None:
        """When the earliest call still waiting for a person times out; None if none waits."""
        return self.ledger.next_deadline()

    def snapshot(self) -> dict[str, Any]:
        """The chat's state as plain JSON, for `StateRestored` elsewhere: its ledger. A run under
        way is not in it: its upstream stream is a connection of this process, gone with it."""
        return {"v": SNAPSHOT_VERSION, "ledger": self.ledger.snapshot()}

    def handle(self, event: ChatEvent) -> list[Output]:
        """Apply `event`; the outputs to carry out, in order. An event of a run that is not the
        one under way (a run that was made to end) changes nothing."""
        kind = type(event)
        if kind in _OF_A_RUN and event.run is not None and not self.under_way(event.run):  # type: ignore[union-attr]
            return []
        if (self.phase, kind) not in TRANSITIONS:
            raise MachineError(f"a chat that is {self.phase.value} does not take {kind.__name__}")
        return _HANDLERS[kind](self, event)

    # ---- handlers ---------------------------------------------------------------------------

    def _start(self, event: RunStarts) -> list[Output]:
        self.run += 1
        self.claimed, self.ending = False, None
        self.turn = Turn(
            event.message_id, ledger=self.ledger, version=event.version, known_tool_calls=event.known_tool_calls,
            denied_tool_calls=event.denied_tool_calls, delivered_tool_calls=event.delivered_tool_calls,
            policy=event.policy, confirms=event.confirms,
        )
        return self.turn.begin()

    def _cancel(self, event: CallCancelled) -> list[Output]:
        if self.turn is not None:
            return self.turn.cancel(event.call, event.why, event.now)
        return _release_alone(self.ledger, event.call, lambda c: c.cancel(event.why), event.now)

    def _expire(self, event: DeadlineReached) -> list[Output]:
        if self.turn is not None:
            return self.turn.expire(event.now)
        out: list[Output] = []
        for call in self.ledger.unreleased():
            if event.now >= call.deadline:
                out += _release_alone(self.ledger, call, lambda c: c.expire(event.now), event.now)
        return out

    def _show(self, event: GateOpened) -> list[Output]:
        if not self.running:
            return []  # no run here to show it in (it ended while the cluster recorded the call)
        return self._current().show_gate(event.call, event.now)

    def _feed(self, event: UpstreamRead) -> list[Output]:
        return self._current().feed(event.batch, event.now)

    def _attach(self, event: Attached) -> list[Output]:
        if not self.running:
            # The run ended while nobody was attached, and what it wrote last was read: nothing to read.
            return [_refused(410, "these calls were already answered and the run has ended")]
        return self._current().attach()

    def _answer(self, event: Answered) -> list[Output]:
        return self._current().answer(event.decisions, event.outputs, event.now)

    def _approvers_decided(self, event: ApproversDecided) -> list[Output]:
        return self._current().approvers_decided(event.call, event.approved, event.reason, event.now)

    def _confirmation_decided(self, event: ConfirmationDecided) -> list[Output]:
        return self._current().confirmation_decided(event.approval_id, event.approved, event.reason, event.by, event.timed_out)

    def _resume(self, event: Resumed) -> list[Output]:
        if self.turn is None:
            return []  # a run log with no run behind it (a browser tool handed over): nothing held
        return self._current().resume()

    def _settle(self, event: Settled) -> list[Output]:
        return self._current().settle(event.decisions, event.now)

    def _fail(self, event: RunFailed) -> list[Output]:
        return self._current().fail(event.text, event.now)

    def _end_asked(self, event: EndAsked) -> list[Output]:
        self.ending = asked(self.ending, event)
        return []

    def _cancelled(self, event: RunCancelled) -> list[Output]:
        return cancelled(self._current(), self.ending, event.now)

    def _close(self, event: RunClosed) -> list[Output]:
        return self._current().end(event.now)

    def _restore(self, event: StateRestored) -> list[Output]:
        data = event.snapshot
        if not isinstance(data, dict) or data.get("v") != SNAPSHOT_VERSION or set(data) != {"v", "ledger"}:
            raise MalformedLedger(f"not a chat state of version {SNAPSHOT_VERSION}")
        if not self.ledger.empty:
            raise MachineError("a chat state is restored only into a chat that has recorded nothing yet")
        self.ledger = Ledger.restore(data["ledger"])  # raises MalformedLedger: nothing changed then
        # A call left waiting was held by the process that saved the state: its plugin request went
        # with that process, and nobody here can show it. It ends as the end of its run would end it.
        out: list[Output] = []
        for call in self.ledger.unreleased():
            out += _release_alone(self.ledger, call, lambda c: c.cancel("the gateway replica that held it stopped"), event.now)
        return out

    def _asked(self, event: ToolAsked) -> list[Output]:
        """The plugin's ask, decided by the approvals room (the machine's `decider`) against this
        chat; what waits, or what a rule decided, recorded in the ledger (the latter shown to the
        browser at once)."""
        ledger = self.ledger
        view = ChatView(
            self.running, len(ledger.unreleased()), ledger.call(event.tool_call_id), ledger.waiting_for_approvers(),
        )
        decided = self.decider.decide(event, view)
        call = decided.call
        if call is None or decided.again:
            return [decided]
        ledger.add(call)
        if decided.action == "rule":
            return [decided, CallChanged(call, CallState.AWAITING_APPROVAL, 0.0), *self._current().show_decided(call, call.created)]
        return [decided]

    def _native_answered(self, event: NativeAnswered) -> list[Output]:
        ledger = self.ledger
        if event.timed_out:
            return [NativeSettled(event.approval_id, ledger.time_out_native(event.approval_id))]
        return [NativeSettled(event.approval_id, ledger.answer_native(event.approval_id, event.tool_call_id))]

    def _browser_approved(self, event: BrowserToolApproved) -> list[Output]:
        learnt = event.known is not None and not self.ledger.native_pending(event.approval_id)
        confirmation = self.ledger.approve_in_browser(event.approval_id, event.now, event.known, wall=event.wall)
        return [] if confirmation is None else [BrowserApproved(confirmation, learnt)]

    def _seen(self, event: ConfirmationsSeen) -> list[Output]:
        out: list[Output] = []
        for confirmation in self.ledger.pending_native():
            if confirmation.seen_at is None:
                confirmation.seen_at = event.wall
                out.append(ConfirmationSeen(confirmation))
        return out

    def _browser_asked(self, event: BrowserAsked) -> list[Output]:
        answers_only = not event.new_message
        if answers_only and event.native_sent and not (event.native_open or event.answers_gated or event.live):
            if any(self.ledger.native_timed_out(a) for a in event.native_sent):
                return [Admission("late")]  # the gateway answered it at its deadline: read what followed
            # ADK 1.x runs a confirmed tool again for a replayed answer (2.13 ignores it).
            return [_refused(410, "this approval was already answered; send a new message to go on")]
        if answers_only and event.answers_gated:
            return [Admission("continue")]
        if answers_only and not event.native_open:
            return [_refused(400, "nothing in the last assistant message is waiting for an answer")]
        if answers_only and self.running:
            # A run in progress is not paused on an ADK confirmation (those end their run), so these
            # answers match nothing; they must not disturb what the run does wait for.
            return [_refused(410, "this approval is not pending; the chat's current run waits for something else")]
        if event.native_open and event.live:
            # ADK has no confirmations in live mode, and answers sent as function responses would
            # reach the model as tool results: never forward them.
            if answers_only:
                return [_refused(400, "this approval is not pending (ADK confirmations do not exist in live mode)")]
            return [Admission("start", forward_native=False)]
        return [Admission("start")]

    def _answers_going(self, event: AnswersGoing) -> list[Output]:
        taken = [a for a in event.approval_ids if a in self.answering]
        if taken:
            if event.browser and any(self.answering[a] for a in taken):
                return [Admission("late")]  # the deadline's answer is on its way: read its outcome
            return [_refused(409, "this approval is being answered")]
        self.answering.update(zip(event.approval_ids, event.timed_out))
        return [Admission("start")]

    def _answers_sent(self, event: AnswersSent) -> list[Output]:
        for approval_id in event.approval_ids:
            self.answering.pop(approval_id, None)
        return []

    def _run_wanted(self, event: RunWanted) -> list[Output]:
        if (event.open and event.read) or (event.free and (event.open or not self.settled)):
            # One streaming response per chat: two runs on one ADK session would interleave.
            return [_refused(409, "a response is already streaming for this chat")]
        if not self.running:
            self.claimed = self.claimed or event.claim
            return [Admission("start")]
        if event.open and not self.ledger.waiting_for_person:
            # Nobody reads the response any more (the AI SDK's stop() dropped its request and the
            # run went on, `chat.on_disconnect: continue`): the run ends as an abort would end it.
            return [Admission("abort")]
        return [Admission("settle")]  # the person typed instead of answering: release what it waits for

    def _run_dropped(self, event: RunDropped) -> list[Output]:
        self.claimed = False
        return []

    def _audio_heard(self, event: AudioHeard) -> list[Output]:
        # Speech during a turn is the turn's input; between turns it starts one (the person just speaks).
        return [Admission("relay" if event.in_turn or self.running else "start")]

    def _socket_closed(self, event: SocketClosed) -> list[Output]:
        # A live session is a model connection paid for while open, so it is not kept for a browser
        # that left; a run under way outlives the socket (a resume reads it), and closes it at its end.
        if not self.running:
            return [Admission("close")]
        return [Admission("abort" if event.cancel else "wait")]

    def _current(self) -> Turn:
        assert self.turn is not None  # TRANSITIONS lets these in only once a run started
        return self.turn


def _refused(status: int, text: str) -> Admission:
    return Admission("refuse", status=status, text=text)


def _release_alone(ledger: Ledger, call: GatedCall, change: Callable[[GatedCall], bool], now: float) -> list[Output]:
    """Change a call no turn shows (none ran in this chat yet): the plugin still gets its verdict."""
    before, since = call.state, call.waiting_since
    if not change(call):
        return []
    if call.released:
        ledger.closed(call.tool_call_id)
    return [CallChanged(call, before, now - since)]


_HANDLERS: Final[dict[type, Callable[[ChatMachine, Any], list[Output]]]] = {
    RunStarts: ChatMachine._start,
    UpstreamRead: ChatMachine._feed,
    GateOpened: ChatMachine._show,
    Attached: ChatMachine._attach,
    Answered: ChatMachine._answer,
    ApproversDecided: ChatMachine._approvers_decided,
    ConfirmationDecided: ChatMachine._confirmation_decided,
    Resumed: ChatMachine._resume,
    Settled: ChatMachine._settle,
    CallCancelled: ChatMachine._cancel,
    DeadlineReached: ChatMachine._expire,
    RunFailed: ChatMachine._fail,
    EndAsked: ChatMachine._end_asked,
    RunCancelled: ChatMachine._cancelled,
    RunClosed: ChatMachine._close,
    ToolAsked: ChatMachine._asked,
    NativeAnswered: ChatMachine._native_answered,
    BrowserToolApproved: ChatMachine._browser_approved,
    ConfirmationsSeen: ChatMachine._seen,
    StateRestored: ChatMachine._restore,
    BrowserAsked: ChatMachine._browser_asked,
    AnswersGoing: ChatMachine._answers_going,
    AnswersSent: ChatMachine._answers_sent,
    RunWanted: ChatMachine._run_wanted,
    RunDropped: ChatMachine._run_dropped,
    AudioHeard: ChatMachine._audio_heard,
    SocketClosed: ChatMachine._socket_closed,
}
