"""The approvals room's ports toward the chat side, and what implements each (no type checker runs
here, so the signatures are held against each other): the machine's `GateDecider`
(core/gate_decider.py), implemented by the room's decision (approvals/decision.py), and the room's
`ApprovalDecisions` (approvals/ports.py), implemented by the chat's desk view (chat/desk_view.py) and called by the desk,
and `ApprovalChats`, the whole of what the desk reads of this replica's chats, through which alone
it reaches them; and `GatedCalls`, implemented by the chat's gates, through which alone the remote
gate reaches the chats with the plugin's ask (tests/unit/test_layers.py holds both to importing
nothing of gateway/chat/)."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from gateway.approvals.decision import DECIDER
from gateway.approvals.decision import refuse_ask
from gateway.approvals.ports import ApprovalChats, ApprovalDecisions, GatedCalls, WaitingConfirmation
from gateway.chat.gates import Gates
from gateway.chat.desk_view import DeskView
from gateway.cluster.approval_desk import CONFIRM_ENGINE, ApprovalDesk
from gateway.cluster.liveness import Liveness
from gateway.cluster.memory import MemoryState
from gateway.cluster.messages import Answer, Gate, Work
from gateway.cluster.remote_gate import RemoteGate
from gateway.cluster.tasks import Tasks
from gateway.config.schema import GatewayConfig, ToolPolicy, parse_config
from gateway.core.approvals import GatedCall, Verdict
from gateway.core.approver_confirmations import ApproverMark
from gateway.core.deadlines import Deadline
from gateway.core.gate_decider import GateDecider
from gateway.core.native_confirmation import NativeConfirmation
from gateway.ops.metrics import GatewayMetrics


def _signature(method: object) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.annotation) for p in inspect.signature(method).parameters.values()]  # type: ignore[arg-type]


@pytest.mark.parametrize(("port", "implementation"), [
    (GateDecider, type(DECIDER)), (ApprovalDecisions, DeskView), (ApprovalChats, DeskView), (GatedCalls, Gates),
])
def test_each_port_is_implemented_with_its_own_signatures(port: type, implementation: type) -> None:
    methods = [name for name, _ in inspect.getmembers(port, inspect.isfunction) if not name.startswith("_")]
    assert methods, port
    for name in methods:
        mine, theirs = getattr(port, name), getattr(implementation, name)
        assert _signature(theirs) == _signature(mine), (implementation.__name__, name)
        assert inspect.signature(theirs).return_annotation == inspect.signature(mine).return_annotation
        assert inspect.iscoroutinefunction(theirs) == inspect.iscoroutinefunction(mine), (implementation.__name__, name)


class _Decisions:
    """The chat side as the desk sees it (`ApprovalDecisions`): what it was asked to apply."""

    def __init__(self) -> None:
        self.applied: list[dict[str, Any]] = []

    def decide_for_approvers(self, **decision: Any) -> str:
        self.applied.append(decision)
        return "decided"

    async def answer_for_approvers(self, *args: Any, **kwargs: Any) -> str:
        raise AssertionError("a call held here is not an ADK confirmation")


async def _no_ask(owner: str, work: Work) -> Answer:
    raise AssertionError("the call's owner is this replica")


async def test_the_desk_applies_a_decision_held_here_through_the_port() -> None:
    decisions = _Decisions()
    desk = ApprovalDesk(MemoryState("a"), decisions, _no_ask)  # type: ignore[arg-type]
    record = {"id": "gw-1", "requester": "u", "session": "s1", "owner": "a"}
    deciders = [{"user": "sup", "auth": "jwt"}]
    assert await desk.decide(record, True, "fine", deciders) == "decided"
    assert decisions.applied == [
        {"user_id": "u", "session_id": "s1", "approval_id": "gw-1", "approved": True, "reason": "fine", "deciders": deciders},
    ]


class _Chats(_Decisions):
    """This replica's chats as the desk sees them (`ApprovalChats`), with nothing of the chat layer:
    one chat of the default agent, its session "s1", waiting on ADK confirmation "adk-1" for its
    supervisors."""

    def __init__(self) -> None:
        super().__init__()
        self.config: GatewayConfig = parse_config("internal:\n  secret: s\nupstream:\n  app_name: pay_app\n", env={})
        self.expired: list[Deadline] = []

    def now(self) -> float:
        return 100.0

    def agent_of(self, user_id: str, session_id: str) -> str:
        return self.config.default if (user_id, session_id) == ("u", "s1") else ""

    def native_waiting(self, agent: str, user_id: str, chat_id: str, approval_id: str) -> WaitingConfirmation | None:
        if approval_id != "adk-1":
            return None
        confirmation = NativeConfirmation("adk-1", "c1", "pay", args={"amount": 500}, mark=ApproverMark("supervisors"))
        return WaitingConfirmation(agent, user_id, chat_id, "s1", confirmation)

    async def expire_confirmation(self, deadline: Deadline) -> float | None:
        self.expired.append(deadline)
        return None


async def test_the_desk_lists_what_waits_reading_the_chats_only_through_the_port() -> None:
    chats, state = _Chats(), MemoryState("a")
    desk = ApprovalDesk(state, chats, _no_ask, wall=lambda: 5000.0)
    call = GatedCall.open(
        user_id="u", chat_id="chat-1", session_id="s1", tool_call_id="c1", tool="pay", args={}, now=90.0,
        policy=ToolPolicy(approval=True, timeout=30),
    )
    assert await desk.opened(call)
    held = await state.get_approval(call.id)
    assert held is not None and (held["agent"], held["app_name"], held["owner"]) == (chats.config.default, "pay_app", "a")
    assert (held["created"], held["deadline"]) == (4990.0, 5020.0)  # the chats' clock, shown on the wall clock
    deadline = Deadline(chats.config.default, "u", "chat-1", "adk-1", "c1", "pay", 5030.0)
    await desk.confirmation_waiting(deadline)
    listed = await state.get_approval("adk-1")
    assert listed is not None and listed["engine"] == CONFIRM_ENGINE and listed["approvers"] == "supervisors"
    assert (listed["requester"], listed["chat_id"], listed["session"], listed["deadline"]) == ("u", "chat-1", "s1", 5030.0)
    await desk.confirmation_waiting(Deadline(chats.config.default, "u", "chat-1", "adk-9", "c9", "pay", 5030.0))
    assert await state.get_approval("adk-9") is None  # no chat here waits on it: nothing listed
    assert await desk.deadline_passed(Deadline(chats.config.default, "u", "chat-2", "adk-2", "c2", "pay", 5030.0)) is None
    assert [d.approval_id for d in chats.expired] == ["adk-2"]


class _Calls:
    """This replica's chats as the remote gate sees them (`GatedCalls`), with nothing of the chat
    layer: every new ask is refused at once, and what it was opened with is kept."""

    def __init__(self, listed: bool) -> None:
        self.listed = listed
        self.opened: list[dict[str, Any]] = []

    def find(self, **_: Any) -> GatedCall | None:
        return None

    def open(self, **ask: Any) -> GatedCall | Verdict:
        self.opened.append(ask)
        return refuse_ask("no_browser", "nobody here")

    def may_be_listed(self, app_name: str, tool: str, *, confirm: bool) -> bool:
        return self.listed

    def grant_scope(self, app_name: str, user_id: str, session_id: str) -> None:
        return None

    def timeout(self, app_name: str, tool: str) -> float:
        return 30.0


@pytest.mark.parametrize("listed", [True, False])
async def test_the_remote_gate_hands_the_users_count_to_the_chats_through_the_port(listed: bool) -> None:
    """The user's count of listed approvals is read from the store before the ask is decided, and
    only for an ask that may be listed; the chat's machine decides with it (approvals/decision.py)."""
    state = MemoryState("a")
    for n in (1, 2):
        await state.put_approval({"id": f"gw-{n}", "agent": "a", "tool": "pay", "requester": "u", "created": 1.0}, ttl=60)
    calls = _Calls(listed)
    gate = RemoteGate(
        state, calls, GatewayMetrics(), Tasks(), Liveness(state, 0.01), _no_ask, forward_timeout=0.05,  # type: ignore[arg-type]
        desk=ApprovalDesk(state, _Chats(), _no_ask),
    )
    ask = Gate(app="pay_app", user="u", session="s1", tool_call_id="c1", tool="pay", args={}, confirm=True, approvers=True)
    verdict, result = await gate.here(ask)
    assert result == "no_browser" and not verdict.run
    [opened] = calls.opened
    assert opened["user_waiting"] == (2 if listed else None)
    assert (opened["confirm"], opened["approvers"], opened["tool_call_id"]) == (True, True, "c1")
