"""The ADK servers the fault suite's rows share (stack.Upstream), one per agent configuration.

A row starts its own replicas on one (`replicas(tmp_path, on=...)`), kills or restarts whatever it
likes, and the next row's `replicas` resets it (Redis emptied, the ledger cleared, a killed ADK
server or a stopped Redis started again). Package-scoped: the held path's rows of
test_failure_modes.py and test_handover.py share one; under xdist, one per worker that needs it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.ops.stack import Upstream, ops_adk, upstream


@pytest.fixture(scope="package")
def balanced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    """The stock ADK server (sessions in memory, no delay between chunks), its plugin behind the balancer."""
    with upstream(tmp_path_factory.mktemp("ops-balanced")) as up:
        yield up


@pytest.fixture(scope="package")
def on_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    """The same on a SQLite session file (what `make run` gives ADK; a restart keeps the sessions),
    with OPS_ADK_VERSION's ADK when set: the durable approvals' rig."""
    tmp = tmp_path_factory.mktemp("ops-sqlite")
    with upstream(tmp, adk_sessions=tmp / "sessions.db", adk=ops_adk()) as up:
        yield up
