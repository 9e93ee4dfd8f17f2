"""Shared fixtures: real ADK API servers (demo agent, scripted model) and gateways, one of each per session.

- `gateway`: ADK's native confirmation flow (process_payment declares `require_confirmation`),
  gateway without a tool policy. (The demo's topology, the plugin in ADK's process, is started where
  it is used: tests/integration/conftest.py shares its ADK servers.)

And the hooks that spread the suite over pytest-xdist workers (tests/parallel.py).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.parallel import pytest_collection_modifyitems, pytest_xdist_make_scheduler  # noqa: F401 (hooks)
from tests.procs import GatewayProcess, adk_server, gateway_process


@pytest.fixture(scope="session")
def adk_base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with adk_server(tmp_path_factory.mktemp("adk"), env={"DEMO_NATIVE_CONFIRMATION": "1"}) as base:
        yield base


@pytest.fixture(scope="session")
def gateway(adk_base: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with gateway_process(tmp_path_factory.mktemp("gw"), adk_base) as gw:
        yield gw


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    return tmp_path


if os.environ.get("ADK_GATEWAY_LOOP", "").strip().lower() == "uvloop":
    # `ADK_GATEWAY_LOOP=uvloop pytest tests/unit`: in-process async tests run on uvloop, the loop the
    # gateway picks by default, so both loops can be tested (without it, pytest-asyncio's standard
    # loop). Gateways started as processes read the variable themselves.
    @pytest.fixture(scope="session")
    def event_loop_policy() -> asyncio.AbstractEventLoopPolicy:
        import uvloop

        return uvloop.EventLoopPolicy()
