"""The layers of gateway/, as an import contract checked on the source as it is.

The packages are layers (docs/architecture.md): `core` is sans-IO (it takes events and returns
chunks, requests and verdicts, testable in milliseconds and free of sockets, clocks and event
loops, so that a chat's state can be stored and rebuilt: issue 25); `chat`, `upstream`, `access`,
`cluster`, `config` and `ops` are shells around it; `edge` (the HTTP application, process and
transports) sits on top. A contract checked here, not in reviews:
- no module of the core, nor `config/loosening.py`, reaches an I/O library through its imports,
  inside the gateway package too;
- the core imports nothing from the shells, and nothing below the edge imports the edge;
- no two modules import each other at load time (a cycle), lazily or not.
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
# I/O, clocks and the process's logging: the shells' business. (`time` is a clock: the core is
# given `now` by its caller.)
FORBIDDEN = ("asyncio", "aiohttp", "redis", "structlog", "prometheus_client", "socket", "time", "logging")

# Which packages each layer may not import (the edge may import anything; cli.py sits above all).
SHELLS = ("chat", "upstream", "edge", "access", "cluster", "ops")
MAY_NOT_IMPORT = {
    "core": SHELLS,
    **{below: ("edge",) for below in ("chat", "upstream", "access", "cluster", "config", "ops")},
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


@pytest.mark.parametrize("module", CORE)
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


def test_every_package_init_says_what_it_owns_and_imports_nothing() -> None:
    for init in GATEWAY.glob("*/__init__.py"):
        package = init.parent.name
        if package == "demo":
            continue
        text = init.read_text()
        assert text.startswith('"""'), f"gateway/{package}/__init__.py has no docstring saying what it owns"
        assert list(_statements(package)) == [], f"gateway/{package}/__init__.py imports something"


def test_each_module_logs_under_its_own_name() -> None:
    for module in _modules():
        for name in re.findall(r'structlog\.get_logger\("([\w.]+)"\)', _path(module).read_text()):
            assert name in ("adk_gateway", f"adk_gateway.{module}"), f"gateway.{module} logs as {name}"


def test_the_contract_can_fail() -> None:
    """The checker sees an import of each kind (a test that cannot fail is a defect)."""
    outside, inside = _imports("chat.actor")
    assert "asyncio" in outside and "core.turn" in inside
    assert set(FORBIDDEN) & {pkg for m, pkgs in _closure("chat.service").items() for pkg in pkgs}
    assert "edge.ws" in _imports("edge.app")[1]  # `from . import ws`-style and `.ws import` alike
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    assert "core.chat_events" in _load_graph()["chat.service"]
    assert CORE[0].startswith("core.") and "core.turn" in CORE
