"""Shadow rules (config/shadow_rules.py): evaluated where rules are, never enforced; what each would
have decided reaches the decision (approvals/decision.py), the call's audit record, the metrics and a
reload's judgement as data. Table tests at the layer where the decision lives."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.approvals.decision import ChatView, decide_ask
from gateway.approvals.notice import ApprovalNotice
from gateway.config.approvers import AskSpec
from gateway.config.decision_loosening import tool_rules_loosened
from gateway.config.rules import RuleDecision, decide
from gateway.config.agent import AgentConfig
from gateway.config.schema import ToolPolicy
from gateway.config.shadow_rules import AGREEMENTS, compare, shadowed
from gateway.chat import gates as gates_module
from gateway.config.schema import parse_config
from gateway.approvals.reports import Notices
from gateway.core.approvals import GatedCall, Verdict
from gateway.core.approver_confirmations import marked, read_mark, read_shadow
from gateway.core.native_confirmation import NativeConfirmation
from gateway.core.chat_events import ToolAsked
from gateway.ops.metric_labels import SHADOW_AGREEMENTS
from gateway.ops.metrics import GatewayMetrics
from tests.support.adk import ScriptedAdk
from tests.support.chat import USER, call_event, request
from tests.support.logs import RecordingLog
from tests.support.service import chat_service, held_engine

# Enforced: small refunds run, huge ones are refused, the rest the chatting user answers. Shadowed:
# a tighter limit for supervisors, and an approve rule that would loosen mid-sized refunds.
REFUND = ToolPolicy.model_validate({"approval": True, "rules": [
    {"name": "small", "when": "args.amount < 5", "decide": "approve"},
    {"name": "try_supervisors", "when": "args.amount > 100", "decide": "ask", "approvers": "supervisors",
     "self_approval": False, "shadow": True},
    {"name": "try_mid", "when": "args.amount < 50", "decide": "approve", "shadow": True},
    {"name": "huge", "when": "args.amount >= 10000", "decide": "deny", "reason": "Too much."},
]})


def _decide(policy: ToolPolicy, amount: Any) -> tuple[RuleDecision, list[dict[str, Any]]]:
    call = dict(args={"amount": amount}, tool="refund", agent="desk", user="bob", claims={},
                default="ask" if policy.approval else "approve", default_asks=policy.asks(None))
    ruling = decide(policy.rules, **call)  # type: ignore[arg-type]
    return ruling, [f.as_json() for f in shadowed(policy.rules, ruling, **call)]  # type: ignore[arg-type]


SUPERVISORS = {"decide": "ask", "rule": "try_supervisors", "approvers": "supervisors", "self_approval": False, "quorum": 1}
CASES = [
    # (why, amount, enforced (decide, rule), {shadow rule: (would_decide, agreement)})
    ("nothing shadowed matches: both agree", 2, ("approve", "small"),
     {"try_supervisors": ({"decide": "approve", "rule": "small"}, "agree"),
      "try_mid": ({"decide": "approve", "rule": "small"}, "agree")}),
    ("a shadow approve rule would loosen", 20, ("ask", None),
     {"try_supervisors": ({"decide": "ask", "rule": None}, "agree"),
      "try_mid": ({"decide": "approve", "rule": "try_mid"}, "looser")}),
    ("a shadow ask rule would tighten", 250, ("ask", None),
     {"try_supervisors": (SUPERVISORS, "stricter"), "try_mid": ({"decide": "ask", "rule": None}, "agree")}),
    ("an enforced deny after it still denies: the shadow rule would have asked first", 20000, ("deny", "huge"),
     {"try_supervisors": (SUPERVISORS, "looser"), "try_mid": ({"decide": "deny", "rule": "huge"}, "agree")}),
    # Unevaluable: the enforced deny rule denies; the shadow ask rule is a candidate, weaker than deny.
    ("a value no condition can read fails closed in the shadow walk too", "lots", ("deny", "huge"),
     {"try_supervisors": ({"decide": "deny", "rule": "huge"}, "agree"),
      "try_mid": ({"decide": "deny", "rule": "huge"}, "agree")}),
]


@pytest.mark.parametrize(("why", "amount", "enforced", "shadows"), CASES, ids=[c[0] for c in CASES])
def test_a_shadow_rule_is_never_enforced_and_says_what_it_would_decide(
    why: str, amount: Any, enforced: tuple[str, str | None], shadows: dict[str, tuple[dict[str, Any], str]],
) -> None:
    ruling, findings = _decide(REFUND, amount)
    assert (ruling.decide, ruling.rule) == enforced
    assert {f["rule"]: (f["would_decide"], f["agreement"]) for f in findings} == shadows
    # As if absent: the same decision as the policy without its shadow rules.
    bare = ToolPolicy.model_validate({"approval": True, "rules": [
        r.model_dump(exclude={"shadow"}) for r in REFUND.rules if not r.shadow]})
    assert _decide(bare, amount) == (ruling, [])


def _asks(group: str, quorum: int = 1, self_approval: bool = True) -> RuleDecision:
    return RuleDecision("ask", asks=AskSpec(group, self_approval, quorum))


COMPARED = [
    (RuleDecision("approve"), RuleDecision("approve", "r"), "agree"),
    (RuleDecision("approve"), RuleDecision("ask"), "stricter"),
    (RuleDecision("ask"), _asks("leads"), "stricter"),
    (_asks("leads"), RuleDecision("deny"), "stricter"),
    (RuleDecision("deny"), RuleDecision("ask"), "looser"),
    (_asks("leads"), RuleDecision("ask"), "looser"),
    (_asks("leads"), _asks("leads", quorum=2), "stricter"),
    (_asks("leads"), _asks("leads", self_approval=False), "stricter"),
    (_asks("leads", quorum=2), _asks("leads"), "looser"),
    (_asks("leads", quorum=2), _asks("leads", self_approval=False), "different"),
    (_asks("leads"), _asks("ops"), "different"),
    (_asks("leads", 2, False), _asks("leads", 2, False), "agree"),
]


@pytest.mark.parametrize(("decided", "other", "expected"), COMPARED)
def test_compare_orders_decisions_by_the_authority_they_withhold(decided: RuleDecision, other: RuleDecision, expected: str) -> None:
    assert compare(decided, other) == expected


def _ask(policy: ToolPolicy, amount: Any, mode: str) -> ToolAsked:
    plugin = {"confirm": True, "approvers": True} if mode == "sse" else {}
    return ToolAsked("t1", "refund", {"amount": amount}, policy, "desk", "bob", "c", "c", 1.0, mode=mode,  # type: ignore[arg-type]
                     max_pending=16, max_pending_user=16, **plugin)


@pytest.mark.parametrize(("mode", "amount", "action"), [
    ("sse", 250, "confirm"), ("live", 250, "wait"), ("sse", 2, "rule"), ("live", 20000, "rule"),
])
def test_the_decision_carries_the_findings_in_either_mode(mode: str, amount: Any, action: str) -> None:
    decided = decide_ask(_ask(REFUND, amount, mode), ChatView(run_under_way=True, waiting=0))
    assert decided.action == action
    assert [f["rule"] for f in decided.shadow] == ["try_supervisors", "try_mid"]
    if decided.call is not None:  # held or ruled: the call keeps them for its audit record
        assert decided.call.shadow == list(decided.shadow)
        again = GatedCall.from_json(decided.call.as_json())
        assert again.shadow == decided.call.shadow


@pytest.mark.parametrize(("amount", "approvers", "kept"), [(20, True, True), (250, True, True), (20, False, False)])
def test_adks_confirmation_keeps_the_findings_in_its_payload(amount: int, approvers: bool, kept: bool) -> None:
    """On /run_sse the confirmation is recorded from ADK's session: the verdict's payload (which a
    0.3 plugin asks ADK's confirmation with) carries the findings there, beside any mark of approvers."""
    policy = ToolPolicy.model_validate({"approval": True, "rules": [
        {"name": "try_leads", "when": "args.amount > 10", "decide": "ask", "approvers": "leads", "shadow": True},
        *([{"name": "large", "when": "args.amount > 100", "decide": "ask", "approvers": "supervisors"}] if amount > 100 else []),
    ]})
    asked = ToolAsked("t1", "refund", {"amount": amount}, policy, "desk", "bob", "c", "c", 1.0, mode="sse",  # type: ignore[arg-type]
                      max_pending=16, max_pending_user=16, confirm=True, approvers=approvers)
    decided = decide_ask(asked, ChatView(run_under_way=True, waiting=0))
    assert decided.action == "confirm" and decided.verdict is not None and decided.verdict.confirm
    payload = decided.verdict.payload
    assert read_shadow(payload) == (list(decided.shadow) if kept else [])
    if kept:
        assert read_shadow(payload)[0]["agreement"] == ("stricter" if amount < 100 else "different")
    else:
        assert payload is None  # a 0.2 plugin asks ADK's confirmation without the verdict's payload
    # A mark of approvers reads as before; findings alone mark nobody (the chatting user answers).
    assert (read_mark(payload) is not None) == (amount > 100) and marked(payload) == (amount > 100)
    confirmation = NativeConfirmation("a1", "t1", "refund", args={"amount": amount}, mark=read_mark(payload),
                                      shadow=read_shadow(payload))
    again = NativeConfirmation.from_json(confirmation.as_json())
    assert again.shadow == confirmation.shadow
    older = {key: value for key, value in confirmation.as_json().items() if key != "shadow"}
    assert NativeConfirmation.from_json(older).shadow == []


def test_a_confirmations_notice_carries_its_findings() -> None:
    notices: list[ApprovalNotice] = []
    reports = Notices(GatewayMetrics(), lambda: parse_config("upstream: {url: 'http://adk'}", env={}))
    reports.add_sink(notices.append)
    finding = {"rule": "try_leads", "would_decide": {"decide": "ask", "rule": "try_leads"}, "agreement": "stricter"}
    confirmation = NativeConfirmation("a1", "t1", "refund", args={"amount": 20}, shadow=[finding])
    reports.native_decided("desk", "c", "bob", confirmation, "approved", 1.0)
    assert [n.shadow for n in notices] == [(finding,)]


def test_a_tool_with_only_shadow_rules_is_asked_about_and_runs_as_before() -> None:
    policy = ToolPolicy.model_validate({"rules": [
        {"name": "try_deny", "when": "args.amount > 10", "decide": "deny", "reason": "no", "shadow": True}]})
    assert policy.gated  # the plugin asks, so the rule is evaluated
    decided = decide_ask(_ask(policy, 50, "sse"), ChatView(run_under_way=True, waiting=0))
    assert decided.action == "rule" and decided.verdict is not None and decided.verdict.run
    assert decided.shadow[0]["agreement"] == "stricter"


def test_the_notice_and_so_the_audit_record_carry_the_findings() -> None:
    finding = {"rule": "try_mid", "would_decide": {"decide": "approve", "rule": "try_mid"}, "agreement": "looser"}
    notice = ApprovalNotice("decided", "a1", "desk", "desk", "refund", "t1", "c", "bob", {}, 1.0, shadow=(finding,),
                            asked={"approvers": "leads", "self_approval": True, "quorum": 1})
    record = notice.as_json(with_args=False)
    assert record["shadow"] == [finding] and record["asked"]["approvers"] == "leads"
    assert ApprovalNotice("decided", "a1", "desk", "desk", "refund", "t1", "c", "bob", {}, 1.0).as_json()["shadow"] == []


def test_each_shadow_rule_series_is_exported_at_zero() -> None:
    assert SHADOW_AGREEMENTS == AGREEMENTS
    metrics = GatewayMetrics()
    metrics.know_tools("desk", {"refund": REFUND})
    for rule in ("try_supervisors", "try_mid"):
        for agreement in AGREEMENTS:
            labels = {"agent": "desk", "tool": "refund", "rule": rule, "agreement": agreement}
            assert metrics.registry.get_sample_value("adk_gateway_policy_shadow_total", labels) == 0
    assert metrics.registry.get_sample_value(
        "adk_gateway_policy_shadow_total", {"agent": "desk", "tool": "refund", "rule": "small", "agreement": "agree"}) is None


def _agent(rules: list[dict[str, Any]]) -> AgentConfig:
    return AgentConfig.model_validate({"upstream": {"url": "http://adk"}, "tools": {"refund": {"approval": True, "rules": rules}}})


SMALL = {"name": "small", "when": "args.amount < 5", "decide": "approve"}


@pytest.mark.parametrize(("was", "now", "loosened"), [
    ([], [{**SMALL, "shadow": True}], False),  # a shadow approve rule added: nothing is enforced
    ([{**SMALL, "shadow": True}], [], False),
    ([{**SMALL, "shadow": True}], [SMALL], True),  # promoted: an approve rule added
    ([SMALL], [{**SMALL, "shadow": True}], False),  # demoted: an approve rule removed
])
def test_a_reload_judges_only_the_rules_in_force(was: list[dict[str, Any]], now: list[dict[str, Any]], loosened: bool) -> None:
    assert bool(tool_rules_loosened(_agent(was), _agent(now))) == loosened


# ---- the shell: the plugin's ask through the chat service (chat/gates.py) ---------------------------

SHADOWED = """\
internal:
  secret: s3cret
tools:
  process_payment:
    approval: true
    rules:
      - {name: small, when: args.amount < 5, decide: approve}
      - {name: try_cap, when: args.amount > 100, decide: deny, reason: Too much., shadow: true}
"""


async def test_the_shell_logs_counts_and_audits_what_a_shadow_rule_would_decide(monkeypatch: pytest.MonkeyPatch) -> None:
    log = RecordingLog()
    monkeypatch.setattr(gates_module, "log", log)
    adk = ScriptedAdk()
    service = chat_service(held_engine(parse_config(SHADOWED, env={})), adk=adk, new_id="msg-1")
    notices: list[ApprovalNotice] = []
    service.notices.add_sink(notices.append)
    await service.submit("demo_agent", "u", request(USER))
    adk.reads.put_nowait([call_event("process_payment")])
    await asyncio.sleep(0.01)

    def open_call(call_id: str, amount: int) -> Any:
        return service.gates.open(app_name="demo_agent", user_id="u", session_id="chat-1", tool_call_id=call_id,
                                  tool="process_payment", args={"amount": amount})

    ruled = open_call("call-a", 2)  # approved by `small`; the shadow cap agrees
    assert isinstance(ruled, Verdict) and ruled.run
    held = open_call("call-b", 500)  # the chatting user is asked; the shadow cap would refuse it
    assert isinstance(held, GatedCall) and held.shadow[0]["agreement"] == "stricter"
    lines = [(line["rule"], line["decided"], line["would_decide"]["decide"], line["agreement"])
             for line in log.named("policy_shadow")]
    assert lines == [("try_cap", "approve", "approve", "agree"), ("try_cap", "ask", "deny", "stricter")]

    def counted(agreement: str) -> float | None:
        return service.metrics.registry.get_sample_value("adk_gateway_policy_shadow_total", {
            "agent": "demo_agent", "tool": "process_payment", "rule": "try_cap", "agreement": agreement})
    assert (counted("agree"), counted("stricter")) == (1, 1)
    decided = [n for n in notices if n.kind == "decided"]
    assert [(n.source, [f["agreement"] for f in n.shadow]) for n in decided] == [("rule", ["agree"])]
    assert [n.shadow[0]["would_decide"]["decide"] for n in notices if n.kind == "waiting"] == ["deny"]
