"""How a reload could loosen who decides a tool call: the tools' rules on their arguments and the
approvers who answer what they ask. Part of the judgement of a reload (config/loosening.py, whose
table names each judge here); pure, as that one is.
"""

from __future__ import annotations

from .agent import AgentConfig
from .approvers import ApproversConfig, AskSpec, Principal, key_digests
from .rules import ToolRule

__all__ = ["Finding", "approver_keys_added", "asks_widened", "auditors_widened", "groups_widened", "tool_key", "tool_names",
           "tool_rules_loosened"]

# What a judge says is wrong: the key (relative to the agent for an agent's setting) and what a reload cannot do.
Finding = tuple[str, str]


def tool_names(was: AgentConfig, now: AgentConfig) -> list[str]:
    # The tools either lists, and `default`: a tool listed only now may escape the default that gated it.
    return sorted(set(was.tools) | set(now.tools) | {"default"})


def tool_key(name: str) -> str:
    return "tools.default (every tool not listed)" if name == "default" else f"tools.{name}"


def tool_rules_loosened(was: AgentConfig, now: AgentConfig) -> list[Finding]:
    findings = []
    for name in tool_names(was, now):
        if what := _rules_loosened(_in_force(was.tool_policy(name).rules), _in_force(now.tool_policy(name).rules)):
            key = "tools.default.rules (every tool not listed)" if name == "default" else f"tools.{name}.rules"
            findings.append((key, f"loosen a tool's rules ({'; '.join(what)})"))
    return findings


def _in_force(rules: list[ToolRule]) -> list[ToolRule]:
    # A shadow rule decides nothing (config/shadow_rules.py): adding or dropping one changes no call;
    # making it enforced is judged as adding it.
    return [rule for rule in rules if not rule.shadow]


def _rules_loosened(was: list[ToolRule], now: list[ToolRule]) -> list[str]:
    """What makes `now` decide some call more loosely than `was` (deny, then ask, then approve).

    A rule is the same by its name, condition and outcome (a reason edited is the same rule). Kept
    rules must stay in their order; deny rules may be added and approve rules removed, anywhere:
    since a rule whose condition cannot be evaluated is decided by its own outcome at least
    (config/rules.py `decide`: an unevaluable deny rule denies, an unevaluable approve rule never
    approves), an added deny rule only ever refuses more, and a removed approve rule only lets the
    walk reach a decision at least as strict."""
    was_keys, now_keys = {_rule_key(rule) for rule in was}, {_rule_key(rule) for rule in now}
    gone = {rule.name: rule for rule in was if _rule_key(rule) not in now_keys}
    added = {rule.name: rule for rule in now if _rule_key(rule) not in was_keys}
    what = []
    for rule in now:
        if rule.name not in added:
            continue
        before = gone.get(rule.name)
        if before is not None and (before.decide, rule.decide) != ("approve", "deny"):
            what.append(f"change the rule {rule.name}")
        elif rule.decide != "deny":
            what.append(f"add the {rule.decide} rule {rule.name}")
    for rule in was:
        if rule.name in gone and rule.name not in added and rule.decide != "approve":
            what.append(f"remove the {rule.decide} rule {rule.name}")
    kept_was = [_rule_key(rule) for rule in was if rule.name not in gone]
    if not what and kept_was != [_rule_key(rule) for rule in now if rule.name not in added]:
        what.append("reorder the rules")
    return what


def _rule_key(rule: ToolRule) -> tuple[str, str, str]:
    return rule.name, rule.when, rule.decide


def approver_keys_added(was: ApproversConfig, now: ApproversConfig) -> list[Finding]:
    old = set(key_digests(was.api_keys))
    added = {user for digest, user in key_digests(now.api_keys) if (digest, user) not in old}
    return [(f"approvers.api_keys[{user}]", "let another key answer approvals (a key added, or given to another id)")
            for user in sorted(added)]


def _members_widened(was_users: frozenset[Principal], was_claims: dict[str, list[str]],
                     now_users: frozenset[Principal], now_claims: dict[str, list[str]]) -> list[str]:
    """How a list of people (a group, the auditors: the principals it lists, and whoever carries
    every claim with an allowed value) takes in more: a principal added (an id now read from
    another source is another person), claims where none were (none match nobody), a claim dropped
    or allowed another value. Claims added to others, or all dropped, narrow."""
    what = []
    if added := sorted(now_users - was_users):
        what.append(f"users added: {', '.join(map(str, added))}")
    if now_claims and not was_claims:
        what.append("claims that match where none were")
    elif now_claims:
        what += [f"the claim {claim} dropped or widened" for claim, allowed in was_claims.items()
                 if claim not in now_claims or set(now_claims[claim]) - set(allowed)]
    return what


def groups_widened(was: ApproversConfig, now: ApproversConfig) -> list[Finding]:
    # A group new in the file answers nothing a running rule asks of it: a rule moved to it is
    # judged with the rule (`agents.<name>.tools.<tool>.approvers`); a group gone answers nobody.
    findings = []
    for name, group in now.groups.items():
        before = was.groups.get(name)
        if before is not None and (what := _members_widened(
                was.group_members(name), before.jwt_claims, now.group_members(name), group.jwt_claims)):
            findings.append((f"approvers.groups.{name}", f"let more people answer its approvals ({'; '.join(what)})"))
    return findings


def auditors_widened(was: ApproversConfig, now: ApproversConfig) -> list[Finding]:
    what = _members_widened(was.members(was.auditors.users), was.auditors.jwt_claims,
                            now.members(now.auditors.users), now.auditors.jwt_claims)
    return [("approvers.auditors", f"let more people read decided approvals ({'; '.join(what)})")] if what else []


def asks_widened(was: AgentConfig, now: AgentConfig) -> list[Finding]:
    """Who answers each call asked either side (the tool's own asks, and each ask rule both keep;
    rules added or removed are the rules' judgement): never wider than running."""
    findings = []
    for name in tool_names(was, now):
        before, after = was.tool_policy(name), now.tool_policy(name)
        kept = {rule.name for rule in _in_force(after.rules) if rule.decide == "ask"}
        for rule in [None, *(r.name for r in _in_force(before.rules) if r.decide == "ask" and r.name in kept)]:
            if what := _ask_widened(before.asks(rule), after.asks(rule)):
                key = f"tools.{name}" + (f".rules[{rule}]" if rule else "") + (" (every tool not listed)" if name == "default" else "")
                findings.append((key, what))
    return findings


def _ask_widened(was: AskSpec | None, now: AskSpec | None) -> str | None:
    if was is None:
        # The chatting user answered their own calls: a group's members would decide them instead,
        # people who decide none of them now.
        return None if now is None else f"hand the chatting user's calls to the group {now.group}"
    if now is None:
        return f"let the chatting user answer what the group {was.group} answers"
    what = []
    if now.group != was.group:
        what.append(f"hand the calls to another group ({now.group}, running: {was.group})")
    if now.self_approval and not was.self_approval:
        what.append("let the requester approve their own calls (self_approval)")
    if now.quorum < was.quorum:
        what.append(f"need fewer approvers (quorum {now.quorum}, running: {was.quorum})")
    return "; ".join(what) or None
