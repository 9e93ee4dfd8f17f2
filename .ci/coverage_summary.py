"""Per-package line and branch coverage from a combined .coverage file (`make coverage`).

coverage.py's own report is per file; the baseline in docs/testing.md is per package (gateway/core,
gateway/chat, ..., the plugin), which is how a restructured test suite is compared against it. Prints
a Markdown table, ready to paste, and the totals.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import coverage

ROOT = Path(__file__).resolve().parents[1]
FIELDS = ("num_statements", "covered_lines", "num_branches", "covered_branches")


def package_of(path: str) -> str:
    """gateway/chat/machine.py -> gateway/chat; gateway/cli.py -> gateway (top-level modules)."""
    parts = Path(path).relative_to(ROOT).parts if Path(path).is_absolute() else Path(path).parts
    if parts[0] == "plugin":
        return "/".join(parts[:2])
    return "/".join(parts[:2]) if len(parts) > 2 else "gateway (top-level modules)"


def percent(covered: int, total: int) -> str:
    return f"{100 * covered / total:.1f}%" if total else "-"


def row(name: str, s: dict[str, int]) -> str:
    return (
        f"| {name} | {s['num_statements']:,} | {s['covered_lines']:,} | {percent(s['covered_lines'], s['num_statements'])} "
        f"| {s['num_branches']:,} | {s['covered_branches']:,} | {percent(s['covered_branches'], s['num_branches'])} |"
    )


def main(data_file: str = ".coverage") -> int:
    cov = coverage.Coverage(data_file=data_file)
    cov.load()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "coverage.json"
        cov.json_report(outfile=str(out))
        report = json.loads(out.read_text())
    packages: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(FIELDS, 0))
    for path, entry in report["files"].items():
        for field in FIELDS:
            packages[package_of(path)][field] += entry["summary"][field]
    print("| package | statements | covered | line % | branches | covered | branch % |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in sorted(packages):
        print(row(name, packages[name]))
    totals = report["totals"]
    print(row("**total**", totals))
    print(
        f"\nlines {totals['covered_lines']:,}/{totals['num_statements']:,} "
        f"({percent(totals['covered_lines'], totals['num_statements'])}), "
        f"branches {totals['covered_branches']:,}/{totals['num_branches']:,} "
        f"({percent(totals['covered_branches'], totals['num_branches'])}), "
        f"combined {totals['percent_covered_display']}%"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
