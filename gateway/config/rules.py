"""Rules on a tool call's arguments: the `rules:` of a tool's policy (config/agent.py `ToolPolicy`),
each a CEL condition that decides `approve`, `deny` or `ask`; `ToolRule` compiles its condition when
the configuration is validated, and `decide` walks a tool's rules for one call, a pure function of
the rules, the call and the tool's own setting.

CEL (the Common Expression Language, cel.dev) rather than a language of our own: it is not Turing
complete (no loops, no recursion, no I/O; every expression ends in time bounded by its length and its
input), it is type-checked when compiled, so a typo is refused by `check-config` and a reload with a
caret under it, and cel-cpp evaluates a rule in about 10 us.

The arguments come from the model, so a prompt chooses them, and a condition may not be evaluable for
a call (a missing argument, a string or a list where a number is meant, a list past CEL's iteration
budget). Evaluation fails closed: never less authority than any rule that could have matched decides.
The walk goes through the rules in order; a rule whose condition cannot be evaluated is a candidate
(it might have matched) and the walk goes on; the first rule whose condition holds is a candidate and
ends it; with none holding, the tool's own setting is one. The decision is the strongest candidate by
authority: deny > ask approvers > ask the chatting user > approve. So an unevaluable `deny` rule
denies, an unevaluable `ask` rule asks its approvers (or the user), and an unevaluable `approve` rule
is no candidate at all (it could only have approved, which whatever follows it decides at least as
strictly). With every condition evaluable this is the first match. Among candidates of one strength
the first in the walk decides, except that approvers combine: the first candidate's group, four-eyes
(no self-approval) if any approver candidate asks it, and the largest quorum among that group's
candidates. Before the walk the values are read as a person would: an integer beyond 64 bits is
a number (a double; past a double's range, infinite), and NaN, which no JSON writer produces, is no
number (null); strings stay strings.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

from cel_expr_python import cel
from pydantic import Field, PrivateAttr, model_validator

from .approvers import GROUP_NAME_PATTERN, MAX_QUORUM, AskSpec
from .values import Section

__all__ = [
    "MAX_CONDITION_CHARS", "Asker", "Condition", "Outcome", "RuleDecision", "ToolRule", "asker_problem", "authority",
    "compile_condition", "decide",
]


Outcome = Literal["approve", "deny", "ask"]

# A condition is a line or two of config; the bound keeps one rule's compile and evaluation small.
MAX_CONDITION_CHARS = 2000

# CEL compares an int with a double, but its arithmetic and its type checker do not mix them, and a
# JSON number is an int or a double depending on how the model wrote it (4 or 4.0).
_NUMBERS_HINT = ("\nCEL compares ints with doubles, but does not mix them in arithmetic or in a comparison"
                 " with a computed double: write 5.0 rather than 5 there, or convert with double(args.amount)")
# cel-cpp's status code, before its message (`INVALID_ARGUMENT: `, `NOT_FOUND: `) and after it (` [INVALID_ARGUMENT]`).
_STATUS = re.compile(r"^[A-Z_]+: | \[[A-Z_]+\]$")


@functools.cache
def _environment() -> cel.Env:
    """What every rule sees, declared once per process: `args` and `claims` as maps of anything,
    `tool`, `agent` and `user` as strings."""
    anything = cel.Type.Map(cel.Type.STRING, cel.Type.DYN)
    return cel.NewEnv(variables={
        "args": anything, "claims": anything,
        "tool": cel.Type.STRING, "agent": cel.Type.STRING, "user": cel.Type.STRING,
    })


def _cel_message(text: str) -> str:
    """CEL's message without its status codes, its position and caret kept (on lines of their own)."""
    text = _STATUS.sub("", text.strip()).replace("ERROR: <input>:", "at ")
    lower = text.lower()
    if "no matching overload" in lower and "double" in lower and "int" in lower.replace("double", ""):
        text += _NUMBERS_HINT
    return text


@dataclass(frozen=True, eq=False)
class _Program:
    """A compiled condition. Equal to another of the same text, and copied as itself (cel-cpp's
    program can be neither compared nor copied), so the rule holding it compares and copies by its fields."""

    text: str
    expression: cel.Expression

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Program) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __deepcopy__(self, memo: dict[int, Any]) -> _Program:
        return self


class ToolRule(Section):
    """One rule of a tool: when `when` is true for a call, `decide` applies to it."""

    # Unique within the tool; names the rule in logs, the audit trail and errors.
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    # A CEL expression over `args`, `tool`, `agent`, `user` and `claims`, true or false.
    when: str = Field(min_length=1)
    decide: Outcome
    # Why: required for `deny` (the model and the person are told); optional otherwise.
    reason: str | None = Field(None, min_length=1)
    # `decide: ask` only: who answers the calls this rule asks (config/approvers.py). `approvers`
    # names a group of the top-level `approvers.groups`; unset, the chatting user answers.
    # `self_approval: false`: the requester may not answer their own call even if in the group
    # (four-eyes); `quorum`: distinct approvers who must approve (one deny denies).
    approvers: str | None = Field(None, pattern=GROUP_NAME_PATTERN)
    self_approval: bool = True
    quorum: int = Field(1, ge=1, le=MAX_QUORUM)
    # Evaluated for every call but never enforced: calls are decided as if the rule were absent, and
    # what it would have decided is logged, counted and audited (config/shadow_rules.py).
    shadow: bool = False
    _program: _Program = PrivateAttr()

    @model_validator(mode="after")
    def _compile(self) -> ToolRule:
        if len(self.when) > MAX_CONDITION_CHARS:
            raise ValueError(f"rule {self.name}: `when` has {len(self.when)} characters, "
                             f"at most {MAX_CONDITION_CHARS} are allowed")
        if self.decide == "deny" and self.reason is None:
            raise ValueError(f"rule {self.name}: a deny rule needs a `reason` (the model and the person are told it)")
        if problem := asker_problem(self, ask=self.decide == "ask"):
            raise ValueError(f"rule {self.name}: {problem}")
        try:
            self._program = _compiled(self.when)
        except ValueError as exc:
            raise ValueError(f"rule {self.name}: {exc}") from None
        return self

    def matches(self, data: Mapping[str, Any]) -> bool | str:
        """Whether the condition holds for `data` (every variable), or why it cannot be evaluated."""
        return _evaluate(self._program.expression, data)


    @property
    def ask_spec(self) -> AskSpec | None:
        """Who answers the calls this rule asks; None: the chatting user."""
        if self.decide != "ask" or self.approvers is None:
            return None
        return AskSpec(self.approvers, self.self_approval, self.quorum)


class Asker(Protocol):
    """A rule or a tool, as far as who answers its asked calls goes."""

    approvers: str | None
    self_approval: bool
    quorum: int


def asker_problem(asker: Asker, *, ask: bool) -> str | None:
    """Why the `approvers`, `self_approval` and `quorum` keys of a rule or tool cannot stand, or None:
    they only mean something where calls are asked, and the last two only with a group (without
    one, the chatting user alone answers, so neither could hold). Judged by value, not by the keys
    written, so a config rebuilt from its dump (`revalidate`) passes as the file did."""
    given = [name for name, unset in (("approvers", asker.approvers is None), ("self_approval", asker.self_approval),
                                      ("quorum", asker.quorum == 1)) if not unset]
    if not given:
        return None
    if not ask:
        return f"{', '.join(given)} only apply where calls are asked (decide: ask)"
    if asker.approvers is None:
        return f"{' and '.join(given)} {'need' if len(given) > 1 else 'needs'} `approvers` (a group of approvers.groups)"
    return None


def _type_name(kind: cel.Type) -> str:
    return str(kind.name()).lower()


@dataclass(frozen=True)
class RuleDecision:
    """What a tool's rules decided for one call: the outcome; the rule that decided (None: the tool's
    own setting); its reason (a deny's is told to the model and the person); who answers an `ask`
    (a group, or None: the chatting user); and each rule whose condition could not be evaluated,
    with why, in the order walked (for the log)."""

    decide: Outcome
    rule: str | None = None
    reason: str | None = None
    asks: AskSpec | None = None
    errors: tuple[tuple[str, str], ...] = ()


# Authority, weakest first: how much a decision withholds from the requester.
_APPROVE, _ASK_USER, _ASK_APPROVERS, _DENY = range(4)
# An int outside int64: cel-cpp refuses it (for every rule, whatever argument it sits in).
_INT64 = range(-(2**63), 2**63)


def decide(
    rules: Sequence[ToolRule], *, args: Mapping[str, Any], tool: str, agent: str, user: str,
    claims: Mapping[str, Any], default: Literal["approve", "ask"], default_asks: AskSpec | None = None,
    trying: str | None = None,
) -> RuleDecision:
    """The decision of `rules` for one call, failing closed (the module's docstring says exactly
    how): `default` is the tool's `approval` (ask or approve), `default_asks` who answers what the
    tool itself asks (its own approvers; None: the chatting user). Shadow rules are not in force and
    are skipped, except the one named `trying`, walked as if it were (config/shadow_rules.py)."""
    rules = [rule for rule in rules if not rule.shadow or rule.name == trying]
    data = _variables(args, tool, agent, user, claims)
    candidates: list[RuleDecision] = []
    errors: list[tuple[str, str]] = []
    for rule in rules:
        matched = rule.matches(data) if data is not None else "the arguments are nested too deeply to read"
        if isinstance(matched, str):
            errors.append((rule.name, matched))
            if rule.decide != "approve":
                candidates.append(_applied(rule, unevaluated=True))
        elif matched:
            candidates.append(_applied(rule, unevaluated=False))
            break
    else:
        candidates.append(RuleDecision(default, asks=default_asks if default == "ask" else None))
    return replace(_strongest(candidates), errors=tuple(errors))


def _variables(
    args: Mapping[str, Any], tool: str, agent: str, user: str, claims: Mapping[str, Any],
) -> dict[str, Any] | None:
    """What a condition sees of one call, its values read as a person would; None when nested
    past Python's stack (no condition can read it)."""
    try:
        return {"args": _as_read(dict(args)), "tool": tool, "agent": agent, "user": user, "claims": _as_read(dict(claims))}
    except RecursionError:
        return None


def _applied(rule: ToolRule, *, unevaluated: bool) -> RuleDecision:
    reason = rule.reason
    if unevaluated and rule.decide == "deny":
        reason = f"The rule {rule.name} could not be evaluated for this call's arguments, so it applies: {rule.reason}"
    return RuleDecision(rule.decide, rule.name, reason, rule.ask_spec)


def authority(decision: RuleDecision) -> int:
    """How much `decision` withholds from the requester: approve 0, ask the chatting user 1, ask
    approvers 2, deny 3."""
    if decision.decide == "ask":
        return _ASK_APPROVERS if decision.asks is not None else _ASK_USER
    return _DENY if decision.decide == "deny" else _APPROVE


def _strongest(candidates: list[RuleDecision]) -> RuleDecision:
    """The first candidate of the greatest authority; approvers combine, never weaker than any one
    of them alone could be within the group chosen: four-eyes if any asks it, the largest quorum."""
    top = max(authority(candidate) for candidate in candidates)
    tied = [candidate for candidate in candidates if authority(candidate) == top]
    first = tied[0]
    if first.asks is None:
        return first
    specs = [candidate.asks for candidate in tied if candidate.asks is not None]
    group = first.asks.group
    quorum = max(spec.quorum for spec in specs if spec.group == group)
    return replace(first, asks=AskSpec(group, all(spec.self_approval for spec in specs), quorum))


def _as_read(value: Any) -> Any:
    """`value` with its numbers as a person reads them: an int beyond 64 bits is a number (cel-cpp
    compares ints with doubles), NaN is none. Strings are never numbers."""
    if isinstance(value, dict):
        return {key: _as_read(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_as_read(item) for item in value]
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value not in _INT64:
        return _to_double(value)
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _to_double(value: int) -> float:
    try:
        return float(value)
    except OverflowError:  # past a double's range too
        return math.inf if value > 0 else -math.inf


def _compiled(text: str, what: str = "`when`") -> _Program:
    """`text` compiled and checked to be true or false; ValueError with CEL's message otherwise
    (`what`: how the message names it)."""
    try:
        expression = _environment().compile(text)
    except RuntimeError as exc:
        raise ValueError(f"{what} does not compile: {_cel_message(str(exc))}") from None
    kind = expression.return_type()
    if kind != cel.Type.BOOL and kind != cel.Type.DYN:
        raise ValueError(f"{what} must be true or false, but it gives {_type_name(kind)}")
    return _Program(text, expression)


def _evaluate(expression: cel.Expression, data: Mapping[str, Any] | None) -> bool | str:
    """Whether a compiled condition holds for `data` (every variable), or why it cannot be evaluated."""
    if data is None:
        return "the arguments are nested too deeply to read"
    try:
        value = expression.eval(data=data)
    except (RuntimeError, TypeError, ValueError) as exc:  # a value the binding cannot convert
        return _cel_message(str(exc))
    kind = value.type()
    if kind == cel.Type.ERROR:
        return _cel_message(str(value.plain_value()))
    if kind != cel.Type.BOOL:
        return f"the condition gave {_type_name(kind)}, not true or false"
    return bool(value.plain_value())


@dataclass(frozen=True)
class Condition:
    """A condition outside a tool's rules (a standing grant's, approvals/grants.py): the same CEL
    environment, the same reading of the values, the same failure as data."""

    text: str
    _program: _Program

    def holds(self, *, args: Mapping[str, Any], tool: str, agent: str, user: str, claims: Mapping[str, Any]) -> bool | str:
        """Whether it holds for one call, or why it cannot be evaluated (the caller fails closed)."""
        return _evaluate(self._program.expression, _variables(args, tool, agent, user, claims))


@functools.lru_cache(maxsize=256)
def compile_condition(text: str) -> Condition:
    """`text` as a condition (at most MAX_CONDITION_CHARS); ValueError with CEL's message, its
    position and caret, when it does not compile or is not true or false. Cached by text: a
    grant's condition is compiled where it is read, once per replica."""
    if len(text) > MAX_CONDITION_CHARS:
        raise ValueError(f"the condition has {len(text)} characters, at most {MAX_CONDITION_CHARS} are allowed")
    return Condition(text, _compiled(text, "the condition"))
