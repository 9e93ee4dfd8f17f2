"""The approvals inbox page (`/inbox`) in headless Chromium, against a stand-in for the gateway's
approvals API.

`FakeApprovalsApi` serves the built page and implements the API's routes (GET /api/approvals,
POST /api/approvals/{id}) in memory, with the answers and error shapes the gateway gives, and keys
like the demo's. The page-driving steps are in inboxpage.py and take a base URL and a key, so the
same steps run against a real gateway (`adk-gateway demo`) by swapping the `inbox_api` fixture.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from playwright.sync_api import expect

from tests.browser.inboxpage import TIMEOUT_MS, InboxPage
from tests.procs import ROOT

pytestmark = [pytest.mark.browser]

STATIC = ROOT / "gateway" / "static"
PAGE = STATIC / "demo" / "inbox.html"
SUPERVISOR_KEY = "demo-supervisor"
KEYS = {SUPERVISOR_KEY: "supervisor", "k-auditor": "auditor"}
UNKNOWN_KEY = "unknown API key"


def refund(approval_id: str, amount: int = 250, *, quorum: int = 1, requester: str = "anonymous") -> dict[str, Any]:
    """A pending approval as the API lists it: a refund the `large_refund` rule gave the supervisors."""
    now = time.time()
    return {
        "id": approval_id, "state": "pending", "agent": "support_agent", "app_name": "support_agent",
        "tool": "issue_refund", "tool_call_id": f"adk-{approval_id}", "chat_id": "chat-1", "requester": requester,
        "args": {"order_id": "1234", "amount": amount, "currency": "USD"}, "rule": "large_refund",
        "hint": "The customer's card is credited when you approve.", "approvers": "supervisors",
        "self_approval": False, "quorum": quorum, "votes": [], "created": now, "deadline": now + 300,
    }


class FakeApprovalsApi:
    """The approvals API's routes over a dict of pending approvals. The test thread changes it
    while the server's thread answers, hence the lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pending: dict[str, dict[str, Any]] = {}
        self.decided: dict[str, dict[str, Any]] = {}
        # The next POST on an id gets this (status, code, message) instead of a vote.
        self.refusals: dict[str, tuple[int, str, str]] = {}
        self.lines: list[str] = []
        self.slow: dict[str, float] = {}  # user -> seconds their lists take

    def add(self, approval: dict[str, Any]) -> None:
        with self.lock:
            self.pending[approval["id"]] = approval

    def decide_elsewhere(self, approval_id: str) -> None:
        with self.lock:
            self.decided[approval_id] = {**self.pending.pop(approval_id), "state": "decided", "outcome": "approved", "source": "approver"}

    def log_text(self) -> str:
        with self.lock:
            return "\n".join(self.lines)

    @staticmethod
    def error(status: int, code: str, message: str, **extra: Any) -> web.Response:
        return web.json_response({"error": {"code": code, "message": message}, **extra}, status=status)

    def caller(self, request: web.Request) -> str | None:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        return KEYS.get(token) if scheme.lower() == "bearer" else None

    async def list(self, request: web.Request) -> web.Response:
        user = self.caller(request)
        if user is None:
            return self.error(401, "unauthorized", UNKNOWN_KEY)
        await asyncio.sleep(self.slow.get(user, 0))
        if request.query.get("state") != "pending":
            return self.error(400, "bad_request", "this stand-in lists pending approvals only")
        # Pages as the gateway does: `limit`, and a cursor (here the offset) while more remain.
        limit, start = int(request.query.get("limit", "100")), int(request.query.get("cursor", "0"))
        with self.lock:
            self.lines.append(f"GET {request.path_qs}")
            ordered = sorted(self.pending.values(), key=lambda a: (a["created"], a["id"]))
            more = start + limit < len(ordered)
            return web.json_response({"approvals": ordered[start:start + limit], "next_cursor": str(start + limit) if more else None})

    async def decide(self, request: web.Request) -> web.Response:
        user = self.caller(request)
        if user is None:
            return self.error(401, "unauthorized", UNKNOWN_KEY)
        body = await request.json()
        if not isinstance(body, dict) or not isinstance(body.get("approved"), bool):
            return self.error(400, "bad_request", "body must be {approved: bool, reason?: str}")
        approval_id = request.match_info["id"]
        with self.lock:
            self.lines.append(f"POST {request.path} {body}")
            if approval_id in self.refusals:
                status, code, message = self.refusals.pop(approval_id)
                extra = {"approval": self.decided.get(approval_id)} if status == 409 else {}
                return self.error(status, code, message, **extra)
            approval = self.pending.get(approval_id)
            if approval is None:
                return self.error(404, "approval_not_found", "no such pending approval")
            approval = {**approval, "votes": [*approval["votes"], {"user": user, "approved": body["approved"]}]}
            yes = sum(vote["approved"] for vote in approval["votes"])
            if not body["approved"] or yes >= approval["quorum"]:
                outcome = "approved" if body["approved"] else "denied"
                approval = {**approval, "state": "decided", "outcome": outcome, "source": "approver", "reason": body.get("reason")}
                del self.pending[approval_id]
                self.decided[approval_id] = approval
            else:
                self.pending[approval_id] = approval
            return web.json_response(approval)

    def app(self) -> web.Application:
        async def inbox(request: web.Request) -> web.FileResponse:
            return web.FileResponse(PAGE)

        async def chat(request: web.Request) -> web.FileResponse:
            return web.FileResponse(STATIC / "demo" / "index.html")

        app = web.Application()
        app.router.add_static("/static/", STATIC)
        app.add_routes([
            web.get("/", chat), web.get("/inbox", inbox),
            web.get("/api/approvals", self.list), web.post("/api/approvals/{id}", self.decide),
        ])
        return app


@contextmanager
def served(app: web.Application) -> Iterator[str]:
    """`app` on a free loopback port, in a thread of its own (Playwright's sync API holds this
    thread's event loop); yields its base URL."""
    loop = asyncio.new_event_loop()
    # A list the stand-in slows down (FakeApprovalsApi.slow) need not finish at teardown: cut it short.
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    ready = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, name="fake-approvals-api", daemon=True)
    thread.start()
    assert ready.wait(10), "the stand-in API did not start"
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.fixture
def inbox_api() -> Iterator[tuple[FakeApprovalsApi, str]]:
    if not PAGE.is_file():
        raise AssertionError(f"{PAGE.relative_to(ROOT)} is not built: run `make gateway/static/demo/app.js`")
    api = FakeApprovalsApi()
    with served(api.app()) as base:
        yield api, base


@pytest.fixture
def inbox(browser: Any, inbox_api: tuple[FakeApprovalsApi, str], artifact: Path) -> Iterator[InboxPage]:
    api, base = inbox_api
    context = browser.new_context(viewport={"width": 1000, "height": 760}, locale="en-US")
    try:
        page = InboxPage(context, base, artifact, api.log_text)
        yield page
        page.screenshot()
    finally:
        context.close()


def test_the_supervisor_signs_in_sees_the_refund_and_approves_it(inbox: InboxPage, inbox_api: tuple[FakeApprovalsApi, str]) -> None:
    api, _ = inbox_api
    api.add(refund("gw-1"))
    inbox.open()
    inbox.expect("the demo key explained", lambda: expect(inbox.page.locator("#signin")).to_contain_text(
        "In the demo, the supervisor's key is demo-supervisor"))
    inbox.sign_in(SUPERVISOR_KEY)
    inbox.signed_in()
    inbox.sees(
        "gw-1", "issue_refund", "on support_agent", '"order_id": "1234"', '"amount": 250', '"currency": "USD"',
        "large_refund", "The customer's card is credited when you approve.", "anonymous", "supervisors",
        "0 of 1 approval",
    )
    inbox.expect("a countdown to the deadline", lambda: expect(inbox.item("gw-1").locator(".countdown")).to_have_text(
        re.compile(r"^expires in 4:[0-5][0-9]$")))
    inbox.approve("gw-1")
    inbox.gone("gw-1")
    inbox.decided("gw-1", SUPERVISOR_KEY, {"approved": True})
    assert api.decided["gw-1"]["outcome"] == "approved"
    inbox.expect("the outcome said", lambda: expect(inbox.page.locator("#status")).to_have_text("issue_refund on support_agent: approved."))
    inbox.expect("the empty inbox said", lambda: expect(inbox.page.get_by_text("Nothing waits for you.")).to_be_visible())
    assert inbox.lists and set(inbox.lists) == {f"Bearer {SUPERVISOR_KEY}"}, inbox.lists
    inbox.no_error()
    inbox.clean_console()


def test_deny_with_a_reason(inbox: InboxPage, inbox_api: tuple[FakeApprovalsApi, str]) -> None:
    api, _ = inbox_api
    api.add(refund("gw-1"))
    api.add(refund("gw-2", 120))
    inbox.open()
    inbox.sign_in(SUPERVISOR_KEY)
    inbox.signed_in()
    inbox.sees("gw-2", '"amount": 120')
    inbox.deny("gw-2", "order 1234 was refunded last week")
    inbox.gone("gw-2")
    inbox.decided("gw-2", SUPERVISOR_KEY, {"approved": False, "reason": "order 1234 was refunded last week"})
    assert api.decided["gw-2"]["outcome"] == "denied"
    inbox.sees("gw-1", '"amount": 250')  # the other one still waits
    inbox.no_error()
    inbox.clean_console()


def test_an_approval_with_a_quorum_stays_listed_with_the_vote_counted(inbox: InboxPage, inbox_api: tuple[FakeApprovalsApi, str]) -> None:
    api, _ = inbox_api
    api.add(refund("gw-1", quorum=2))
    inbox.open()
    inbox.sign_in(SUPERVISOR_KEY)
    inbox.signed_in()
    inbox.sees("gw-1", "0 of 2 approvals")
    inbox.approve("gw-1")
    inbox.sees("gw-1", "1 of 2 approvals (supervisor approved)", "Your approval is counted", "expires in 4:")
    inbox.decided("gw-1", SUPERVISOR_KEY, {"approved": True})
    inbox.clean_console()


def test_the_list_follows_the_gateway_every_two_seconds(inbox: InboxPage, inbox_api: tuple[FakeApprovalsApi, str]) -> None:
    """New approvals appear and ones decided elsewhere leave without a click; Refresh asks at once."""
    api, _ = inbox_api
    inbox.open()
    inbox.sign_in(SUPERVISOR_KEY)
    inbox.signed_in()
    inbox.expect("the empty inbox said", lambda: expect(inbox.page.get_by_text("Nothing waits for you.")).to_be_visible())
    api.add(refund("gw-1"))
    inbox.sees("gw-1", "issue_refund")
    api.decide_elsewhere("gw-1")
    inbox.gone("gw-1")
    api.add(refund("gw-2"))
    inbox.refresh()
    inbox.expect("the new one at once", lambda: expect(inbox.item("gw-2")).to_be_visible(timeout=1500))
    inbox.clean_console()


def test_the_list_follows_the_gateways_cursor_past_one_page(inbox: InboxPage, inbox_api: tuple[FakeApprovalsApi, str]) -> None:
    """More approvals than one page (the page asks 100 at a time): every one is shown, in order."""
    api, _ = inbox_api
    for n in range(230):
        api.add({**refund(f"gw-{n:03d}"), "created": refund("x")["created"] + n})
    inbox.open()
    inbox.sign_in(SUPERVISOR_KEY)
    inbox.signed_in()
    inbox.expect("all 230 listed", lambda: expect(inbox.items()).to_have_count(230, timeout=5000))
    inbox.sees("gw-229", "issue_refund")
    assert any("cursor=200" in line for line in api.log_text().splitlines()), api.log_text()[-500:]
    inbox.expect("no note of more", lambda: expect(inbox.page.locator("#more")).to_be_hidden())
    inbox.clean_console()


@pytest.mark.parametrize(
    ("status", "code", "message", "stays"),
    [
        (403, "self_approval", "you asked for this call: another approver must decide it", True),
        (403, "not_an_approver", "you are not an approver of this call", True),
        (409, "already_decided", "this approval was already decided", False),
        (410, "approval_gone", "the chat of this approval is gone", False),
    ],
    ids=["403-self_approval", "403-not_an_approver", "409", "410"],
)
def test_a_refused_decision_shows_the_gateways_message(
    inbox: InboxPage, inbox_api: tuple[FakeApprovalsApi, str], status: int, code: str, message: str, stays: bool
) -> None:
    api, _ = inbox_api
    api.add(refund("gw-1"))
    inbox.open()
    inbox.sign_in(SUPERVISOR_KEY)
    inbox.signed_in()
    if status == 409:
        api.decide_elsewhere("gw-1")  # and the page has not refreshed yet
    api.refusals["gw-1"] = (status, code, message)
    inbox.approve("gw-1")
    inbox.error(message)
    inbox.decided("gw-1", SUPERVISOR_KEY, {"approved": True})
    if stays:
        # A refusal of this approver: the call still waits for someone who may decide it.
        inbox.sees("gw-1", "issue_refund")
        inbox.expect("Approve enabled again", lambda: expect(inbox.item("gw-1").get_by_role("button", name="Approve", exact=True)).to_be_enabled())
        # A refresh later (the page's counter of lists fetched moved on), the message is still there.
        done = inbox.page.evaluate("Number(document.body.dataset.refreshes)")
        inbox.expect("a refresh", lambda: inbox.page.wait_for_function(
            f"Number(document.body.dataset.refreshes) > {done}", timeout=TIMEOUT_MS))
        inbox.error(message)
    else:
        inbox.gone("gw-1")
    inbox.clean_console()


def test_a_wrong_key_shows_the_401_message_and_the_right_one_signs_in(inbox: InboxPage, inbox_api: tuple[FakeApprovalsApi, str]) -> None:
    api, _ = inbox_api
    api.add(refund("gw-1"))
    inbox.open()
    inbox.sign_in("not-the-key")
    inbox.error(UNKNOWN_KEY)
    inbox.signed_out()
    inbox.expect("nothing listed", lambda: expect(inbox.items()).to_have_count(0))
    assert inbox.page.evaluate("sessionStorage.length") == 0
    inbox.sign_in(SUPERVISOR_KEY)
    inbox.signed_in()
    inbox.no_error()
    inbox.sees("gw-1", "issue_refund")
    # The key lives in this tab's sessionStorage: a reload stays signed in.
    inbox.page.reload()
    inbox.signed_in()
    inbox.sees("gw-1", "issue_refund")
    inbox.page.get_by_role("button", name="Sign out").click()
    inbox.signed_out()
    inbox.expect("nothing listed once signed out", lambda: expect(inbox.items()).to_have_count(0))
    inbox.clean_console()


def test_a_list_still_on_its_way_for_the_last_key_does_not_hold_up_the_next(
    inbox: InboxPage, inbox_api: tuple[FakeApprovalsApi, str]
) -> None:
    """Signed out and in again while a list was being fetched: the new key gets its own list."""
    api, _ = inbox_api
    api.add(refund("gw-1"))
    api.slow["auditor"] = 3.0
    inbox.open()
    inbox.sign_in("k-auditor")
    inbox.expect("the first list asked for", lambda: expect(inbox.page.get_by_role("button", name="Sign out")).to_be_visible())
    inbox.page.get_by_role("button", name="Sign out").click()
    inbox.sign_in(SUPERVISOR_KEY)
    inbox.expect("the supervisor's list before the auditor's comes back", lambda: expect(inbox.item("gw-1")).to_be_visible(timeout=2000))
    inbox.clean_console()


def test_the_chat_page_links_to_the_inbox_and_back(inbox: InboxPage) -> None:
    page = inbox.page
    page.goto(f"{inbox.base}/")
    page.get_by_role("link", name="Approvals inbox").click()
    inbox.expect("the inbox", lambda: expect(page).to_have_url(f"{inbox.base}/inbox"))
    inbox.expect("the sign-in box", lambda: expect(page.get_by_label("Approver key")).to_be_visible())
    page.get_by_role("link", name="Back to the chat").click()
    inbox.expect("the chat", lambda: expect(page).to_have_url(f"{inbox.base}/"))
