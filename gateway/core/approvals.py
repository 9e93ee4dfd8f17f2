"""Gateway-owned tool calls that wait for a person: the state machine of one call (sans-IO).

The gateway's ADK plugin asks before a gated tool runs (DESIGN.md decision 3b). The call then waits
for a person's approval, for the browser to run it and send its output, or for both in that order
(a browser tool that needs approval). Every path ends in exactly one `Verdict` for the plugin:
run the tool, or answer the call with this response instead. A call is released once and only
once: a replayed decision, a late output or a timeout after the fact changes nothing.

No clock is read here: callers pass `now`. No I/O either: the turn (core/turn.py) changes calls, and
the plugin's side (chat/gates.py) delivers their verdicts. A call is plain JSON data and back
(`as_json`, `from_json`: a part of its chat's ledger's snapshot, core/ledger_snapshot.py).
"""

from __future__ import annotations

import copy
import secrets
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from ..config.agent import ToolPolicy
from .ledger_snapshot import MalformedLedger, flag, json_object, json_objects, member, number, record, text

__all__ = ["CONFIRM", "REFUSAL_KEY", "CallState", "GatedCall", "Outcome", "Verdict", "new_approval_id", "refusal_code"]

APPROVAL_ID_PREFIX = "gw-"

# Marks a tool response that the plugin or the gateway wrote instead of running the tool, next to
# ADK's `{"error": ...}`; its value says why. Without it a refusal looks like a tool that ran and
# failed, and the converter would count a gated call the plugin refused before the gateway could
# announce it as a bypass. ADK passes a before_tool_callback's dict through as the function
# response unchanged. The plugin (plugin/adk_gateway_plugin) keeps its own copy (it is installed
# without the gateway's modules); tests/unit/test_agent_plugin.py checks that the two agree.
REFUSAL_KEY = "adk_gateway_refusal"


def refusal_code(response: Any) -> str | None:
    """Why the plugin or the gateway answered a call in place of the tool; None for a tool's own result."""
    if isinstance(response, dict) and isinstance(response.get("error"), str):
        code = response.get(REFUSAL_KEY)
        if isinstance(code, str):
            return code
    return None


def new_approval_id() -> str:
    # Unguessable: the id is what the browser sends back to decide.
    return APPROVAL_ID_PREFIX + secrets.token_urlsafe(16)


class CallState(Enum):
    AWAITING_APPROVAL = "awaiting_approval"
    AWAITING_OUTPUT = "awaiting_output"
    RELEASED = "released"


class Outcome(Enum):
    APPROVED = "approved"
    DENIED = "denied"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    OUTPUT = "output"
    OUTPUT_ERROR = "output_error"
    # The plugin stopped waiting before any verdict (its ADK_GATEWAY_MAX_WAIT ran out, the replica
    # holding its request died, a proxy cut it) and answered ADK itself: the tool did not run.
    ABANDONED = "abandoned"


@dataclass(frozen=True)
class Verdict:
    """What the plugin does with the call: let the tool run, or answer with `response`."""

    run: bool
    response: dict[str, Any] | None = None
    # Why the gateway answered at once rather than asking a person (a metrics label).
    reason: str | None = None
    # Neither: the plugin asks ADK's own confirmation of the call (confirm mode, a rule said ask).
    confirm: bool = False
    # With `confirm`: what the plugin asks ADK's confirmation with (the gateway's mark of who
    # answers: approvers), kept in ADK's session with the request and read back by the gateway.
    payload: dict[str, Any] | None = field(default=None, compare=True, hash=False)

    def as_json(self) -> dict[str, Any]:
        if self.confirm:
            return {"verdict": "confirm", "payload": self.payload} if self.payload is not None else {"verdict": "confirm"}
        return {"verdict": "run"} if self.run else {"verdict": "respond", "response": self.response}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Verdict:
        """The verdict `as_json` wrote (passed between replicas); anything else refuses the call."""
        if data.get("verdict") == "run":
            return RUN
        if data.get("verdict") == "confirm":
            payload = data.get("payload")
            return replace(CONFIRM, payload=payload) if isinstance(payload, dict) else CONFIRM
        response = data.get("response")
        return cls(run=False, response=response) if isinstance(response, dict) else cls.refuse("The call was not run.")

    @classmethod
    def refuse(cls, text: str, code: str = "refused") -> Verdict:
        # ADK's own convention for a call that did not run: {"error": ...}; the model reads it.
        # The marker tells the converter that the tool did not run (see REFUSAL_KEY).
        return cls(run=False, response={"error": text, REFUSAL_KEY: code})


RUN = Verdict(run=True)
# The plugin asks ADK's confirmation: a person decides, the request kept in ADK's session.
CONFIRM = Verdict(run=False, reason="confirm", confirm=True)

# Who released a call (ApprovalNotice.source), by its outcome when nobody says otherwise.
_SOURCE_OF = {
    "approved": "person", "denied": "person", "output": "person", "output_error": "person",
    "timeout": "timeout", "cancelled": "cancel", "abandoned": "give_up",
}

_TEXTS = ("id", "user_id", "chat_id", "session_id", "tool_call_id", "tool")
_TIMES = ("created", "deadline", "waiting_since")
_CALL_KEYS = (*_TEXTS, "args", "policy", *_TIMES, "state", "outcome", "verdict", "approved")
# Written since issue 26; a snapshot of an older replica has none of them (read as unset).
_DECISION_KEYS = ("rule", "reason", "decided_by", "approvers", "self_approval", "quorum", "deciders", "shadow")


@dataclass(eq=False)
class GatedCall:
    id: str
    user_id: str
    chat_id: str
    session_id: str
    tool_call_id: str
    tool: str
    args: dict[str, Any]
    policy: ToolPolicy
    created: float
    deadline: float
    state: CallState = CallState.AWAITING_APPROVAL
    outcome: Outcome | None = None
    verdict: Verdict | None = None
    # When the wait that the metrics time started: the approval wait, then the browser's.
    waiting_since: float = 0.0
    approved: bool = field(default=False)
    # The rule of the tool's policy that decided the call (or asked for it), by name.
    rule: str | None = None
    # The reason given with the decision (the rule's, or the person's denial).
    reason: str | None = None
    # Set when a rule decided it: `rule`; an approver through the API: `approver` (else the source
    # follows from the outcome: `source`).
    decided_by: str | None = None
    # Who answers, when not the chatting user: a group of `approvers.groups` (config/approvers.py),
    # whether the requester may answer too, and how many distinct approvers must approve.
    approvers: str | None = None
    self_approval: bool = True
    quorum: int = 1
    # The people who decided it ({"user", "auth"} each), for the audit trail.
    deciders: list[dict[str, str]] = field(default_factory=list)
    # What each shadow rule of the tool would have decided (config/shadow_rules.py), for the audit trail.
    shadow: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def open(
        cls, *, user_id: str, chat_id: str, session_id: str, tool_call_id: str, tool: str,
        args: dict[str, Any], policy: ToolPolicy, now: float, approval_id: str | None = None,
    ) -> GatedCall:
        # A tool with rules waits for a decision first (a rule's, or a person's when one asks).
        state = CallState.AWAITING_APPROVAL if policy.approval or policy.rules else CallState.AWAITING_OUTPUT
        return cls(
            approval_id or new_approval_id(), user_id, chat_id, session_id, tool_call_id, tool, dict(args),
            policy, now, now + policy.timeout, state, waiting_since=now,
        )

    @property
    def released(self) -> bool:
        return self.state is CallState.RELEASED

    @property
    def runs_in_browser(self) -> bool:
        return self.policy.runs_in == "browser"

    # ---- transitions: each returns True when it changed the call ---------------------------

    @property
    def for_approver(self) -> bool:
        """Waits for approvers through the approvals API, not for the chatting user's answer in the chat."""
        return self.approvers is not None and self.state is CallState.AWAITING_APPROVAL

    @property
    def decided_elsewhere(self) -> bool:
        """Decided by a rule or by approvers, not in the chat's stream: the browser holds no answer of its own."""
        return self.decided_by == "rule" or self.approvers is not None

    @property
    def source(self) -> str | None:
        """Who or what released the call (ApprovalNotice.source); None while it waits."""
        if self.outcome is None:
            return None
        return self.decided_by or _SOURCE_OF[self.outcome.value]

    def decide_by_rule(self, approved: bool, rule: str | None, reason: str | None) -> bool:
        """A rule of the tool's policy decided before anyone was asked (`rule`: its name; None
        for the tool's own default). Denied, the model reads the rule's reason."""
        if self.state is not CallState.AWAITING_APPROVAL:
            return False
        self.approved, self.rule, self.reason, self.decided_by = approved, rule, reason, "rule"
        if approved:
            self._release(RUN, Outcome.APPROVED)
        else:
            text = "The gateway's policy refused this tool call; it was not run."
            self._release(Verdict.refuse(f"{text} Reason: {reason}" if reason else text, "denied_by_rule"), Outcome.DENIED)
        return True

    def decide(self, approved: bool, now: float, reason: str | None = None) -> bool:
        """The person's answer. Only the first answer counts."""
        if self.state is not CallState.AWAITING_APPROVAL:
            return False
        self.approved = approved
        if reason:
            self.reason = reason
        if not approved:
            who = "An approver" if self.decided_by == "approver" else "The user"
            text = f"{who} rejected this tool call; it was not run."
            self._release(Verdict.refuse(f"{text} Reason: {reason}" if reason else text, "denied"), Outcome.DENIED)
        elif self.runs_in_browser:
            # Approved: now the browser runs it, with a fresh deadline for that wait.
            self.state = CallState.AWAITING_OUTPUT
            self.waiting_since = now
            self.deadline = now + self.policy.timeout
        else:
            self._release(RUN, Outcome.APPROVED)
        return True

    def deliver_output(self, output: Any = None, error_text: str | None = None) -> bool:
        """The browser ran the tool; its output (or its error) becomes the tool's response."""
        if self.state is not CallState.AWAITING_OUTPUT:
            return False
        if error_text is not None:
            # The tool did run, in the browser, and failed: a result, not a refusal.
            self._release(Verdict(run=False, response={"error": error_text}), Outcome.OUTPUT_ERROR)
        else:
            response = output if isinstance(output, dict) else {"result": output}
            self._release(Verdict(run=False, response=response), Outcome.OUTPUT)
        return True

    def expire(self, now: float) -> bool:
        """Apply the policy's timeout outcome if the deadline has passed."""
        if self.released or now < self.deadline:
            return False
        waited = "approval" if self.state is CallState.AWAITING_APPROVAL else "the browser"
        self._release(Verdict.refuse(f"Timed out waiting for {waited}; the call was not run.", "timeout"), Outcome.TIMEOUT)
        return True

    def cancel(self, why: str) -> bool:
        """Nobody will answer any more (the user moved on, the run or the gateway stopped)."""
        if self.released:
            return False
        self._release(Verdict.refuse(f"The call was cancelled: {why}", "cancelled"), Outcome.CANCELLED)
        return True

    def abandon(self, why: str | None) -> bool:
        """The plugin answered ADK without waiting for a verdict (`why`: its refusal code, if it
        gave one). Nobody takes a verdict any more; the later answer of a person changes nothing."""
        if self.released:
            return False
        self._release(
            Verdict.refuse(f"The plugin stopped waiting ({why or 'no reason given'}); the call was not run.", "abandoned"),
            Outcome.ABANDONED,
        )
        return True

    def _release(self, verdict: Verdict, outcome: Outcome) -> None:
        self.state = CallState.RELEASED
        self.verdict = verdict
        self.outcome = outcome

    # ---- as plain JSON: a part of the chat's ledger's snapshot (core/ledger_snapshot.py) ------

    def as_json(self) -> dict[str, Any]:
        """Every field as plain JSON data (enums by value, the verdict whole); `from_json` reads it back."""
        verdict = self.verdict
        return {
            **{key: getattr(self, key) for key in (*_TEXTS, *_TIMES)}, "args": copy.deepcopy(self.args),
            "policy": self.policy.model_dump(mode="json"), "state": self.state.value,
            "outcome": None if self.outcome is None else self.outcome.value,
            "verdict": None if verdict is None else {
                "run": verdict.run, "response": copy.deepcopy(verdict.response), "reason": verdict.reason,
            },
            "approved": self.approved, "rule": self.rule, "reason": self.reason, "decided_by": self.decided_by,
            "approvers": self.approvers, "self_approval": self.self_approval, "quorum": self.quorum,
            "deciders": copy.deepcopy(self.deciders), "shadow": copy.deepcopy(self.shadow),
        }

    @classmethod
    def from_json(cls, data: Any, where: str = "call") -> GatedCall:
        """The call `as_json` wrote; anything else raises MalformedLedger (no call is made of it)."""
        given = data if isinstance(data, dict) else {}
        fields = record(data, (*_CALL_KEYS, *(k for k in _DECISION_KEYS if k in given)), where)
        try:
            policy = ToolPolicy.model_validate(fields["policy"])
        except ValueError as e:  # pydantic's ValidationError is one
            raise MalformedLedger(f"{where}.policy: not a tool policy ({e.__class__.__name__}: {str(e)[:200]})") from None
        state = member(CallState, fields, "state", where)
        outcome = member(Outcome, fields, "outcome", where, optional=True)
        verdict = None if fields["verdict"] is None else _verdict(fields["verdict"], f"{where}.verdict")
        # Released once, with both its outcome and its verdict; never one without the other.
        if len({state is CallState.RELEASED, outcome is not None, verdict is not None}) != 1:
            raise MalformedLedger(f"{where}: state {state.value}, outcome and verdict do not agree")
        return cls(
            *(text(fields, key, where) for key in _TEXTS), json_object(fields, "args", where), policy,
            number(fields, "created", where), number(fields, "deadline", where), state, outcome, verdict,
            number(fields, "waiting_since", where), flag(fields, "approved", where),
            *(text(fields, key, where, optional=True) if key in fields else None for key in _DECISION_KEYS[:4]),
            flag(fields, "self_approval", where) if "self_approval" in fields else True,
            _quorum(fields, where), _deciders(fields, where), json_objects(fields, "shadow", where),
        )

    # ---- how the browser should see the outcome -----------------------------------------

    @property
    def shown_as_denied(self) -> bool:
        """The browser shows `tool-output-denied` rather than an output or an error."""
        if self.outcome in (Outcome.DENIED, Outcome.CANCELLED):
            return True
        return self.outcome is Outcome.TIMEOUT and self.policy.on_timeout == "deny"


def _quorum(fields: dict[str, Any], where: str) -> int:
    value = fields.get("quorum", 1)
    if type(value) is not int or value < 1:
        raise MalformedLedger(f"{where}.quorum: expected a whole number of at least 1")
    return value


def _deciders(fields: dict[str, Any], where: str) -> list[dict[str, str]]:
    value = fields.get("deciders", [])
    if not isinstance(value, list) or not all(
        isinstance(d, dict) and set(d) == {"user", "auth"} and all(isinstance(v, str) for v in d.values()) for d in value
    ):
        raise MalformedLedger(f"{where}.deciders: expected a list of {{user, auth}}")
    return [dict(d) for d in value]


def _verdict(data: Any, where: str) -> Verdict:
    fields = record(data, ("run", "response", "reason"), where)
    return Verdict(
        flag(fields, "run", where), json_object(fields, "response", where, optional=True),
        text(fields, "reason", where, optional=True),
    )
