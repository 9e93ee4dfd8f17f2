"""Standing grants from the pages, in headless Chromium against what `make run` runs: the chat
page's "Approve and allow for this chat" approves the call and lets the next payment of the same
chat run without asking; the inbox's "Approve and allow for 1 hour" approves a large refund and
lets the customer's next one run without the supervisors (docs/approvals.md "Standing grants")."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.browser.demopage import DemoPage
from tests.browser.inboxpage import InboxPage
from tests.browser.test_four_eyes import SUPERVISOR_KEY
from tests.procs import GatewayProcess, request

pytestmark = pytest.mark.browser

SUPERVISOR = {"Authorization": f"Bearer {SUPERVISOR_KEY}"}


@pytest.fixture
def revoked(demo_gateway: GatewayProcess) -> Iterator[None]:
    """The gateway is the package's: what a test granted must not decide another test's calls."""
    yield
    for headers in (SUPERVISOR, {}):
        for grant in request(demo_gateway.base, "GET", "/api/grants", headers=headers).json()["grants"]:
            request(demo_gateway.base, "DELETE", f"/api/grants/{grant['id']}", headers=headers)


def test_approve_and_allow_for_this_chat(demo: DemoPage, revoked: None) -> None:
    demo.open("sse")
    demo.example("pay 50 to Hanako")
    card = demo.tool("process_payment")
    demo.state(card, "approval-requested", "waiting for approval")
    card.get_by_role("button", name="Approve and allow for this chat", exact=True).click()
    demo.state(card, "output-available", "done")
    demo.sees("Done: sent 50 USD to Hanako")
    demo.idle()
    demo.type("pay 20 to Alice")
    second = demo.tool("process_payment", 1)
    demo.state(second, "output-available", "done")
    demo.sees("approved this call automatically", second)
    demo.sees("grant:gr-", second)
    demo.idle()
    demo.clean_console()


def test_approve_and_allow_for_1_hour_in_the_inbox(demo: DemoPage, supervisor: InboxPage, revoked: None) -> None:
    demo.open("sse")
    demo.choose_agent("support_agent")
    demo.type("refund 250 on order 1234")
    card = demo.tool("issue_refund")
    demo.sees("Waiting for the supervisors (rule large_refund)")
    supervisor.open()
    supervisor.sign_in(SUPERVISOR_KEY)
    supervisor.signed_in()
    [approval_id] = supervisor.items().evaluate_all("items => items.map(i => i.dataset.approvalId)")
    supervisor.item(approval_id).get_by_role("button", name="Approve and allow for 1 hour", exact=True).click()
    supervisor.gone(approval_id)
    supervisor.no_error()
    demo.state(card, "output-available", "done")
    demo.sees("Refunded 250 USD on order 1234")
    demo.idle()
    # The next large refund of this customer is the grant's: nobody is asked.
    demo.type("refund 300 on order 1234")
    second = demo.tool("issue_refund", 1)
    demo.state(second, "output-available", "done")
    demo.sees("approved this call automatically", second)
    demo.sees("Refunded 300 USD on order 1234")
    demo.idle()
    demo.clean_console()
    supervisor.clean_console()
