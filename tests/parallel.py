"""How `make test` spreads the suite over pytest-xdist workers (docs/testing.md, "In parallel"):
which tests run together on one worker, and in which order the workers are handed them.

A test module is the unit: its tests run on one worker, in order, so a fixture it shares between
its tests (an ADK server, a gateway, a redis-server: module, package or session scope) starts once
there. The packages of ONE_WORKER_PACKAGES run whole on one worker. xdist's own `loadgroup` mode
cannot say this here: pytest 9.2 ignores the node-id suffix it groups by (pytest-xdist issue 1386),
so the grouping is a scheduler of ours, chosen for `--dist loadfile` (pyproject's addopts).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

# Run whole on one worker, in collection order: the fuzz suite's last module (test_zz_after_fuzz.py)
# checks the victims that its other modules attacked through one session fixture, and the browser
# tests share one Chromium and one `make run` stack (package fixtures).
ONE_WORKER_PACKAGES = ("tests/fuzz", "tests/browser")
# Handed out first, the longest single units first, so that none starts last and leaves the other
# workers idle at the end; the unit tests' modules (short) come last and fill the gaps.
HEAVY_FIRST = ("tests/fuzz", "tests/browser", "tests/ops", "tests/integration")


def work_unit(nodeid: str) -> str:
    """The unit of work a test belongs to: its package for ONE_WORKER_PACKAGES, else its module."""
    module = nodeid.split("::", 1)[0]
    for package in ONE_WORKER_PACKAGES:
        if module.startswith(package + "/"):
            return package
    return module


def heaviness(nodeid: str) -> int:
    """Where a test's unit goes in the queue: by HEAVY_FIRST, the rest after."""
    for rank, package in enumerate(HEAVY_FIRST):
        if nodeid.startswith(package + "/"):
            return rank
    return len(HEAVY_FIRST)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile` with work_unit's units: xdist's module scheduler, packages kept whole."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return UnitScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # The queue follows the workers' collection order (`--no-loadscope-reorder`); every worker
        # sorts alike (the controller checks that their collections agree), and a stable sort keeps
        # each module's own order. A serial run keeps pytest's order.
        items.sort(key=lambda item: heaviness(item.nodeid))
