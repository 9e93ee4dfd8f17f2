"""The demo page in headless Chromium, against the real stack (ADK API server + plugin + gateway).

Each scenario of the demo script runs over both transports, chosen with the page's own toggle, and
checks what a person sees: the tool card with its input and state, the Approve / Deny buttons, the
agent's words, and that the requests really went over the chosen transport. The support agent's
refunds run on that agent, picked with the page's agent selector, and their requests are checked to
go to its own routes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.browser.demopage import DemoPage

pytestmark = [pytest.mark.browser, pytest.mark.integration]

TRANSPORTS = ["sse", "ws"]
DEMO_EXAMPLES = ("pay 50 to Hanako", "pay 10 to Alice and 20 to Bob", "where am I", "play track 2", "weather in Tokyo")
SUPPORT_EXAMPLES = ("refund 20 on order 1234", "where is order 1234")
TOKYO = {"latitude": 35.6812, "longitude": 139.7671, "accuracy": 20}


def test_first_view(demo: DemoPage) -> None:
    demo.open()
    page = demo.page
    demo.expect("the message box", lambda: expect(page.get_by_placeholder("Type a message", exact=True)).to_be_visible())
    for example in ("pay 50 to Hanako", "pay 10 to Alice and 20 to Bob", "where am I", "play track 2",
                    "weather in Tokyo", "hello there"):
        demo.expect(f"the example {example!r}", lambda: expect(
            page.locator(".examples").get_by_role("button", name=example, exact=True)).to_be_visible())
    demo.expect("the SSE toggle selected", lambda: expect(page.get_by_role("radio", name="SSE")).to_have_attribute("aria-checked", "true"))
    demo.expect("the WebSocket toggle", lambda: expect(page.get_by_role("radio", name="WebSocket")).to_be_visible())
    demo.expect("no error banner", lambda: expect(page.get_by_role("alert")).to_be_hidden())
    demo.type("hello there")
    demo.sees('You said: "hello there"')
    demo.idle()
    demo.used_transport("sse")
    demo.used_agent("demo_agent")  # the default agent
    demo.clean_console()


def test_the_agent_selector_lists_both_agents_and_switching_starts_a_new_chat(demo: DemoPage) -> None:
    demo.open()
    page, picker = demo.page, demo.agent_picker()
    demo.expect("both agents in the selector", lambda: expect(picker.locator("option")).to_have_text(["demo_agent", "support_agent"]))
    demo.expect("the default agent selected", lambda: expect(picker).to_have_value("demo_agent"))
    demo.expect("demo_agent's routes shown", lambda: expect(page.locator("#endpoint")).to_contain_text("/agents/demo_agent/api/chat"))

    def examples_of(agent: str, texts: tuple[str, ...]) -> None:
        """The examples shown are that agent's, and the one that suits any agent; no other."""
        shown = [*texts, "hello there"]
        demo.expect(f"{agent}'s examples only", lambda: expect(page.locator(".examples .example:visible")).to_have_text(shown))

    examples_of("demo_agent", DEMO_EXAMPLES)
    demo.example("hello there")
    demo.sees('You said: "hello there"')
    demo.idle()
    demo.choose_agent("support_agent")
    demo.expect("a new, empty chat", lambda: expect(page.locator("#empty")).to_be_visible())
    demo.expect("no messages left", lambda: expect(page.locator("#message-list")).to_be_empty())
    demo.expect("support_agent's routes shown", lambda: expect(page.locator("#endpoint")).to_contain_text("/agents/support_agent/api/chat"))
    examples_of("support_agent", SUPPORT_EXAMPLES)
    # The choice is kept in the URL (?agent=support_agent), which preselects it on load.
    demo.expect("?agent= in the URL", lambda: expect(page).to_have_url(re.compile(r"[?&]agent=support_agent\b")))
    page.reload()
    demo.expect("the page to load again", lambda: expect(page.locator("body[data-status=ready]")).to_be_attached())
    demo.expect("support_agent preselected", lambda: expect(picker).to_have_value("support_agent"))
    demo.used_agent("demo_agent")  # the one message went to the agent selected then
    demo.clean_console()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_approve_a_refund_on_the_support_agent(demo: DemoPage, transport: str) -> None:
    demo.open(transport)
    demo.choose_agent("support_agent")
    demo.example("refund 20 on order 1234")
    card = demo.tool("issue_refund")
    demo.state(card, "approval-requested", "waiting for approval")
    demo.sees('"order_id": "1234"', card)
    demo.sees("The customer's card is credited when you approve.", card)  # support_agent's policy hint
    demo.idle()
    card.get_by_role("button", name="Approve", exact=True).click()
    demo.state(card, "output-available", "done")
    demo.sees('"refund_id": "rf-', card)
    demo.sees("Refunded 20 USD on order 1234 (refund id rf-")
    demo.idle()
    demo.used_transport(transport)
    demo.used_agent("support_agent")
    demo.clean_console()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_deny_a_refund_on_the_support_agent(demo: DemoPage, transport: str) -> None:
    demo.open(transport)
    demo.choose_agent("support_agent")
    demo.example("refund 20 on order 1234")
    card = demo.tool("issue_refund")
    demo.state(card, "approval-requested", "waiting for approval")
    card.get_by_role("button", name="Deny", exact=True).click()
    demo.state(card, "output-denied", "denied")
    demo.sees("the tool did not run", card)
    demo.sees("The refund of 20 USD on order 1234 was not made")
    demo.idle()
    demo.used_transport(transport)
    demo.used_agent("support_agent")
    demo.clean_console()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_approve_a_payment(demo: DemoPage, transport: str) -> None:
    demo.open(transport)
    demo.example("pay 50 to Hanako")
    card = demo.tool("process_payment")
    demo.state(card, "approval-requested", "waiting for approval")
    demo.sees('"recipient": "Hanako"', card)
    demo.sees("Money leaves the account when you approve.", card)  # the policy's hint
    demo.idle()
    card.get_by_role("button", name="Approve", exact=True).click()
    demo.state(card, "output-available", "done")
    demo.sees('"transaction_id"', card)
    demo.sees("Done: sent 50 USD to Hanako")
    demo.expect("the buttons to be gone", lambda: expect(card.get_by_role("button")).to_have_count(0))
    demo.idle()
    demo.used_transport(transport)
    demo.clean_console()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_deny_a_payment(demo: DemoPage, transport: str) -> None:
    demo.open(transport)
    demo.example("pay 50 to Hanako")
    card = demo.tool("process_payment")
    demo.state(card, "approval-requested", "waiting for approval")
    card.get_by_role("button", name="Deny", exact=True).click()
    demo.state(card, "output-denied", "denied")
    demo.sees("the tool did not run", card)
    demo.sees("The payment of 50 USD to Hanako was not made")
    demo.idle()
    demo.used_transport(transport)
    demo.clean_console()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_two_payments_one_approved_one_denied(demo: DemoPage, transport: str, artifact: Path) -> None:
    demo.open(transport)
    demo.example("pay 10 to Alice and 20 to Bob")
    alice, bob = demo.tool("process_payment", 0), demo.tool("process_payment", 1)
    demo.state(alice, "approval-requested", "waiting for approval")
    demo.state(bob, "approval-requested", "waiting for approval")
    demo.idle()
    demo.sees("Approve or Deny the 2 calls", demo.page.locator("#status"))
    demo.screenshot(artifact.with_name(artifact.stem + "-approval.png"))  # the picture in docs/demo.md
    alice.get_by_role("button", name="Approve", exact=True).click()
    # Nothing is sent until every call has an answer.
    demo.expect("Bob's buttons to stay", lambda: expect(bob.get_by_role("button", name="Deny")).to_be_visible())
    bob.get_by_role("button", name="Deny", exact=True).click()
    demo.state(alice, "output-available", "done")
    demo.state(bob, "output-denied", "denied")
    demo.sees("Done: sent 10 USD to Alice")
    demo.sees("The payment of 20 USD to Bob was not made")
    demo.idle()
    demo.used_transport(transport)
    demo.clean_console()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_weather_runs_on_the_server(demo: DemoPage, transport: str) -> None:
    demo.open(transport)
    demo.example("weather in Tokyo")
    card = demo.tool("get_weather")
    demo.state(card, "output-available", "done")
    demo.sees('"city": "Tokyo"', card)
    demo.sees("The weather in Tokyo is")
    demo.idle()
    demo.expect("no approval buttons", lambda: expect(demo.page.get_by_role("button", name="Approve")).to_have_count(0))
    demo.used_transport(transport)
    demo.clean_console()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_where_am_i_asks_the_browser_after_approval(demo: DemoPage, transport: str) -> None:
    demo.context.grant_permissions(["geolocation"], origin=demo.gateway.base)
    demo.context.set_geolocation(TOKYO)
    demo.open(transport)
    demo.example("where am I")
    card = demo.tool("get_location")
    demo.state(card, "approval-requested", "waiting for approval")
    demo.sees("runs in your browser", card)
    demo.idle()
    card.get_by_role("button", name="Approve", exact=True).click()
    demo.state(card, "output-available", "done")
    demo.sees('"latitude": 35.6812', card)
    demo.sees("You are at latitude 35.6812, longitude 139.7671.")
    demo.idle()
    demo.used_transport(transport)
    demo.clean_console()


def test_where_am_i_without_permission_answers_with_an_error(demo: DemoPage) -> None:
    demo.open("sse")  # no geolocation permission granted: headless Chromium denies it
    demo.example("where am I")
    card = demo.tool("get_location")
    demo.state(card, "approval-requested", "waiting for approval")
    card.get_by_role("button", name="Approve", exact=True).click()
    demo.state(card, "output-error", "error")
    demo.sees("Location unavailable", card)
    demo.sees("I could not get your location")
    demo.idle()
    demo.clean_console()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_play_track_2_runs_in_the_browser(demo: DemoPage, transport: str) -> None:
    demo.open(transport)
    demo.example("play track 2")
    card = demo.tool("change_bgm")
    demo.state(card, "output-available", "done")
    demo.sees('"track": 2', card)
    demo.sees("Now playing track 2.")
    demo.expect("the now-playing note", lambda: expect(demo.page.locator("#now-playing")).to_have_text("♪ Track 2"))
    demo.idle()
    demo.used_transport(transport)
    demo.clean_console()


def test_a_new_message_instead_of_an_answer_cancels_the_call(demo: DemoPage) -> None:
    demo.open("sse")
    demo.example("pay 50 to Hanako")
    card = demo.tool("process_payment")
    demo.state(card, "approval-requested", "waiting for approval")
    demo.idle()
    demo.type("hello there")
    demo.sees('You said: "hello there"')
    demo.expect("the unanswered call to read cancelled", lambda: expect(card.locator(".badge")).to_have_text("cancelled"))
    demo.expect("its buttons to be gone", lambda: expect(card.get_by_role("button")).to_have_count(0))
    demo.idle()
    demo.clean_console()


def test_switching_transport_keeps_the_chat(demo: DemoPage) -> None:
    """An approval asked over SSE is answered over the WebSocket: the same run continues."""
    demo.open("sse")
    demo.example("pay 50 to Hanako")
    card = demo.tool("process_payment")
    demo.state(card, "approval-requested", "waiting for approval")
    demo.idle()
    demo.choose_transport("ws")
    card.get_by_role("button", name="Approve", exact=True).click()
    demo.state(card, "output-available", "done")
    demo.sees("Done: sent 50 USD to Hanako")
    demo.idle()
    assert len(demo.chat_posts) == 1 and len(demo.sockets) == 1, demo.report(
        f"expected one POST then one socket; POSTs: {demo.chat_posts}, sockets: {demo.sockets}"
    )
    demo.clean_console()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_error_shows_the_banner_and_the_chat_goes_on(demo: DemoPage, transport: str, artifact: Path) -> None:
    demo.open(transport)
    demo.type("trigger error")
    banner = demo.page.get_by_role("alert")
    demo.expect("the error banner", lambda: expect(banner).to_contain_text("DEMO_ERROR"))
    demo.screenshot(artifact.with_name(artifact.stem + "-banner.png"))
    banner.get_by_role("button", name="Dismiss").click()
    demo.expect("the banner to go", lambda: expect(banner).to_be_hidden())
    demo.example("hello there")
    demo.sees('You said: "hello there"')
    demo.idle()
    demo.used_transport(transport)
