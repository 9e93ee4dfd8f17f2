"""What a chat's machine asks its shell to do: the outputs `Turn` (turn.py) and `ChatMachine`
(chat_machine.py) return, in order (sans-IO).

The chat (chat/record.py, chat/carry_out.py) carries each one out: responses opened and closed in the chat's chunk
log, chunks written there, a released call's verdict sent to the plugin, metrics and log lines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from .approvals import CallState, GatedCall, Verdict
from .ledger import NativeConfirmation
from .message_writer import Chunk

__all__ = [
    "Admission", "BrowserApproved", "Bypassed", "CallChanged", "Chunks", "CloseResponse", "ConfirmationSeen", "GateAction", "GateDecided", "NativeAsked",
    "NativeSettled", "OpenResponse", "Output", "Raised", "RunEnded", "UsageSeen",
]


@dataclass(frozen=True, slots=True)
class OpenResponse:
    """Start a new browser response (the chunks that follow begin with `start`)."""


@dataclass(frozen=True, slots=True)
class Chunks:
    chunks: list[Chunk]


@dataclass(frozen=True, slots=True)
class CloseResponse:
    """The current response is complete; `waiting`: the run now waits for a person."""

    waiting: bool


@dataclass(frozen=True, slots=True)
class CallChanged:
    """A gated call changed state (`before` it was in, after `waited` seconds in it)."""

    call: GatedCall
    before: CallState
    waited: float
    # Why it changed, where the outcome alone does not say: the plugin's refusal code when it gave up.
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class Bypassed:
    """A gated tool answered without the plugin asking (is it installed?)."""

    tool: str


@dataclass(frozen=True, slots=True)
class UsageSeen:
    """One LLM call's token usage, as ADK reported it (its `usageMetadata`), and the model that
    made the call (its `modelVersion`, "" if none): for the shell to count."""

    model: str
    usage: dict[str, Any]


@dataclass(frozen=True, slots=True)
class NativeAsked:
    """The run ended on a native ADK confirmation that now waits for the person."""

    confirmation: NativeConfirmation


@dataclass(frozen=True, slots=True)
class RunEnded:
    outcome: str  # completed, waiting (for a native confirmation), error, cancelled


@dataclass(frozen=True, slots=True)
class Raised:
    """Taking a batch raised (the upstream's events could not be read, or a bug): the chunks of the
    events before it are out; the shell raises `error` where it reads events, and ends the turn."""

    error: Exception


@dataclass(frozen=True, slots=True)
class Admission:
    """What a browser request may do in its chat: `continue` the run that waits for its answers,
    read what followed a deadline's answer (`late`), `start` a run (`forward_native` false: its
    answers to ADK confirmations are dropped, live mode has none), or `refuse` with `status` and
    `text` (safe to show the browser)."""

    action: str
    forward_native: bool = True
    status: int = 0
    text: str = ""


GateAction = Literal["run", "refuse", "rule", "confirm", "wait"]


@dataclass(frozen=True, slots=True)
class GateDecided:
    """What the plugin's ask comes to (the approvals room's decision, approvals/decision.py, taken
    through the machine's port core/gate_decider.py), for the shell to carry out:

    - `run`: the tool is not gated (`verdict` RUN);
    - `refuse`: refused at once, `verdict` says why (its `reason`: `no_browser`, `too_many_pending`,
      `plugin_too_old`);
    - `rule`: a rule approved or denied `call` (recorded released, shown to the browser);
      `verdict` is the call's, for the plugin at once;
    - `confirm`: the plugin asks ADK's confirmation (`verdict` CONFIRM, with the mark of who
      answers when approvers do); nothing is recorded here;
    - `wait`: `call` waits here, held in the plugin's request (recorded now; `again`: the call the
      plugin asked about before).

    `rule_failed`: each rule whose condition could not be evaluated, with why (the shell logs
    them), and `ruled`, `by_rule`: what the rules decided and by which rule (None: the tool's own
    setting), when they ran; `shadow`: what each shadow rule would have decided instead
    (config/shadow_rules.py `ShadowFinding.as_json`), for the shell to log and count.
    """

    action: GateAction
    verdict: Verdict | None = None
    call: GatedCall | None = None
    again: bool = False
    rule_failed: tuple[tuple[str, str], ...] = ()
    ruled: str | None = None
    by_rule: str | None = None
    shadow: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class NativeSettled:
    """A native confirmation is answered (or settled unanswered): `confirmation` if it was pending
    in this chat, None if only ADK's session knew it. Its metrics are the caller's to observe."""

    approval_id: str
    confirmation: NativeConfirmation | None


@dataclass(frozen=True, slots=True)
class BrowserApproved:
    """A browser tool's confirmation was approved, the first time: its output is awaited now.
    `learnt`: the ledger did not hold it before (only ADK's session did), so no replica counts it
    as waiting yet."""

    confirmation: NativeConfirmation
    learnt: bool = False


@dataclass(frozen=True, slots=True)
class ConfirmationSeen:
    """The gateway sees a pending confirmation for the first time: its deadline can be set now."""

    confirmation: NativeConfirmation


Output = (
    OpenResponse | Chunks | CloseResponse | CallChanged | Bypassed | UsageSeen | NativeAsked | RunEnded | Raised | GateDecided
    | NativeSettled | BrowserApproved | ConfirmationSeen | Admission
)
