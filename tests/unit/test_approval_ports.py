"""The approvals room's ports toward the chat side, and what implements each (no type checker runs
here, so the signatures are held against each other): the machine's `GateDecider`
(core/gate_decider.py), implemented by the room's decision (approvals/decision.py), and the room's
`ApprovalDecisions` (approvals/ports.py), implemented by the chat service and called by the desk."""

from __future__ import annotations

import inspect

import pytest

from gateway.approvals.decision import DECIDER
from gateway.approvals.ports import ApprovalDecisions
from gateway.chat.service import ChatService
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
