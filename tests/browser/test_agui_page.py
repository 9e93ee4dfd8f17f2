"""The AG-UI demo page (`/agui`) in headless Chromium, against what `make run` runs: the stock
`HttpAgent` of @ag-ui/client in a page, the gateway's AG-UI route, the real ADK API server.

What a person sees and does: approvals arrive as interrupts the page shows with Approve / Deny and
answers with `resume`; browser tools run in the page when a run hands them over; the supervisors'
decision on a large refund shows as the run's activity while the run stays open; a refusal of the
gateway (RUN_ERROR) shows in the error banner. The requests are checked too: each run went to the
agent's own AG-UI route, and an answer went as `resume` on the same thread.
"""

from __future__ import annotations

import json
import urllib.request
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Route, expect

from tests.browser.aguipage import AguiPage
from tests.procs import GatewayProcess

pytestmark = [pytest.mark.browser, pytest.mark.integration]

TOKYO = {"latitude": 35.6812, "longitude": 139.7671, "accuracy": 20}
SUPERVISOR_KEY = "demo-supervisor"  # what `adk-gateway demo` gives the supervisor (docs/demo.md)


def test_the_ai_sdk_page_links_here_and_a_plain_reply_streams(agui: AguiPage) -> None:
    page = agui.page
    page.goto(f"{agui.gateway.base}/")
    page.get_by_role("link", name="Try the AG-UI page").click()
    agui.expect("the AG-UI page to load", lambda: expect(page.locator("body[data-status=ready]")).to_be_attached())
    agui.expect("the AG-UI route shown", lambda: expect(page.locator("#endpoint")).to_contain_text("POST /agents/demo_agent/ag-ui"))
    agui.example("hello there")
    agui.sees('You said: "hello there"')
    agui.idle()
    agui.used_agent("demo_agent")
    [run] = agui.runs
    assert run["threadId"] == agui.thread_id() and run["messages"][-1]["content"] == "hello there"
    # The page declares the agent's browser tools and no others (the gateway refuses any others).
    assert sorted(tool["name"] for tool in run["tools"]) == ["change_bgm", "get_location"]
    agui.clean_console()


def test_switching_agent_starts_a_new_thread_on_its_route(agui: AguiPage) -> None:
    agui.open()
    page, first = agui.page, agui.thread_id()
    agui.example("hello there")
    agui.sees('You said: "hello there"')
    agui.idle()
    agui.choose_agent("support_agent")
    agui.expect("a new, empty thread", lambda: expect(page.locator("#message-list")).to_be_empty())
    agui.expect("support_agent's route shown", lambda: expect(page.locator("#endpoint")).to_contain_text("/agents/support_agent/ag-ui"))
    agui.expect("support_agent's examples", lambda: expect(page.locator(".examples .example:visible")).to_have_text(
        ["refund 20 on order 1234", "refund 250 on order 1234", "hello there"]))
    assert agui.thread_id() != first
    agui.example("hello there")
    agui.sees('You said: "hello there"')
    agui.idle()
    assert [urlsplit(url).path for url in agui.chat_posts] == ["/agents/demo_agent/ag-ui", "/agents/support_agent/ag-ui"]
    assert agui.runs[1]["threadId"] == agui.thread_id() and len(agui.runs[1]["messages"]) == 1
    assert agui.runs[1]["tools"] == []  # support_agent hands no tool to the browser
    agui.clean_console()


def test_approve_a_payment(agui: AguiPage) -> None:
    agui.open()
    card = agui.asks("pay 50 to Hanako", "process_payment")
    agui.sees('"recipient": "Hanako"', card)
    agui.sees("Money leaves the account when you approve.", card)  # the policy's hint, the interrupt's message
    agui.idle()
    agui.sees("Approve or Deny the call above", agui.page.locator("#status"))
    card.get_by_role("button", name="Approve", exact=True).click()
    agui.state(card, "done", "done")
    agui.sees('"transaction_id"', card)
    agui.sees("You approved this call.", card)
    agui.sees("Done: sent 50 USD to Hanako")
    agui.expect("the buttons to be gone", lambda: expect(card.get_by_role("button")).to_have_count(0))
    agui.idle()
    first, resumed = agui.runs
    [entry] = resumed["resume"]
    assert resumed["threadId"] == first["threadId"] == agui.thread_id()
    assert entry["status"] == "resolved" and entry["payload"] == {"approved": True}
    assert entry["interruptId"].endswith(":" + str(card.get_attribute("data-tool-call-id")))
    agui.used_agent("demo_agent")
    agui.clean_console()


def test_deny_a_payment(agui: AguiPage) -> None:
    agui.open()
    card = agui.asks("pay 50 to Hanako", "process_payment")
    card.get_by_role("button", name="Deny", exact=True).click()
    agui.state(card, "denied", "denied")
    agui.sees("You denied this call: the tool did not run.", card)
    agui.sees("The payment of 50 USD to Hanako was not made")
    agui.idle()
    agui.lacks("Done: sent")
    agui.lacks('"transaction_id"')
    assert agui.runs[-1]["resume"][0]["payload"] == {"approved": False}
    agui.clean_console()


def test_two_payments_are_resumed_together(agui: AguiPage) -> None:
    agui.open()
    agui.example("pay 10 to Alice and 20 to Bob")
    alice, bob = agui.tool("process_payment", 0), agui.tool("process_payment", 1)
    agui.state(alice, "waiting-approval", "waiting for approval")
    agui.state(bob, "waiting-approval", "waiting for approval")
    agui.idle()
    agui.sees("Approve or Deny the 2 calls", agui.page.locator("#status"))
    alice.get_by_role("button", name="Approve", exact=True).click()
    # Nothing is sent until every interrupt has an answer: the client refuses a partial resume.
    agui.state(alice, "answered", "answered, sending")
    agui.expect("Bob's buttons to stay", lambda: expect(bob.get_by_role("button", name="Deny")).to_be_visible())
    assert len(agui.runs) == 1
    bob.get_by_role("button", name="Deny", exact=True).click()
    agui.state(alice, "done", "done")
    agui.state(bob, "denied", "denied")
    agui.sees("Done: sent 10 USD to Alice")
    agui.sees("The payment of 20 USD to Bob was not made")
    agui.idle()
    assert sorted(entry["payload"]["approved"] for entry in agui.runs[1]["resume"]) == [False, True]
    agui.clean_console()


def test_where_am_i_asks_the_browser_after_approval(agui: AguiPage) -> None:
    agui.context.grant_permissions(["geolocation"], origin=agui.gateway.base)
    agui.context.set_geolocation(TOKYO)
    agui.open()
    card = agui.asks("where am I", "get_location")
    agui.sees("runs in your browser", card)
    card.get_by_role("button", name="Approve", exact=True).click()
    agui.state(card, "done", "done")
    agui.sees('"latitude": 35.6812', card)
    agui.sees("You are at latitude 35.6812, longitude 139.7671.")
    agui.idle()
    # The approval resumed the run, which handed the call over; the page answered it with a tool message.
    _, resumed, answered = agui.runs
    [tool] = [m for m in answered["messages"] if m["role"] == "tool"]
    assert "resume" in resumed and "resume" not in answered
    assert json.loads(tool["content"])["latitude"] == 35.6812 and tool["toolCallId"] == card.get_attribute("data-tool-call-id")
    agui.clean_console()


def test_play_track_2_runs_in_the_browser(agui: AguiPage) -> None:
    agui.open()
    card = agui.asks("play track 2", "change_bgm", "done", "done")
    agui.sees('"track": 2', card)
    agui.sees("Now playing track 2.")
    agui.expect("the now-playing note", lambda: expect(agui.page.locator("#now-playing")).to_have_text("♪ Track 2"))
    agui.idle()
    agui.clean_console()


def _decide(gateway: GatewayProcess, chat_id: str, approved: bool) -> None:
    """The supervisor decides the chat's one pending approval through /api/approvals."""
    auth = {"authorization": f"Bearer {SUPERVISOR_KEY}", "content-type": "application/json"}
    with urllib.request.urlopen(urllib.request.Request(f"{gateway.base}/api/approvals", headers=auth), timeout=10) as response:
        [approval] = [a for a in json.load(response)["approvals"] if a["chat_id"] == chat_id]
    body = json.dumps({"approved": approved}).encode()
    request = urllib.request.Request(f"{gateway.base}/api/approvals/{approval['id']}", data=body, headers=auth, method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


def test_the_supervisors_decide_a_large_refund_while_the_run_waits(agui: AguiPage) -> None:
    agui.open()
    agui.choose_agent("support_agent")
    card = agui.asks("refund 250 on order 1234", "issue_refund", "waiting-approvers", "waiting for the approvers")
    agui.sees("Waiting for the supervisors (rule large_refund)", card)
    assert card.get_by_role("button").count() == 0, "the customer must not be offered the approval"
    agui.expect("the run to stay open", lambda: expect(agui.page.locator("body")).to_have_attribute("data-status", "running"))
    _decide(agui.gateway, agui.thread_id(), approved=True)
    agui.state(card, "done", "done")
    agui.sees("Approved by supervisor.", card)
    agui.sees("Refunded 250 USD on order 1234")
    agui.idle()
    assert len(agui.runs) == 1  # one run, held open until the supervisors decided
    agui.used_agent("support_agent")
    agui.clean_console()


def test_a_refusal_shows_in_the_banner_and_a_new_message_goes_on(agui: AguiPage) -> None:
    """An answer naming an approval the gateway does not hold (here the page's resume is altered on
    the wire) is refused with RUN_ERROR approval_gone; the page shows it, and a new message cancels
    the real interrupt and goes on."""
    def tamper(route: Route) -> None:
        body = json.loads(route.request.post_data or "{}")
        for entry in body.get("resume") or []:
            entry["interruptId"] = "gw-unknown:" + entry["interruptId"].split(":", 1)[1]
        route.continue_(post_data=json.dumps(body))

    agui.open()
    card = agui.asks("pay 50 to Hanako", "process_payment")
    agui.page.route("**/ag-ui", tamper)
    card.get_by_role("button", name="Approve", exact=True).click()
    agui.banner("this approval is no longer pending")
    agui.banner("(approval_gone)")
    agui.idle()
    agui.page.unroute("**/ag-ui")
    agui.lacks("Done: sent")
    agui.type("hello there")
    agui.sees('You said: "hello there"')
    agui.expect("the banner to go", lambda: expect(agui.page.get_by_role("alert")).to_be_hidden())
    agui.state(card, "cancelled", "cancelled")
    agui.idle()
    assert agui.runs[-1]["resume"][0]["status"] == "cancelled"
    agui.clean_console()


def test_a_rule_decides_a_small_payment_without_an_interrupt(agui: AguiPage) -> None:
    agui.open()
    card = agui.asks("pay 3 to Bob", "process_payment", "done", "done")
    agui.sees("A rule of the gateway approved a call automatically.")  # the run's CUSTOM adk_gateway.approval
    agui.sees("Done: sent 3 USD to Bob")
    agui.idle()
    assert len(agui.runs) == 1 and card.get_by_role("button").count() == 0
    agui.clean_console()


def test_a_failed_run_shows_in_the_banner(agui: AguiPage) -> None:
    agui.open()
    agui.type("trigger error")
    banner = agui.page.get_by_role("alert")
    agui.banner("DEMO_ERROR")
    agui.banner("(agent_error)")  # RUN_ERROR's code
    banner.get_by_role("button", name="Dismiss").click()
    agui.expect("the banner to go", lambda: expect(banner).to_be_hidden())
    agui.example("hello there")
    agui.sees('You said: "hello there"')
    agui.idle()
    agui.clean_console()


def test_a_server_call_left_without_a_result_is_not_answered_by_the_page(agui: AguiPage) -> None:
    """A run that ends `success` without `pendingToolCallIds` makes the client count every call it
    saw no result for as pending. The page runs only the agent's browser tools: a server call (here
    issue_refund, in a run the test answers itself) gets no tool message from it, and no new run."""
    def finished_early(route: Route) -> None:
        run = json.loads(route.request.post_data or "{}")
        ids = {"threadId": run["threadId"], "runId": run["runId"]}
        call = {"toolCallId": "call-1"}
        events = [
            {"type": "RUN_STARTED", **ids},
            {"type": "TOOL_CALL_START", **call, "toolCallName": "issue_refund"},
            {"type": "TOOL_CALL_ARGS", **call, "delta": '{"order_id": "1234", "amount": 250}'},
            {"type": "TOOL_CALL_END", **call},
            {"type": "RUN_FINISHED", **ids, "outcome": {"type": "success"}},
        ]
        body = "".join(f"data: {json.dumps(event)}\n\n" for event in events)
        route.fulfill(status=200, headers={"content-type": "text/event-stream"}, body=body)

    agui.page.route("**/ag-ui", finished_early)
    agui.open()
    agui.choose_agent("support_agent")
    card = agui.asks("refund 250 on order 1234", "issue_refund", "open", "no result")
    agui.idle()
    agui.page.wait_for_timeout(500)  # a second run would be on its way by now
    assert len(agui.runs) == 1, agui.runs
    agui.lacks("no browser tool named", card)
    agui.clean_console()
