"""Drives the AG-UI demo page (`/agui`, web/src/agui.js) the way a person does. The page has the
AI SDK page's controls and cards (DemoPage's actions and checks work on it), with AG-UI's own
states in `data-state`; what it records is every AG-UI run the page posted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from playwright.sync_api import BrowserContext, Locator, expect

from tests.browser.demopage import TIMEOUT_MS, DemoPage
from tests.procs import GatewayProcess


class AguiPage(DemoPage):
    def __init__(self, context: BrowserContext, gateway: GatewayProcess, artifact: Path) -> None:
        super().__init__(context, gateway, artifact)
        self.runs: list[dict[str, Any]] = []  # the RunAgentInput of every run the page posted, in order

    def _on_request(self, request: Any) -> None:
        if request.method == "POST" and request.url.endswith("/ag-ui"):
            self.chat_posts.append(request.url)
            self.runs.append(json.loads(request.post_data or "{}"))

    def open(self, transport: str = "sse") -> None:
        """Loads /agui (AG-UI has one transport here: SSE)."""
        self.page.goto(f"{self.gateway.base}/agui")
        self.expect("the AG-UI page to load", lambda: expect(self.page.locator("body[data-status=ready]")).to_be_attached())

    def asks(self, example: str, tool: str, state: str = "waiting-approval", badge: str = "waiting for approval") -> Locator:
        """Clicks an example and waits for its tool's card to reach `state` (by default, an
        interrupt waiting for the person's answer); returns the card."""
        self.example(example)
        card = self.tool(tool)
        self.state(card, state, badge)
        return card

    def thread_id(self) -> str:
        return str(self.page.evaluate("demo.thread.id"))

    def used_agent(self, name: str) -> None:
        """Every run went to agent `name`'s AG-UI route, POST /agents/<name>/ag-ui."""
        paths = [urlsplit(url).path for url in self.chat_posts]
        if not paths or any(path != f"/agents/{name}/ag-ui" for path in paths):
            raise AssertionError(self.report(f"expected every run on {name}'s AG-UI route; runs: {self.chat_posts}"))

    def banner(self, text: str) -> None:
        self.expect(f"the error banner to say {text!r}", lambda: expect(self.page.get_by_role("alert")).to_contain_text(text, timeout=TIMEOUT_MS))
