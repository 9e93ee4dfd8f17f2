"""The event loop the gateway runs on: uvloop by default where installed, the standard loop when asked."""

from __future__ import annotations

import asyncio
import importlib.util
import os

import pytest

from gateway.config.sections import ListenConfig
from gateway.edge import event_loop

HAVE_UVLOOP = importlib.util.find_spec("uvloop") is not None


def test_default_is_uvloop_where_installed() -> None:
    assert ListenConfig().event_loop == "auto"
    assert event_loop.choose("auto", {}) == ("uvloop" if HAVE_UVLOOP else "asyncio")


def test_the_standard_loop_when_the_file_or_the_environment_asks() -> None:
    assert event_loop.choose("asyncio", {}) == "asyncio"
    assert event_loop.choose("auto", {"ADK_GATEWAY_LOOP": "asyncio"}) == "asyncio"
    assert event_loop.choose("uvloop", {"ADK_GATEWAY_LOOP": " AsyncIO "}) == "asyncio"  # the environment wins


def test_an_unknown_value_is_refused() -> None:
    with pytest.raises(ValueError, match="ADK_GATEWAY_LOOP 'tokio'"):
        event_loop.choose("auto", {"ADK_GATEWAY_LOOP": "tokio"})


def test_uvloop_asked_for_and_missing_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "uvloop" else real(name, *a))
    assert event_loop.choose("auto", {}) == "asyncio"  # auto falls back
    with pytest.raises(ValueError, match="listen.event_loop uvloop: uvloop is not installed"):
        event_loop.choose("uvloop", {})


@pytest.mark.parametrize("name", ["asyncio", "uvloop"])
def test_run_runs_on_the_chosen_loop(name: str) -> None:
    if name == "uvloop" and not HAVE_UVLOOP:
        pytest.skip("uvloop is not installed")

    async def which() -> str:
        return type(asyncio.get_running_loop()).__module__

    module = event_loop.run(which(), name)
    assert module.startswith("uvloop") == (name == "uvloop")


async def test_in_process_tests_run_on_the_loop_the_environment_names() -> None:
    # tests/conftest.py: `ADK_GATEWAY_LOOP=uvloop pytest ...` runs these on uvloop, else the standard loop.
    on_uvloop = type(asyncio.get_running_loop()).__module__.startswith("uvloop")
    assert on_uvloop == (os.environ.get("ADK_GATEWAY_LOOP", "").strip().lower() == "uvloop")
