"""The turns of one live session (`/run_live`) as a state machine (sans-IO): where a turn ends,
whose an event is, and when the next turn may start.

In live mode one ADK socket carries every turn of a chat (upstream/live.py keeps it, its reader
task and the turn's inbox). `LiveTurns` decides; the shell carries out:

- a turn ends at ADK's `turnComplete`, unless the model has not spoken since the last tool
  results: some Live models (Gemini 2.x, per ADK) complete a turn right after a tool call and then
  answer the tool's result in another turn, and that turn is not over yet (`after_tools`);
- an event with no turn in progress (the model speaking up by itself) is dropped and counted: the
  AI SDK has no request to carry it;
- a turn its reader left before its end (the browser stopped it, a new message came while nobody
  read it) is CUT: ADK's model goes on with it, so its remainder is dropped, up to its end, and no
  turn may start until then (the shell's `settle` waits for `CUT_ENDED`): what the next turn
  reads is the answer to its own request;
- the socket closing under a turn fails that turn once its reader has taken what came before
  (`CLOSE_TURN`), and ends a cut one.

States: IDLE (no turn, none cut), IN_TURN (a turn's reader takes the events), ENDED (its end came;
its reader has not left yet, and what arrives meanwhile goes with it, unread), CUT, CLOSING (the
socket closed while a turn's reader is still there) and CLOSED. `TRANSITIONS` is the whole table:
an input it does not list for the state is a `LiveTurnError` (a bug in the shell), raised before
anything changes. Each input returns a `Verdict` for the shell to carry out.

The machine sees parsed events only where it judges them: a turn's events reach it as the turn
iterates them (they are parsed there, lazily), the others as the reader takes them.
"""

from __future__ import annotations

from enum import Enum, IntEnum
from typing import Any, Final, NamedTuple

__all__ = ["TRANSITIONS", "LiveInput", "LiveState", "LiveTurnError", "LiveTurns", "Step", "Verdict", "after_tools"]


class LiveState(Enum):
    IDLE = "idle"
    IN_TURN = "in turn"
    ENDED = "ended"
    CUT = "cut"
    CLOSING = "closing"
    CLOSED = "closed"


class LiveInput(IntEnum):
    """What the shell tells the machine. An IntEnum: looked up on every event of a turn, where an
    Enum's hash (a Python-level call) would cost several times a dict lookup."""

    BEGIN = 1  # a turn is requested
    EVENT = 2  # an event arrived that does not end a turn (`event` tells EVENT from END)
    END = 3  # an event arrived that ends the turn it belongs to
    LEFT = 4  # the turn's reader left, its request having gone out (or it had none)
    WITHDRAWN = 5  # the turn's reader left before its request went out (the send failed)
    CLOSE = 6  # the socket closed


class Verdict(Enum):
    START = "start"  # the turn may start: send its request, read its events
    # Refusals of a turn (BEGIN), worded for the error the caller gets.
    BUSY = "a live turn is already in progress for this chat"
    UNSETTLED = "the live session's previous turn has not ended (settle first)"
    CLOSED = "closed"
    DELIVER = "deliver"  # the turn's event, not its last
    TURN_ENDED = "turn ended"  # the turn's event, and its last: what follows is not the turn's
    DROP = "drop"  # nobody's (no turn in progress): dropped, counted
    DROP_CUT = "drop cut"  # the cut turn's: dropped, counted
    CUT_ENDED = "cut ended"  # the cut turn's end (or the socket's): the next turn may start
    CUT = "cut"  # the turn was left before its end: drop what its inbox holds, and what follows
    CLOSE_TURN = "close turn"  # hand the turn the close after what arrived before it
    NOTHING = "nothing"


class Step(NamedTuple):
    after: LiveState
    verdict: Verdict


S, I, V = LiveState, LiveInput, Verdict
# (state, input) -> (next state, verdict). Anything missing is a LiveTurnError.
TRANSITIONS: Final[dict[tuple[LiveState, LiveInput], Step]] = {
    (S.IDLE, I.BEGIN): Step(S.IN_TURN, V.START),
    (S.IDLE, I.EVENT): Step(S.IDLE, V.DROP),
    (S.IDLE, I.END): Step(S.IDLE, V.DROP),
    (S.IDLE, I.CLOSE): Step(S.CLOSED, V.NOTHING),
    (S.IN_TURN, I.BEGIN): Step(S.IN_TURN, V.BUSY),
    (S.IN_TURN, I.EVENT): Step(S.IN_TURN, V.DELIVER),
    (S.IN_TURN, I.END): Step(S.ENDED, V.TURN_ENDED),
    # ADK's model goes on with a turn whose request went out; one that never went out is nothing.
    (S.IN_TURN, I.LEFT): Step(S.CUT, V.CUT),
    (S.IN_TURN, I.WITHDRAWN): Step(S.IDLE, V.NOTHING),
    (S.IN_TURN, I.CLOSE): Step(S.CLOSING, V.CLOSE_TURN),
    (S.ENDED, I.BEGIN): Step(S.ENDED, V.BUSY),
    (S.ENDED, I.LEFT): Step(S.IDLE, V.NOTHING),
    (S.ENDED, I.CLOSE): Step(S.CLOSED, V.NOTHING),
    (S.CUT, I.BEGIN): Step(S.CUT, V.UNSETTLED),
    (S.CUT, I.EVENT): Step(S.CUT, V.DROP_CUT),
    (S.CUT, I.END): Step(S.IDLE, V.CUT_ENDED),
    # A closed socket ends the cut turn too: nothing more of it can arrive.
    (S.CUT, I.CLOSE): Step(S.CLOSED, V.CUT_ENDED),
    # The turn's reader takes what arrived before the close; its end may be among it.
    (S.CLOSING, I.BEGIN): Step(S.CLOSING, V.BUSY),
    (S.CLOSING, I.EVENT): Step(S.CLOSING, V.DELIVER),
    (S.CLOSING, I.END): Step(S.CLOSED, V.TURN_ENDED),
    (S.CLOSING, I.LEFT): Step(S.CLOSED, V.NOTHING),
    (S.CLOSING, I.WITHDRAWN): Step(S.CLOSED, V.NOTHING),
    (S.CLOSING, I.CLOSE): Step(S.CLOSING, V.NOTHING),
    (S.CLOSED, I.BEGIN): Step(S.CLOSED, V.CLOSED),
    (S.CLOSED, I.LEFT): Step(S.CLOSED, V.NOTHING),
    (S.CLOSED, I.WITHDRAWN): Step(S.CLOSED, V.NOTHING),
    (S.CLOSED, I.CLOSE): Step(S.CLOSED, V.NOTHING),
}
# Each state's row, so that an event looks up by its input alone (no tuple, no Enum hash).
_ROWS: Final[dict[LiveState, dict[LiveInput, Step]]] = {
    state: {move: step for (at, move), step in TRANSITIONS.items() if at is state} for state in LiveState
}
# The states in which a turn's reader is there: the reader task hands it what arrives, unread.
_READER_THERE: Final = frozenset({S.IN_TURN, S.ENDED, S.CLOSING})
del S, I, V
# Read on every event of a turn: an Enum member looked up on its class costs a Python-level call
# (Python 3.11), a module global does not.
_EVENT, _END = LiveInput.EVENT, LiveInput.END
_DELIVER, _TURN_ENDED = Verdict.DELIVER, Verdict.TURN_ENDED


class LiveTurnError(Exception):
    """An input the live session's state does not take (a bug in the shell); nothing was changed."""


class LiveTurns:
    """One live session's turns. `in_turn`: a turn's reader is there (what arrives is handed to
    it, unparsed); `dropped`: how many events were nobody's or a cut turn's."""

    __slots__ = ("_row", "answered", "dropped", "in_turn", "state")

    def __init__(self) -> None:
        self.state = LiveState.IDLE
        self._row = _ROWS[self.state]
        self.in_turn = False
        # Whether the model has spoken since the last tool results, in the turn under way or cut.
        self.answered = True
        self.dropped = 0

    @property
    def cut(self) -> bool:
        return self.state is LiveState.CUT

    def begin(self) -> Verdict:
        """A turn is requested: START, or why not (BUSY, UNSETTLED, CLOSED)."""
        verdict = self._take(LiveInput.BEGIN)
        if verdict is Verdict.START:
            self.answered = True
        return verdict

    def event(self, event: dict[str, Any]) -> Verdict:
        """An event (a parsed dict) arrived, the turn's or nobody's: whose it is, and whether it
        ends the turn (or the cut one)."""
        answered = after_tools(event, self.answered)
        step = self._row.get(_END if answered and event.get("turnComplete") else _EVENT)
        if step is None:
            raise LiveTurnError(f"a live session that is {self.state.value} takes no event")
        self.answered = answered
        after, verdict = step
        if after is not self.state:
            self._go(after)
        if verdict is not _DELIVER and verdict is not _TURN_ENDED:
            self.dropped += 1
        return verdict

    def left(self, sent: bool) -> Verdict:
        """The turn's reader left (its end read, stopped, or failed); `sent`: its request went out."""
        return self._take(LiveInput.LEFT if sent else LiveInput.WITHDRAWN)

    def closed(self) -> Verdict:
        """The socket closed (or its reader stopped for good)."""
        return self._take(LiveInput.CLOSE)

    def _take(self, move: LiveInput) -> Verdict:
        step = self._row.get(move)
        if step is None:
            raise LiveTurnError(f"a live session that is {self.state.value} does not take {move.name}")
        self._go(step.after)
        return step.verdict

    def _go(self, state: LiveState) -> None:
        self.state = state
        self._row = _ROWS[state]
        self.in_turn = state in _READER_THERE


def after_tools(event: dict[str, Any], answered: bool) -> bool:
    """Whether the model has spoken since the last tool results, after this event."""
    content = event.get("content")
    parts = content.get("parts") if isinstance(content, dict) else None
    if not parts:
        return answered
    for part in parts:
        if "functionResponse" in part:
            return False
    if content.get("role") == "model":
        return True
    return answered
