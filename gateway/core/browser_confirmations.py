"""Browser tools in confirm mode: what a browser request's answers and outputs mean to ADK (sans-IO).

With `upstream.approvals: confirm` a browser tool's call waits as an ADK confirmation
(`adk_request_confirmation`, in ADK's session), and the browser sees it as hold mode shows it:
the call under its own id, an approval request if the tool needs one. What the browser sends back
is worked out here, as hold mode answers it:

- its output (a tool part with `output-available` or `output-error`) is the confirmation's answer:
  `confirmed: true` with the output, or the error, as the payload (the plugin returns it as the
  call's result, without running the tool);
- an approval alone sends ADK nothing: the call is handed to the browser to run
  (`tool-input-available`), and the answer goes to ADK with the output. Other answers of the same
  message wait with it, so that ADK gets the message's answers together;
- a denial is ADK's at once, `confirmed: false`;
- a new message instead of an answer rejects what still waits, as for any native confirmation.

Which confirmations are a browser tool's is the caller's lookup: the chat's ledger, or ADK's
session when the gateway does not know the chat; which tools run in the browser is the policy's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..config.agent import ToolPolicy
from .ledger import Ledger, NativeConfirmation
from .message_writer import Chunk, finish_reason_for
from .chat_request import ApprovalAnswer, ToolOutput
from .protocol import ClientVersion

__all__ = ["NAMESPACE", "BrowserCalls", "BrowserPlan", "handover_chunks", "output_answers", "payload", "plan_browser"]

# The namespace of the gateway's keys in a confirmation's payload (the plugin reads it).
NAMESPACE = "adk_gateway"


def payload(output: ToolOutput) -> dict[str, object]:
    """The browser's output, or its error, as the payload of its confirmation's answer."""
    if output.error_text is not None:
        return {NAMESPACE: {"error": output.error_text}}
    return {NAMESPACE: {"output": output.output}}


@dataclass
class BrowserCalls:
    """Which native confirmations are browser tools': the chat's ledger knows those it asked (and
    answered); `originals` (from ADK's session: approval id -> (tool call id, tool, args)) the
    others. A browser tool is one the policy runs in the browser, whatever ADK's payload says."""

    ledger: Ledger
    policy: Callable[[str], ToolPolicy]
    originals: Mapping[str, tuple[str, str, dict[str, Any]]] = field(default_factory=dict)

    def in_browser(self, tool: str) -> bool:
        return self.policy(tool).runs_in == "browser"

    def by_id(self, approval_id: str) -> NativeConfirmation | None:
        known = self.ledger.native(approval_id)
        if known is not None:
            return known if known.in_browser else None
        original = self.originals.get(approval_id)
        if original is None or not self.in_browser(original[1]):
            return None
        call_id, tool, args = original
        return NativeConfirmation(approval_id, call_id, tool, in_browser=True, approval=self.policy(tool).approval, args=args)

    def of_output(self, output: ToolOutput) -> NativeConfirmation | None:
        known = self.ledger.native_of_call(output.tool_call_id)
        if known is not None:
            return known if known.in_browser else None
        if not self.in_browser(output.tool_name):
            return None
        answered = self.ledger.answered_of_call(output.tool_call_id)
        if answered is not None:
            # A replay: answered here before (the caller refuses it as such).
            return NativeConfirmation(
                answered, output.tool_call_id, output.tool_name, in_browser=True, approval=self.policy(output.tool_name).approval,
            )
        for approval_id, (call_id, _tool, _args) in self.originals.items():
            if call_id == output.tool_call_id:
                return self.by_id(approval_id)
        return None

    def need_session(self, outputs: Iterable[ToolOutput], answers: Iterable[ApprovalAnswer]) -> bool:
        """Whether the request names a browser tool's call or approval the ledger does not know
        (the gateway restarted, or never ran the chat): only ADK's session can say what it is."""
        ledger = self.ledger
        return any(
            self.in_browser(o.tool_name) and ledger.native_of_call(o.tool_call_id) is None
            and ledger.answered_of_call(o.tool_call_id) is None
            for o in outputs
        ) or any(self.in_browser(a.tool_name) and not ledger.knows_native(a.approval_id) for a in answers)


def output_answers(
    outputs: Iterable[ToolOutput], confirmation_of_call: Callable[[ToolOutput], NativeConfirmation | None],
) -> tuple[list[ApprovalAnswer], list[ToolOutput]]:
    """The answers the browser's outputs give to browser tools' confirmations, and those outputs.

    An output for a call that is no browser tool's confirmation (a server tool's output riding
    along, a call of another chat, one nobody asked about) is not an answer: left to the caller."""
    answers: list[ApprovalAnswer] = []
    carried: list[ToolOutput] = []
    for output in outputs:
        confirmation = confirmation_of_call(output)
        if confirmation is None or not confirmation.in_browser:
            continue
        if confirmation.approval and confirmation.approved_at is None and not output.approved:
            # Hold mode takes no output before the approval either: the browser never had the call.
            continue
        answers.append(ApprovalAnswer(
            confirmation.approval_id, confirmation.tool_call_id, confirmation.tool, True, payload=payload(output),
        ))
        carried.append(output)
    return answers, carried


@dataclass(frozen=True)
class BrowserPlan:
    """What the request does: `forward` to ADK (nothing held back), or hand `handover` to the browser."""

    forward: list[ApprovalAnswer]
    # Browser tools the person approved: the browser runs them now; ADK hears of it with the output.
    handover: list[NativeConfirmation]


def plan_browser(
    answers: Iterable[ApprovalAnswer],
    confirmation: Callable[[str], NativeConfirmation | None],
    *,
    new_message: bool,
    waiting: Iterable[NativeConfirmation] = (),
) -> BrowserPlan:
    """Split a request's answers to native confirmations (ADK still waits for each: the caller
    checked) into what goes to ADK now and the browser tools to hand to the browser.

    `confirmation(approval_id)`: the browser tool's confirmation that id names, or None (another
    native confirmation). `waiting`: the chat's browser tools' confirmations still unanswered, which
    a new message rejects when the request does not answer them.
    """
    forward: list[ApprovalAnswer] = []
    handover: list[NativeConfirmation] = []
    for answer in answers:
        asked = confirmation(answer.approval_id)
        if asked is None or answer.payload is not None or not answer.approved or answer.implicit:
            forward.append(answer)
        elif new_message:
            # Approved, never run: the person moved on without the browser's output.
            forward.append(ApprovalAnswer(answer.approval_id, answer.tool_call_id, answer.tool_name, False, implicit=True))
        else:
            handover.append(asked)
    if new_message:
        answered = {a.approval_id for a in forward}
        forward += [
            ApprovalAnswer(c.approval_id, c.tool_call_id, c.tool, False, implicit=True)
            for c in waiting if c.in_browser and c.approval_id not in answered
        ]
    if handover:
        # The message's other answers go to ADK with the browser's output, all together (its
        # next request carries them again).
        return BrowserPlan([], handover)
    return BrowserPlan(forward, [])


def handover_chunks(message_id: str, calls: Iterable[NativeConfirmation], version: ClientVersion) -> list[Chunk]:
    """The response that hands approved browser tools to the browser, as hold mode's continuation
    does: the call's input made available (the AI SDK's `onToolCall` runs it), and a finish that
    waits for its output. No new step: the chunk updates the tool part where it stands."""
    chunks: list[Chunk] = [{"type": "start", "messageId": message_id}]
    for call in calls:
        chunks.append({
            "type": "tool-input-available", "toolCallId": call.tool_call_id, "toolName": call.tool, "input": call.args or {},
        })
    chunks.append({"type": "finish", "finishReason": finish_reason_for("tool-calls", version)})
    return chunks
