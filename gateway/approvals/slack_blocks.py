"""The Slack messages of an approval (Block Kit): what approvers see while it waits, with Approve and
Deny buttons, and what the message becomes once it is decided or expires (no buttons).

Pure: a notice (approvals/notice.py), the facts the approvals API lists with it (quorum, deadline,
hint) and how users may be shown in, a `chat.postMessage` / `chat.update` body out. The arguments
are shown only when the channel's `include_args` says so, as a webhook's body carries them; else
their keyed digest. The requester is shown as `logging.user_id` writes user ids (the caller passes
that rule in): a hashed id stays hashed, an omitted one is not shown.

A button's `value` is the approval id, its `action_id` the answer (`ACTION_APPROVE`, `ACTION_DENY`):
that is all a press carries back (edge/slack.py), so nothing in the message decides anything.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from .notice import ApprovalNotice, Approver

__all__ = ["ACTION_APPROVE", "ACTION_DENY", "Facts", "ended_message", "waiting_message"]

ACTION_APPROVE = "adk_gateway.approve"
ACTION_DENY = "adk_gateway.deny"
# Block Kit's limits: a section's text 3000 characters, a field's 2000, a header's 150.
_TEXT_MAX = 2800
_FIELD_MAX = 1900
_HEADER_MAX = 150

# How a notice's outcome reads, after "Approved"/"Denied" or for an approval nobody decided.
_ENDED = {
    "approved": "Approved", "denied": "Denied", "timeout": "Expired: nobody decided before the deadline",
    "cancelled": "Cancelled: the chat or its run ended first", "abandoned": "Abandoned: the agent stopped waiting",
}


@dataclass(frozen=True, slots=True)
class Facts:
    """What the approvals API lists with an approval and a notice does not carry."""

    group: str
    quorum: int
    # Wall-clock seconds (UNIX time).
    deadline: float
    hint: str | None = None


def _escape(text: str) -> str:
    # mrkdwn reads these three as markup (api.slack.com/reference/surfaces/formatting#escaping).
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _field(label: str, value: str) -> dict[str, str]:
    return {"type": "mrkdwn", "text": _cut(f"*{label}*\n{value}", _FIELD_MAX)}


def _when(at: float) -> str:
    # Slack shows the date in each reader's time zone; the fallback is UTC.
    fallback = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"<!date^{int(at)}^{{date_short_pretty}} {{time_secs}}|{fallback}>"


def _facts_blocks(notice: ApprovalNotice, facts: Facts, requester: str | None, include_args: bool) -> list[dict[str, Any]]:
    fields = [
        _field("Agent", _escape(notice.agent)),
        _field("Requested by", _escape(requester) if requester is not None else "_not shown_"),
        _field("Rule", _escape(notice.rule) if notice.rule else "_the tool's own setting_"),
        _field("Approvers", f"{facts.quorum} of {_escape(facts.group)}"),
        _field("Deadline", _when(facts.deadline)),
    ]
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": _cut(f"Approval: {notice.tool}", _HEADER_MAX)}},
        {"type": "section", "fields": fields},
    ]
    if include_args:
        shown = json.dumps(notice.args, ensure_ascii=False, indent=1, sort_keys=True, default=str)
        text = f"*Arguments*\n```{_cut(_escape(shown), _TEXT_MAX - 20)}```"
    else:
        text = f"*Arguments' digest*\n`{notice.args_digest or 'none (no audit.args_digest_key)'}`"
    blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": text}})
    if facts.hint:
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": _cut(_escape(facts.hint), _FIELD_MAX)}]})
    return blocks


def _button(text: str, action: str, style: str, approval_id: str) -> dict[str, Any]:
    return {"type": "button", "text": {"type": "plain_text", "text": text}, "action_id": action, "style": style,
            "value": approval_id}


def waiting_message(notice: ApprovalNotice, facts: Facts, *, requester: str | None, include_args: bool) -> dict[str, Any]:
    """The body of `chat.postMessage` (without `channel`) for an approval that waits for its approvers."""
    blocks = _facts_blocks(notice, facts, requester, include_args)
    blocks.append({"type": "actions", "block_id": "adk_gateway.answer", "elements": [
        _button("Approve", ACTION_APPROVE, "primary", notice.approval_id),
        _button("Deny", ACTION_DENY, "danger", notice.approval_id),
    ]})
    return {"text": f"Approval needed: {notice.tool} ({notice.agent})", "blocks": blocks}


def ended_message(
    notice: ApprovalNotice, facts: Facts, *, requester: str | None, include_args: bool, who: Callable[[Approver], str],
) -> dict[str, Any]:
    """The body of `chat.update` (without `channel`, `ts`) once the approval is decided or expired:
    the same facts, how it ended and by whom (`who` writes one decider), no buttons."""
    outcome = _ENDED.get(notice.outcome or "", notice.outcome or "Ended")
    line = f"*{outcome}*" + _by(notice.approvers, who)
    if notice.reason:
        line += f"\n>{_cut(_escape(notice.reason), _FIELD_MAX)}"
    blocks = _facts_blocks(notice, facts, requester, include_args)
    blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": line}})
    return {"text": f"{outcome}: {notice.tool} ({notice.agent})", "blocks": blocks}


def _by(approvers: Iterable[Approver], who: Callable[[Approver], str]) -> str:
    names = [who(approver) for approver in approvers]
    return f" by {', '.join(names)}" if names else ""
