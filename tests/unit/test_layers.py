"""The sans-IO core imports no I/O: an import contract, checked on the source as it is.

The modules below take events and return chunks, requests and verdicts (docs/architecture.md); they
must stay testable in milliseconds and free of sockets, clocks and event loops, so that the chat's
state can be stored and rebuilt (issue 25). A contract checked here, not in reviews: every module
the core imports, inside the gateway package too, is read, and none may import an I/O library.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"

# The sans-IO core: the turn and what it is made of, the browser's and ADK's formats.
CORE = (
    "turn", "converter", "message_writer", "ledger", "approvals", "protocol", "messages",
    "live_frames", "eventstream", "limits", "loosening", "deadlines",
)
# I/O, clocks and the process's logging: the shells' business. (`time` is a clock: the core is
# given `now` by its caller.)
FORBIDDEN = ("asyncio", "aiohttp", "redis", "structlog", "prometheus_client", "socket", "time", "logging")


# One import statement's head, at any indentation (lazy imports inside functions count too). Read
# as text, not with `ast.parse`: CPython 3.11.7's AST constructor can fail with "AST constructor
# recursion depth mismatch" depending on the caller's stack depth (fixed in 3.11.8), which made
# this contract fail in CI on a file that had not changed.
_IMPORT = re.compile(r"^\s*import\s+([\w.]+(?:\s+as\s+\w+)?(?:\s*,\s*[\w.]+(?:\s+as\s+\w+)?)*)\s*(?:#.*)?$")
_FROM = re.compile(r"^\s*from\s+(\.*)([\w.]*)\s+import\s+(.+)$")


def _imports(module: str) -> tuple[set[str], set[str]]:
    """(top-level packages outside gateway, modules of gateway) that `module` imports."""
    path = GATEWAY / f"{module.replace('.', '/')}.py"
    outside: set[str] = set()
    inside: set[str] = set()
    for line in path.read_text().splitlines():
        if match := _IMPORT.match(line):
            for name in (part.split()[0] for part in match.group(1).split(",")):
                if name.startswith("gateway."):
                    inside.add(name.removeprefix("gateway."))
                else:
                    outside.add(name.split(".")[0])
        elif match := _FROM.match(line):
            dots, name, names = match.groups()
            if not dots:
                if name.startswith("gateway."):
                    inside.add(name.removeprefix("gateway."))
                elif name != "__future__":
                    outside.add(name.split(".")[0])
                continue
            base = module.split(".")[: -len(dots)] if "." in module else []
            target = ".".join([*base, name] if name else base)
            if target:
                inside.add(target)
            else:  # `from . import x`
                inside.update(n.strip().split()[0] for n in names.strip("()").split(",") if n.strip())
    return outside, {m for m in inside if (GATEWAY / f"{m.replace('.', '/')}.py").exists()}


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


def test_the_contract_can_fail() -> None:
    """The checker sees an import of each kind (a test that cannot fail is a defect)."""
    outside, inside = _imports("driver")
    assert "asyncio" in outside and "turn" in inside
    assert set(FORBIDDEN) & {pkg for m, pkgs in _closure("chats").items() for pkg in pkgs}
