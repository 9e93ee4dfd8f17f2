"""A native ADK confirmation a chat's run asked for (`adk_request_confirmation`), as the chat's ledger
keeps it (core/ledger.py): what it asks about, who answers it, and when it was asked and approved.
Plain JSON data and back (`as_json`, `from_json`; the format's checks: core/ledger_snapshot.py)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from .approver_confirmations import ApproverMark, read_mark
from .ledger_snapshot import MalformedLedger, flag, json_object, json_objects, number, record, text

__all__ = ["NativeConfirmation"]


@dataclass(eq=False, slots=True)
class NativeConfirmation:
    """A native ADK confirmation a run asked for."""

    approval_id: str
    tool_call_id: str
    tool: str
    # When the run that asked ended (the metrics time the wait from there); None while it runs.
    asked_at: float | None = None
    # A browser tool's (confirm mode): the browser runs it, and its output answers the confirmation.
    in_browser: bool = False
    # Whether a person approves it first (a browser tool without approval asks nobody).
    approval: bool = True
    # The call's arguments, handed to the browser once approved (a browser tool's).
    args: dict[str, Any] | None = None
    # When the person approved it (a browser tool's: its output is awaited since).
    approved_at: float | None = None

    # When the gateway first saw it pending, on the wall clock (its deadline runs from the later
    # of this and ADK's own time: deadlines.py); None until its deadline is set.
    seen_at: float | None = None
    # When the person approved it, on the wall clock (a browser tool's: its deadline runs from
    # here, deadlines.py); None until then, or when approved where this replica did not see it.
    approved_wall: float | None = None
    # Who answers it when not the chatting person: its approvers, as the gateway marked ADK's
    # confirmation (core/approver_confirmations.py); None: the chatting person.
    mark: ApproverMark | None = None
    # What each shadow rule of the tool would have decided, as the gateway's verdict put it in the
    # confirmation's payload (core/approver_confirmations.py `read_shadow`), for the audit trail.
    shadow: list[dict[str, Any]] = field(default_factory=list)

    @property
    def for_approvers(self) -> bool:
        return self.mark is not None

    @property
    def awaits_output(self) -> bool:
        """A browser tool's that nobody has to approve first, or that was approved."""
        return self.in_browser and (not self.approval or self.approved_at is not None)

    def as_json(self) -> dict[str, Any]:
        """Every field as plain JSON data; `from_json` reads it back."""
        data = {key: copy.deepcopy(getattr(self, key)) for key in _NATIVE_KEYS if key != "mark"}
        data["mark"] = self.mark.as_json() if self.mark is not None else None
        data["shadow"] = copy.deepcopy(self.shadow)
        return data

    @classmethod
    def from_json(cls, data: Any, where: str = "confirmation") -> NativeConfirmation:
        """The confirmation `as_json` wrote; anything else raises MalformedLedger."""
        if isinstance(data, dict) and "mark" not in data:
            data = {**data, "mark": None}  # kept by a replica from before approvers' confirmations
        given = data if isinstance(data, dict) else {}
        fields = record(data, (*_NATIVE_KEYS, *(["shadow"] if "shadow" in given else [])), where)
        mark = fields["mark"]
        if mark is not None and (not isinstance(mark, dict) or read_mark({"adk_gateway": {"approvers": mark}}) is None):
            raise MalformedLedger(f"{where}.mark: expected who answers, got {mark!r:.40}")
        return cls(
            *(text(fields, key, where) for key in ("approval_id", "tool_call_id", "tool")),
            asked_at=number(fields, "asked_at", where, optional=True), in_browser=flag(fields, "in_browser", where),
            approval=flag(fields, "approval", where), args=json_object(fields, "args", where, optional=True),
            approved_at=number(fields, "approved_at", where, optional=True),
            seen_at=number(fields, "seen_at", where, optional=True),
            approved_wall=number(fields, "approved_wall", where, optional=True),
            mark=read_mark({"adk_gateway": {"approvers": mark}}) if mark is not None else None,
            shadow=json_objects(fields, "shadow", where),
        )


_NATIVE_KEYS = (
    "approval_id", "tool_call_id", "tool", "asked_at", "in_browser", "approval", "args", "approved_at", "seen_at",
    "approved_wall", "mark",
)
