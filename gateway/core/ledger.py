"""The ledger: the one record of a chat's tool calls that wait, or waited, for a person.

One ledger per chat. It holds both kinds of approval (DESIGN.md decision 3):
- gateway-gated calls (the plugin's: approvals and browser tools), from the moment the model's
  output shows a gated tool ("expected": the plugin has not asked yet), through the plugin opening
  the call and the browser being shown it ("open"), to its release with a verdict. Released calls
  stay, so a replayed answer or a late browser output finds what became of its call;
- native ADK confirmations (`adk_request_confirmation`): asked by one run, answered by the request
  that starts the next; answered ones are remembered (bounded) so a replay never reaches ADK twice.
  In confirm mode a browser tool's call is one too (`in_browser`): approved, it waits for the
  browser's output, which answers it.

What a run asked or was told (the gated calls it expects, the confirmations it asked, the calls the
person denied in the request that started it) is reset by `begin_run`: a chat runs one run at a time.

Sans-IO: no clock (callers pass `now`), no I/O, no asyncio. The turn (core/turn.py) changes it; the chat
service looks answers up in it; the converter asks it how to show a call. Its state is plain JSON
data and back (`snapshot`, `restore`; the format's checks: core/ledger_snapshot.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

from .approvals import GatedCall, Outcome
from .ledger_snapshot import SNAPSHOT_VERSION, MalformedLedger, indices, items, keyed, names, record, refer
from .native_confirmation import NativeConfirmation

__all__ = ["Ledger", "MalformedLedger", "NativeConfirmation"]

# Answered native confirmations a chat remembers; older ones are looked up in ADK's session.
_ANSWERED_KEPT = 256


# The ledger's sets of names (dicts of None), under their snapshot's keys (the field is `_` + key).
_NAME_SETS = ("current", "expected", "confirmable", "seen", "denied", "delivered", "timed_out")
_SNAPSHOT_KEYS = ("v", "calls", "by_approval", "open", *_NAME_SETS, "confirmations", "asking", "native", "answered")
# Every map of a ledger, and those a new run starts empty.
_RUN_MAPS = ("_expected", "_confirmable", "_seen", "_current", "_asking", "_denied", "_delivered")
_MAPS = frozenset((*_RUN_MAPS, "_calls", "_by_approval", "_open", "_native", "_answered", "_timed_out"))


class Ledger:
    # A chat keeps its ledger for as long as it is remembered: dicts (64 bytes empty), not sets (216).
    __slots__ = (
        "_answered", "_asking", "_by_approval", "_calls", "_confirmable", "_current", "_delivered", "_denied", "_expected",
        "_native", "_open", "_seen", "_timed_out",
    )

    # Each map is made at its first use (`__getattr__`), not here: a chat that never gates a
    # call (most of them) kept 13 empty dicts, 832 bytes, for as long as it was remembered.
    _calls: dict[str, GatedCall]  # every gated call opened in this chat, by tool call id
    _by_approval: dict[str, GatedCall]
    _open: dict[str, GatedCall]  # shown to the browser and not released
    _current: dict[str, None]  # this run: the gated calls opened in it
    _expected: dict[str, None]  # this run: gated calls in the model's output the plugin has not opened
    # This run: gated calls ADK is to confirm (`upstream.approvals: confirm`) that it has not
    # asked about yet. Unlike `_expected`, they do not hold back a pause: ADK asks only once
    # every call of the model's event returned, a browser tool's too.
    _confirmable: dict[str, None]
    _seen: dict[str, None]  # this run: every gated call it showed (expected once at most)
    _denied: dict[str, None]  # this run: tool calls the person denied natively
    # This run: tool calls whose output the browser sent as their confirmation's answer.
    _delivered: dict[str, None]
    _asking: dict[str, NativeConfirmation]  # this run: native confirmations asked, by tool call id
    _native: dict[str, NativeConfirmation]  # asked, not answered, by approval id
    _answered: dict[str, str]  # answered native approval ids (-> tool call id), oldest first
    _timed_out: dict[str, None]  # of those, the ones the gateway answered at their deadline

    def __getattr__(self, name: str) -> Any:
        # Only reached for a map not made yet (a set slot is found before this is asked).
        if name not in _MAPS:
            raise AttributeError(name)
        made: dict[str, Any] = {}
        object.__setattr__(self, name, made)
        return made

    def begin_run(self, denied: Iterable[str] = (), delivered: Iterable[str] = ()) -> None:
        """A new run starts in the chat; `denied`: tool calls whose native confirmation it denies;
        `delivered`: tool calls whose confirmation it answers with the browser's output."""
        for name in _RUN_MAPS:
            with contextlib.suppress(AttributeError):  # not made yet
                delattr(self, name)  # made again at its next use, empty
        if denied:
            self._denied = dict.fromkeys(denied)
        if delivered:
            self._delivered = dict.fromkeys(delivered)

    @property
    def empty(self) -> bool:
        """Nothing was ever recorded here (a new ledger): no call, confirmation or answer."""
        return not (self._calls or self._asking or self._native or self._answered or self._timed_out)

    # ---- gated calls -----------------------------------------------------------------------

    def add(self, call: GatedCall) -> GatedCall:
        """Record a call the plugin opened, or return the one already recorded for its tool call."""
        existing = self._calls.get(call.tool_call_id)
        if existing is not None:
            return existing
        self._calls[call.tool_call_id] = call
        self._by_approval[call.id] = call
        self._current[call.tool_call_id] = None
        return call

    def of_current_run(self, call: GatedCall) -> bool:
        """The call was opened in the chat's current (or last) run, not in one before it."""
        return call.tool_call_id in self._current

    def call(self, tool_call_id: str) -> GatedCall | None:
        return self._calls.get(tool_call_id)

    def by_approval(self, approval_id: str) -> GatedCall | None:
        return self._by_approval.get(approval_id)

    def calls(self) -> list[GatedCall]:
        return list(self._calls.values())

    def unreleased(self) -> list[GatedCall]:
        return [c for c in self._calls.values() if not c.released]

    def next_deadline(self) -> float | None:
        """When the earliest call not released times out; None if none waits. Asked after every
        event of a chat: no list, and nothing to walk in a chat that never gated a call."""
        if not self._calls:
            return None
        return min((c.deadline for c in self._calls.values() if not c.released), default=None)

    def expect(self, tool_call_id: str, *, confirmed_by_adk: bool = False) -> None:
        """The model's output shows a gated call: the run waits until the plugin opens it, or,
        `confirmed_by_adk`, expects ADK to ask its confirmation (without waiting for that)."""
        if tool_call_id not in self._seen:
            self._seen[tool_call_id] = None
            call = self._calls.get(tool_call_id)
            # One released before it could be shown (cancelled, decided early) is never shown: no wait for it.
            if tool_call_id not in self._open and (call is None or not call.released):
                (self._confirmable if confirmed_by_adk else self._expected)[tool_call_id] = None

    def expected(self, tool_call_id: str) -> bool:
        """Neither opened by the plugin nor confirmed by ADK yet: a result now ran unasked."""
        return tool_call_id in self._expected or tool_call_id in self._confirmable

    def shown(self, call: GatedCall) -> None:
        """The browser was shown the call: while it is not released, the run waits for a person."""
        self._seen[call.tool_call_id] = None
        self._expected.pop(call.tool_call_id, None)
        # A plugin that blocks (live, or from before confirm mode) opened a call ADK was to confirm.
        self._confirmable.pop(call.tool_call_id, None)
        if not call.released:
            self._open[call.tool_call_id] = call

    def is_open(self, tool_call_id: str) -> bool:
        return tool_call_id in self._open

    def closed(self, tool_call_id: str) -> None:
        """The call no longer waits: released, or answered by ADK without a verdict."""
        self._open.pop(tool_call_id, None)
        self._expected.pop(tool_call_id, None)
        self._confirmable.pop(tool_call_id, None)

    def answered_unexpectedly(self, tool_call_id: str) -> None:
        """ADK answered a call the run expected the plugin to open or ADK to confirm (nobody asked)."""
        self._expected.pop(tool_call_id, None)
        self._confirmable.pop(tool_call_id, None)

    @property
    def gates_open(self) -> bool:
        """Some call shown to the browser is not released. Only showing a call opens one, so
        while this is false no upstream event can make the run wait for a person."""
        return bool(self._open)

    @property
    def waiting_for_person(self) -> bool:
        """Every gated call the run expects was shown, and at least one waits for the chatting
        person's answer (one that waits for approvers elsewhere does not end the response)."""
        return bool(self._open) and not self._expected and any(not c.for_approver for c in self._open.values())

    def concerns(self, tool_call_id: str) -> bool:
        """Whether a gated call, an expectation, a native confirmation or a native denial concerns
        the tool call. When none does (an ungated tool, the usual case) its function response is a
        plain result: one check instead of the five below."""
        return (
            tool_call_id in self._calls or tool_call_id in self._expected or tool_call_id in self._asking
            or tool_call_id in self._denied or tool_call_id in self._confirmable or tool_call_id in self._delivered
        )

    def shown_as_denied(self, tool_call_id: str, *, automatic_too: bool = True) -> bool:
        """`tool-output-denied` for the call; one decided by a rule or by approvers only
        `automatic_too` (ai 6 holds a denied part only with the person's approval response, which
        such a decision has not)."""
        if tool_call_id in self._denied:
            return True
        call = self._calls.get(tool_call_id)
        return call is not None and call.released and call.shown_as_denied and (automatic_too or not call.decided_elsewhere)

    def answered_in_browser(self, tool_call_id: str) -> bool:
        """The browser produced the call's output itself: ADK's echo of it is not news to it."""
        if tool_call_id in self._delivered:
            return True
        call = self._calls.get(tool_call_id)
        return call is not None and call.outcome in (Outcome.OUTPUT, Outcome.OUTPUT_ERROR)

    # ---- native confirmations --------------------------------------------------------------

    def ask(self, confirmation: NativeConfirmation) -> None:
        """The run asked ADK's confirmation of a call (the converter saw it)."""
        self._asking[confirmation.tool_call_id] = confirmation
        # A gated call confirmed this way is never opened by the plugin's blocking path: the run
        # must not wait for it to be.
        self._expected.pop(confirmation.tool_call_id, None)
        self._confirmable.pop(confirmation.tool_call_id, None)

    def confirming(self, tool_call_id: str) -> bool:
        """This run asked a confirmation of the call: ADK's placeholder response is bookkeeping."""
        return tool_call_id in self._asking

    @property
    def asking(self) -> bool:
        return bool(self._asking)

    def asked_for_approvers(self) -> list[NativeConfirmation] | None:
        """The confirmations this run asked that its approvers answer; None if it also asked one of
        the chatting person (the run ends for their answer, as always)."""
        asked = list(self._asking.values())
        return None if any(not c.for_approvers for c in asked) else asked

    def waiting_for_approvers(self) -> int:
        """The confirmations its approvers answer that wait in this chat: asked by this run, or
        pending since an earlier one (the chat's cap of waiting calls counts them)."""
        return len({c.approval_id for c in (*self._asking.values(), *self._native.values()) if c.for_approvers})

    def answer_asked(self, approval_id: str, denied: bool) -> NativeConfirmation | None:
        """Approvers answered a confirmation this run asked, and the run goes on with their answer
        (`denied`: its call shows as denied). Returns it if it was still asked."""
        found = next((c for c in self._asking.values() if c.approval_id == approval_id), None)
        if found is None:
            return None
        del self._asking[found.tool_call_id]
        self._answered[approval_id] = found.tool_call_id
        if denied:
            self._denied[found.tool_call_id] = None
        return found

    def settle_asked(self, now: float) -> list[NativeConfirmation]:
        """The run ended: its confirmations now wait for the person; returns those newly pending."""
        new = []
        for confirmation in self._asking.values():
            if confirmation.approval_id not in self._native and confirmation.approval_id not in self._answered:
                confirmation.asked_at = now
                self._native[confirmation.approval_id] = confirmation
                new.append(confirmation)
        return new

    def knows_native(self, approval_id: str) -> bool:
        """Pending or answered here; an unknown one is ADK's session's to say."""
        return approval_id in self._native or approval_id in self._answered

    def native_pending(self, approval_id: str) -> bool:
        return approval_id in self._native

    def native_answered(self, approval_id: str) -> bool:
        return approval_id in self._answered

    def answer_native(self, approval_id: str, tool_call_id: str = "") -> NativeConfirmation | None:
        """Record an answer forwarded to ADK; returns the confirmation if it was pending here."""
        pending = self._native.pop(approval_id, None)
        self._answered[approval_id] = pending.tool_call_id if pending is not None else tool_call_id
        if len(self._answered) > _ANSWERED_KEPT:
            del self._answered[next(iter(self._answered))]
        return pending

    def native(self, approval_id: str) -> NativeConfirmation | None:
        """The pending native confirmation `approval_id`, if this chat asked it."""
        return self._native.get(approval_id)

    def native_of_call(self, tool_call_id: str) -> NativeConfirmation | None:
        """The pending native confirmation of a tool call, if this chat asked one."""
        return next((c for c in self._native.values() if c.tool_call_id == tool_call_id), None)

    def answered_of_call(self, tool_call_id: str) -> str | None:
        """The approval id of the answered native confirmation of a tool call, if remembered."""
        return next((a for a, call in self._answered.items() if call == tool_call_id), None)

    def approve_in_browser(
        self, approval_id: str, now: float, known: NativeConfirmation | None = None, *, wall: float | None = None,
    ) -> NativeConfirmation | None:
        """The person approved a pending browser tool's confirmation, at `now` (and `wall` on the
        wall clock); its output is awaited now. Returns it the first time only (a replayed approval
        changes nothing). `known`: the confirmation as ADK's session shows it, taken in when this
        ledger lacks it and never answered it (the replica that asked died before the chat's state
        was kept): from here this ledger is the only record of the approval, which ADK hears of
        only with the output, and an output that does not repeat it (AG-UI's tool message) is
        matched by it."""
        pending = self._native.get(approval_id)
        if pending is None and known is not None and known.in_browser and approval_id not in self._answered:
            pending = self._native[approval_id] = known
        if pending is None or not pending.in_browser or pending.approved_at is not None:
            return None
        pending.approved_at = now
        if wall is not None:
            pending.approved_wall = wall
        return pending

    def time_out_native(self, approval_id: str) -> NativeConfirmation | None:
        """Record the gateway's answer to a confirmation whose deadline passed (`answer_native`,
        remembered as a timeout so that the person's late answer is told so)."""
        self._timed_out[approval_id] = None
        if len(self._timed_out) > _ANSWERED_KEPT:
            del self._timed_out[next(iter(self._timed_out))]
        return self.answer_native(approval_id)

    def native_timed_out(self, approval_id: str) -> bool:
        return approval_id in self._timed_out

    def pending_native(self) -> list[NativeConfirmation]:
        return list(self._native.values())

    # ---- as plain JSON ---------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The ledger's state as plain JSON data; `restore` makes an equal ledger of it. Each call
        (by tool call id) and each confirmation (by position) is written once and named by the
        maps that hold it, so the restored maps share them as these do. Every map is a list in its
        order: the bounded ones forget the oldest first. A call the ledger shows is its own (`add`)."""
        confirmations: dict[int, NativeConfirmation] = {}  # the same one may be asked and pending
        for confirmation in (*self._asking.values(), *self._native.values()):
            confirmations.setdefault(id(confirmation), confirmation)
        position = {key: n for n, key in enumerate(confirmations)}
        return {
            "v": SNAPSHOT_VERSION,
            "calls": [call.as_json() for call in self._calls.values()],
            "by_approval": [call.tool_call_id for call in self._by_approval.values()],
            "open": list(self._open),
            **{key: list(getattr(self, "_" + key)) for key in _NAME_SETS},
            "confirmations": [confirmation.as_json() for confirmation in confirmations.values()],
            "asking": [position[id(c)] for c in self._asking.values()],
            "native": [position[id(c)] for c in self._native.values()],
            "answered": [[approval_id, tool_call_id] for approval_id, tool_call_id in self._answered.items()],
        }

    @classmethod
    def restore(cls, data: Any) -> Ledger:
        """The ledger `snapshot` wrote. Anything else (a key missing or unknown, a value of the wrong
        type, a name of a call or confirmation that is not there, another version) raises
        `MalformedLedger`: fail closed, no ledger is made of it."""
        version = data.get("v") if isinstance(data, dict) else None
        if type(version) is not int or version != SNAPSHOT_VERSION:
            raise MalformedLedger(f"not a ledger snapshot of version {SNAPSHOT_VERSION} (v: {version!r:.60})")
        fields = record(data, _SNAPSHOT_KEYS, "ledger")
        ledger = cls()
        calls = [GatedCall.from_json(raw, f"ledger.calls[{n}]") for n, raw in enumerate(items(fields, "calls", "ledger"))]
        ledger._calls = keyed(calls, lambda call: call.tool_call_id, "ledger.calls")
        by_approval = refer(names(fields, "by_approval", "ledger"), ledger._calls, "ledger.by_approval")
        ledger._by_approval = keyed(by_approval, lambda call: call.id, "ledger.by_approval")
        shown = refer(names(fields, "open", "ledger"), ledger._calls, "ledger.open")
        ledger._open = {call.tool_call_id: call for call in shown}
        for key in _NAME_SETS:
            most = _ANSWERED_KEPT if key == "timed_out" else None
            setattr(ledger, "_" + key, dict.fromkeys(names(fields, key, "ledger", most=most)))
        refer(list(ledger._current), ledger._calls, "ledger.current")  # the calls this run opened are recorded
        ledger._restore_native(fields)
        return ledger

    def _restore_native(self, fields: dict[str, Any]) -> None:
        raw = items(fields, "confirmations", "ledger")
        pool = [NativeConfirmation.from_json(c, f"ledger.confirmations[{n}]") for n, c in enumerate(raw)]
        self._asking = keyed(indices(fields, "asking", "ledger", pool), lambda c: c.tool_call_id, "ledger.asking")
        self._native = keyed(indices(fields, "native", "ledger", pool), lambda c: c.approval_id, "ledger.native")
        if len({id(c) for c in (*self._asking.values(), *self._native.values())}) != len(pool):
            raise MalformedLedger("ledger.confirmations: one that is neither asked nor pending")
        answered = items(fields, "answered", "ledger", most=_ANSWERED_KEPT)
        for n, pair in enumerate(answered):
            if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(name, str) for name in pair)):
                raise MalformedLedger(f"ledger.answered[{n}]: expected [approval id, tool call id]")
        by_id = keyed(answered, lambda pair: pair[0], "ledger.answered")
        self._answered = {approval_id: pair[1] for approval_id, pair in by_id.items()}
