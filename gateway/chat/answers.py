"""Which waiting call each answer in a browser request is for, and whether it may answer it.

The last assistant message a request carries holds the person's answers to approvals and the
browser's tool outputs, old and new alike. Here each is matched to what the chat's ledger says
waits: a gateway-gated call (its `GatedCall`), a native ADK confirmation (left to ADK's session),
or nothing. An approval of another chat is refused (403), one the gateway no longer knows is gone
(410). The registry and the ledger are only read here, never changed.
"""

from __future__ import annotations

import structlog

from ..core.approvals import APPROVAL_ID_PREFIX, CallState, GatedCall, Outcome
from .record import Chat
from ..core.refusals import Refusal
from ..core.chat_request import ApprovalAnswer, ToolOutput
from .registry import Registry

__all__ = ["LOST_APPROVAL", "NOT_PENDING", "ForApprovers", "Forbidden", "Gone", "pending_outputs", "split_answers"]

log = structlog.get_logger("adk_gateway.chat.answers")

# A native confirmation ADK's session no longer holds: ADK restarted without keeping its sessions
# (`memory://`), so the paused call, and the approval with it, are gone.
LOST_APPROVAL = "the agent service restarted and lost this approval; send your message again"
# An ADK confirmation id this chat never asked (another chat's, or made up): its session never held it.
NOT_PENDING = "this approval is not pending in this chat; send a new message to go on"


class Forbidden(Refusal):
    """The request touches an approval that belongs to another chat."""

    status = 403
    code = "forbidden"


class ForApprovers(Refusal):
    """The request answers an approval that its approvers decide, through the approvals API."""

    status = 403
    code = "approval_for_approvers"


class Gone(Refusal):
    """The request answers an approval that is no longer pending (expired, or the gateway restarted)."""

    status = 410
    code = "approval_gone"


def split_answers(
    registry: Registry, chat: Chat, answers: tuple[ApprovalAnswer, ...], *, strict: bool
) -> tuple[list[tuple[ApprovalAnswer, GatedCall]], list[ApprovalAnswer]]:
    """Answers to gateway-gated calls (with their call) and to native ADK confirmations.

    `strict`: the request only answers, so an answer to an unknown gateway approval is an error;
    alongside a new message such leftovers in the history are simply stale.
    """
    gated: list[tuple[ApprovalAnswer, GatedCall]] = []
    native: list[ApprovalAnswer] = []
    for answer in answers:
        owner = registry.approval_chat(answer.approval_id)
        call = owner.ledger.by_approval(answer.approval_id) if owner is not None else None
        if call is None:
            if answer.approval_id.startswith(APPROVAL_ID_PREFIX):
                if not strict:
                    continue
                raise Gone(
                    "this approval is no longer pending (it expired or the gateway restarted); "
                    "send a new message to try again"
                )
            native.append(answer)
            continue
        if owner is not chat:
            log.warning("approval_of_another_chat", approval_id=answer.approval_id, owner_chat=call.chat_id)
            raise Forbidden("this approval belongs to another chat")
        if call.for_approver:
            # Four-eyes and quorums hold only if the chat cannot answer for the approvers.
            log.warning("approval_for_approvers", approval_id=answer.approval_id, approvers=call.approvers)
            raise ForApprovers(f"this approval is decided by its approvers ({call.approvers}) through the approvals API")
        gated.append((answer, call))
    return gated, native


def pending_outputs(chat: Chat, outputs: tuple[ToolOutput, ...]) -> list[tuple[ToolOutput, GatedCall]]:
    found = []
    for output in outputs:
        call = chat.ledger.call(output.tool_call_id)
        # Outputs of server tools ride along in the history too; only browser delegates count.
        # An abandoned call's output is too late for the tool, but the request still reads what
        # became of it (the plugin's error and the model's words).
        if call is not None and call.runs_in_browser and (
            call.state is CallState.AWAITING_OUTPUT
            or call.outcome in (Outcome.OUTPUT, Outcome.OUTPUT_ERROR, Outcome.ABANDONED)
        ):
            found.append((output, call))
    return found
