"""Two people in headless Chromium against what `make run` runs: a customer asks support_agent for a
large refund in the chat page, which the demo's rule hands to the supervisors (four-eyes); the
supervisor signs in to the approvals inbox with the demo's key and approves it; the customer's chat
streams the outcome. Small refunds stay with the chatting user (test_demo_page.py)."""

from __future__ import annotations

import pytest

from tests.browser.demopage import DemoPage
from tests.browser.inboxpage import InboxPage

pytestmark = pytest.mark.browser

SUPERVISOR_KEY = "demo-supervisor"  # what `adk-gateway demo` gives the supervisor (docs/demo.md)


@pytest.mark.parametrize(("decision", "outcome"), [("approve", "output-available"), ("deny", "output-denied")])
def test_the_supervisor_decides_a_large_refund_the_customer_asked_for(
    demo: DemoPage, supervisor: InboxPage, decision: str, outcome: str,
) -> None:
    demo.open("sse")
    demo.choose_agent("support_agent")
    demo.type("refund 250 on order 1234")
    card = demo.tool("issue_refund")
    demo.sees("Waiting for the supervisors (rule large_refund)")
    assert card.get_by_role("button", name="Approve", exact=True).count() == 0, "the customer must not be offered the approval"
    # issue_refund runs on the server: the page's onToolCall (which the AI SDK calls for every call)
    # must leave it alone, not answer it with an error while the supervisors decide.
    demo.state(card, "input-available", "running")
    demo.lacks("no browser tool named", card)

    supervisor.open()
    supervisor.sign_in(SUPERVISOR_KEY)
    supervisor.signed_in()
    [approval_id] = supervisor.items().evaluate_all("items => items.map(i => i.dataset.approvalId)")
    supervisor.sees(approval_id, "issue_refund", '"amount": 250', "large_refund", "anonymous")
    if decision == "approve":
        supervisor.approve(approval_id)
    else:
        supervisor.deny(approval_id, "call the customer first")
    supervisor.gone(approval_id)
    supervisor.no_error()

    demo.state(card, outcome, "done" if decision == "approve" else "denied")
    if decision == "approve":
        demo.sees("Refunded 250 USD on order 1234")
        demo.sees("The supervisors approved this call.", card)
        demo.sees("Approved by supervisor.")
    else:
        demo.sees("The refund of 250 USD on order 1234 was not made")
        demo.sees("Denied by supervisor: call the customer first.")
    demo.idle()
    demo.clean_console()
    supervisor.clean_console()
