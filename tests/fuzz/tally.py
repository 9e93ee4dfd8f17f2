"""The figures a fuzz run reports at its end (printed by conftest.pytest_terminal_summary)."""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field


@dataclass
class Tally:
    started: float = field(default_factory=time.monotonic)
    # Examples executed, by test (hypothesis' generation, replays and shrinks all count).
    cases: collections.Counter[str] = field(default_factory=collections.Counter)
    # Misbehaviours the fault upstream served, by name.
    faults: collections.Counter[str] = field(default_factory=collections.Counter)
    # Pending approvals (set up before the fuzz) that changed state without a valid answer by their
    # owner, or that did not complete when their owner answered them at the end.
    lost: dict[str, int] = field(default_factory=dict)  # by gateway
    approvals_checked: int = 0
    health_checks: int = 0
    # Things worth a look that are not failures (e.g. error answers that are not the JSON shape).
    notes: collections.Counter[str] = field(default_factory=collections.Counter)
    # The slowest cases: (seconds, input).
    slowest: list[tuple[float, str]] = field(default_factory=list)

    @property
    def approvals_lost(self) -> int:
        return sum(self.lost.values())

    @property
    def total_cases(self) -> int:
        return sum(self.cases.values())

    def lines(self) -> list[str]:
        out = [
            f"cases run: {self.total_cases} ({', '.join(f'{k} {v}' for k, v in sorted(self.cases.items()))})",
            f"faults injected: {sum(self.faults.values())} ({', '.join(f'{k} {v}' for k, v in sorted(self.faults.items())) or 'none'})",
            f"approvals lost: {self.approvals_lost} (of {self.approvals_checked} checked)",
            f"health checks passed: {self.health_checks}",
            f"duration: {time.monotonic() - self.started:.1f} s",
        ]
        for seconds, what in self.slowest:
            out.append(f"slow case: {seconds:.2f} s for {what}")
        if self.notes:
            out.append("notes: " + "; ".join(f"{k} x{v}" for k, v in self.notes.most_common()))
        return out


TALLY = Tally()
