"""Headless Chromium (Debian's `chromium`, driven by Playwright for Python) against the demo pages.

One real stack for the whole suite, started as `make run` starts it (`adk-gateway demo` with the
reference config/gateway.yaml: the stock ADK API server with the gateway plugin serving demo_agent and
support_agent, and a gateway serving both and the demo page), one browser; each test gets a fresh
browser context (own permissions, own geolocation) and so a fresh chat. Every test saves a screenshot
to artifacts/browser/<test>.png. Playwright never downloads a browser here: it launches the system
Chromium by path.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import sync_playwright  # the `test` extra: pip install -e '.[test]'

from tests.browser.aguipage import AguiPage
from tests.browser.demopage import DemoPage
from tests.browser.inboxpage import InboxPage
from tests.procs import ROOT, GatewayProcess, make_run

ARTIFACTS = ROOT / "artifacts" / "browser"
BUNDLE = ROOT / "gateway" / "static" / "demo" / "app.js"
AGUI_BUNDLE = BUNDLE.with_name("agui.js")  # built with app.js; a bundle from before the AG-UI page lacks it
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def chromium_path() -> str:
    path = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        raise AssertionError("no chromium on PATH: `make test` installs it (apt-get install -y chromium)")
    return path


# Package scope, not session: Playwright's sync API keeps an event loop running while it is open,
# which would break every asyncio test collected after this package.
@pytest.fixture(scope="package")
def demo_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """What `make run` runs: `adk-gateway demo` with config/gateway.yaml (both agents, the page on),
    no other origin allowed (test_quickstart_origins.py's stock gateway too)."""
    if not BUNDLE.is_file():
        raise AssertionError(f"{BUNDLE.relative_to(ROOT)} is not built: run `make {BUNDLE.relative_to(ROOT)}`")
    # Debug lines, so that a failure's report shows what the gateway did.
    with make_run(tmp_path_factory.mktemp("browser"), {"LOG_LEVEL": "debug"}, unset=("GATEWAY_ALLOWED_ORIGINS",)) as gateway:
        yield gateway


@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def artifact(request: pytest.FixtureRequest) -> Path:
    """Where this test's screenshot goes: artifacts/browser/<test name>.png."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS / (re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name).strip("_") + ".png")


@contextlib.contextmanager
def _fresh_page(browser: Any, driver: type[DemoPage], gateway: GatewayProcess, artifact: Path) -> Iterator[Any]:
    """A page driver in a fresh browser context (so a fresh chat); its screenshot is saved whether
    the test passed or not."""
    context = browser.new_context(viewport={"width": 1000, "height": 760}, locale="en-US")
    try:
        page = driver(context, gateway, artifact)
        yield page
        page.screenshot()
    finally:
        context.close()


@pytest.fixture
def demo(browser: Any, demo_gateway: GatewayProcess, artifact: Path) -> Iterator[DemoPage]:
    """The AI SDK demo page's driver (`/`)."""
    with _fresh_page(browser, DemoPage, demo_gateway, artifact) as page:
        yield page


@pytest.fixture
def agui(browser: Any, demo_gateway: GatewayProcess, artifact: Path) -> Iterator[AguiPage]:
    """The AG-UI demo page's driver (`/agui`)."""
    if not AGUI_BUNDLE.is_file():
        raise AssertionError(f"{AGUI_BUNDLE.relative_to(ROOT)} is not built: run `cd web && npm ci && node build.mjs`")
    with _fresh_page(browser, AguiPage, demo_gateway, artifact) as page:
        yield page


@pytest.fixture
def supervisor(browser: Any, demo_gateway: GatewayProcess, artifact: Path) -> Iterator[InboxPage]:
    """The approvals inbox in its own browser context (another person); its screenshot is saved beside the chat's."""
    context = browser.new_context(viewport={"width": 1000, "height": 760}, locale="en-US")
    try:
        page = InboxPage(context, demo_gateway.base, artifact.with_name(artifact.stem + "-inbox.png"), demo_gateway.log_text)
        yield page
        page.screenshot()
    finally:
        context.close()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "browser: drives the demo page in headless Chromium (Playwright)")
