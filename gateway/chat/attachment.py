"""What an admitted browser request reads of a chat's run, and what a replay of it is given besides the agent's chunks.

`Attachment`: the response a request reads (or `ChatBusy`: another request reads the chat's
response already). A run's chunk log (chat/chunk_log.py) is also given what the agent did not
write, so that a resume replays the whole assistant message: what the browser added between two
responses (`browser_added`), and, for a run that continues a message, the message as the earlier
run wrote it (`message_so_far`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.chat_request import ApprovalAnswer, ToolOutput
from ..core.protocol import ClientVersion, encode_chunks
from ..core.refusals import Refusal
from .chunk_log import Feed, Run
from .record import Chat

__all__ = ["Attachment", "ChatBusy", "browser_added", "message_so_far"]


class ChatBusy(Refusal):
    """The chat already has a response streaming that a request reads (another tab, say); the
    client should wait for it to end."""

    status = 409
    code = "chat_busy"
    retry_after = 1


@dataclass(frozen=True, slots=True)
class Attachment:
    """What a browser request reads: `response` of `run` (no run here: it runs on another replica).

    `response` counts as a reader of the run's response until the request closes it: the
    transport closes it when it stops reading, whatever stopped it.
    """

    run: Run | None
    response: Feed


def browser_added(version: ClientVersion, answers: list[ApprovalAnswer], outputs: list[ToolOutput]) -> list[bytes]:
    """What the browser put into the message between two of its responses, as chunks for a replay
    (chat/chunk_log.py), which the AI SDK rebuilds the message from: the browser tools' outputs and, for ai 7,
    the person's answers (ai 6 has no chunk for an answer: its replay shows an answered part's
    later states, without `approval.approved`)."""
    chunks: list[dict[str, object]] = []
    if version == 7:
        for answer in answers:
            chunk: dict[str, object] = {"type": "tool-approval-response", "approvalId": answer.approval_id, "approved": answer.approved}
            if answer.reason:
                chunk["reason"] = answer.reason
            chunks.append(chunk)
    for output in outputs:
        if output.error_text is not None:
            chunks.append({"type": "tool-output-error", "toolCallId": output.tool_call_id, "errorText": output.error_text})
        else:
            chunks.append({"type": "tool-output-available", "toolCallId": output.tool_call_id, "output": output.output})
    return encode_chunks(chunks)


def message_so_far(chat: Chat, message_id: str | None) -> tuple[bytes, ...] | None:
    """What a resume replays before a new run's chunks: nothing for a new message; for one
    that continues (a native confirmation answered), the message as the earlier run wrote
    it, or None if that is not here (a restart, another replica): then none is resumable."""
    if message_id is None:
        return ()
    if chat.run is None or chat.run.message_id != message_id:
        return None
    return chat.run.message()
