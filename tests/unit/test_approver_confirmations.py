"""Calls its approvers decide, on ADK's confirmation engine (`/run_sse`, confirm mode): the plugin asks
ADK's confirmation with the gateway's mark of who answers, the run ends, the call waits in ADK's
session (durable), the chat shows whom it waits for and refuses the requester's own answer, and the
gateway answers ADK once the approvers decided."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.chat.answers import ForApprovers
from gateway.core.approvals import CONFIRM, Verdict
from gateway.core.approver_confirmations import ApproverMark
from gateway.core.ledger import Ledger, NativeConfirmation
from gateway.core.turn import Turn
from gateway.upstream.session_history import SessionConfirmations
from tests.support.chat import CALL, USER, call_event, request
from tests.support.service import shipped_service
from tests.unit.test_turn import Shell

SPEC = {"approvers": "supervisors", "self_approval": False, "quorum": 1, "rule": "large_refund"}
PAYLOAD = {"adk_gateway": {"approvers": SPEC}}
MARK = ApproverMark("supervisors", False, 1, "large_refund")


def _refund_asked(service: Any, adk: Any, *, approvers: bool) -> Any:
    event = call_event("issue_refund")
    event["content"]["parts"][0]["functionCall"]["args"] = {"amount": "5000"}
    adk.reads.put_nowait([event])
    return lambda: service.gates.open(
        app_name="support_agent", user_id="customer", session_id="chat-1", tool_call_id=CALL, tool="issue_refund",
        args={"amount": "5000"}, confirm=True, approvers=approvers,
    )


async def test_a_call_for_approvers_is_confirmed_by_adk_with_the_gateways_mark_of_who_answers() -> None:
    adk, service = shipped_service()
    await service.submit("support_agent", "customer", request(USER))
    ask = _refund_asked(service, adk, approvers=True)
    await asyncio.sleep(0.01)
    verdict = ask()
    # Not held (a GatedCall the plugin's request waits on): ADK's confirmation, in ADK's session.
    assert isinstance(verdict, Verdict) and verdict.confirm and not verdict.run
    assert verdict.payload == PAYLOAD
    assert verdict.as_json() == {"verdict": "confirm", "payload": PAYLOAD}
    assert Verdict.from_json(verdict.as_json()) == verdict  # forwarded between replicas unchanged
    assert service.gates.find(app_name="support_agent", user_id="customer", session_id="chat-1", tool_call_id=CALL) is None


def test_a_plain_confirm_verdict_carries_no_payload() -> None:
    assert CONFIRM.as_json() == {"verdict": "confirm"}
    assert Verdict.from_json({"verdict": "confirm", "payload": "not a map"}) == CONFIRM


def _confirmation(payload: dict[str, Any] | None) -> list[dict[str, Any]]:
    confirmation: dict[str, Any] = {"hint": "Card credited.", "confirmed": False}
    if payload is not None:
        confirmation["payload"] = payload
    return [
        {"author": "a", "content": {"role": "model", "parts": [{"functionCall": {"id": "c-1", "name": "issue_refund", "args": {"amount": 250}}}]}},
        {"author": "a", "longRunningToolIds": ["adk-9"], "content": {"role": "user", "parts": [{"functionCall": {
            "id": "adk-9", "name": "adk_request_confirmation",
            "args": {"originalFunctionCall": {"id": "c-1", "name": "issue_refund", "args": {"amount": 250}},
                     "toolConfirmation": confirmation},
        }}]}},
    ]


def _turn(version: int = 7) -> tuple[Turn, Shell]:
    adk, service = shipped_service()
    agent = service.config.agents["support_agent"]
    turn = Turn("m1", ledger=Ledger(), policy=agent.tool_policy, confirms=agent.confirms, version=version)
    return turn, Shell(turn)


@pytest.mark.parametrize("version", [6, 7])
def test_the_chat_sees_whom_an_adk_confirmation_for_approvers_waits_for_never_an_approval_request(version: int) -> None:
    turn, shell = _turn(version)
    shell.apply(turn.begin())
    shell.apply(turn.feed(_confirmation(PAYLOAD), 0.0))
    shell.apply(turn.end(1.0))
    kinds = [c["type"] for c in shell.current.chunks]
    assert "tool-approval-request" not in kinds, "the requester must not be asked to answer for the approvers"
    [part] = [c for c in shell.current.chunks if c["type"] == "data-approval"]
    assert part["id"] == "adk-9" and part["data"] == {
        "approvalId": "adk-9", "toolCallId": "c-1", "state": "waiting", "approvers": "supervisors", "quorum": 1,
        "rule": "large_refund", "hint": "The customer's card is credited when you approve.",
    }
    native = turn.ledger.native("adk-9")
    assert native is not None and native.mark == MARK and native.for_approvers
    # Kept with the chat's state (a replica that restarts reads it back).
    [again] = Ledger.restore(turn.ledger.snapshot()).pending_native()
    assert again.mark == MARK


def test_a_confirmation_without_the_mark_is_the_chatting_users_as_before() -> None:
    turn, shell = _turn()
    shell.apply(turn.begin())
    shell.apply(turn.feed(_confirmation(None), 0.0))
    shell.apply(turn.end(1.0))
    assert "tool-approval-request" in [c["type"] for c in shell.current.chunks]
    native = turn.ledger.native("adk-9")
    assert native is not None and native.mark is None


def test_a_snapshot_of_an_older_replica_reads_as_the_chatting_users() -> None:
    old = {k: v for k, v in NativeConfirmation("adk-1", "c-1", "t").as_json().items()
           if k != "mark"}
    assert NativeConfirmation.from_json(old).mark is None


def test_adks_session_says_which_confirmations_its_approvers_answer() -> None:
    from gateway.upstream.session_history import session_confirmations

    held = session_confirmations({"events": _confirmation(PAYLOAD)})
    assert held.calls["adk-9"].mark == MARK
    plain = session_confirmations({"events": _confirmation(None)})
    assert plain.calls["adk-9"].mark is None


def _answer(approval_id: str = "adk-9", approved: bool = True) -> dict[str, Any]:
    return {"id": "m1", "role": "assistant", "parts": [{
        "type": "tool-issue_refund", "toolCallId": "c-1", "state": "approval-responded", "input": {"amount": 250},
        "approval": {"id": approval_id, "approved": approved},
    }]}


async def test_the_requester_cannot_answer_an_adk_confirmation_for_approvers_even_on_a_replica_that_never_saw_it() -> None:
    adk, service = shipped_service()
    # A fresh replica: the chat's ledger knows nothing; ADK's session holds the mark.
    adk.sessions = [{"events": _confirmation(PAYLOAD)}]
    with pytest.raises(ForApprovers) as refused:
        await service.submit("support_agent", "customer", request(USER, _answer(), message_id="m1"))
    assert refused.value.status == 403 and "supervisors" in str(refused.value)
    assert "run" not in adk.calls


async def test_the_gateway_answers_adks_confirmation_once_the_approvers_decided() -> None:
    adk, service = shipped_service()
    adk.sessions = [{"events": _confirmation(PAYLOAD)}]
    result = await service.desk_view.answer_for_approvers(
        "support_agent", "customer", "chat-1", "adk-9", approved=True, reason=None,
        deciders=[{"user": "sup", "auth": "approver_key"}],
    )
    assert result == "decided"
    await asyncio.sleep(0.01)
    assert adk.calls.count("run") == 1
    [sent] = adk.messages
    [part] = sent["parts"]
    assert part["functionResponse"] == {"id": "adk-9", "name": "adk_request_confirmation", "response": {"confirmed": True}}
    adk.reads.put_nowait(None)
    await asyncio.sleep(0.01)
    # Decided once: a second decision (another replica's, a replay) sends ADK nothing.
    adk.sessions = [{"events": [*_confirmation(PAYLOAD), {"author": "u", "content": {"role": "user", "parts": [part]}}]}]
    again = await service.desk_view.answer_for_approvers(
        "support_agent", "customer", "chat-1", "adk-9", approved=True, reason=None, deciders=[],
    )
    assert again == "already" and adk.calls.count("run") == 1


async def test_a_denial_by_the_approvers_is_adks_rejection_with_their_reason_for_the_model() -> None:
    adk, service = shipped_service()
    adk.sessions = [{"events": _confirmation(PAYLOAD)}]
    result = await service.desk_view.answer_for_approvers(
        "support_agent", "customer", "chat-1", "adk-9", approved=False, reason="not this one", deciders=[],
    )
    assert result == "decided"
    await asyncio.sleep(0.01)
    [sent] = adk.messages
    assert sent["parts"][0]["functionResponse"]["response"]["confirmed"] is False


def test_an_unknown_confirmation_is_gone() -> None:
    assert SessionConfirmations().calls == {}


# ---- the run waits open for its approvers, and streams their outcome into the requester's response ----


async def _follow(attachment: Any, into: list[dict[str, Any]]) -> None:
    import orjson

    async for batch in attachment.response.follow():
        into.extend(orjson.loads(f) for f in batch)


def _result(text: str) -> list[dict[str, Any]]:
    return [
        {"author": "a", "content": {"role": "user", "parts": [{"functionResponse": {
            "id": "c-1", "name": "issue_refund", "response": {"refunded": 250}}}]}},
        {"author": "a", "content": {"role": "model", "parts": [{"text": text}]}},
    ]


@pytest.mark.parametrize("approved", [True, False])
async def test_the_requesters_response_stays_open_and_streams_the_approvers_outcome(approved: bool) -> None:
    adk, service = shipped_service()
    attachment = await service.submit("support_agent", "customer", request(USER, message_id=None))
    seen: list[dict[str, Any]] = []
    follower = asyncio.create_task(_follow(attachment, seen))
    adk.reads.put_nowait(_confirmation(PAYLOAD))
    adk.reads.put_nowait(None)  # ADK's run ends with the confirmation in its session
    await asyncio.sleep(0.05)
    kinds = [c["type"] for c in seen]
    assert "data-approval" in kinds and "finish" not in kinds and "tool-approval-request" not in kinds
    assert not follower.done(), "the requester's response waits for the approvers, open"
    result = await service.desk_view.answer_for_approvers(
        "support_agent", "customer", "chat-1", "adk-9", approved=approved, reason=None if approved else "no",
        deciders=[{"user": "sup", "auth": "approver_key"}],
    )
    assert result == "decided"
    await asyncio.sleep(0.02)
    [sent] = adk.messages[1:]  # the first is the user's message
    assert sent["parts"][0]["functionResponse"]["response"] == {"confirmed": approved}
    adk.reads.put_nowait(_result("Refunded.") if approved else [
        {"author": "a", "content": {"role": "user", "parts": [{"functionResponse": {
            "id": "c-1", "name": "issue_refund", "response": {"error": "This tool call is rejected."}}}]}}])
    adk.reads.put_nowait(None)
    await asyncio.wait_for(follower, 5)
    decided = [c for c in seen if c["type"] == "data-approval"][-1]
    assert decided["data"]["state"] == "decided" and decided["data"]["approved"] is approved
    assert decided["data"]["by"] == ["sup"]
    assert seen[-1]["type"] == "finish" and [c["type"] for c in seen].count("start") == 1
    outcome = "tool-output-available" if approved else "tool-output-error"  # ai 6: a denial without its approval pair
    assert any(c["type"] == outcome and c["toolCallId"] == "c-1" for c in seen), seen
    # Once: the approvers' second word (another replica's replay) finds nothing waiting.
    adk.sessions = [{"events": [*_confirmation(PAYLOAD), {"author": "u", "content": sent}]}]
    again = await service.desk_view.answer_for_approvers("support_agent", "customer", "chat-1", "adk-9", approved=True,
                                               reason=None, deciders=[])
    assert again == "already" and len(adk.messages) == 2
