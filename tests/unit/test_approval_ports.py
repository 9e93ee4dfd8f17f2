"""The approvals room's ports toward the chat side, and what implements each (no type checker runs
here, so the signatures are held against each other): the machine's `GateDecider`
(core/gate_decider.py), implemented by the room's decision (approvals/decision.py), and the room's
`ApprovalDecisions` (approvals/ports.py), implemented by the chat service and called by the desk,
which reaches the chat through it alone."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from gateway.approvals.decision import DECIDER
from gateway.approvals.ports import ApprovalDecisions
from gateway.chat.service import ChatService
from gateway.cluster.approval_desk import ApprovalDesk
from gateway.cluster.memory import MemoryState
from gateway.cluster.messages import Answer, Work
from gateway.core.gate_decider import GateDecider


def _signature(method: object) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.annotation) for p in inspect.signature(method).parameters.values()]  # type: ignore[arg-type]


@pytest.mark.parametrize(("port", "implementation"), [
    (GateDecider, type(DECIDER)), (ApprovalDecisions, ChatService),
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
