"""docs/testing.md and `make coverage` stay true to each other and to `make test`.

The coverage baseline is only comparable if `make coverage` runs what `make test` runs and measures
what the doc says it measures: both packages, branches, and the processes the tests start.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def recipe(target: str) -> str:
    """The recipe lines of a Makefile target, joined."""
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    match = re.search(rf"^{target}:[^\n]*\n((?:\t[^\n]*\n)+)", text, re.M)
    assert match, f"Makefile has no `{target}` target"
    return match.group(1)


def pytest_selection(line: str) -> str:
    """What follows `-m pytest` up to the end of that command."""
    match = re.search(r"-m pytest (.*?)(?:;|$)", line, re.M)
    assert match, line
    return match.group(1).strip()


def test_make_coverage_runs_the_selection_of_make_test() -> None:
    coverage = recipe("coverage")
    assert "coverage run -m pytest" in coverage and "coverage combine" in coverage
    assert "ADK_VERSIONS= " in coverage
    assert pytest_selection(coverage) == pytest_selection(recipe("test"))


def test_the_coverage_config_measures_both_packages_their_branches_and_the_child_processes() -> None:
    run = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["coverage"]["run"]
    assert run["branch"] is True and run["parallel"] is True and run["sigterm"] is True
    assert set(run["source"]) == {"gateway", "plugin/adk_gateway_plugin"}
    assert "subprocess" in run["patch"]


def test_docs_testing_names_make_coverage_and_records_a_baseline() -> None:
    doc = (ROOT / "docs" / "testing.md").read_text(encoding="utf-8")
    assert "make coverage" in doc and "make coverage" in (ROOT / "README.md").read_text(encoding="utf-8")
    baseline = doc.split("### Baseline", 1)[1]
    assert re.search(r"commit `[0-9a-f]{7,40}`", baseline), "the baseline names no commit"
    assert re.search(r"\| \*\*total\*\* \|( [\d,]+ \|){2} [\d.]+% \|( [\d,]+ \|){2} [\d.]+% \|", baseline), (
        "the baseline has no total row with line and branch percentages"
    )
