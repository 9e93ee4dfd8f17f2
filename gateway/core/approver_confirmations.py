"""Calls its approvers decide, waiting as ADK confirmations (`/run_sse`): the gateway's mark of who answers (sans-IO).

On `/run_sse` a call whose rule (or tool) names approvers is not held in the plugin's request: the
gateway's verdict tells the plugin to ask ADK's confirmation with a payload that says who answers
(`mark`), ADK keeps it in its session with the request (durable, DESIGN.md section 6), and whoever
reads that session later, this replica or another after any restart, reads it back (`read_mark`).
The mark is the gateway's own word, written by it into the verdict and read by it from ADK's
session: the browser never writes it (its answers are refused for such a confirmation, and only
the approvals API's quorum makes the gateway answer ADK).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .message_writer import Chunk

__all__ = [
    "ApproverMark", "decided_chunks", "mark", "marked", "native_approver_part", "read_mark", "read_shadow", "with_shadow",
]

# The namespace of the gateway's keys in a confirmation's payload (core/browser_confirmations.py's).
_NAMESPACE = "adk_gateway"
_KEY = "approvers"
# What the tool's shadow rules would have decided (config/shadow_rules.py), kept with the confirmation
# so that its audit record says it, whichever replica records it.
_SHADOW = "shadow"


@dataclass(frozen=True)
class ApproverMark:
    """Who answers a confirmation: a group of approvers, whether the requester may be one of them,
    how many distinct approvals it takes, and the rule that asked (None: the tool's own setting)."""

    approvers: str
    self_approval: bool = True
    quorum: int = 1
    rule: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"approvers": self.approvers, "self_approval": self.self_approval, "quorum": self.quorum, "rule": self.rule}


def mark(spec: ApproverMark) -> dict[str, Any]:
    """The confirmation's payload that says who answers it."""
    return {_NAMESPACE: {_KEY: spec.as_json()}}


def read_mark(payload: Any) -> ApproverMark | None:
    """Who answers a confirmation, from its payload as ADK keeps it; None: the chatting user (no
    mark, or one this gateway did not write: fail closed is the caller's, see chat/confirmations.py)."""
    ours = payload.get(_NAMESPACE) if isinstance(payload, dict) else None
    spec = ours.get(_KEY) if isinstance(ours, dict) else None
    if not isinstance(spec, dict):
        return None
    group, self_approval, quorum, rule = (spec.get(k) for k in ("approvers", "self_approval", "quorum", "rule"))
    if not isinstance(group, str) or not group:
        return None
    return ApproverMark(
        group,
        self_approval if isinstance(self_approval, bool) else False,
        quorum if isinstance(quorum, int) and not isinstance(quorum, bool) and quorum >= 1 else 1,
        rule if isinstance(rule, str) else None,
    )


def with_shadow(payload: dict[str, Any] | None, findings: tuple[dict[str, Any], ...]) -> dict[str, Any] | None:
    """`payload` (None: none) with the shadow rules' `findings` beside the gateway's other keys; as it was without any."""
    if not findings:
        return payload
    ours = dict((payload or {}).get(_NAMESPACE) or {})
    ours[_SHADOW] = [dict(finding) for finding in findings]
    return {**(payload or {}), _NAMESPACE: ours}


def read_shadow(payload: Any) -> list[dict[str, Any]]:
    """The shadow rules' findings `with_shadow` put in a confirmation's payload (none: [])."""
    ours = payload.get(_NAMESPACE) if isinstance(payload, dict) else None
    found = ours.get(_SHADOW) if isinstance(ours, dict) else None
    return [dict(finding) for finding in found if isinstance(finding, dict)] if isinstance(found, list) else []


def marked(payload: Any) -> bool:
    """Whether a confirmation's payload carries an approvers key at all (even one `read_mark`
    cannot read): such a confirmation is never the chatting user's to answer."""
    ours = payload.get(_NAMESPACE) if isinstance(payload, dict) else None
    return isinstance(ours, dict) and _KEY in ours


def native_approver_part(
    approval_id: str, tool_call_id: str, who: ApproverMark, hint: str | None, state: str = "waiting",
    decided: dict[str, Any] | None = None,
) -> Chunk:
    """The data part of an ADK confirmation its approvers answer, as `_approver_part` of a held call."""
    data: dict[str, Any] = {
        "approvalId": approval_id, "toolCallId": tool_call_id, "state": state, "approvers": who.approvers,
        "quorum": who.quorum,
    }
    if who.rule:
        data["rule"] = who.rule
    if hint:
        data["hint"] = hint
    return {"type": "data-approval", "id": approval_id, "data": {**data, **(decided or {})}}


def decided_chunks(
    confirmation: Any, who: ApproverMark, hint: str | None, approved: bool, reason: str | None, by: tuple[str, ...],
    version: int, timed_out: bool = False,
) -> list[Chunk]:
    """What the chat sees when the approvers decided an ADK confirmation: its part updated to
    `decided` (who, and why), and for ai 7 the decision as the tool part's approval (a request and
    its response), so that its outcome reads as it does after a person's answer."""
    decided: dict[str, Any] = {"approved": approved, "by": list(by)}
    if reason:
        decided["reason"] = reason
    approval_id, tool_call_id = confirmation.approval_id, confirmation.tool_call_id
    if timed_out:  # nobody decided in time: the tool's on_timeout (its outcome comes as ADK's result)
        return [native_approver_part(approval_id, tool_call_id, who, hint, "timeout")]
    out = [native_approver_part(approval_id, tool_call_id, who, hint, "decided", decided)]
    if version >= 7:
        descriptor = {key: value for key, value in (("rule", who.rule), ("approvers", who.approvers)) if value}
        out.append({"type": "tool-approval-request", "approvalId": approval_id, "toolCallId": tool_call_id,
                    "approvalDescriptor": descriptor})
        response: Chunk = {"type": "tool-approval-response", "approvalId": approval_id, "approved": approved}
        if reason:
            response["reason"] = reason
        out.append(response)
    return out
