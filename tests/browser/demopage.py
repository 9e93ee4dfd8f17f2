"""Drives the demo page the way a person does, and explains failures with what the page showed.

Every wait goes through `DemoPage.expect`: when it fails, the AssertionError carries the page's
visible text, the browser console's errors, the end of the gateway's log and the path of a
screenshot taken at that moment.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from playwright.sync_api import BrowserContext, Locator, Page, expect

from tests.browser.pagechecks import PageChecks
from tests.procs import GatewayProcess

TIMEOUT_MS = 10_000
TRANSPORT_LABELS = {"sse": "SSE", "ws": "WebSocket"}


class DemoPage(PageChecks):
    def __init__(self, context: BrowserContext, gateway: GatewayProcess, artifact: Path) -> None:
        self.context = context
        self.gateway = gateway
        self.artifact = artifact
        self.page: Page = context.new_page()
        self.console: list[str] = []
        self.page_errors: list[str] = []
        self.chat_posts: list[str] = []
        self.sockets: list[str] = []
        self.page.on("console", self._on_console)
        self.page.on("pageerror", lambda error: self.page_errors.append(str(error)))
        self.page.on("websocket", lambda ws: self.sockets.append(ws.url))
        self.page.on("request", self._on_request)

    def _on_console(self, message: Any) -> None:
        if message.type in ("error", "warning"):
            self.console.append(f"{message.type}: {message.text}")

    def _on_request(self, request: Any) -> None:
        if request.method == "POST" and request.url.endswith("/api/chat"):
            self.chat_posts.append(request.url)

    # ---- actions ---------------------------------------------------------------------------

    def open(self, transport: str = "sse") -> None:
        """Loads the page and picks the transport with the toggle, as a person would."""
        self.page.goto(f"{self.gateway.base}/")
        self.expect("the page to load", lambda: expect(self.page.locator("body[data-status=ready]")).to_be_attached())
        self.choose_transport(transport)

    def choose_transport(self, transport: str) -> None:
        button = self.page.get_by_role("radio", name=TRANSPORT_LABELS[transport])
        button.click()
        self.expect(f"the {transport} transport to be selected", lambda: expect(button).to_have_attribute("aria-checked", "true"))

    def agent_picker(self) -> Locator:
        """The `Agent` selector at the top of the page."""
        return self.page.get_by_role("combobox", name="Agent")

    def choose_agent(self, name: str) -> None:
        """Picks an agent with the selector, as a person would (the page starts a new chat on it)."""
        self.agent_picker().select_option(name)
        self.expect(f"the agent {name} to be selected", lambda: expect(self.page.locator("body")).to_have_attribute("data-agent", name))

    def example(self, text: str) -> None:
        """Clicks one of the page's example buttons (it sends the text at once)."""
        self.page.locator(".examples").get_by_role("button", name=text, exact=True).click()

    def type(self, text: str) -> None:
        box = self.page.get_by_placeholder("Type a message", exact=True)
        box.fill(text)
        box.press("Enter")

    def tool(self, name: str, nth: int = 0) -> Locator:
        return self.page.locator(f".tool[data-tool={name}]").nth(nth)

    # ---- checks ----------------------------------------------------------------------------

    def state(self, card: Locator, state: str, badge: str) -> None:
        """Waits until a tool card is in `state` (the AI SDK part state) and shows `badge`."""
        self.expect(f"the tool card to reach state {state!r}", lambda: expect(card).to_have_attribute("data-state", state, timeout=TIMEOUT_MS))
        self.expect(f"the tool card's badge to read {badge!r}", lambda: expect(card.locator(".badge")).to_have_text(badge))

    def sees(self, text: str, within: Locator | None = None) -> None:
        where = within or self.page.locator(".messages")
        self.expect(f"to see {text!r}", lambda: expect(where).to_contain_text(text, timeout=TIMEOUT_MS))

    def lacks(self, text: str, within: Locator | None = None) -> None:
        """`text` is not on the page now (no waiting: call it after a wait for the state it concerns)."""
        where = within or self.page.locator(".messages")
        if text in where.inner_text():
            raise AssertionError(self.report(f"expected not to see {text!r}"))

    def idle(self) -> None:
        """The chat is ready again: the last response has ended and nothing is being sent."""
        self.expect("the chat to be ready", lambda: expect(self.page.locator("body")).to_have_attribute("data-status", "ready", timeout=TIMEOUT_MS))

    def used_transport(self, transport: str) -> None:
        """Every chat request went over `transport`, none over the other."""
        if transport == "ws":
            ok = bool(self.sockets) and all("/api/chat/ws" in url for url in self.sockets) and not self.chat_posts
        else:
            ok = bool(self.chat_posts) and not self.sockets
        if not ok:
            raise AssertionError(self.report(
                f"expected every request over {transport}; POST /api/chat: {len(self.chat_posts)}, sockets: {self.sockets}"
            ))

    def used_agent(self, name: str) -> None:
        """Every chat request went to agent `name`'s routes: POST /agents/<name>/api/chat, the socket
        /agents/<name>/api/chat/ws (as the page's network requests show)."""
        want = {f"/agents/{name}/api/chat", f"/agents/{name}/api/chat/ws"}
        paths = [urlsplit(url).path for url in self.chat_posts + self.sockets]
        if not paths or any(path not in want for path in paths):
            raise AssertionError(self.report(
                f"expected every chat request on {name}'s routes; POSTs: {self.chat_posts}, sockets: {self.sockets}"
            ))

    def clean_console(self) -> None:
        if self.page_errors or self.console:
            raise AssertionError(self.report("expected no errors in the browser console"))

    def report(self, headline: str, cause: BaseException | None = None) -> str:
        try:
            shot = str(self.screenshot(self.artifact.with_name(self.artifact.stem + "-FAILED.png")))
        except Exception as exc:  # the page may be gone; the text still helps
            shot = f"(no screenshot: {exc})"
        try:
            text = self.page.locator("body").inner_text(timeout=2000)
        except Exception as exc:
            text = f"(page text unavailable: {exc})"
        log = "\n".join(self.gateway.log_text().splitlines()[-15:])
        # Playwright's own message, without its call log: the page text below says more.
        cause_text = f"\n{str(cause).split('Call log:')[0].strip()}" if cause else ""
        return (
            f"{headline}{cause_text}\n"
            f"--- screenshot: {shot}\n"
            f"--- the page showed:\n{text}\n"
            f"--- browser console errors: {self.page_errors + self.console or 'none'}\n"
            f"--- gateway log (last lines):\n{log}"
        )
