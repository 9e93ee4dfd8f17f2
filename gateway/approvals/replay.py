"""Replaying the audit trail against a new policy: what each recorded decision would become (sans-IO).

`adk-gateway policy replay` (gateway/policy_cli.py) is the other half of reviewing a policy change
(docs/approvals.md, "Reviewing a policy change"): shadow rules try a rule on the traffic to come,
a replay tries a whole policy on the traffic that was. Records in (approvals/notice.py's fields, as
the trail keeps them: approvals/replay_records.py reads them), the new configuration's agents in,
a `Replay` out: per record, what was decided, what the new policy decides for the same call (the
tool's rules in force, config/rules.py `decide`, failing closed as it does), and the change:

- `approve->deny`, `deny->approve`: a rule's automatic decision turned over;
- `asked->automatic`, `automatic->asked`: someone was asked and a rule now decides, or the reverse;
- `approvers changed`: asked both ways, but other people (another group, the chatting user instead
  of a group or the reverse, another quorum or four-eyes).

A change loosens when the new decision withholds less (config/shadow_rules.py `compare`: looser),
or asks another group (`different`: nothing says the new group is no wider, so it is taken as
loosening, failing closed). A record that cannot be replayed is `unknown`, never unchanged: its
arguments are not recorded (`audit.include_args` off) and a rule in force reads `args`, before any
rule that holds; the same for `user` (a log line with `logging.user_id: hash`) and `claims` (never
recorded); its agent is not in the new configuration; or who was asked is not recorded (a record
from before `asked`). A browser tool's output is not a decision of the policy: `skipped`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..config.agent import AgentConfig
from ..config.approvers import AskSpec
from ..config.rules import RuleDecision, ToolRule, decide
from ..config.shadow_rules import compare, decision_json

__all__ = ["Replay", "Replayed", "replay", "replay_record"]

Verdict = Literal["changed", "unchanged", "unknown", "skipped"]

# Who decided, as a record says (ApprovalNotice.source), when someone was asked.
_ASKED = frozenset({"person", "approver", "timeout", "cancel", "give_up"})
# The variables of a rule's condition a record may not hold (config/rules.py's environment).
_VARIABLE = re.compile(r"\b(args|user|claims)\b")


@dataclass(frozen=True)
class Replayed:
    """One record replayed: what was decided (`was`) and what the new policy decides (`now`),
    `verdict`, the `change` (None unless changed), whether it `loosens`, and `why` for an unknown
    or skipped record."""

    approval_id: str
    agent: str
    tool: str
    verdict: Verdict
    was: RuleDecision | None = None
    now: RuleDecision | None = None
    change: str | None = None
    loosens: bool = False
    why: str | None = None


@dataclass(frozen=True)
class Replay:
    """Every record replayed, in order, and what they come to."""

    records: tuple[Replayed, ...]

    @property
    def loosened(self) -> int:
        return sum(1 for record in self.records if record.loosens)

    def count(self, verdict: Verdict) -> int:
        return sum(1 for record in self.records if record.verdict == verdict)

    @property
    def exit_status(self) -> int:
        """0: nothing loosens and every record was replayed; 1: something loosens, or a record could
        not be replayed (it might)."""
        return 1 if self.loosened or self.count("unknown") else 0

    def changes(self) -> list[dict[str, Any]]:
        """The changed records grouped by agent, tool, change and the rules that decided either way."""
        groups: Counter[tuple[str, str, str, str | None, str | None, bool]] = Counter()
        examples: dict[tuple[str, str, str, str | None, str | None, bool], Replayed] = {}
        for record in self.records:
            if record.verdict == "changed" and record.was is not None and record.now is not None and record.change:
                key = (record.agent, record.tool, record.change, record.was.rule, record.now.rule, record.loosens)
                groups[key] += 1
                examples.setdefault(key, record)
        return [
            {"agent": key[0], "tool": key[1], "change": key[2], "loosens": key[5], "records": n,
             "was": _as_json(examples[key].was), "now": _as_json(examples[key].now),
             "example": examples[key].approval_id}
            for key, n in sorted(groups.items(), key=lambda item: item[0][:3])
        ]

    def left_out(self, verdict: Verdict) -> list[dict[str, Any]]:
        """The unknown (or skipped) records grouped by agent, tool and why."""
        groups = Counter((r.agent, r.tool, r.why or "") for r in self.records if r.verdict == verdict)
        return [{"agent": a, "tool": t, "why": why, "records": n} for (a, t, why), n in sorted(groups.items())]

    def as_json(self) -> dict[str, Any]:
        return {
            "records": len(self.records), "changed": self.count("changed"), "unchanged": self.count("unchanged"),
            "unknown": self.count("unknown"), "skipped": self.count("skipped"), "loosened": self.loosened,
            "changes": self.changes(), "unknown_records": self.left_out("unknown"),
            "skipped_records": self.left_out("skipped"), "exit_status": self.exit_status,
        }


def _as_json(decision: RuleDecision | None) -> dict[str, Any] | None:
    return None if decision is None else decision_json(decision)


def replay(records: Iterable[Mapping[str, Any]], agents: Mapping[str, AgentConfig]) -> Replay:
    """Each record (one per approval: a second one of the same id is left out) against `agents`."""
    seen: set[str] = set()
    out = []
    for record in records:
        if record["approval_id"] in seen:
            continue
        seen.add(record["approval_id"])
        out.append(replay_record(record, agents))
    return Replay(tuple(out))


def replay_record(record: Mapping[str, Any], agents: Mapping[str, AgentConfig]) -> Replayed:
    """What the new policy decides for the call of one record (its fields as notice.py names them)."""
    who = Replayed(str(record["approval_id"]), str(record["agent"]), str(record["tool"]), "unknown")
    was = _was(record)
    if isinstance(was, str):
        verdict: Verdict = "skipped" if was.startswith("a browser tool") else "unknown"
        return _with(who, verdict=verdict, why=was)
    agent = agents.get(who.agent)
    if agent is None:
        return _with(who, was=was, why="the agent is not in the new configuration")
    policy = agent.tool_policy(who.tool)
    in_force = [rule for rule in policy.rules if not rule.shadow]
    args, user = record.get("args"), record.get("requester")
    call = {"args": args if isinstance(args, dict) else {}, "tool": who.tool, "agent": who.agent,
            "user": user if isinstance(user, str) else "", "claims": {}}
    missing = {"claims"} | ({"args"} if not isinstance(args, dict) else set()) | ({"user"} if not isinstance(user, str) else set())
    if why := _unreadable(in_force, call, missing):
        return _with(who, was=was, why=why)
    now = decide(in_force, args=call["args"], tool=who.tool, agent=who.agent, user=call["user"], claims={},
                 default="ask" if policy.approval else "approve", default_asks=policy.asks(None))
    change = _change(was, now)
    if change is None:
        return _with(who, verdict="unchanged", was=was, now=now)
    return _with(who, verdict="changed", was=was, now=now, change=change, loosens=compare(was, now) in ("looser", "different"))


def _with(who: Replayed, **fields: Any) -> Replayed:
    return Replayed(who.approval_id, who.agent, who.tool, **{"verdict": "unknown", **fields})


def _was(record: Mapping[str, Any]) -> RuleDecision | str:
    """What the record says was decided, or why that cannot be told."""
    source, outcome, rule = record.get("source"), record.get("outcome"), record.get("rule")
    rule = rule if isinstance(rule, str) else None
    if outcome in ("output", "output_error"):
        return "a browser tool's output, not a decision of the policy"
    if source == "rule":
        return RuleDecision("approve" if outcome == "approved" else "deny", rule)
    if source not in _ASKED:
        return f"the record's source {source!r} is none a replay knows"
    if "asked" not in record:
        if source == "person":
            return RuleDecision("ask", rule)
        return "who was asked is not recorded (a record from before the `asked` field)"
    asked = record["asked"]
    if asked is None:
        return RuleDecision("ask", rule)
    group, self_approval, quorum = (asked.get(key) for key in ("approvers", "self_approval", "quorum")) if isinstance(
        asked, dict) else (None, None, None)
    if not isinstance(group, str) or not isinstance(self_approval, bool) or type(quorum) is not int:
        return f"who was asked is unreadable ({str(asked)[:80]})"
    return RuleDecision("ask", rule, asks=AskSpec(group, self_approval, quorum))


def _unreadable(rules: list[ToolRule], call: Mapping[str, Any], missing: set[str]) -> str | None:
    """Why the rules in force cannot be walked for this record: the first rule that reads what the
    record does not hold, before any rule that holds ends the walk (None: they can)."""
    for rule in rules:
        reads = missing & set(_VARIABLE.findall(rule.when))
        if reads:
            held = {"args": "arguments (audit.include_args is off)", "user": "requester (a hashed log line)",
                    "claims": "claims (the trail never records them)"}
            return f"the rule {rule.name} reads the call's {', '.join(held[name] for name in sorted(reads))}"
        if rule.matches(call) is True:
            return None
    return None


def _change(was: RuleDecision, now: RuleDecision) -> str | None:
    """The change from `was` to `now`, by the names of the module's docstring; None: the same."""
    if was.decide != "ask" and now.decide != "ask":
        return None if was.decide == now.decide else f"{was.decide}->{now.decide}"
    if was.decide == "ask" and now.decide == "ask":
        return None if compare(was, now) == "agree" else "approvers changed"
    return f"asked->automatic {now.decide}" if was.decide == "ask" else f"automatic {was.decide}->asked"
