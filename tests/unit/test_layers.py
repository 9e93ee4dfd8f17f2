"""The layers of gateway/, as an import contract checked on the source as it is.

The packages are layers (docs/architecture.md): `core` is sans-IO (it takes events and returns
chunks, requests and verdicts, testable in milliseconds and free of sockets, clocks and event
loops, so that a chat's state can be stored and rebuilt: issue 25); `chat`, `upstream`, `access`,
`cluster`, `config` and `ops` are shells around it; `approvals` is the approvals room, between
them; `edge` (the HTTP application, process and transports) sits on top. A contract checked here,
not in reviews:
- no module of the core, nor `config/loosening.py`, nor the approvals room's plain data and decision
  (what is told, decided, listed, voted, and its ports), reaches an I/O library through its imports,
  inside the gateway package too;
- the core imports nothing from the shells, and nothing below the edge imports the edge;
- the approvals room imports only what lies below it (core, config, ops) and reaches the store
  through its own port (`approvals/store.py`); the chat, the cluster, access and the edge may
  import it, upstream, ops and config may not; of the edge, only the modules that build and hold
  the object graph and the approvals API do; the chat's machine takes the room's decision through
  its own port (`core/gate_decider.py`), and the cluster's desk and remote gate reach the chats only
  through the room's ports to them (`approvals/ports.py` `ApprovalChats`, `GatedCalls`): they import
  nothing of gateway/chat/;
- no two modules import each other at load time (a cycle), lazily or not;
- the edge reaches the chat layer only through the cluster router: of gateway/chat/ it imports only
  the value types a transport follows (`chat/attachment.py`, `chat/response.py`), and the modules
  that build and hold the object graph (`edge/app.py`, `edge/state.py`) the chat service and the
  registry too; `access` does not import the cluster (it keeps tickets through its own port);
- no callback is assigned onto another object after construction (a seam the import contract
  cannot see): a layer that needs another names a `typing.Protocol` port, passed in (`_patched`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"

# The sans-IO core: every module of gateway/core/ (listed, so a new one is covered), and the
# judgement of a reload, which is pure too.
CORE = (*sorted(f"core.{p.stem}" for p in (GATEWAY / "core").glob("*.py")), "config.loosening", "config.decision_loosening")
# The approvals room's plain data and its decision: what is told of an approval, how a plugin's ask
# is decided, where it is listed, how votes count, and its ports to the store and to the chat (a
# Protocol and its value types). Checked as the core is.
APPROVALS_PURE = (
    "approvals.decision", "approvals.grants", "approvals.index", "approvals.notice", "approvals.ports", "approvals.store",
    "approvals.votes", "approvals.replay", "approvals.replay_records",
)
# The seams between the approvals room and the layers around it (docs/architecture.md, "Where an
# approval is decided"): each module, the port it reaches the other side through, and the modules of
# that side it must not import (the port is the way).
ROOM_PORTS = {
    # The machine takes the decision through its own port; the core cannot see the room.
    "core.chat_machine": ("core.gate_decider", "approvals."),
    # The room implements the machine's port.
    "approvals.decision": ("core.gate_decider", "chat."),
    # The desk reaches this replica's chats through the room's port to them (it applies a counted
    # decision, and reads what a listing needs), never through the chat layer itself.
    "cluster.approval_desk": ("approvals.ports", "chat."),
    # The remote gate reaches them through the room's port for the plugin's asks (`GatedCalls`).
    "cluster.remote_gate": ("approvals.ports", "chat."),
}
# I/O, clocks and the process's logging: the shells' business. (`time` is a clock: the core is
# given `now` by its caller.)
FORBIDDEN = ("asyncio", "aiohttp", "redis", "structlog", "prometheus_client", "socket", "time", "logging")

# Which packages each layer may not import (the edge may import anything; cli.py sits above all).
SHELLS = ("chat", "upstream", "edge", "access", "cluster", "ops", "approvals")
MAY_NOT_IMPORT = {
    "core": SHELLS,
    **{below: ("edge",) for below in ("chat", "cluster")},
    **{below: ("edge", "approvals") for below in ("upstream", "config", "ops")},
    "access": ("edge", "cluster"),
    # The approvals room (docs/architecture.md, "The layers' rules"): below the chat, the cluster and
    # access, which use it; it reaches the store through its port, approvals/store.py.
    "approvals": ("edge", "chat", "cluster", "access", "upstream"),
}
# Which edge modules may import the approvals room: those that build and hold the object graph
# (the audit trail, the webhooks, the Slack channel, the mails) and the approvals and grants APIs, its
# HTTP faces, with the approvals API's two other faces, which vote through the API's own vote: the
# Slack presses (edge/slack.py) and the page the mailed decision links open (edge/decision_page.py;
# the links' tokens are the room's).
EDGE_SEES_APPROVALS = ("edge.app", "edge.state", "edge.approvals_api", "edge.grants_api", "edge.slack", "edge.decision_page")
# What of gateway/chat/ the edge may import (docs/architecture.md, "The layers' rules"): the
# transports follow a run's response (`Attachment`, `Feed`, `Reader`, `FollowerLagged`) and reach
# everything else through cluster/router.py; app.py builds the chat service and its registry, and
# state.py holds them for the lifecycle (close, reload).
EDGE_SEES_OF_CHAT = ("chat.attachment", "chat.response")
EDGE_BUILDS_CHAT = {"edge.app": ("chat.service", "chat.registry"), "edge.state": ("chat.service", "chat.registry")}

# Assignments the callback scan (`_patched`) finds that are not a layer's callback, each with why.
NOT_A_PATCHED_CALLBACK = {
    # aiohttp's own object: its Server takes no argument for the head guard, so GuardedAppRunner
    # sets it on the server it just made (tests/unit/test_aiohttp_raw.py fails when aiohttp changes).
    ("edge.aiohttp_raw", "server.guard"),
    # WaitSignal and the reader that listens to it are one module's two halves; the signal has
    # one listener, the stream reading while it is set (tests/unit/test_upstream_idle.py).
    ("upstream.idle_reader", "wait._listener"),
    # A value, not a callable: the agent's AdkClient (its name is also a Tracing method's).
    ("chat.agent_runs", "chat.upstream"),
}

# One import statement's head, at any indentation (lazy imports inside functions count too). Read
# as text, not with `ast.parse`: CPython 3.11.7's AST constructor can fail with "AST constructor
# recursion depth mismatch" depending on the caller's stack depth (fixed in 3.11.8), which made
# this contract fail in CI on a file that had not changed.
_IMPORT = re.compile(r"^(\s*)import\s+([\w.]+(?:\s+as\s+\w+)?(?:\s*,\s*[\w.]+(?:\s+as\s+\w+)?)*)\s*(?:#.*)?$")
_FROM = re.compile(r"^(\s*)from\s+(\.*)([\w.]*)\s+import\s+(.+)$")


def _modules() -> list[str]:
    """Every module of the gateway package, dotted, relative to it (`chat.service`)."""
    return sorted(
        ".".join(p.relative_to(GATEWAY).with_suffix("").parts).removesuffix(".__init__").removesuffix("__init__")
        for p in GATEWAY.rglob("*.py") if "demo" not in p.relative_to(GATEWAY).parts
    )


def _path(module: str) -> Path:
    file = GATEWAY / f"{module.replace('.', '/')}.py"
    return file if file.exists() else GATEWAY / module.replace(".", "/") / "__init__.py"


def _exists(module: str) -> bool:
    return (GATEWAY / f"{module.replace('.', '/')}.py").exists() or (
        GATEWAY / module.replace(".", "/") / "__init__.py"
    ).exists()


def _statements(module: str) -> Iterator[tuple[bool, str, str | None]]:
    """(lazy, package, gateway module or None) per import of `module`: `lazy` when indented
    (inside a function, or `if TYPE_CHECKING:`), the package a non-gateway import names."""
    package = module.split(".")[:-1] if _path(module).name != "__init__.py" else module.split(".")
    for line in _path(module).read_text().splitlines():
        if match := _IMPORT.match(line):
            indent, names = match.groups()
            for name in (part.split()[0] for part in names.split(",")):
                if name == "gateway" or name.startswith("gateway."):
                    yield bool(indent), "gateway", name.removeprefix("gateway").lstrip(".")
                else:
                    yield bool(indent), name.split(".")[0], None
        elif match := _FROM.match(line):
            indent, dots, name, names = match.groups()
            if not dots:
                if name == "gateway" or name.startswith("gateway."):
                    target = name.removeprefix("gateway").lstrip(".")
                elif name != "__future__":
                    yield bool(indent), name.split(".")[0], None
                    continue
                else:
                    continue
            else:
                base = package[: len(package) - (len(dots) - 1)]
                target = ".".join([*base, name] if name else base)
            # `from .pkg import module` imports the module; `from .module import name` the module.
            children = [n.strip().split()[0] for n in names.strip("()").split("#")[0].split(",") if n.strip()]
            submodules = [f"{target}.{c}".lstrip(".") for c in children if _exists(f"{target}.{c}".lstrip("."))]
            for reached in submodules or ([target] if target else []):
                yield bool(indent), "gateway", reached


def _imports(module: str, *, lazy: bool = True) -> tuple[set[str], set[str]]:
    """(top-level packages outside gateway, modules of gateway) that `module` imports."""
    outside: set[str] = set()
    inside: set[str] = set()
    for indented, package, reached in _statements(module):
        if indented and not lazy:
            continue
        if reached is None:
            outside.add(package)
        elif _exists(reached):
            inside.add(reached)
    return outside, inside


def _closure(module: str) -> dict[str, set[str]]:
    """Every gateway module `module` reaches through imports, with what each imports from outside."""
    seen: dict[str, set[str]] = {}
    todo = [module]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        outside, inside = _imports(current)
        seen[current] = outside
        todo.extend(inside - seen.keys())
    return seen


@pytest.mark.parametrize("module", (*CORE, *APPROVALS_PURE))
def test_the_sans_io_core_imports_no_io(module: str) -> None:
    found = {
        reached: sorted(outside & set(FORBIDDEN)) for reached, outside in _closure(module).items()
        if outside & set(FORBIDDEN)
    }
    assert found == {}, f"gateway.{module} reaches I/O through: {found}"


@pytest.mark.parametrize("layer", sorted(MAY_NOT_IMPORT))
def test_no_layer_imports_one_above_it(layer: str) -> None:
    found = {
        module: sorted(m for m in _imports(module)[1] if m.split(".")[0] in MAY_NOT_IMPORT[layer])
        for module in _modules() if module.split(".")[0] == layer
    }
    assert {m: above for m, above in found.items() if above} == {}, f"gateway/{layer}/ imports a layer above it"


def _load_graph() -> dict[str, set[str]]:
    """Module -> the gateway modules it imports at load time (unindented imports)."""
    return {m: _imports(m, lazy=False)[1] - {m} for m in _modules()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle in `graph`, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for module in graph:
        if module not in state and (found := visit(module)):
            return found
    return None


def test_no_import_cycles() -> None:
    cycle = _cycle(_load_graph())
    assert cycle is None, f"gateway's modules import each other at load time: {' -> '.join(cycle or [])}"


def test_the_edge_reaches_chats_only_through_the_router() -> None:
    found = {
        module: sorted(
            m for m in _imports(module)[1]
            if m.split(".")[0] == "chat" and m not in (*EDGE_SEES_OF_CHAT, *EDGE_BUILDS_CHAT.get(module, ()))
        )
        for module in _modules() if module.split(".")[0] == "edge"
    }
    assert {m: chat for m, chat in found.items() if chat} == {}, "gateway/edge/ imports the chat layer beyond its value types"


def test_the_edge_reaches_the_approvals_room_through_its_api() -> None:
    found = {
        module: sorted(m for m in _imports(module)[1] if m.split(".")[0] == "approvals")
        for module in _modules() if module.split(".")[0] == "edge" and module not in EDGE_SEES_APPROVALS
    }
    assert {m: room for m, room in found.items() if room} == {}, "gateway/edge/ imports the approvals room beside its API"


@pytest.mark.parametrize("module", sorted(ROOM_PORTS))
def test_the_approvals_room_and_the_machine_meet_through_ports(module: str) -> None:
    port, forbidden = ROOM_PORTS[module]
    inside = _imports(module)[1]
    assert port in inside, f"gateway.{module} does not go through its port, {port}"
    assert sorted(m for m in inside if m.startswith(forbidden)) == [], f"gateway.{module} reaches past its port"


_DEF = re.compile(r"^\s*(?:async\s+)?def\s+(\w+)")
_PROPERTY = re.compile(r"^\s*@(?:\w+\.setter|property|cached_property|functools\.cached_property)\b")
# `a.b = value` (or `a.b, c.d = x, y`) at any indentation, not a comparison.
_ASSIGN = re.compile(r"^\s+((?:[A-Za-z_]\w*(?:\.\w+)*\s*,\s*)*[A-Za-z_]\w*(?:\.\w+)*)\s*=\s*([^=].*?)\s*(?:#.*)?$")


def _functions(text: str) -> set[str]:
    """The names of the functions and methods `text` defines (properties are values, not callables)."""
    lines = text.splitlines()
    return {
        match.group(1) for i, line in enumerate(lines)
        if (match := _DEF.match(line)) and not (i and _PROPERTY.match(lines[i - 1]))
    }


def _patched(text: str, functions: set[str]) -> list[str]:
    """Callbacks `text` assigns onto another object: a heuristic over the source, documented here.

    A target is an attribute of some object other than `self` itself (`self.x = ...` is an
    object's own state; `self.x.y = ...`, `other.y = ...` are not), and the value is a callable:
    a lambda, a `partial(...)`, or a bound method, a dotted name whose last part is a function
    gateway/ defines (`functions`). What it flags that is no callback is listed, with why, in
    NOT_A_PATCHED_CALLBACK."""
    found = []
    for line in text.splitlines():
        if not (match := _ASSIGN.match(line)):
            continue
        targets = [t.strip() for t in match.group(1).split(",")]
        values = [v.strip() for v in match.group(2).split(",")] if len(targets) > 1 else [match.group(2).strip()]
        for target, value in zip(targets, values):
            if target.count(".") == 0 or (target.startswith("self.") and target.count(".") == 1):
                continue
            bound = re.fullmatch(r"[A-Za-z_]\w*(?:\.\w+)+", value) and value.rsplit(".", 1)[1] in functions
            if value.startswith("lambda") or re.match(r"(?:functools\.)?partial\(", value) or bound:
                found.append(target)
    return found


def test_no_callback_is_patched_onto_another_object() -> None:
    functions = set().union(*(_functions(_path(m).read_text()) for m in _modules()))
    found = sorted(
        (module, target) for module in _modules() for target in _patched(_path(module).read_text(), functions)
        if (module, target) not in NOT_A_PATCHED_CALLBACK
    )
    assert found == [], f"callbacks assigned onto another object after construction (name a port instead): {found}"


def test_every_package_init_says_what_it_owns_and_imports_nothing() -> None:
    for init in GATEWAY.glob("*/__init__.py"):
        package = init.parent.name
        if package == "demo":
            continue
        text = init.read_text()
        assert text.startswith('"""'), f"gateway/{package}/__init__.py has no docstring saying what it owns"
        assert list(_statements(package)) == [], f"gateway/{package}/__init__.py imports something"


# A logger that keeps an earlier module's name, with why.
LOGS_AS = {
    # The audit line's logger is what operators archive and filter the audit by (docs/approvals.md,
    # docs/metrics.md): it kept its name when the module moved into the approvals room.
    "approvals.audit_trail": "adk_gateway.cluster.audit_trail",
}


def test_each_module_logs_under_its_own_name() -> None:
    for module in _modules():
        for name in re.findall(r'structlog\.get_logger\("([\w.]+)"\)', _path(module).read_text()):
            own = LOGS_AS.get(module, f"adk_gateway.{module}")
            assert name in ("adk_gateway", own), f"gateway.{module} logs as {name}"


def test_the_contract_can_fail() -> None:
    """The checker sees an import of each kind (a test that cannot fail is a defect)."""
    outside, inside = _imports("chat.record")
    assert "asyncio" in outside and "core.turn" in inside
    assert set(FORBIDDEN) & {pkg for m, pkgs in _closure("chat.service").items() for pkg in pkgs}
    assert "edge.ws" in _imports("edge.app")[1]  # `from . import ws`-style and `.ws import` alike
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    assert "core.chat_events" in _load_graph()["chat.service"]
    assert CORE[0].startswith("core.") and "core.turn" in CORE
    patched = "        chats.on_run = self._on_run\n        a.b, a.c = self.save, self.load\n        feed.connected = lambda: True\n"
    assert _patched(patched, {"_on_run", "save", "load"}) == ["chats.on_run", "a.b", "a.c", "feed.connected"]
    own = "        self.on_run = self._on_run\n        chat.run = run\n        x.y = self.z\n        if a.b == c.d:\n"
    assert _patched(own, {"_on_run", "run"}) == []
    assert "chat.service" in _imports("edge.app")[1] and "cluster" in MAY_NOT_IMPORT["access"]
    assert "approvals.store" in _imports("approvals.audit_trail")[1] and "cluster" in MAY_NOT_IMPORT["approvals"]
    assert "approvals.index" in _imports("edge.approvals_api")[1] and all(_exists(m) for m in APPROVALS_PURE)
    assert all(_exists(m) and _exists(port) for m, (port, _) in ROOM_PORTS.items())
    assert "approvals.decision" in _imports("chat.record")[1]  # the prefix check above sees such an import
