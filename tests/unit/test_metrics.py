"""GatewayMetrics parts that are not exercised through a running gateway, and its label contract.

The contract: every label value gateway/ counts with is listed in `KNOWN_LABEL_VALUES` (or, per
tool, `TOOL_OUTCOMES`), so that its series exists at 0 before the first event. The last tests
read gateway/'s source to find the values it counts with: literal `.labels("x")` arguments, the
variables and helper parameters they come from, and, where a value comes from an exception or a
verdict, the places those are made (`DYNAMIC_SOURCES`).
"""

from __future__ import annotations

import ast
import gc
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

import gateway
from gateway.core.approvals import Outcome
from gateway.config.schema import ToolPolicy, parse_config
from gateway.ops.metrics import AGENT_LABELLED, KNOWN_LABEL_VALUES, TOOL_OUTCOMES, GatewayMetrics

GATEWAY_DIR = Path(gateway.__file__).parent


def _pauses(metrics: GatewayMetrics, generation: int) -> float:
    value = metrics.registry.get_sample_value("adk_gateway_gc_pause_seconds_count", {"generation": str(generation)})
    return value or 0.0


def test_gc_pauses_are_timed_by_generation_while_watched() -> None:
    metrics = GatewayMetrics()
    metrics.watch_gc()
    metrics.watch_gc()  # twice: still one callback, one observation per collection
    try:
        gc.collect()
        assert _pauses(metrics, 2) == 1
        total = metrics.registry.get_sample_value("adk_gateway_gc_pause_seconds_sum", {"generation": "2"})
        assert total is not None and 0 < total < 10
        gc.collect(0)
        assert _pauses(metrics, 0) >= 1
    finally:
        metrics.unwatch_gc()
    gc.collect()
    assert _pauses(metrics, 2) == 1
    assert metrics._on_gc not in gc.callbacks


# ---- series exported from the start ---------------------------------------------------------------


def _rendered(metrics: GatewayMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape, as the text format says it (what Prometheus would store)."""
    samples = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


TWO_AGENTS = """\
agents:
  pay:
    upstream: {app_name: pay_app}
  desk:
    upstream: {app_name: desk_app}
"""

def _value_sample(metrics: GatewayMetrics, attribute: str) -> tuple[str, tuple[str, ...]]:
    """The sample name an alert reads for a metric (a counter's _total, a histogram's _count), and
    its label names after the agent (which AGENT_LABELLED metrics carry first)."""
    metric = getattr(metrics, attribute)
    suffix = {"counter": "_total", "histogram": "_count", "gauge": ""}[metric._type]
    names = metric._labelnames
    if attribute in AGENT_LABELLED:
        assert names[0] == "agent", f"{attribute} is agent-labelled, but its first label is {names[0]}"
        names = names[1:]
    return metric._name + suffix, names


def test_a_fresh_gateway_exports_every_known_label_value_at_zero_for_each_agent() -> None:
    metrics = GatewayMetrics()
    metrics.know_agents(parse_config(TWO_AGENTS, env={}))
    samples = _rendered(metrics)
    for attribute, label_sets in KNOWN_LABEL_VALUES.items():
        name, labelnames = _value_sample(metrics, attribute)
        agents = [("pay",), ("desk",)] if attribute in AGENT_LABELLED else [()]
        if attribute == "plugin_requests":
            agents.append(("",))  # requests that name no agent's app
        for agent, values in product(agents, label_sets):
            labels = (("agent",) if agent else ()) + labelnames
            key = (name, tuple(sorted(zip(labels, agent + values, strict=True))))
            assert samples.get(key) == 0, f"{name}{dict(key[1])} is not exported at 0 from the start"
    for agent in ("pay", "desk"):
        assert samples.get(("adk_gateway_upstream_up", (("agent", agent),))) == 0
        assert samples.get(("adk_gateway_approvals_pending", (("agent", agent),))) == 0


def test_known_label_values_name_real_labelled_metrics_without_duplicates() -> None:
    metrics = GatewayMetrics()
    for attribute, label_sets in KNOWN_LABEL_VALUES.items():
        _, labelnames = _value_sample(metrics, attribute)
        assert all(len(values) == len(labelnames) for values in label_sets), attribute
        assert len(set(label_sets)) == len(label_sets), f"{attribute} lists a value twice"
    for attribute in AGENT_LABELLED:
        _value_sample(metrics, attribute)  # asserts the agent comes first


def test_know_tools_exports_the_series_each_tool_policy_can_move() -> None:
    metrics = GatewayMetrics()
    metrics.know_tools("pay", {
        "default": ToolPolicy(approval=True),
        "transfer_funds": ToolPolicy(approval=True),
        "pick_colour": ToolPolicy(runs_in="browser"),
        "get_weather": ToolPolicy(),
    })
    metrics.know_tools("pay", {"transfer_funds": ToolPolicy(approval=True)})  # a reload: idempotent
    samples = _rendered(metrics)

    def exported(name: str, **labels: str) -> float | None:
        return samples.get((name, tuple(sorted({"agent": "pay", **labels}.items()))))

    assert exported("adk_gateway_policy_bypassed_total", tool="transfer_funds") == 0
    assert exported("adk_gateway_policy_bypassed_total", tool="pick_colour") == 0
    assert exported("adk_gateway_approval_timeouts_total", tool="transfer_funds") == 0
    for outcome in TOOL_OUTCOMES["approval_wait"]:
        assert exported("adk_gateway_approval_wait_seconds_count", tool="transfer_funds", outcome=outcome) == 0
        assert exported("adk_gateway_approval_wait_seconds_bucket", tool="transfer_funds", outcome=outcome, le="+Inf") == 0
    for outcome in TOOL_OUTCOMES["browser_tool_wait"]:
        assert exported("adk_gateway_browser_tool_wait_seconds_count", tool="pick_colour", outcome=outcome) == 0
    # Only what a policy can move: no approval timeouts for a browser tool, nothing for an ungated
    # tool, nothing for `default`, which names no tool.
    tools = {dict(labels).get("tool") for (_, labels) in samples}
    assert {dict(labels).get("agent") for (_, labels) in samples if dict(labels).get("tool")} == {"pay"}
    assert "get_weather" not in tools and "default" not in tools
    assert exported("adk_gateway_approval_timeouts_total", tool="pick_colour") is None
    assert exported("adk_gateway_browser_tool_wait_seconds_count", tool="transfer_funds", outcome="output") is None


def test_every_outcome_a_waiting_call_ends_with_is_a_known_tool_outcome() -> None:
    # The gateway labels Outcome.OUTPUT_ERROR "error"; every other outcome by its value.
    named = {Outcome.OUTPUT_ERROR: "error"}
    known = set(TOOL_OUTCOMES["approval_wait"]) | set(TOOL_OUTCOMES["browser_tool_wait"])
    for outcome in Outcome:
        assert named.get(outcome, outcome.value) in known, f"{outcome} is not a known outcome of the wait histograms"


# ---- the values gateway/ counts with, read from its source ----------------------------------------

DYNAMIC = "<dynamic>"


@dataclass
class Source:
    """gateway/'s modules, parsed, with what the scan needs to walk them."""

    modules: dict[str, ast.Module]
    parents: dict[ast.AST, ast.AST] = field(default_factory=dict)
    module_of: dict[ast.AST, ast.Module] = field(default_factory=dict)
    # Every node, walked once: the scan asks for calls hundreds of times (a walk each took ~25 s).
    walked: list[tuple[str, ast.AST]] = field(default_factory=list)
    calls: dict[str, list[tuple[str, ast.Call]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for path, module in self.modules.items():
            for node in ast.walk(module):
                self.walked.append((path, node))
                self.module_of[node] = module
                for child in ast.iter_child_nodes(node):
                    self.parents[child] = node
                if isinstance(node, ast.Call):
                    func = node.func
                    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
                    if name is not None:
                        self.calls.setdefault(name, []).append((path, node))

    @classmethod
    def read(cls, folder: Path) -> Source:
        return cls({str(p.relative_to(folder)): ast.parse(p.read_text(encoding="utf-8")) for p in sorted(folder.rglob("*.py"))})

    def nodes(self, kind: type[ast.AST] | tuple[type[ast.AST], ...]) -> Iterator[tuple[str, ast.AST]]:
        return ((path, node) for path, node in self.walked if isinstance(node, kind))

    def calls_to(self, name: str) -> Iterator[tuple[str, ast.Call]]:
        return iter(self.calls.get(name, ()))

    def function_of(self, node: ast.AST) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        while node in self.parents:
            node = self.parents[node]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return node
        return None


def _assignments(tree: ast.AST, name: str) -> Iterator[ast.expr | None]:
    """What `name` is assigned in `tree` (None: something the scan cannot follow, such as a loop
    variable or an unpacked tuple); nested functions are their own scope."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if node is not tree and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id == name:
                    yield node.value
                elif any(isinstance(t, ast.Name) and t.id == name for t in ast.walk(target)):
                    yield None
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) and isinstance(node.target, ast.Name) and node.target.id == name:
            yield node.value if not isinstance(node, ast.AugAssign) else None
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension, ast.withitem)):
            target = getattr(node, "target", None) or getattr(node, "optional_vars", None)
            if target is not None and any(isinstance(t, ast.Name) and t.id == name for t in ast.walk(target)):
                yield None
        stack.extend(ast.iter_child_nodes(node))


class Resolver:
    """The string values an expression can take, as far as the source tells; DYNAMIC for the rest."""

    def __init__(self, source: Source) -> None:
        self.source = source

    def values(self, expr: ast.AST | None, seen: frozenset[int] = frozenset()) -> set[str]:
        if expr is None or id(expr) in seen:
            return {DYNAMIC}
        seen = seen | {id(expr)}
        if isinstance(expr, ast.Constant):
            return {expr.value} if isinstance(expr.value, str) else set()
        if isinstance(expr, ast.IfExp):
            return self.values(expr.body, seen) | self.values(expr.orelse, seen)
        if isinstance(expr, ast.BoolOp):
            return set().union(*(self.values(v, seen) for v in expr.values))
        if isinstance(expr, ast.Dict):
            return set().union(*(self.values(v, seen) for v in expr.values))
        if (
            isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "get"
            and isinstance(expr.func.value, ast.Dict)
        ):
            default = self.values(expr.args[1], seen) if len(expr.args) > 1 else set()
            return self.values(expr.func.value, seen) | default
        if isinstance(expr, ast.Name):
            return self._name(expr, seen)
        return {DYNAMIC}

    def _name(self, name: ast.Name, seen: frozenset[int]) -> set[str]:
        function = self.source.function_of(name)
        if function is not None:
            assigned = list(self._reaching(name, function))
            if assigned:
                return set().union(*(self.values(value, seen) for value in assigned))
            params = [a.arg for a in (*function.args.posonlyargs, *function.args.args)]
            if name.id in params or name.id in [a.arg for a in function.args.kwonlyargs]:
                return self._argument(function, name.id, params, seen)
        module = self.source.module_of[name]
        top = [value for stmt in module.body for value in _assignments(stmt, name.id)]
        return set().union(*(self.values(value, seen) for value in top)) if top else {DYNAMIC}

    def _reaching(self, name: ast.Name, function: ast.AST) -> Iterator[ast.expr | None]:
        """Assignments to `name` in `function` that may precede its use: of an `if`, only the
        branch the use is in (the other one never runs first); of anything else, every block."""
        child: ast.AST = name
        while child is not function:
            parent = self.source.parents[child]
            if isinstance(parent, ast.If):
                blocks = [b for b in (parent.body, parent.orelse) if child in b]
            else:
                blocks = [v for v in vars(parent).values() if isinstance(v, list)]
            for block in blocks:
                for stmt in block:
                    if stmt is not child and isinstance(stmt, ast.AST):
                        yield from _assignments(stmt, name.id)
            child = parent

    def _argument(self, function: ast.FunctionDef | ast.AsyncFunctionDef, param: str, params: list[str], seen: frozenset[int]) -> set[str]:
        """A helper's parameter: what its callers pass."""
        index = params.index(param) if param in params else None
        if index is not None and params and params[0] in ("self", "cls"):
            index -= 1
        found: set[str] = set()
        callers = list(self.source.calls_to(function.name))
        for _, call in callers:
            passed = next((k.value for k in call.keywords if k.arg == param), None)
            if passed is None and index is not None and 0 <= index < len(call.args):
                passed = call.args[index]
            found |= self.values(passed, seen)
        return found or {DYNAMIC}


def _constants(resolver: Resolver, exprs: Iterable[ast.AST | None]) -> set[str]:
    return set().union(*(resolver.values(e) for e in exprs)) - {DYNAMIC}


def _call_args(source: Source, callee: str, index: int, *, first: object = None, module: str | None = None) -> list[ast.AST | None]:
    """Argument `index` of every call to `callee` (in `module`, and whose first argument is `first`, if given)."""
    out = []
    for path, call in source.calls_to(callee):
        if module is not None and path != module:
            continue
        if first is not None and not (call.args and isinstance(call.args[0], ast.Constant) and call.args[0].value == first):
            continue
        out.append(call.args[index] if index < len(call.args) else None)
    return out


def _returned_labels(source: Source) -> list[ast.AST | None]:
    """The label half of what the functions returning `tuple[Verdict, str]` (verdict, result) return."""
    out: list[ast.AST | None] = []
    for _, function in source.nodes((ast.FunctionDef, ast.AsyncFunctionDef)):
        if function.returns is None or ast.unparse(function.returns) != "tuple[Verdict, str]":  # type: ignore[attr-defined]
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.Return) and isinstance(node.value, ast.Tuple) and len(node.value.elts) == 2:
                out.append(node.value.elts[1])
    return out


def _run_outcomes(source: Source, resolver: Resolver) -> set[str]:
    """How turns end (core/turn.py): what `_outcome` is set to, and what `fail` is told, by default too."""
    exprs: list[ast.AST | None] = [
        node.value for path, node in source.nodes(ast.Assign) if path == "core/turn.py"  # type: ignore[attr-defined]
        for target in node.targets if isinstance(target, ast.Attribute) and target.attr == "_outcome"  # type: ignore[attr-defined]
    ]
    exprs += [k.value for _, call in source.calls_to("fail") for k in call.keywords if k.arg == "outcome"]
    exprs += [d for path, f in source.nodes(ast.FunctionDef) if path == "core/turn.py" and f.name == "fail"  # type: ignore[attr-defined]
              for d in f.args.kw_defaults]  # type: ignore[attr-defined]
    return _constants(resolver, exprs)


def _browser_run_outcomes(source: Source, protocols: set[str]) -> set[str]:
    """How a browser's response ended: the strings the AI SDK transports (edge/sse.py, edge/ws.py)
    assign to `outcome`; for AG-UI's (edge/agui.py), those and the ones its stream sets as its own
    (core/agui_stream.py `AguiStream.outcome`)."""
    paths = {"edge/agui.py", "core/agui_stream.py"} if "ag_ui" in protocols else {"edge/sse.py", "edge/ws.py"}
    values: set[str] = set()
    for path, node in source.nodes(ast.Assign):
        if path not in paths:
            continue
        for target in node.targets:  # type: ignore[attr-defined]
            names = target.elts if isinstance(target, ast.Tuple) else [target]
            if any(isinstance(t, (ast.Name, ast.Attribute)) and getattr(t, "id", getattr(t, "attr", "")) == "outcome" for t in names):
                values |= {n.value for n in ast.walk(node.value) if isinstance(n, ast.Constant) and isinstance(n.value, str)}  # type: ignore[attr-defined]
    return values


def _ws_frame_types(source: Source, resolver: Resolver, direction: str) -> set[str]:
    if direction == "in":  # the frame types the socket has a handler for; the rest count as invalid
        handlers = [v for _, n in source.nodes(ast.Assign) for t in n.targets  # type: ignore[attr-defined]
                    if isinstance(t, ast.Name) and t.id == "HANDLERS" for v in [n.value]]  # type: ignore[attr-defined]
        return _constants(resolver, [k for h in handlers if isinstance(h, ast.Dict) for k in h.keys])
    frames = [a for _, call in source.calls_to("send") for a in call.args[:1] if isinstance(a, ast.Dict)]
    return _constants(resolver, [v for d in frames for k, v in zip(d.keys, d.values, strict=True)
                                 if isinstance(k, ast.Constant) and k.value == "type"])


# Where the values come from when `.labels()` gets them from an exception, a verdict or a frame:
# (metric, label position) -> the values, given the other positions' values at that call.
DynamicSource = Callable[[Source, Resolver, list[set[str]]], set[str]]
DYNAMIC_SOURCES: dict[tuple[str, int], DynamicSource] = {
    ("upstream_errors", 0): lambda s, r, _: _constants(r, _call_args(s, "UpstreamError", 0)),
    # admit counts what auth refuses with 403 by its code, and every Limited by its code.
    ("limited", 0): lambda s, r, _: _constants(
        r, _call_args(s, "Limited", 1) + _call_args(s, "HttpError", 1, first=403, module="access/auth.py")
    ),
    ("plugin_requests", 0): lambda s, r, _: _constants(
        r, [k.value for _, c in s.calls_to("Verdict") for k in c.keywords if k.arg == "reason"] + _returned_labels(s)
    ),
    ("runs", 0): lambda s, r, _: _run_outcomes(s, r),
    ("browser_runs", 1): lambda s, r, other: _browser_run_outcomes(s, other[0]),
    ("ws_frames", 1): lambda s, r, other: set().union(*(_ws_frame_types(s, r, d) for d in other[0] - {DYNAMIC})),
}
# Label positions whose values are open by design: tool names (exported from the policy by
# know_tools), and the outcome of a call (`call.outcome.value`, an Outcome: see the test above).
OPEN_POSITIONS = {
    ("policy_bypassed", 0), ("approval_timeouts", 0), ("approval_wait", 0), ("browser_tool_wait", 0),
    ("approval_wait", 1), ("browser_tool_wait", 1),
    # Who decided an approval and how (approvals/reports.py, from the call or the confirmation): the
    # pairs that can happen are exported at 0 (KNOWN_LABEL_VALUES); the notices' test checks them.
    ("approval_decisions", 0), ("approval_decisions", 1), ("approval_decision_wait", 0),
    # A shadow rule's findings (chat/gates.py): the tool and rule from the policy, the agreement one of
    # SHADOW_AGREEMENTS; know_tools exports each shadow rule's series (test_shadow_rules.py checks them).
    ("policy_shadow", 0), ("policy_shadow", 1), ("policy_shadow", 2),
}
# Metrics born at first use (any status, any chunk type): not part of the contract.
OPEN_METRICS = {"http_requests"}


def _metric_aliases(source: Source) -> dict[str, str]:
    """`self._frames_out = gateway.metrics.ws_frames`: attribute or variable name -> metric."""
    aliases = {}
    for _, node in source.nodes(ast.Assign):
        value = node.value  # type: ignore[attr-defined]
        metric = _metric_name(value, {})
        if metric is None:
            continue
        for target in node.targets:  # type: ignore[attr-defined]
            if isinstance(target, (ast.Attribute, ast.Name)):
                aliases[target.attr if isinstance(target, ast.Attribute) else target.id] = metric
    return aliases


def _metric_name(receiver: ast.AST, aliases: dict[str, str]) -> str | None:
    if isinstance(receiver, ast.Attribute):
        owner = receiver.value
        if (isinstance(owner, ast.Attribute) and owner.attr in ("metrics", "_metrics")) or (isinstance(owner, ast.Name) and owner.id == "metrics"):
            return receiver.attr
        return aliases.get(receiver.attr)
    if isinstance(receiver, ast.Name):
        return aliases.get(receiver.id)
    return None


def contract_problems(source: Source) -> list[str]:
    """Every value gateway/ counts a labelled series with that the contract does not list."""
    resolver = Resolver(source)
    aliases = _metric_aliases(source)
    known_tool_outcomes = {name: {(o,) for o in outcomes} for name, outcomes in TOOL_OUTCOMES.items()}
    problems = []
    for path, call in source.calls_to("labels"):
        if path in ("ops/metrics.py", "ops/webhook_metrics.py") or not isinstance(call.func, ast.Attribute):
            continue  # these make the series from the contract itself
        where = f"gateway/{path}:{call.lineno}"
        metric = _metric_name(call.func.value, aliases)
        if metric is None:
            problems.append(f"{where}: .labels() on {ast.unparse(call.func.value)}, which the scan cannot tie to a metric")
            continue
        if metric in OPEN_METRICS:
            continue
        args = call.args
        if metric in AGENT_LABELLED:
            # The agent comes first: a name from the config (know_agents makes each one's series),
            # an agent's `.name`, a chat's `.agent`, or "" for a plugin request naming none.
            if not args or not _an_agent(args[0]):
                problems.append(f"{where}: {metric} is agent-labelled, but its first label is not an agent")
                continue
            args = args[1:]
        per_position = [resolver.values(arg) for arg in args]
        for position, values in enumerate(per_position):
            if DYNAMIC in values and (metric, position) not in OPEN_POSITIONS:
                dynamic = DYNAMIC_SOURCES.get((metric, position))
                if dynamic is None:
                    problems.append(f"{where}: {metric} label {position} ({ast.unparse(args[position])}) comes from "
                                    "where the scan cannot follow: add its source to DYNAMIC_SOURCES")
                    continue
                per_position[position] = (values - {DYNAMIC}) | dynamic(source, resolver, per_position)
        known = KNOWN_LABEL_VALUES.get(metric)
        if known is None and metric in known_tool_outcomes:
            for outcome in per_position[1] - {DYNAMIC}:
                if (outcome,) not in known_tool_outcomes[metric]:
                    problems.append(f"{where}: {metric} is counted with outcome {outcome!r}, missing from TOOL_OUTCOMES")
            continue
        if known is None:
            if not all((metric, p) in OPEN_POSITIONS for p in range(len(per_position))):
                problems.append(f"{where}: {metric} is labelled but not in KNOWN_LABEL_VALUES")
            continue
        for values in product(*per_position):
            if DYNAMIC not in values and values not in known:
                problems.append(f"{where}: {metric} is counted with {values}, missing from KNOWN_LABEL_VALUES")
    return problems


def _an_agent(node: ast.AST) -> bool:
    text = ast.unparse(node)
    return text in ("agent", "self.agent", "agent.name", "chat.agent", "name") or text.endswith(
        ("agent_for_app(body.app_name) or ''", ".agent")
    ) or (isinstance(node, ast.Constant) and node.value == "")


def test_gateway_counts_only_with_known_label_values() -> None:
    problems = contract_problems(Source.read(GATEWAY_DIR))
    assert not problems, "\n".join(problems)


def test_the_scan_finds_every_counted_value() -> None:
    # The values the scan must find in today's source, through each way it follows them.
    source = Source.read(GATEWAY_DIR)
    resolver = Resolver(source)
    assert {"connect", "reset", "session_missing"} <= DYNAMIC_SOURCES["upstream_errors", 0](source, resolver, [])
    assert {"rate_limited", "too_many_chats", "origin_not_allowed"} <= DYNAMIC_SOURCES["limited", 0](source, resolver, [])
    assert {"no_browser", "not_gated", "owner_lost", "verdict_lost"} <= DYNAMIC_SOURCES["plugin_requests", 0](source, resolver, [])
    assert {"send", "audio"} <= DYNAMIC_SOURCES["ws_frames", 1](source, resolver, [{"in"}])
    assert {"start", "end", "no-active"} <= DYNAMIC_SOURCES["ws_frames", 1](source, resolver, [{"out"}])
    assert DYNAMIC_SOURCES["runs", 0](source, resolver, []) == {"completed", "waiting", "error", "cancelled"}
    refusal = next(c for p, c in source.calls_to("labels") if p == "edge/admit.py")
    assert {"draining", "body_too_large", "unauthorized"} <= resolver.values(refusal.args[0])


UNLISTED = '''
from .upstream import UpstreamError

async def drive(metrics, exc):
    metrics.limited.labels("brand_new_reason").inc()
    metrics.upstream_errors.labels(chat.agent, exc.kind).inc()
    metrics.upstream_errors.labels(exc.kind, "connect").inc()
    outcome = "completed"
    try:
        pass
    except Exception:
        outcome = "exploded"
    finally:
        metrics.runs.labels(self.agent, outcome).inc()
    if exc:
        result = "approved"
        metrics.approval_wait.labels(agent, "tool", result).observe(1)
    else:
        result = "vanished"
        metrics.browser_tool_wait.labels(agent, "tool", result).observe(1)
    metrics.forwarded.labels(exc.direction).inc()
    mystery.labels("x").inc()

def fail():
    raise UpstreamError("new_kind", "message")
'''


def test_the_scan_reports_values_missing_from_the_contract() -> None:
    problems = "\n".join(contract_problems(Source({"fake.py": ast.parse(UNLISTED)})))
    for expected in ("('brand_new_reason',)", "('new_kind',)", "('exploded',)", "outcome 'vanished'",
                     "forwarded label 0 (exc.direction)", "mystery",
                     "fake.py:7: upstream_errors is agent-labelled, but its first label is not an agent"):
        assert expected in problems, f"the scan does not report {expected}:\n{problems}"
    for listed in ("('completed',)", "'approved'"):
        assert listed not in problems, problems


# ---- labels taken from requests come from closed sets ----------------------------------------------


def test_a_made_up_method_counts_as_other_and_adds_no_series() -> None:
    metrics = GatewayMetrics()
    for method in ("GET", "get", "BREW", "X" * 200, "PROPFIND"):
        metrics.count_request("/healthz", method, "200")
    counted = {
        sample.labels["method"]: sample.value
        for family in metrics.registry.collect() if family.name == "adk_gateway_http_requests"
        for sample in family.samples if sample.name.endswith("_total")
    }
    assert counted == {"GET": 1, "other": 4}
    assert len(metrics._http_children) == 2


async def test_a_request_with_an_unusual_method_is_counted_as_other() -> None:
    from aiohttp.test_utils import TestClient, TestServer

    from gateway.edge.app import create_app
    from gateway.edge.state import GATEWAY

    app = create_app(parse_config("upstream: {url: 'http://127.0.0.1:9', health_interval: 1h}\n", env={}))
    async with TestClient(TestServer(app)) as client:
        for method in ("PROPFIND", "MKCOL", "GET"):
            async with client.request(method, "/healthz") as response:
                await response.read()
    registry = app[GATEWAY].metrics.registry
    sample = registry.get_sample_value
    assert sample("adk_gateway_http_requests_total", {"route": "unmatched", "method": "other", "status": "405"}) == 2
    assert sample("adk_gateway_http_requests_total", {"route": "/healthz", "method": "GET", "status": "200"}) == 1
    methods = {
        s.labels["method"] for family in registry.collect() if family.name == "adk_gateway_http_requests" for s in family.samples
    }
    assert methods == {"GET", "other"}


# ---- request duration: one observation per request, bounded labels ---------------------------------


def test_a_request_is_timed_by_route_template_and_status_class_and_an_upgrade_is_not() -> None:
    metrics = GatewayMetrics()
    metrics.count_request("/api/agents/{agent}/chat", "POST", "200", 0.3)
    metrics.count_request("/api/agents/{agent}/chat", "POST", "429", 0.001)
    metrics.count_request("/api/agents/{agent}/chat", "POST", "404", 0.002)
    metrics.count_request("/api/chat/ws", "GET", "101", 3600.0)  # a socket's whole life
    metrics.count_request("/healthz", "GET", "200")  # not timed: no duration given
    sample = metrics.registry.get_sample_value
    route = "/api/agents/{agent}/chat"
    assert sample("adk_gateway_request_duration_seconds_count", {"route": route, "status_class": "2xx"}) == 1
    assert sample("adk_gateway_request_duration_seconds_sum", {"route": route, "status_class": "2xx"}) == 0.3
    assert sample("adk_gateway_request_duration_seconds_count", {"route": route, "status_class": "4xx"}) == 2
    classes = {
        (s.labels["route"], s.labels["status_class"]) for family in metrics.registry.collect()
        if family.name == "adk_gateway_request_duration_seconds" for s in family.samples
    }
    assert classes == {(route, "2xx"), (route, "4xx")}


async def test_a_streamed_answer_is_timed_to_its_end_once() -> None:
    import asyncio
    from types import SimpleNamespace

    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    from gateway.edge.app import request_context
    from gateway.edge.state import GATEWAY
    from gateway.ops.tracing import Tracing

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(b"data: one\n\n")
        await asyncio.sleep(0.3)  # the turn goes on after the headers went out
        await response.write_eof(b"data: [DONE]\n\n")
        return response

    metrics = GatewayMetrics()
    app = web.Application(middlewares=[request_context])
    app[GATEWAY] = SimpleNamespace(metrics=metrics, tracing=Tracing.off())  # type: ignore[assignment]
    app.router.add_post("/api/chat", stream)
    async with TestClient(TestServer(app)) as client:
        async with client.post("/api/chat") as response:
            assert (await response.read()).endswith(b"[DONE]\n\n")
    labels = {"route": "/api/chat", "status_class": "2xx"}
    assert metrics.registry.get_sample_value("adk_gateway_request_duration_seconds_count", labels) == 1
    assert metrics.registry.get_sample_value("adk_gateway_request_duration_seconds_sum", labels) >= 0.3


# ---- tokens: the model label is bounded by the config ----------------------------------------------


def test_tokens_are_exported_at_zero_per_listed_model_and_other_and_any_other_model_counts_as_other() -> None:
    from gateway.ops.metrics import OTHER_MODEL, TOKEN_KINDS

    metrics = GatewayMetrics()
    metrics.know_agents(parse_config(TWO_AGENTS + "metrics: {models: [gemini-2.5-flash]}\n", env={}))
    samples = _rendered(metrics)
    for agent, model, (kind, _) in product(("pay", "desk"), ("gemini-2.5-flash", OTHER_MODEL), TOKEN_KINDS):
        key = ("adk_gateway_tokens_total", tuple(sorted({"agent": agent, "model": model, "kind": kind}.items())))
        assert samples.get(key) == 0, key
    assert samples.get(("adk_gateway_first_token_seconds_count", (("agent", "pay"),))) == 0
    usage = {"promptTokenCount": 10, "candidatesTokenCount": 3, "totalTokenCount": 15, "thoughtsTokenCount": 2,
             "cachedContentTokenCount": 4, "toolUsePromptTokenCount": 99, "promptTokensDetails": [{"x": 1}]}
    metrics.count_tokens("pay", "gemini-2.5-flash", usage)
    for made_up in ("gemini-9-ultra", "", "x" * 500):
        metrics.count_tokens("pay", made_up, {"promptTokenCount": 1, "totalTokenCount": "2"})
    # ADK 1.x in live mode: Gemini Live's own field names, passed through.
    metrics.count_tokens("pay", "", {"promptTokenCount": 0, "responseTokenCount": 5})
    samples = _rendered(metrics)
    counted = {
        (dict(labels)["model"], dict(labels)["kind"]): value for (name, labels), value in samples.items()
        if name == "adk_gateway_tokens_total" and dict(labels)["agent"] == "pay" and value
    }
    assert counted == {
        ("gemini-2.5-flash", "input"): 10, ("gemini-2.5-flash", "output"): 3, ("gemini-2.5-flash", "total"): 15,
        ("gemini-2.5-flash", "thinking"): 2, ("gemini-2.5-flash", "cached"): 4, ("other", "input"): 3,
        ("other", "output"): 5,
    }
    models = {dict(labels).get("model") for (name, labels) in samples if name == "adk_gateway_tokens_total"}
    assert models == {"gemini-2.5-flash", OTHER_MODEL}


def test_token_counts_of_a_usage_shape_seen_before_are_the_same() -> None:
    # count_tokens remembers what a usage of one shape counts: the values are read each time,
    # a kind's first field counts even when its value does not (None blocks the next field),
    # and past the memo's bound the counts are still right.
    from gateway.ops import metrics as module

    metrics = GatewayMetrics()
    for _ in range(3):
        metrics.count_tokens("a", "m", {"candidatesTokenCount": 2, "promptTokenCount": 1})
        metrics.count_tokens("a", "m", {"candidatesTokenCount": None, "responseTokenCount": 7, "totalTokenCount": True})
    for n in range(module._TOKEN_PLANS + 10):
        metrics.count_tokens("a", "m", {"promptTokenCount": 1, f"odd{n}": 0})
    assert len(metrics._token_plans) == module._TOKEN_PLANS
    assert metrics._token_counts == {("a", "other", "output"): 6, ("a", "other", "input"): 3 + module._TOKEN_PLANS + 10}
