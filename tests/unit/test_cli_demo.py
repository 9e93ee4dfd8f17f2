"""`adk-gateway demo` on a daemon-only install says what to install instead of a traceback."""

from __future__ import annotations

import pytest

from gateway import cli
from gateway.config import ConfigError


def test_demo_without_adk_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "_importable", lambda name: name != "google.adk")
    with pytest.raises(ConfigError) as info:
        cli._agent_adk(None)
    assert "needs google.adk" in info.value.problems[0] and "adk-gateway[demo]" in info.value.problems[0]


def test_demo_with_adk_and_the_plugin_runs_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "_importable", lambda name: True)
    assert cli._agent_adk(None) is None


def test_a_missing_parent_package_is_not_importable() -> None:
    assert not cli._importable("surely_not_installed_pkg.sub")
