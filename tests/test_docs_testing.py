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


def pytest_selections(text: str) -> list[str]:
    """What follows each `-m pytest` up to the end of that command, in order."""
    found = [m.strip() for m in re.findall(r"-m pytest (.*?)(?:;|$)", text, re.M)]
    assert found, text
    return found


def test_make_coverage_runs_the_selections_of_make_test() -> None:
    coverage, test = recipe("coverage"), recipe("test")
    # Each of make test's runs (PYTEST_ARGS's, or the parallel one then tests/ops alone), under coverage.
    assert pytest_selections(coverage) == pytest_selections(test)
    assert coverage.count("coverage run -m pytest") == test.count("-m pytest") == 3
    assert "coverage combine" in coverage.split("fi;", 1)[1], "one report of every run, after the last"
    assert coverage.count("ADK_VERSIONS= ") == test.count("ADK_VERSIONS= ")


def test_the_selections_are_read_from_each_run() -> None:
    two_runs = "\t\tX= p -m pytest -n 4 --ignore=tests/ops; a=$$?; \\\n\t\tX= p -m pytest -n 0 tests/ops; b=$$?; \\\n"
    assert pytest_selections(two_runs) == ["-n 4 --ignore=tests/ops", "-n 0 tests/ops"]


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
