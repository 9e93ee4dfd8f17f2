"""Answers to gateway-gated calls: the answering request re-attaches to the run that waits, which carries on.

A call the tool policy gates (the ADK plugin asks, chat/gates.py) pauses its run while it stays
open upstream (DESIGN.md decision 3). The request that carries the person's decisions, or a
browser tool's outputs, for such calls does not start a run: it reads the same run's next
response (the machine's `Attached`), into which what the browser added is written first, and the
decisions and outputs reach the run as one event (`Answered`).
"""

from __future__ import annotations

import structlog

from ..core.approvals import CallState, GatedCall
from ..core.chat_events import Answered, Attached
from ..core.chat_outputs import Admission
from ..core.chat_request import ApprovalAnswer, ToolOutput
from .answers import Gone
from .attachment import Attachment, browser_added
from .record import Chat

__all__ = ["continue_gated_run"]


def continue_gated_run(
    chat: Chat,
    answers: list[tuple[ApprovalAnswer, GatedCall]],
    outputs: list[tuple[ToolOutput, GatedCall]],
    now: float,
) -> Attachment:
    """Attach the answering request to the chat's run that waits for these calls, and give the
    run the answers and outputs; raises Gone if that run is over (or the calls were of an earlier one)."""
    # Answers to calls of an earlier run (a new message ended it) ride along in the history, or
    # come from a tab left behind: they must not attach to the run that runs now.
    answers = [(answer, call) for answer, call in answers if chat.ledger.of_current_run(call)]
    outputs = [(output, call) for output, call in outputs if chat.ledger.of_current_run(call)]
    run, turn = chat.run, chat.machine.turn
    if run is None or turn is None or not (answers or outputs):
        raise Gone("these calls were already answered and the run has ended")
    unread = run.unread()
    if unread is None:
        # A new response of the run to read; the machine refuses if the run is over (and what it
        # wrote last, after a deadline passed while nobody was attached, was read already).
        refused = [o for o in chat.handle(Attached()) if isinstance(o, Admission)]
        if refused:
            raise Gone(refused[0].text)
    added = browser_added(
        turn.converter.version,
        [answer for answer, call in answers if call.state is CallState.AWAITING_APPROVAL and not answer.implicit],
        [output for output, call in outputs if call.state is CallState.AWAITING_OUTPUT],
    )
    if unread is None:
        unread = run.current
        # Before anything can read the new response, so no position in a replay moves.
        run.browser_added(added)
    elif not unread.closed:
        # The run wrote while the person decided: the answer comes in the middle of that
        # response, where it is written (the browser that sent it finds what it has).
        run.publish(added)
    attachment = Attachment(run, unread.reader())
    structlog.contextvars.bind_contextvars(message_id=run.message_id)
    # As one input: a replayed answer changes nothing, and if the run still waits for a person
    # the response just opened is closed rather than left empty and open.
    chat.handle(Answered(
        [(call, answer.approved, answer.reason) for answer, call in answers],
        [(call, output.output, output.error_text) for output, call in outputs],
        now,
    ))
    return attachment
