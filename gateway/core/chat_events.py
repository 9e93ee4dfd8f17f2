"""What happens to a chat, as the typed events its machine (core/chat_machine.py) takes (sans-IO).

Each event is a fact the shell observed, with the time it observed it (`now`, on the gateway's
clock) where the machine's answer depends on time: a browser request's plan starting a run, a read
of upstream events, the plugin's ask (which the machine decides), the person's answers, why the
shell is ending a run (`EndAsked`) and its task's cancellation, a deadline, the run's end.
The machine answers each with the outputs of core/chat_outputs.py; it never reads a clock itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ..config.agent import ToolPolicy
from .approvals import GatedCall
from .native_confirmation import NativeConfirmation
from .protocol import ClientVersion

__all__ = [
    "Answered", "AnswersGoing", "ApproversDecided", "AnswersSent", "Attached", "BrowserAsked", "BrowserToolApproved", "CallCancelled", "ChatEvent", "ConfirmationDecided",
    "ConfirmationsSeen", "DeadlineReached", "EndAsked", "EndHow", "GateOpened", "NativeAnswered", "Resumed", "RunCancelled",
    "RunClosed", "RunFailed", "RunStarts", "RunWanted", "RunDropped", "AudioHeard", "SocketClosed", "Settled", "StateRestored", "ToolAsked", "UpstreamRead",
]

Decision = tuple[GatedCall, bool, "str | None"]  # (call, approved, reason)
BrowserResult = tuple[GatedCall, Any, "str | None"]  # (call, the browser's output, its error text)


@dataclass(frozen=True, slots=True)
class RunStarts:
    """A browser request (or a deadline's answer) starts a run that writes message `message_id`.

    `known_tool_calls`: tool calls the client already holds in that message; `denied_tool_calls`
    and `delivered_tool_calls`: calls whose ADK confirmation this run answers with a denial or with
    the browser's output. `policy` and `confirms` are the agent's configuration, read, not kept.
    """

    message_id: str
    now: float
    version: ClientVersion = 6
    known_tool_calls: Iterable[str] = ()
    denied_tool_calls: Iterable[str] = ()
    delivered_tool_calls: Iterable[str] = ()
    policy: Callable[[str], ToolPolicy] | None = field(default=None, compare=False)
    confirms: Callable[[str], bool] | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class UpstreamRead:
    """One read's worth of the run's upstream events."""

    batch: Iterable[dict[str, Any]]
    now: float
    # The run it is of (`ChatMachine.run` when it started); None: the run under way.
    run: int | None = None


@dataclass(frozen=True, slots=True)
class GateOpened:
    """The plugin asked about `call` (already in the chat's ledger): show it to the browser."""

    call: GatedCall
    now: float


@dataclass(frozen=True, slots=True)
class Attached:
    """A request that answers wants a new response of the run to read."""


@dataclass(frozen=True, slots=True)
class Answered:
    """The person's decisions and the browser's tool outputs, applied as one."""

    decisions: Iterable[Decision]
    outputs: Iterable[BrowserResult]
    now: float


@dataclass(frozen=True, slots=True)
class ApproversDecided:
    """Approvers decided a call through the approvals API: nobody in the chat answered, so no
    request reads a held response because of it."""

    call: GatedCall
    approved: bool
    reason: str | None
    now: float


@dataclass(frozen=True, slots=True)
class ConfirmationDecided:
    """Approvers decided an ADK confirmation the run asked and waits open for: the run goes on
    with their answer (chat/approver_waits.py); `by`: who decided."""

    approval_id: str
    approved: bool
    reason: str | None
    by: tuple[str, ...]
    now: float
    # The gateway's answer to its deadline, not the approvers'.
    timed_out: bool = False


@dataclass(frozen=True, slots=True)
class Resumed:
    """A reconnecting browser reads the response held for it."""


@dataclass(frozen=True, slots=True)
class Settled:
    """The person sent a new message instead of answering: `decisions` they did make count, the
    rest of what the run waits for is cancelled."""

    decisions: Iterable[Decision]
    now: float


@dataclass(frozen=True, slots=True)
class CallCancelled:
    """Nobody will answer `call` any more (its plugin request went away, or could not be recorded)."""

    call: GatedCall
    why: str
    now: float


@dataclass(frozen=True, slots=True)
class DeadlineReached:
    """The machine's next deadline passed: apply every deadline due by `now`."""

    now: float


@dataclass(frozen=True, slots=True)
class RunFailed:
    """The run cannot go on: the upstream failed, or the gateway broke while streaming it."""

    text: str
    now: float
    run: int | None = None


# How the shell ends a run early: as the browser's stop (`abort`), or closing it with a sentence (`cancel`).
EndHow = Literal["abort", "cancel"]


@dataclass(frozen=True, slots=True)
class EndAsked:
    """The shell is ending run `run` before its end (it cancels the run's task next): `abort`, the
    browser stopped it, or a new message came for a chat whose response nobody reads; `cancel`,
    the gateway closes it saying `reason` (its agent was removed, a shutdown; None: the default
    sentence). Recorded by the machine until the run's `RunCancelled` (core/run_ending.py)."""

    run: int | None
    how: EndHow
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class RunCancelled:
    """The run's task was cancelled (or is stuck past its bound, and the shell ends the run for it):
    the run ends as the `EndAsked` its machine recorded says, the default sentence without one."""

    now: float
    run: int | None = None


@dataclass(frozen=True, slots=True)
class RunClosed:
    """The run's upstream stream is over, whatever ended it."""

    now: float
    run: int | None = None


@dataclass(frozen=True, slots=True)
class ToolAsked:
    """The plugin asks about a call of `tool` (its raw ask, as the shell read it): the approvals
    room decides what it comes to (approvals/decision.py), asked by the machine through its port
    (core/gate_decider.py), and the machine records what waits here.

    `policy`: the tool's in the agent `agent`; `claims`: those of the chatting user's latest
    request (the rules read them); `confirm`: the plugin asks ADK's confirmation unless the gateway
    decides (confirm mode); `approvers`: it can mark that confirmation with who answers (plugin
    0.3); `mode`: the agent's upstream (`live` has no confirmation); `max_pending`: the chat's cap
    of waiting calls; `user_waiting`: how many approvals the user has listed for the approvals API
    (the shared store's count, read before the ask; None: not read, or unknown), `max_pending_user`
    their cap; `approval_id`: the id a new call takes (None: a fresh unguessable one).
    A recorded call is shown to the browser by `GateOpened`, once the cluster recorded it too; one
    a rule decided (released) is recorded and shown at once.
    """

    tool_call_id: str
    tool: str
    args: Mapping[str, Any]
    policy: ToolPolicy
    agent: str
    user_id: str
    chat_id: str
    session_id: str
    now: float
    claims: Mapping[str, Any] = field(default_factory=dict)
    confirm: bool = False
    approvers: bool = False
    mode: Literal["sse", "live"] = "sse"
    max_pending: int = 16
    approval_id: str | None = None
    user_waiting: int | None = None
    max_pending_user: int = 64
    # Standing grants that could decide the call (approvals/grants.py `Grant`s, typed loosely: the
    # core cannot see the room), each with a use reserved for it by the shell.
    grants: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class NativeAnswered:
    """An answer to ADK confirmation `approval_id` goes out to ADK now, or the confirmation is
    settled without one (ADK lost it); `timed_out`: the gateway's answer at its deadline."""

    approval_id: str
    tool_call_id: str = ""
    timed_out: bool = False


@dataclass(frozen=True, slots=True)
class BrowserToolApproved:
    """The person approved a browser tool's ADK confirmation: the browser runs it now, and its
    output will answer the confirmation. `wall`: the wall clock, for its shared deadline.
    `known`: the confirmation as ADK's session shows it, for a ledger that does not hold it."""

    approval_id: str
    now: float
    wall: float
    known: NativeConfirmation | None = None


@dataclass(frozen=True, slots=True)
class ConfirmationsSeen:
    """The gateway now knows of the confirmations pending in the chat: those it had not seen yet
    are seen at `wall` (their deadlines run from the later of this and ADK's own time)."""

    wall: float


@dataclass(frozen=True, slots=True)
class BrowserAsked:
    """A browser request, as the shell matched it against the chat: whether it carries a new
    message, answers (or browser outputs) for gated calls of the chat's current run, and the
    approval ids of its answers to ADK confirmations (`native_sent`), of which `native_open` are
    still waited for (ADK's session says so; all of them in live mode, which has none to ask)."""

    new_message: bool
    answers_gated: bool
    native_sent: tuple[str, ...]
    native_open: int
    live: bool


@dataclass(frozen=True, slots=True)
class AnswersGoing:
    """Answers to these ADK confirmations are about to go out to ADK (`timed_out`, one per id: the
    deadline's answer); `browser`: a browser request sends them, not the deadline."""

    approval_ids: tuple[str, ...]
    timed_out: tuple[bool, ...]
    browser: bool


@dataclass(frozen=True, slots=True)
class AnswersSent:
    """The answers `AnswersGoing` claimed went out (and were recorded), or their run did not start."""

    approval_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RunWanted:
    """A request wants a run of the chat (or only asks whether it could start one now), with what
    the shell observed of the chat's current response: `open`, still being written; `read`,
    somebody reads it (a browser here, or a relay given the time to say its browser left).
    `free`: the request cannot make a run under way end (it did so already and asks again, or it
    hands a browser tool over instead of running), so anything under way or being written is
    busy. `claim`: a `start` answer claims the chat for the run this request starts (until its
    `RunStarts`, or `RunDropped`); False when the request only asks."""

    open: bool
    read: bool = False
    free: bool = False
    claim: bool = True


@dataclass(frozen=True, slots=True)
class RunDropped:
    """The run a request claimed (`RunWanted`) will not start: its upstream refused before it."""


@dataclass(frozen=True, slots=True)
class AudioHeard:
    """The person's speech reached a live chat; `in_turn`: its live session is in a model turn."""

    in_turn: bool


@dataclass(frozen=True, slots=True)
class SocketClosed:
    """The browser socket that drove a live chat closed; `cancel`: `chat.on_disconnect: cancel`."""

    cancel: bool


@dataclass(frozen=True, slots=True)
class StateRestored:
    """The chat's state as a machine saved it elsewhere (`ChatMachine.snapshot`, kept in the shared
    store): taken by a machine that has done nothing yet, for a chat this process takes over."""

    snapshot: Any
    now: float


ChatEvent = (
    RunStarts | UpstreamRead | GateOpened | Attached | Answered | Resumed | Settled | CallCancelled | DeadlineReached
    | RunFailed | EndAsked | RunCancelled | RunClosed | ToolAsked | NativeAnswered | BrowserToolApproved | ConfirmationsSeen
    | StateRestored | BrowserAsked | AnswersGoing | AnswersSent | RunWanted | ApproversDecided | ConfirmationDecided
    | RunDropped | AudioHeard | SocketClosed
)
