"""What every page driver of the browser tests shares: its screenshot, and a check that fails with
the driver's own report (what the page showed, the console, the server's log)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from playwright.sync_api import Page


class PageChecks:
    page: Page
    artifact: Path

    def report(self, headline: str, cause: BaseException | None = None) -> str:
        raise NotImplementedError

    def screenshot(self, path: Path | None = None) -> Path:
        path = path or self.artifact
        path.parent.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def expect(self, what: str, check: Callable[[], Any]) -> None:
        try:
            check()
        except AssertionError as exc:
            raise AssertionError(self.report(f"expected {what}", exc)) from None
