"""The sans-IO core imports no I/O: an import contract, checked on the source as it is.

The modules below take events and return chunks, requests and verdicts (docs/architecture.md); they
must stay testable in milliseconds and free of sockets, clocks and event loops, so that the chat's
state can be stored and rebuilt (issue 25). A contract checked here, not in reviews: every module
the core imports, inside the gateway package too, is read, and none may import an I/O library.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"

# The sans-IO core: the turn and what it is made of, the browser's and ADK's formats.
CORE = (
    "turn", "converter", "message_writer", "ledger", "approvals", "protocol", "messages",
    "live_frames", "eventstream", "limits", "loosening",
)
# I/O, clocks and the process's logging: the shells' business. (`time` is a clock: the core is
# given `now` by its caller.)
FORBIDDEN = ("asyncio", "aiohttp", "redis", "structlog", "prometheus_client", "socket", "time", "logging")


def _imports(module: str) -> tuple[set[str], set[str]]:
    """(top-level packages outside gateway, modules of gateway) that `module` imports."""
    path = GATEWAY / f"{module.replace('.', '/')}.py"
    outside: set[str] = set()
    inside: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("gateway."):
                    inside.add(alias.name.removeprefix("gateway."))
                else:
                    outside.add(alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if node.module and node.module.startswith("gateway."):
                    inside.add(node.module.removeprefix("gateway."))
                elif node.module:
                    outside.add(node.module.split(".")[0])
                continue
            base = module.split(".")[: -node.level] if "." in module else []
            target = ".".join([*base, node.module] if node.module else base)
            if target:
                inside.add(target)
            else:  # `from . import x`
                inside.update(alias.name for alias in node.names)
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
