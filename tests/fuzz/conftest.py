"""Fixtures of the fuzz suite: one gateway in front of the real ADK stack for every bad-input test,
with victims (pending approvals) set up before the first case; and the figures at the end."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.faults.stack import demo_stack
from tests.fuzz.harness import FUZZ_TOOLS, PROFILE, Fuzz, fuzz_config, setup_victims
from tests.fuzz.tally import TALLY


@pytest.fixture(scope="session")
def fuzz(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzz]:
    # The victims wait as ADK's confirmations (the run ended with each request), so no run is open,
    # silent, for the fuzz run's length.
    with demo_stack(tmp_path_factory.mktemp("fuzz"), tools=FUZZ_TOOLS, extra=fuzz_config()) as stack:
        yield setup_victims(stack.gateway)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not TALLY.total_cases and not TALLY.approvals_checked:
        return
    terminalreporter.section(f"fuzz figures (hypothesis profile {PROFILE})")
    for line in TALLY.lines():
        terminalreporter.write_line(line)
