"""Standing grants, sans-IO (approvals/grants.py): which grants could decide a call (`candidates`),
whether one decides what the rules ask (`covers`), and the decision with grants
(approvals/decision.py): a grant decides only what its granter could have answered."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gateway.approvals.decision import ChatView, decide_ask
from gateway.approvals.grants import USER_AUTHORITY, Grant, asked_of, candidates, covers, grant_rule
from gateway.config.approvers import AskSpec
from gateway.config.schema import ToolPolicy
from gateway.core.approvals import CONFIRM
from gateway.core.chat_events import ToolAsked
from tests.unit.test_gate_decision import PAY, REFUND

NOW = 1000.0
# The chatting user's own grant, for their calls of `pay` in chat c.
MINE = Grant(
    id="gr-mine", agent="agent", tool="pay", user_id="alice", chat_id="c", condition=None, expires_at=NOW + 60,
    uses_left=None, granted_by={"user": "alice", "auth": "api_key"}, authority=USER_AUTHORITY, created_at=NOW,
)
# A supervisor's grant (an approver key) over every user's refunds.
SUPERVISED = replace(
    MINE, id="gr-sup", tool="refund", user_id=None, chat_id=None, granted_by={"user": "boss", "auth": "approver_key"},
    authority="supervisors",
)


def _candidates(grants: list[Grant], *, tool: str = "pay", user: str = "alice", chat: str = "c", args: Any = None,
                claims: Any = None, now: float = NOW) -> list[str]:
    found = candidates(grants, agent="agent", tool=tool, user=user, chat=chat, args=args or {"amount": 50},
                       claims=claims or {}, now=now)
    return [grant.id for grant in found]


CANDIDATES = [
    ("in scope", MINE, {}, True),
    ("another agent's", replace(MINE, agent="other"), {}, False),
    ("another tool's", replace(MINE, tool="refund"), {}, False),
    ("another user's", MINE, {"user": "bob"}, False),
    ("another chat's", MINE, {"chat": "d"}, False),
    ("any chat of the user", replace(MINE, chat_id=None), {"chat": "d"}, True),
    ("every user's", replace(MINE, user_id=None), {"user": "bob"}, True),
    ("expired", MINE, {"now": NOW + 60}, False),
    ("used up", replace(MINE, uses_left=0), {}, False),
    ("a use left", replace(MINE, uses_left=1), {}, True),
    ("its condition holds", replace(MINE, condition="args.amount <= 50"), {}, True),
    ("its condition does not hold", replace(MINE, condition="args.amount < 50"), {}, False),
    ("its condition cannot be evaluated: fails closed", replace(MINE, condition="args.total < 50"), {}, False),
    ("a condition on the claims", replace(MINE, condition='"staff" in claims.groups'), {"claims": {"groups": ["staff"]}}, True),
    ("a condition that does not compile: no match", replace(MINE, condition="args.amount <"), {}, False),
]


@pytest.mark.parametrize(("why", "grant", "call", "matches"), CANDIDATES, ids=[c[0] for c in CANDIDATES])
def test_which_grants_could_decide_a_call(why: str, grant: Grant, call: dict[str, Any], matches: bool) -> None:
    assert _candidates([grant], **call) == ([grant.id] if matches else [])


COVERS = [
    # (why, grant, who the rules ask, requester, covered)
    ("the user's grant, a call the user is asked", MINE, None, "alice", True),
    ("the user's grant never passes what approvers are asked", MINE, AskSpec("supervisors"), "alice", False),
    ("the user's grant covers only its user", MINE, None, "bob", False),
    ("a group's grant, a call asked of the group", SUPERVISED, AskSpec("supervisors"), "alice", True),
    ("a group's grant, a call the user is asked", SUPERVISED, None, "alice", False),
    ("a group's grant, another group asked", SUPERVISED, AskSpec("leads"), "alice", False),
    ("a quorum of two is not one person's standing word", SUPERVISED, AskSpec("supervisors", quorum=2), "alice", False),
    ("four-eyes: an approver key is never the requester", SUPERVISED, AskSpec("supervisors", False), "boss", True),
    ("four-eyes: the requester's own grant does not pass",
     replace(SUPERVISED, granted_by={"user": "alice", "auth": "jwt"}), AskSpec("supervisors", False), "alice", False),
    ("four-eyes: another member's grant passes",
     replace(SUPERVISED, granted_by={"user": "carol", "auth": "jwt"}), AskSpec("supervisors", False), "alice", True),
    ("self-approval allowed: the requester's own grant passes",
     replace(SUPERVISED, granted_by={"user": "alice", "auth": "jwt"}), AskSpec("supervisors", True), "alice", True),
]


@pytest.mark.parametrize(("why", "grant", "asks", "requester", "covered"), COVERS, ids=[c[0] for c in COVERS])
def test_whom_a_grant_covers(why: str, grant: Grant, asks: AskSpec | None, requester: str, covered: bool) -> None:
    assert covers(grant, asks, requester) is covered


COMMITTEE = ToolPolicy.model_validate({"approval": True, "approvers": "supervisors", "quorum": 2})
LOCATE = ToolPolicy.model_validate({"approval": True, "runs_in": "browser"})


def _ask(policy: ToolPolicy, amount: Any, grants: tuple[Grant, ...], **plugin: Any) -> ToolAsked:
    return ToolAsked(
        "t1", "pay", {"amount": amount}, policy, "agent", "alice", "c", "c", 1.0, grants=grants,
        **({"confirm": True, "approvers": True} | plugin),
    )


DECISIONS = [
    # (why, policy, amount, grants, action, the call's rule or the verdict)
    ("the user's grant decides what the user is asked", PAY, 50, (MINE,), "rule", grant_rule("gr-mine")),
    ("without a grant the user is asked", PAY, 50, (), "confirm", CONFIRM),
    ("a rule's approve decides first", PAY, 2, (MINE,), "rule", "small"),
    ("a rule's deny is never passed", PAY, 20000, (MINE,), "rule", "too_large"),
    ("an unevaluable deny is never passed", PAY, "lots", (MINE,), "rule", "too_large"),
    ("the user's grant cannot pass a rule that asks approvers", REFUND, 250, (replace(MINE, tool="refund"),), "confirm", None),
    ("the group's grant decides what the group is asked", REFUND, 250, (SUPERVISED,), "rule", grant_rule("gr-sup")),
    ("the group's grant cannot pass what the user is asked", REFUND, 50, (SUPERVISED,), "confirm", CONFIRM),
    ("a quorum of two: the group's grant does not apply", COMMITTEE, 50, (SUPERVISED,), "confirm", None),
    ("the first grant that covers decides", REFUND, 250, (replace(MINE, tool="refund"), SUPERVISED), "rule", grant_rule("gr-sup")),
    ("a browser tool's call is never a grant's", LOCATE, 50, (MINE,), "confirm", CONFIRM),
]


@pytest.mark.parametrize(("why", "policy", "amount", "grants", "action", "expected"), DECISIONS, ids=[c[0] for c in DECISIONS])
def test_the_decision_with_grants(
    why: str, policy: ToolPolicy, amount: Any, grants: tuple[Grant, ...], action: str, expected: Any,
) -> None:
    decided = decide_ask(_ask(policy, amount, grants), ChatView(run_under_way=True, waiting=0))
    assert decided.action == action
    if action == "rule":
        assert decided.call is not None and decided.call.rule == expected
        assert decided.verdict is not None and decided.verdict.run is (expected != "too_large")
    elif expected is CONFIRM:
        assert decided.verdict == CONFIRM
    else:
        # Marked for its approvers: still theirs to decide.
        assert decided.verdict is not None and decided.verdict.payload is not None


def test_a_grant_decides_on_live_too() -> None:
    decided = decide_ask(_ask(PAY, 50, (MINE,), confirm=False, approvers=False, mode="live"), ChatView(run_under_way=True, waiting=0))
    assert decided.action == "rule" and decided.call is not None and decided.call.rule == grant_rule("gr-mine")
    assert decided.call.decided_by == "rule" and decided.call.approved is True


ASKED_OF = [
    ("the user answers the tool", PAY, USER_AUTHORITY, True),
    ("the user answers below the rule", REFUND, USER_AUTHORITY, True),
    ("the rule's group", REFUND, "supervisors", True),
    ("a group the policy never names", REFUND, "leads", False),
    ("only approvers answer the tool", COMMITTEE, USER_AUTHORITY, False),
    ("an ungated tool asks nobody", ToolPolicy(), USER_AUTHORITY, False),
    ("a browser tool's approval is not a grant's", LOCATE, USER_AUTHORITY, False),
]


@pytest.mark.parametrize(("why", "policy", "authority", "asked"), ASKED_OF, ids=[c[0] for c in ASKED_OF])
def test_what_may_be_granted(why: str, policy: ToolPolicy, authority: str, asked: bool) -> None:
    assert asked_of(policy, authority) is asked


def test_a_grant_reads_back_as_itself_and_refuses_what_is_not_one() -> None:
    assert Grant.from_json(MINE.as_json()) == MINE
    assert Grant.from_json({**MINE.as_json(), "uses_left": "3"}) is None
    assert Grant.from_json({"id": "gr-x"}) is None
