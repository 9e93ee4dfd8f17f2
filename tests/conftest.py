"""Shared fixtures: one real ADK API server (demo agent, scripted model) and one gateway per session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.procs import GatewayProcess, adk_server, gateway_process


@pytest.fixture(scope="session")
def adk_base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with adk_server(tmp_path_factory.mktemp("adk")) as base:
        yield base


@pytest.fixture(scope="session")
def gateway(adk_base: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with gateway_process(tmp_path_factory.mktemp("gw"), adk_base) as gw:
        yield gw


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    return tmp_path
