"""ADK events in, AI SDK UI message chunks out: the sans-IO heart of the gateway.

A `Converter` turns the events of ADK runs into the chunks of ONE assistant message. On top of the
framing rules it inherits (core/message_writer.py), it owns what ADK's events mean for the client: a
tool part exists before any chunk that names its `toolCallId`; ADK's streamed `partial` text is not
repeated when the aggregated final event arrives; ADK's confirmation machinery
(`adk_request_confirmation` and its placeholder response) never reaches the browser as tool parts
of its own; gated calls are shown as the tool policy says.

It does no I/O and reads no clock: events are the upstream JSON's top-level fields the gateway
reads (core/adk_events.py; the upstream is trusted, so nothing is validated chunk by chunk on this
hot path), chunks are plain dicts ready to encode. What it learns about calls that wait for a person goes into the chat's
ledger (core/ledger.py); when a response ends is the turn's to decide (core/turn.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Final

import orjson

from ..config.agent import ToolPolicy
from .adk_events import UNSET, AdkEvent, as_event, error_code_text, run_failed_text
from .approvals import CallState, GatedCall, refusal_code
from .approver_confirmations import native_approver_part, read_mark, read_shadow
from .ledger import Ledger, NativeConfirmation
from .message_writer import Chunk, MessageWriter, map_finish_reason
from .protocol import ClientVersion

__all__ = ["CONFIRMATION_TOOL", "Converter", "map_finish_reason"]

CONFIRMATION_TOOL: Final = "adk_request_confirmation"

# ADK serialises bytes as URL-safe base64; browsers (atob, data: URLs) want the standard alphabet.
_STANDARD_BASE64 = str.maketrans("-_", "+/")


def _approval_request(approval_id: str, tool_call_id: str, hint: str | None) -> Chunk:
    chunk: Chunk = {"type": "tool-approval-request", "approvalId": approval_id, "toolCallId": tool_call_id}
    if hint:
        # ai 6 and ai 7 keep this as the tool part's `approval.descriptor`, for the UI to show.
        chunk["approvalDescriptor"] = {"hint": hint}
    return chunk


def _approval_pair(call: GatedCall, *, automatic: bool = False) -> list[Chunk]:
    """ai 7's record of a decision the browser did not make: the request, then its response."""
    request: Chunk = {"type": "tool-approval-request", "approvalId": call.id, "toolCallId": call.tool_call_id}
    if automatic:
        request["isAutomatic"] = True
    descriptor = {key: value for key, value in (("rule", call.rule), ("approvers", call.approvers)) if value}
    if descriptor:
        request["approvalDescriptor"] = descriptor
    response: Chunk = {"type": "tool-approval-response", "approvalId": call.id, "approved": call.approved}
    if call.reason:
        response["reason"] = call.reason
    return [request, response]


def _approver_part(call: GatedCall, state: str) -> Chunk:
    """The data part (`data-approval`, updated in place by its id) of a call approvers decide."""
    data: dict[str, Any] = {
        "approvalId": call.id, "toolCallId": call.tool_call_id, "state": state, "approvers": call.approvers,
        "quorum": call.quorum,
    }
    if call.rule:
        data["rule"] = call.rule
    if call.policy.hint:
        data["hint"] = call.policy.hint
    if state == "decided":
        data["approved"] = call.approved
        data["by"] = [d["user"] for d in call.deciders]
        if call.reason:
            data["reason"] = call.reason
    return {"type": "data-approval", "id": call.id, "data": data}


def _is_default_hint(hint: Any) -> bool:
    # ADK's generated hint instructs the model, not the person; a tool's own hint is worth showing.
    return not isinstance(hint, str) or hint.startswith("Please approve or reject the tool call ")


class Converter(MessageWriter):
    """Chunks for one assistant message, possibly spread over several ADK runs and responses.

    `known_tool_calls` are tool call ids the client already holds in this message (a continuation
    after an approval): their outputs need no new tool part. `policy` says which tools the gateway
    gates (approval, browser): their calls are expected to be opened by the plugin, and the message
    waits until they are; or, for a tool `confirms` names, to be confirmed by ADK (no wait: ADK asks
    when the run's calls returned). `ledger` is the chat's (a fresh one when the converter stands alone).
    """

    def __init__(
        self,
        message_id: str,
        version: ClientVersion = 6,
        known_tool_calls: Iterable[str] = (),
        policy: Callable[[str], ToolPolicy] | None = None,
        ledger: Ledger | None = None,
        confirms: Callable[[str], bool] | None = None,
    ) -> None:
        super().__init__(message_id, version)
        self.policy = policy
        # Gated tools ADK confirms (`upstream.approvals: confirm`): the plugin asks ADK, not the gateway.
        self.confirms = confirms
        self.ledger = ledger if ledger is not None else Ledger()
        self._tools_shown: dict[str, None] = {call: None for call in known_tool_calls}  # fromkeys presizes: 224 B empty
        # Gated tools that answered without the plugin asking (it is not installed?); read and
        # cleared by the turn.
        self.bypassed: list[str] = []
        # (tool call id, refusal code) of shown calls that ADK answered before the gateway released
        # them: the plugin stopped waiting. Read and cleared by the turn, which ends them.
        self.abandoned: list[tuple[str, str | None]] = []
        # Text already streamed as partials; the aggregated final event must not repeat it.
        self._streamed_partials = False
        # Live transcriptions: the model's (streamed as text) and the person's (a data part).
        self._streamed_transcript = False
        self._heard_text = ""
        self._heard_seq = 0

    def waits_for_person(self) -> bool:
        return self.ledger.asking or self.ledger.gates_open

    # ---- events --------------------------------------------------------------------------

    def feed(self, event: AdkEvent | dict[str, Any]) -> list[Chunk]:
        """The chunks one ADK event produces (often none): an `AdkEvent` as the upstream client
        decodes a streamed one (core/adk_events.py), or a dict (a live event, what orjson read of
        an odd one), read as the same struct (UNSET where the dict has no key)."""
        if type(event) is not AdkEvent:
            event = as_event(event)
        unset = UNSET
        if event.error is not unset and event.content is unset and event.author is unset:
            # /run_sse reports a failed run as {"error": ..., "error_details": ...}.
            return self.error(run_failed_text(event.error))

        out: list[Chunk] = []
        partial = event.partial
        content = event.content
        parts = content.get("parts") if isinstance(content, dict) else None
        if parts:
            if partial:
                for part in parts:
                    text = part.get("text")
                    if text:
                        self._streamed_partials = True
                        self._delta(out, "reasoning" if part.get("thought") else "text", text)
            else:
                self._final_parts(out, parts)
        if not partial:
            reason = event.finishReason
            if reason:
                self._set_finish_reason(reason)
            usage = event.usageMetadata
            if usage:
                # Partial events repeat a running count; the final one is the call's (counted once).
                self._add_usage(usage, event.modelVersion if event.modelVersion is not unset else None)
        if (
            event.interrupted is not unset or event.outputTranscription is not unset
            or event.inputTranscription is not unset or event.errorCode is not unset or event.errorMessage is not unset
        ):
            self._rare(out, event, bool(partial))
        return out

    def _rare(self, out: list[Chunk], event: AdkEvent, partial: bool) -> None:
        """Live mode's interruptions and transcriptions, and error codes."""
        if event.get("interrupted"):
            self._interrupted(out)
        transcript = event.get("outputTranscription")
        if transcript:
            self._transcript(out, transcript, partial)
        heard = event.get("inputTranscription")
        if heard:
            out.append(self._heard(heard, partial))
        error_code = event.get("errorCode")
        error_message = event.get("errorMessage")
        if error_code or error_message:
            out.extend(self.error(error_code_text(error_code, error_message)))

    def _final_parts(self, out: list[Chunk], parts: list[dict[str, Any]]) -> None:
        streamed, self._streamed_partials = self._streamed_partials, False
        for part in parts:
            text = part.get("text")
            if text is not None:
                if not streamed and text:
                    kind = "reasoning" if part.get("thought") else "text"
                    self._delta(out, kind, text)
                    out.extend(self._close_block(kind))
                continue
            call = part.get("functionCall")
            if call is not None:
                self._function_call(out, call)
                continue
            response = part.get("functionResponse")
            if response is not None:
                self._function_response(out, response)
                continue
            self._media(out, part)
        # The aggregated final event closes whatever its partials opened.
        if streamed:
            out.extend(self._close_blocks())

    def _media(self, out: list[Chunk], part: dict[str, Any]) -> None:
        inline = part.get("inlineData")
        if inline is not None:
            self._model_output(out)
            mime = inline.get("mimeType") or "application/octet-stream"
            data = (inline.get("data") or "").translate(_STANDARD_BASE64)
            if mime.startswith("audio/pcm"):
                # Live audio: many small pieces to play as they come, not files to keep.
                out.append({"type": "data-pcm", "data": {"mimeType": mime, "data": data}, "transient": True})
            else:
                out.append({"type": "file", "mediaType": mime, "url": f"data:{mime};base64,{data}"})
            return
        file_data = part.get("fileData")
        if file_data is not None and file_data.get("fileUri"):
            self._model_output(out)
            out.append(
                {"type": "file", "mediaType": file_data.get("mimeType") or "application/octet-stream", "url": file_data["fileUri"]}
            )
        # executableCode / codeExecutionResult and future part kinds have no UI chunk yet.

    def _function_call(self, out: list[Chunk], call: dict[str, Any]) -> None:
        call_id = call.get("id") or ""
        name = call.get("name") or ""
        args = call.get("args") or {}
        if name == CONFIRMATION_TOOL:
            self._confirmation_call(out, call_id, args)
            return
        self._show_tool(out, call_id, name, args)

    def _confirmation_call(self, out: list[Chunk], approval_id: str, args: dict[str, Any]) -> None:
        original = args.get("originalFunctionCall") or {}
        tool_call_id = original.get("id")
        if not tool_call_id or not approval_id:
            return
        name = original.get("name") or ""
        call_args = original.get("args") or {}
        self._show_tool(out, tool_call_id, name, call_args)
        policy = self.policy(name) if self.policy is not None else None
        if policy is not None and policy.runs_in == "browser":
            # Confirm mode's browser tool: shown as hold mode shows it (the gateway's policy says
            # which tools run in the browser, not ADK's payload), its approval the policy's.
            self.ledger.ask(NativeConfirmation(
                approval_id, tool_call_id, name, in_browser=True, approval=policy.approval, args=dict(call_args),
            ))
            if policy.approval:
                out.append(_approval_request(approval_id, tool_call_id, policy.hint))
            return
        confirmation = args.get("toolConfirmation") or {}
        payload = confirmation.get("payload") if isinstance(confirmation, dict) else None
        who = read_mark(payload)
        self.ledger.ask(NativeConfirmation(approval_id, tool_call_id, name, args=dict(call_args), mark=who,
                                           shadow=read_shadow(payload)))
        if who is not None:
            # Its approvers answer, through the approvals API: the chat is told whom it waits for,
            # and given nothing to answer (ai 6 and ai 7 alike, as for a held call's).
            out.append(native_approver_part(approval_id, tool_call_id, who, policy.hint if policy else None))
            return
        hint = confirmation.get("hint") if isinstance(confirmation, dict) else None
        out.append(_approval_request(approval_id, tool_call_id, None if _is_default_hint(hint) else hint))

    def _show_tool(self, out: list[Chunk], call_id: str, name: str, args: Any) -> None:
        policy = self.policy(name) if self.policy is not None else None
        if policy is not None and policy.gated:
            self.ledger.expect(call_id, confirmed_by_adk=self.confirms is not None and self.confirms(name))
        if call_id in self._tools_shown:
            return
        self._model_output(out)
        self._tools_shown[call_id] = None
        out.append({"type": "tool-input-start", "toolCallId": call_id, "toolName": name})
        if policy is not None and policy.approval and policy.runs_in == "browser":
            # The AI SDK runs a browser tool (onToolCall) on tool-input-available: before the person
            # approved, the input travels as a delta, which shows it without running it.
            out.append({"type": "tool-input-delta", "toolCallId": call_id, "inputTextDelta": orjson.dumps(args).decode()})
        else:
            out.append({"type": "tool-input-available", "toolCallId": call_id, "toolName": name, "input": args})

    # ---- gateway-gated calls (the plugin path) ---------------------------------------------

    def show_gate(self, call: GatedCall) -> list[Chunk]:
        """The plugin opened a gated call: show it and, if it needs one, ask for approval."""
        out: list[Chunk] = []
        self._show_tool(out, call.tool_call_id, call.tool, call.args)
        if call.for_approver:
            # Not the chatting person's to answer: no approval request (its part would wait for
            # their answer), a data part that says whom it waits for (ai 6 and ai 7 alike).
            out.append(_approver_part(call, "waiting"))
        elif call.state is CallState.AWAITING_APPROVAL:
            out.append(_approval_request(call.id, call.tool_call_id, call.policy.hint))
        return out

    def show_decided(self, call: GatedCall) -> list[Chunk]:
        """A rule decided the call before anyone was asked: ai 7 shows the AI SDK's automatic
        approval (a request with `isAutomatic`, then its response); ai 6, whose stream has no
        approval response, shows the call alone (its outcome comes as ADK's function response:
        an output, or the refusal as an error, `_function_response`)."""
        out: list[Chunk] = []
        self._show_tool(out, call.tool_call_id, call.tool, call.args)
        # The tool's own default letting a call run (a tool gated only for its rules) asks nothing.
        if self.version >= 7 and (call.rule is not None or call.policy.approval or not call.approved):
            out += _approval_pair(call, automatic=True)
        return out

    def gate_moved(self, call: GatedCall) -> list[Chunk]:
        """A gated call moved on; what the browser must see now (the outcome itself comes as
        ADK's function response)."""
        if call.approvers is not None and call.released:
            # Approvers decided (or nobody did): the data part says so, and ai 7's tool part gets
            # the decision as its approval, so that its outcome reads as it does after a person's.
            ended = "decided" if call.decided_by == "approver" else call.outcome.value if call.outcome else "ended"
            out = [_approver_part(call, ended)]
            if self.version >= 7:
                out += _approval_pair(call)
            return out
        if call.state is CallState.AWAITING_OUTPUT and call.policy.approval and call.runs_in_browser:
            # Approved: hand the held call to the browser. No new step: the chunk updates the tool
            # part where it stands (a new step would make the client add a second part).
            return [{"type": "tool-input-available", "toolCallId": call.tool_call_id, "toolName": call.tool, "input": call.args}]
        return []

    def _function_response(self, out: list[Chunk], response: dict[str, Any]) -> None:
        call_id = response.get("id") or ""
        name = response.get("name") or ""
        ledger = self.ledger
        # Most results are an ungated tool's, which no gate, confirmation or denial concerns: one
        # check instead of the ledger's five below (tool-heavy streams, docs/performance.md).
        tracked = name == CONFIRMATION_TOOL or ledger.concerns(call_id)
        if tracked and (name == CONFIRMATION_TOOL or ledger.confirming(call_id) or ledger.answered_in_browser(call_id)):
            # ADK's own bookkeeping (the answer echo, or the "requires confirmation" placeholder),
            # or an output the browser produced itself: not news to the browser.
            return
        if call_id not in self._tools_shown:
            # The client rejects a tool chunk for a call it has never seen: introduce it first.
            self._show_tool(out, call_id, name, {})
        result = response.get("response")
        refusal = refusal_code(result)
        if tracked and ledger.expected(call_id):
            ledger.answered_unexpectedly(call_id)
            # Never shown: either the plugin refused the call before the gateway could open it
            # (gateway unreachable, no policy) or the gateway refused it at once, both marked;
            # or the tool ran without the plugin asking, which is what the bypass alarm is for.
            if refusal is None:
                self.bypassed.append(name)
        elif tracked and ledger.is_open(call_id):
            # Shown, never released, yet answered: the plugin stopped waiting (its long poll ended)
            # and answered ADK itself, since it only runs a tool on the gateway's verdict. Nobody
            # waits for a person here any more, so what the model says next is not held back: it
            # streams on in one response instead of one closed response per event.
            ledger.closed(call_id)
            self.abandoned.append((call_id, refusal))
        self._tool_results()
        if tracked and ledger.shown_as_denied(call_id, automatic_too=self.version >= 7):
            out.append({"type": "tool-output-denied", "toolCallId": call_id})
        elif isinstance(result, dict) and isinstance(result.get("error"), str) and len(result) == (1 if refusal is None else 2):
            # ADK's convention for a failed tool: {"error": "..."}, maybe marked as a refusal (the
            # marker is the gateway's bookkeeping, not something to show).
            out.append({"type": "tool-output-error", "toolCallId": call_id, "errorText": result["error"]})
        else:
            out.append({"type": "tool-output-available", "toolCallId": call_id, "output": result})

    # ---- live-mode transcriptions ----------------------------------------------------------

    def _transcript(self, out: list[Chunk], transcript: dict[str, Any], partial: bool) -> None:
        """What the model said aloud, as the message's text: partials stream, the final closes."""
        text = transcript.get("text") or ""
        if partial:
            if text:
                self._streamed_transcript = True
                self._delta(out, "text", text)
            return
        if not self._streamed_transcript and text:
            self._delta(out, "text", text)
        self._streamed_transcript = False
        out.extend(self._close_block("text"))

    def _heard(self, transcript: dict[str, Any], partial: bool) -> Chunk:
        """What the person said aloud: one data part, updated in place (same id) as it grows."""
        text = transcript.get("text") or ""
        if partial:
            self._heard_text += text
        else:
            self._heard_text = text
        chunk: Chunk = {
            "type": "data-transcription",
            "id": f"heard-{self._heard_seq}",
            "data": {"role": "user", "text": self._heard_text, "finished": not partial},
        }
        if not partial:
            self._heard_seq += 1
            self._heard_text = ""
        return chunk
