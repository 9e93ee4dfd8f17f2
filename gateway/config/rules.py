"""Rules on a tool call's arguments: the `rules:` of a tool's policy (config/agent.py `ToolPolicy`),
each a CEL condition that decides `approve`, `deny` or `ask`; `ToolRule` compiles its condition when
the configuration is validated, and `decide` walks a tool's rules for one call.

CEL (the Common Expression Language, cel.dev) rather than a language of our own: it is not Turing
complete (no loops, no recursion, no I/O; every expression ends in time bounded by its length and its
input), it is type-checked when compiled, so a typo is refused by `check-config` and a reload with a
caret under it, and cel-cpp evaluates a rule in about 10 us.

Evaluation fails closed: a condition that cannot be evaluated for a call (a missing key, a string
where a number was expected, a result that is not a bool) stops the walk and asks a person, rather
than letting a later rule approve the call.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from cel_expr_python import cel
from pydantic import Field, PrivateAttr, model_validator

from .approvers import GROUP_NAME_PATTERN, MAX_QUORUM, AskSpec
from .values import Section

__all__ = ["MAX_CONDITION_CHARS", "Asker", "Outcome", "RuleDecision", "ToolRule", "asker_problem", "decide"]

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
            expression = _environment().compile(self.when)
        except RuntimeError as exc:
            raise ValueError(f"rule {self.name}: `when` does not compile: {_cel_message(str(exc))}") from None
        kind = expression.return_type()
        if kind != cel.Type.BOOL and kind != cel.Type.DYN:
            raise ValueError(f"rule {self.name}: `when` must be true or false, but it gives {_type_name(kind)}")
        self._program = _Program(self.when, expression)
        return self

    def matches(self, data: Mapping[str, Any]) -> bool | str:
        """Whether the condition holds for `data` (every variable), or why it cannot be evaluated."""
        try:
            value = self._program.expression.eval(data=data)
        except (RuntimeError, TypeError, ValueError) as exc:  # a value the binding cannot convert
            return _cel_message(str(exc))
        kind = value.type()
        if kind == cel.Type.ERROR:
            return _cel_message(str(value.plain_value()))
        if kind != cel.Type.BOOL:
            return f"the condition gave {_type_name(kind)}, not true or false"
        return bool(value.plain_value())


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
    """What a tool's rules decided for one call: the outcome, the rule that decided (None: no rule
    matched and the tool's own setting applies), the rule's reason, and why its condition could
    not be evaluated (then `decide` is `ask`)."""

    decide: Outcome
    rule: str | None = None
    reason: str | None = None
    error: str | None = None


def decide(
    rules: Sequence[ToolRule], *, args: Mapping[str, Any], tool: str, agent: str, user: str,
    claims: Mapping[str, Any], default: Literal["approve", "ask"],
) -> RuleDecision:
    """The first rule whose condition holds decides; with none, `default` (the tool's `approval`).
    A condition that cannot be evaluated stops the walk and asks a person (fail closed)."""
    data = {"args": dict(args), "tool": tool, "agent": agent, "user": user, "claims": dict(claims)}
    for rule in rules:
        matched = rule.matches(data)
        if isinstance(matched, str):
            return RuleDecision("ask", rule.name, None, matched)
        if matched:
            return RuleDecision(rule.decide, rule.name, rule.reason)
    return RuleDecision(default)
