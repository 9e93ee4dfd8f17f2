"""Shadow rules: what a rule marked `shadow: true` would have decided for one call, beside what was decided (pure).

A shadow rule is how a policy change is tried on real traffic before it is enforced
(docs/approvals.md, "Reviewing a policy change"): config/rules.py `decide` skips it, so every call is
decided as if it were absent, and `shadowed` walks the tool's rules once more for each shadow rule,
with that one rule in force where it stands (the others still skipped), so that what it "would
decide" is exactly what enforcing it alone would decide, failing closed as the enforced walk does.
`compare` says how two decisions differ (agree, stricter, looser, different); the replay of the
audit trail (approvals/replay.py) judges an old decision against a new policy's with it too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .approvers import AskSpec
from .rules import RuleDecision, ToolRule, authority, decide

__all__ = ["AGREEMENTS", "Agreement", "ShadowFinding", "compare", "decision_json", "shadowed"]

Agreement = Literal["agree", "stricter", "looser", "different"]
# Every value of `Agreement`: the label values of adk_gateway_policy_shadow_total (ops/metrics.py).
AGREEMENTS: tuple[Agreement, ...] = ("agree", "stricter", "looser", "different")


@dataclass(frozen=True)
class ShadowFinding:
    """What the shadow rule `rule` would have decided (`would`), and how that compares with what was decided."""

    rule: str
    would: RuleDecision
    agreement: Agreement

    def as_json(self) -> dict[str, Any]:
        """Plain JSON data: what a log line, an audit record and a notice carry."""
        return {"rule": self.rule, "would_decide": decision_json(self.would), "agreement": self.agreement}


def decision_json(decision: RuleDecision) -> dict[str, Any]:
    """A decision as plain JSON: `decide`, the deciding `rule` (None: the tool's own setting), and
    who answers an ask (`approvers`, `self_approval`, `quorum`; no `approvers`: the chatting user)."""
    data: dict[str, Any] = {"decide": decision.decide, "rule": decision.rule}
    if decision.decide == "ask" and decision.asks is not None:
        data.update(approvers=decision.asks.group, self_approval=decision.asks.self_approval, quorum=decision.asks.quorum)
    return data


def shadowed(
    rules: Sequence[ToolRule], decided: RuleDecision, *, args: Mapping[str, Any], tool: str, agent: str, user: str,
    claims: Mapping[str, Any], default: Literal["approve", "ask"], default_asks: AskSpec | None = None,
) -> tuple[ShadowFinding, ...]:
    """Each shadow rule of `rules`, in order, with what it would have decided for the call that
    `decided` was decided for (the other arguments are `decide`'s, as given for that call)."""
    findings = []
    for rule in rules:
        if not rule.shadow:
            continue
        would = decide(rules, args=args, tool=tool, agent=agent, user=user, claims=claims, default=default,
                       default_asks=default_asks, trying=rule.name)
        findings.append(ShadowFinding(rule.name, would, compare(decided, would)))
    return tuple(findings)


def compare(decided: RuleDecision, other: RuleDecision) -> Agreement:
    """How `other` would decide against `decided`: `agree` (the same outcome, asking the same
    people), `stricter` or `looser` (more or less authority withheld from the requester: deny >
    ask approvers > ask the chatting user > approve; within one group, a larger quorum or four-eyes
    is stricter), or `different` (another group asked, or a mix of stricter and looser)."""
    was, now = authority(decided), authority(other)
    if was != now:
        return "stricter" if now > was else "looser"
    if decided.decide != "ask" or decided.asks is None or other.asks is None:
        return "agree"
    before, after = decided.asks, other.asks
    if before.group != after.group:
        return "different"
    # Each: how much stricter `other` is on quorum and on four-eyes (negative: looser).
    steps = (after.quorum - before.quorum, int(before.self_approval) - int(after.self_approval))
    if all(step == 0 for step in steps):
        return "agree"
    if all(step >= 0 for step in steps):
        return "stricter"
    return "looser" if all(step <= 0 for step in steps) else "different"
