"""Drives the approvals inbox page (`/inbox`) the way an approver does, against any base URL: the
gateway of `adk-gateway demo`, or a stand-in for its approvals API.

Every wait goes through `InboxPage.expect`: when it fails, the AssertionError carries the page's
visible text, the browser console's errors, the decisions the page sent and a screenshot's path.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from playwright.sync_api import BrowserContext, Locator, Page, expect

from tests.browser.pagechecks import PageChecks

TIMEOUT_MS = 10_000
LOADED = re.compile(r"^[1-9][0-9]*$")  # body[data-refreshes]: lists fetched so far


@dataclass(frozen=True)
class Decision:
    """A POST /api/approvals/{id} the page sent, as the browser sent it."""

    approval_id: str
    authorization: str | None
    body: Any


class InboxPage(PageChecks):
    def __init__(self, context: BrowserContext, base: str, artifact: Path, log: Callable[[], str] = lambda: "") -> None:
        """`base`: where the page and the API are (`http://127.0.0.1:PORT`); `log`: the server's log
        text, for failure reports."""
        self.base = base.rstrip("/")
        self.artifact = artifact
        self.log = log
        self.page: Page = context.new_page()
        self.console: list[str] = []
        self.page_errors: list[str] = []
        self.decisions: list[Decision] = []
        self.lists: list[str | None] = []  # the Authorization of each GET /api/approvals
        self.page.on("console", self._on_console)
        self.page.on("pageerror", lambda error: self.page_errors.append(str(error)))
        self.page.on("request", self._on_request)

    def _on_console(self, message: Any) -> None:
        # The browser reports every 4xx answer as a failed resource; those are the page's to show.
        if message.type in ("error", "warning") and not message.text.startswith("Failed to load resource"):
            self.console.append(f"{message.type}: {message.text}")

    def _on_request(self, request: Any) -> None:
        path = urlsplit(request.url).path
        if not path.startswith("/api/approvals"):
            return
        if request.method == "POST":
            body = request.post_data
            self.decisions.append(Decision(
                path.rsplit("/", 1)[-1], request.headers.get("authorization"), json.loads(body) if body else None,
            ))
        elif request.method == "GET":
            self.lists.append(request.headers.get("authorization"))

    # ---- actions ---------------------------------------------------------------------------

    def open(self) -> None:
        self.page.goto(f"{self.base}/inbox")
        self.expect("the inbox page to load", lambda: expect(self.page.locator("body[data-signed-in]")).to_be_attached())

    def sign_in(self, key: str) -> None:
        """Types the key into the sign-in box and submits it (whether the gateway takes it is the caller's check)."""
        self.page.get_by_label("Approver key").fill(key)
        self.page.get_by_role("button", name="Sign in").click()

    def signed_in(self) -> None:
        """Signed in, and at least one list of approvals has come back."""
        body = self.page.locator("body")
        self.expect("to be signed in", lambda: expect(body).to_have_attribute("data-signed-in", "true", timeout=TIMEOUT_MS))
        self.expect("the list to load", lambda: expect(body).to_have_attribute("data-refreshes", LOADED, timeout=TIMEOUT_MS))

    def signed_out(self) -> None:
        self.expect("the sign-in box", lambda: expect(self.page.get_by_label("Approver key")).to_be_visible(timeout=TIMEOUT_MS))
        self.expect("to be signed out", lambda: expect(self.page.locator("body")).to_have_attribute("data-signed-in", "false"))

    def refresh(self) -> None:
        self.page.get_by_role("button", name="Refresh").click()

    def item(self, approval_id: str) -> Locator:
        """The card of one pending approval."""
        return self.page.locator(f'.inbox-item[data-approval-id="{approval_id}"]')

    def items(self) -> Locator:
        return self.page.locator(".inbox-item")

    def approve(self, approval_id: str) -> None:
        self.item(approval_id).get_by_role("button", name="Approve", exact=True).click()

    def deny(self, approval_id: str, reason: str = "") -> None:
        """Deny, then the optional reason, then the second Deny that sends it."""
        card = self.item(approval_id)
        card.get_by_role("button", name="Deny").click()
        card.get_by_label("Reason for denying").fill(reason)
        card.locator(".deny-form").get_by_role("button", name="Deny").click()

    # ---- checks ----------------------------------------------------------------------------

    def sees(self, approval_id: str, *texts: str) -> None:
        """The approval's card is listed and shows every one of `texts`."""
        card = self.item(approval_id)
        self.expect(f"the approval {approval_id} listed", lambda: expect(card).to_be_visible(timeout=TIMEOUT_MS))
        for text in texts:
            self.expect(f"{approval_id}'s card to show {text!r}", lambda t=text: expect(card).to_contain_text(t, timeout=TIMEOUT_MS))

    def gone(self, approval_id: str) -> None:
        self.expect(f"the approval {approval_id} to leave the list", lambda: expect(self.item(approval_id)).to_have_count(0, timeout=TIMEOUT_MS))

    def error(self, message: str) -> None:
        """The page's error banner shows `message` (the API's `error.message`)."""
        self.expect(f"the error {message!r}", lambda: expect(self.page.get_by_role("alert")).to_contain_text(message, timeout=TIMEOUT_MS))

    def no_error(self) -> None:
        self.expect("no error banner", lambda: expect(self.page.get_by_role("alert")).to_be_hidden())

    def decided(self, approval_id: str, key: str, body: dict[str, Any]) -> None:
        """The page sent exactly one decision on `approval_id`: with the key as a bearer, and `body`."""
        sent = [d for d in self.decisions if d.approval_id == approval_id]
        if sent != [Decision(approval_id, f"Bearer {key}", body)]:
            raise AssertionError(self.report(f"expected one POST on {approval_id} with {body}; sent: {sent}"))

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
        log = "\n".join(self.log().splitlines()[-15:])
        cause_text = f"\n{str(cause).split('Call log:')[0].strip()}" if cause else ""
        return (
            f"{headline}{cause_text}\n"
            f"--- screenshot: {shot}\n"
            f"--- the page showed:\n{text}\n"
            f"--- decisions sent: {self.decisions}\n"
            f"--- browser console errors: {self.page_errors + self.console or 'none'}\n"
            f"--- server log (last lines):\n{log}"
        )

