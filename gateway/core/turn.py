"""The turn: one upstream run of a chat, and the person it may wait for, as a state machine (sans-IO).

A `Turn` is what happens between a browser request that starts an agent run and the end of that
run. It takes inputs (upstream events, a gated call the plugin opened, the person's answers and the
browser's tool outputs, a deadline reached, an abort, a failure; the caller supplies the time) and
returns outputs (defined in chat_outputs.py), in order, for the chat's machine (core/chat_machine.py)
to hand to its chat (chat/record.py), which carries them out (chat/carry_out.py):

- `OpenResponse`, `Chunks`, `CloseResponse`: the browser responses the run's chunks go into. A
  run that waits for a person ends its response (`finish` with reason `tool-calls`) so the AI SDK
  can answer, and the answer's request reads the next one;
- `CallChanged`: a gated call moved on; once released, its verdict goes to the plugin;
- `Bypassed`, `UsageSeen`, `NativeAsked`, `RunEnded`: what the metrics and the logs record;
- `Raised`: an error the turn cannot judge (the upstream's or a bug), for the shell to act on.

Its states and the moves between them are in `TRANSITIONS`; an input that its state does not
allow raises `TurnError` and leaves the turn FAILED. The chat's ledger (core/ledger.py) is the one
record of the calls that wait; the turn is the only thing that changes a gated call.

No sockets, no clocks, no asyncio: every input is a method call, every effect an output.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from enum import Enum
from typing import Any, Final

from ..config.agent import ToolPolicy
from .approvals import GatedCall
from .approver_confirmations import decided_chunks
from .converter import Converter
from .ledger import Ledger
from .message_writer import Chunk
from .protocol import ClientVersion
from .chat_outputs import (
    Bypassed, CallChanged, Chunks, CloseResponse, NativeAsked, OpenResponse, Output, Raised, RunEnded, UsageSeen,
)

__all__ = [
    "TRANSITIONS", "CallChanged", "Bypassed", "Chunks", "CloseResponse", "Raised", "Move", "NativeAsked",
    "OpenResponse", "Output", "RunEnded", "Turn", "TurnError", "TurnState", "UsageSeen",
]


class TurnState(Enum):
    STREAMING = "streaming"  # a response is open: chunks go to the browser following it
    WAITING = "waiting"  # the response ended: the run, still open upstream, waits for a person
    # A response is open that no request reads yet: what the run wrote while a person decides (a
    # non-blocking tool's text, a call opened late, a deadline's aftermath). The next request that
    # answers or resumes reads it whole, from its start.
    HELD = "held"
    DONE = "done"  # the run ended; its last response is closed
    FAILED = "failed"  # the run ended on an error the browser was shown
    ABORTED = "aborted"  # the browser stopped it


class Move(Enum):
    WRITE = "write"  # chunks for the browser
    PAUSE = "pause"  # every gated call is shown and one waits for a person
    ATTACH = "attach"  # a request that answers wants a new response to read
    READ = "read"  # a request reads the held response
    END = "end"  # the upstream run ended
    FAIL = "fail"  # the upstream failed, the gateway closed the run, or the turn broke
    ABORT = "abort"  # the browser stopped the response


S, M = TurnState, Move
# (state, move) -> next state. Anything missing is a TurnError.
TRANSITIONS: Final[dict[tuple[TurnState, Move], TurnState]] = {
    (S.STREAMING, M.WRITE): S.STREAMING,
    (S.STREAMING, M.PAUSE): S.WAITING,
    # A response partly lost to the bounded log is finished; the answer reads a whole new one.
    (S.STREAMING, M.ATTACH): S.STREAMING,
    (S.STREAMING, M.END): S.DONE,
    (S.STREAMING, M.FAIL): S.FAILED,
    (S.STREAMING, M.ABORT): S.ABORTED,
    (S.STREAMING, M.READ): S.STREAMING,
    # Late events, calls and deadlines write into one new response, held for the next reader.
    (S.WAITING, M.WRITE): S.HELD,
    (S.WAITING, M.ATTACH): S.STREAMING,
    (S.WAITING, M.END): S.DONE,
    (S.WAITING, M.FAIL): S.FAILED,
    (S.WAITING, M.ABORT): S.ABORTED,
    (S.HELD, M.WRITE): S.HELD,
    (S.HELD, M.READ): S.STREAMING,
    # A reader that resumes while the run still waits gets the held response ended as it would be.
    (S.HELD, M.PAUSE): S.WAITING,
    (S.HELD, M.ATTACH): S.STREAMING,
    (S.HELD, M.END): S.DONE,
    (S.HELD, M.FAIL): S.FAILED,
    (S.HELD, M.ABORT): S.ABORTED,
}
del S, M

_ENDED: Final = frozenset({TurnState.DONE, TurnState.FAILED, TurnState.ABORTED})


class TurnError(Exception):
    """An input the turn's state does not allow (a bug in the caller); the turn is now FAILED."""


_OPEN: Final = OpenResponse()


class Turn:
    """One run of one chat. The response the run starts in is open when the turn is made."""

    __slots__ = ("_outcome", "_reported", "converter", "ledger", "state")

    def __init__(
        self,
        message_id: str,
        *,
        ledger: Ledger,
        version: ClientVersion = 6,
        known_tool_calls: Iterable[str] = (),
        denied_tool_calls: Iterable[str] = (),
        policy: Callable[[str], ToolPolicy] | None = None,
        confirms: Callable[[str], bool] | None = None,
        delivered_tool_calls: Iterable[str] = (),
    ) -> None:
        ledger.begin_run(denied_tool_calls, delivered_tool_calls)
        self.ledger = ledger
        self.converter = Converter(message_id, version, known_tool_calls, policy, ledger, confirms)
        self.state = TurnState.STREAMING
        self._outcome = "completed"
        self._reported = False

    @property
    def ended(self) -> bool:
        return self.state in _ENDED

    @property
    def waiting_for_person(self) -> bool:
        return self.ledger.waiting_for_person

    @property
    def reported(self) -> bool:
        """`end` reported how the run ended: the run is over for its chat."""
        return self._reported

    def _move(self, move: Move) -> None:
        after = TRANSITIONS.get((self.state, move))
        if after is None:
            before, self.state = self.state, TurnState.FAILED
            raise TurnError(f"{move.value} is not possible while the turn is {before.value}")
        self.state = after

    # ---- inputs ----------------------------------------------------------------------------

    def begin(self) -> list[Output]:
        """The first chunk of the run's first response."""
        return [Chunks(self.converter.start())]

    def feed(self, batch: Iterable[dict[str, Any]], now: float) -> list[Output]:
        """Upstream events (one read's worth). A run waiting for a person ends its response right
        after the event that made it wait, as if that event had come alone."""
        if self.ended:
            self._move(Move.WRITE)
        out: list[Output] = []
        converter, ledger = self.converter, self.ledger
        chunks: list[Chunk] = []
        # Only a shown gate lets an event make the run wait (events open none): else no check.
        gated = ledger.gates_open
        try:
            for event in batch:
                chunks += converter.feed(event)
                if gated and ledger.waiting_for_person:
                    self._flush(out, chunks, now)
                    chunks = []
        except Exception as exc:  # noqa: BLE001 - handed back: the shell knows what each error means
            self._flush(out, chunks, now)
            out.append(Raised(exc))
            return out
        self._flush(out, chunks, now)
        return out

    def show_gate(self, call: GatedCall, now: float) -> list[Output]:
        """The plugin opened `call` (already in the ledger): show it to the browser, once."""
        if self.ended or call.released or self.ledger.is_open(call.tool_call_id):
            return []
        out: list[Output] = []
        self.ledger.shown(call)
        self._flush(out, self.converter.show_gate(call), now)
        return out

    def show_decided(self, call: GatedCall, now: float) -> list[Output]:
        """A rule decided `call` (already in the ledger, released) before anyone was asked: show
        the decision. Nobody waits for it, so the response goes on."""
        if self.ended:
            return []
        out: list[Output] = []
        self.ledger.shown(call)
        self._flush(out, self.converter.show_decided(call), now)
        return out

    def attach(self) -> list[Output]:
        """A request that answers wants a response to read: a new one. One still being written
        (its start already lost to the bounded log) is finished first, so both are whole."""
        out: list[Output] = []
        if self.state in (TurnState.STREAMING, TurnState.HELD):
            out += [Chunks(self.converter.finish()), CloseResponse(waiting=False)]
        self._move(Move.ATTACH)
        return [*out, _OPEN, Chunks(self.converter.start())]

    def answer(
        self,
        decisions: Iterable[tuple[GatedCall, bool, str | None]],
        outputs: Iterable[tuple[GatedCall, Any, str | None]],
        now: float,
    ) -> list[Output]:
        """The person's decisions (call, approved, reason) and the browser's tool outputs (call,
        output, error text), applied as one: the response does not end between two of them. An
        answer to a call already released changes nothing (only the first answer counts). The
        request reads the held response, if there is one."""
        out: list[Output] = []
        if self.state is TurnState.HELD:
            self._move(Move.READ)
        self._decide(out, decisions, now)
        for call, output, error_text in outputs:
            self._change(out, call, lambda c, o=output, e=error_text: c.deliver_output(o, e), now)
        self._pause(out)
        return out

    def approvers_decided(self, call: GatedCall, approved: bool, reason: str | None, now: float) -> list[Output]:
        """Approvers decided `call` through the approvals API. Nobody in the chat answered: the
        response goes on where it is (its reader, if any, sees the outcome)."""
        out: list[Output] = []
        self._decide(out, [(call, approved, reason)], now)
        self._pause(out)
        return out

    def confirmation_decided(
        self, approval_id: str, approved: bool, reason: str | None, by: tuple[str, ...], timed_out: bool = False,
    ) -> list[Output]:
        """Approvers decided an ADK confirmation this run asked: its part says so (ai 7: with the
        approval pair), and the run goes on with ADK's answer to it."""
        asked = self.ledger.answer_asked(approval_id, denied=not approved and not timed_out and self.converter.version >= 7)
        if asked is None or asked.mark is None:
            return []
        hint = self.converter.policy(asked.tool).hint if self.converter.policy is not None else None
        out: list[Output] = []
        self._write(out, decided_chunks(asked, asked.mark, hint, approved, reason, by, self.converter.version, timed_out))
        return out

    def resume(self) -> list[Output]:
        """A reconnecting browser reads the held response: ended with `tool-calls` if the run still
        waits for a person (so the AI SDK can answer), else followed as it streams on."""
        if self.state is not TurnState.HELD:
            return []
        if not self.ledger.waiting_for_person:
            self._move(Move.READ)
            return []
        self._move(Move.PAUSE)
        return [Chunks(self.converter.finish()), CloseResponse(waiting=True)]

    def settle(self, decisions: Iterable[tuple[GatedCall, bool, str | None]], now: float) -> list[Output]:
        """The person sent a new message instead of answering: the decisions they did make count,
        every other call is cancelled, so the run can end."""
        out: list[Output] = []
        self._decide(out, decisions, now)
        for call in self.ledger.unreleased():
            self._change(out, call, lambda c: c.cancel("the user sent a new message instead of answering"), now)
        self._pause(out)
        return out

    def cancel(self, call: GatedCall, why: str, now: float) -> list[Output]:
        out: list[Output] = []
        self._change(out, call, lambda c: c.cancel(why), now)
        self._pause(out)
        return out

    def expire(self, now: float) -> list[Output]:
        """Apply the deadlines that passed by `now`."""
        out: list[Output] = []
        for call in self.ledger.unreleased():
            if now >= call.deadline:
                self._change(out, call, lambda c: c.expire(now), now)
        self._pause(out)
        return out

    def fail(self, text: str, now: float, *, outcome: str = "error") -> list[Output]:
        """The run cannot go on (the upstream failed, the gateway closes it): say so, end it."""
        if self.ended:
            return []
        out: list[Output] = []
        self._write(out, self.converter.error(text))
        self._outcome = outcome
        self._close(out, Move.FAIL, now)
        return out

    def abort(self, now: float) -> list[Output]:
        """The browser stopped the response: the run ends with an `abort` chunk and no `finish`."""
        if self.ended:
            return []
        out: list[Output] = []
        self._write(out, self.converter.abort())
        self._outcome = "cancelled"
        self._close(out, Move.ABORT, now)
        return out

    def end(self, now: float) -> list[Output]:
        """The upstream run is over (whatever ended it): close the last response, cancel what
        still waits, and report how the run ended. Only the first call reports."""
        out: list[Output] = []
        if not self.ended:
            self._close(out, Move.FAIL if self.converter.failed else Move.END, now)
        if self._reported:
            return out
        self._reported = True
        asked = self.ledger.settle_asked(now)
        out += [NativeAsked(c) for c in asked]
        if self._outcome == "completed" and self.converter.failed:
            self._outcome = "error"
        elif self._outcome == "completed" and self.ledger.asking:
            self._outcome = "waiting"
        out.append(RunEnded(self._outcome))
        return out

    # ---- internals -------------------------------------------------------------------------

    def _write(self, out: list[Output], chunks: list[Chunk]) -> None:
        if not chunks:
            return
        if self.state is TurnState.WAITING:
            self._move(Move.WRITE)
            out.append(_OPEN)
            out.append(Chunks(self.converter.start() + chunks))
            return
        self._move(Move.WRITE)
        out.append(Chunks(chunks))

    def _flush(self, out: list[Output], chunks: list[Chunk], now: float) -> None:
        """Write chunks, end what the converter found ended, and pause if the run now waits."""
        self._write(out, chunks)
        converter = self.converter
        if converter.bypassed:
            out += [Bypassed(tool) for tool in converter.bypassed]
            converter.bypassed.clear()
        if converter.usage_seen:
            out += [UsageSeen(model, usage) for model, usage in converter.usage_seen]
            converter.usage_seen.clear()
        if converter.abandoned:
            # Taken before acting: ending a call writes again, which must find the list empty.
            abandoned, converter.abandoned = converter.abandoned, []
            for tool_call_id, code in abandoned:
                call = self.ledger.call(tool_call_id)
                if call is not None:
                    self._change(out, call, lambda c, why=code: c.abandon(why), now, reason=code)
        self._pause(out)

    def _decide(self, out: list[Output], decisions: Iterable[tuple[GatedCall, bool, str | None]], now: float) -> None:
        for call, approved, reason in decisions:
            self._change(out, call, lambda c, a=approved, r=reason: c.decide(a, now, r), now)

    def _pause(self, out: list[Output]) -> None:
        if self.state is TurnState.STREAMING and self.ledger.waiting_for_person:
            out.append(Chunks(self.converter.finish()))
            out.append(CloseResponse(waiting=True))
            self._move(Move.PAUSE)

    def _change(
        self, out: list[Output], call: GatedCall, change: Callable[[GatedCall], bool], now: float, reason: str | None = None
    ) -> bool:
        before, since = call.state, call.waiting_since
        if not change(call):
            return False
        if call.released:
            self.ledger.closed(call.tool_call_id)
        out.append(CallChanged(call, before, now - since, reason))
        if not self.ended:
            self._write(out, self.converter.gate_moved(call))
        return True

    def _close(self, out: list[Output], move: Move, now: float) -> None:
        for call in self.ledger.unreleased():
            self._change(out, call, lambda c: c.cancel("the agent run ended"), now)
        if self.state in (TurnState.STREAMING, TurnState.HELD):
            finish = self.converter.finish()
            if finish:
                out.append(Chunks(finish))
        out.append(CloseResponse(waiting=False))
        self._move(move)
