"""README.md's quick start followed literally by an app on its own origin, in headless Chromium.

The app (tests/browser/quickstart/: the stock ai 6 / ai 7 Chat core with the README's transports and its rule
for cancelled approvals, bundled by esbuild from tests/js's vendored SDKs) is served by a static server on
http://localhost:<port>; the gateway runs as `make run` runs it (`adk-gateway demo`, the reference
config/gateway.yaml, the demo agent) on http://127.0.0.1:<another port>: another origin. Started with
`GATEWAY_ALLOWED_ORIGINS=<the app's origin>` (the README's gateway side), the app chats over SSE and over the
WebSocket; started without it (the stock config), the same page is refused: a CORS failure on SSE, a 403 on
the WebSocket handshake, and ai 6's transport module cannot even be imported.
"""

from __future__ import annotations

import functools
import http.server
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.demopage import DemoPage
from tests.procs import ROOT, GatewayProcess, make_run, serve_http

pytestmark = [pytest.mark.browser, pytest.mark.integration]

PAGE_SOURCES = Path(__file__).parent / "quickstart"
ESBUILD = ROOT / "web" / "node_modules" / ".bin" / "esbuild"
SDKS = ROOT / "tests" / "js" / "node_modules"
CLIENTS = [(6, "sse"), (7, "sse"), (6, "ws"), (7, "ws")]


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def app_origin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The app, bundled and served from its own origin: http://localhost:<port>."""
    for needed, how in ((ESBUILD, "make gateway/static/demo/app.js (npm ci in web/)"), (SDKS / "ai7", "npm ci in tests/js")):
        if not needed.exists():
            raise AssertionError(f"{needed.relative_to(ROOT)} is missing: {how}")
    out = tmp_path_factory.mktemp("quickstart-app")
    subprocess.run(
        [str(ESBUILD), str(PAGE_SOURCES / "app.js"), "--bundle", "--format=esm", "--platform=browser",
         "--target=es2022", f"--outfile={out / 'app.js'}", "--log-level=warning"],
        env={**os.environ, "NODE_PATH": str(SDKS)}, check=True, timeout=60,
    )
    (out / "index.html").write_text((PAGE_SOURCES / "index.html").read_text())
    with serve_http(functools.partial(_Quiet, directory=str(out)), host_name="localhost") as origin:
        yield origin


@pytest.fixture(scope="module")
def allowing_gateway(tmp_path_factory: pytest.TempPathFactory, app_origin: str) -> Iterator[GatewayProcess]:
    # What `GATEWAY_ALLOWED_ORIGINS=... make run` runs.
    with make_run(tmp_path_factory.mktemp("allowing"), {"GATEWAY_ALLOWED_ORIGINS": app_origin}) as gateway:
        yield gateway


KEY = "k-app-" + "q" * 20


@pytest.fixture(scope="module")
def keyed_gateway(tmp_path_factory: pytest.TempPathFactory, app_origin: str) -> Iterator[GatewayProcess]:
    # The README's gateway side with an API key (a JWT from the app's identity provider goes the same way).
    env = {"GATEWAY_ALLOWED_ORIGINS": app_origin, "AUTH_MODE": "api_key", "GATEWAY_API_KEY": KEY, "API_KEY_USER": "app-user"}
    with make_run(tmp_path_factory.mktemp("keyed"), env) as gateway:
        yield gateway


@pytest.fixture
def stock_gateway(demo_gateway: GatewayProcess) -> GatewayProcess:
    # The package's `make run` (conftest.py: no GATEWAY_ALLOWED_ORIGINS, the stock config).
    return demo_gateway


def _open(browser: Any, gateway: GatewayProcess, app_origin: str, artifact: Path, sdk: int, transport: str) -> DemoPage:
    context = browser.new_context(viewport={"width": 900, "height": 700}, locale="en-US")
    app = DemoPage(context, gateway, artifact)
    app.page.goto(f"{app_origin}/index.html?gateway={gateway.base}&sdk={sdk}&transport={transport}")
    app.expect("the app to load", lambda: expect(app.page.locator("body[data-status=ready]")).to_be_attached())
    return app


def approve_a_payment(app: DemoPage) -> None:
    app.type("pay 50 to Hanako")
    card = app.tool("process_payment")
    app.state(card, "approval-requested", "approval-requested")
    app.idle()
    card.get_by_role("button", name="Approve", exact=True).click()
    app.state(card, "output-available", "output-available")
    app.sees("Done: sent 50 USD to Hanako")
    app.idle()


@pytest.mark.parametrize(("sdk", "transport"), CLIENTS)
def test_the_quick_start_works_from_another_origin(
    browser: Any, allowing_gateway: GatewayProcess, app_origin: str, artifact: Path, sdk: int, transport: str
) -> None:
    app = _open(browser, allowing_gateway, app_origin, artifact, sdk, transport)
    try:
        assert app.page.evaluate("location.origin") != allowing_gateway.base  # really another origin
        app.type("hello there")
        app.sees('You said: "hello there"')
        app.idle()
        # An approval round trip: the second request of the turn crosses origins too.
        approve_a_payment(app)
        # A new message instead of an answer: the gateway cancels the call, the README's rule hides its buttons.
        app.type("pay 50 to Hanako")
        waiting = app.tool("process_payment", 1)
        app.state(waiting, "approval-requested", "approval-requested")
        app.idle()
        app.type("hello there")
        app.expect("the unanswered call to read cancelled", lambda: expect(waiting.locator(".badge")).to_have_text("cancelled"))
        app.expect("its buttons to be gone", lambda: expect(waiting.get_by_role("button")).to_have_count(0))
        app.expect("the reply", lambda: expect(app.page.locator(".messages article").last).to_contain_text('You said: "hello there"'))
        app.idle()
        app.used_transport(transport)
        if transport == "ws":
            assert all(url.startswith(allowing_gateway.base.replace("http", "ws", 1)) for url in app.sockets), app.sockets
        else:
            assert all(url == f"{allowing_gateway.base}/api/chat" for url in app.chat_posts), app.chat_posts
        app.clean_console()
        app.screenshot()
    finally:
        app.context.close()


# Every WebSocket the page opens, so the test can drop one as a network would (the transports keep theirs private).
RECORD_SOCKETS = """
const Native = window.WebSocket;
window.__sockets = [];
window.WebSocket = class extends Native {
  constructor(...args) { super(...args); window.__sockets.push(this); }
};
"""


@pytest.mark.parametrize("client", ["7", "6-copied"])
def test_a_cross_site_app_opens_the_websocket_with_a_ticket_for_each_connection(
    browser: Any, keyed_gateway: GatewayProcess, app_origin: str, artifact: Path, client: str
) -> None:
    """The stock ai 7 WebSocketChatTransport (and the gateway's ai 6 one) with `params` asking for a
    single-use ticket: no long-lived credential in any URL, and a dropped connection reopens with
    a new ticket at the next request."""
    sdk, *copied = client.split("-")
    query = f"gateway={keyed_gateway.base}&sdk={sdk}&transport=ws&key={KEY}" + ("&ws-module=copied" if copied else "")
    context = browser.new_context(viewport={"width": 900, "height": 700}, locale="en-US")
    context.add_init_script(RECORD_SOCKETS)
    app = DemoPage(context, keyed_gateway, artifact)
    tickets: list[str] = []
    app.page.on("request", lambda r: tickets.append(r.url) if r.url.endswith("/ws-ticket") and r.method == "POST" else None)
    try:
        app.page.goto(f"{app_origin}/index.html?{query}")
        app.expect("the app to load", lambda: expect(app.page.locator("body[data-status=ready]")).to_be_attached())
        app.type("hello there")
        app.sees('You said: "hello there"')
        app.idle()
        # The connection drops (a network, a proxy, a replica going away): the next request opens
        # another, with a ticket of its own; an approval round trip rides on it.
        app.page.evaluate("window.__sockets.at(-1).close()")
        approve_a_payment(app)
        app.clean_console()
        app.screenshot()
    finally:
        context.close()
    assert len(app.sockets) == 2 and len(tickets) == 2, (app.sockets, tickets)
    assert all("ticket=wst_" in url and KEY not in url and "access_token" not in url for url in app.sockets), app.sockets
    assert len({url.split("ticket=")[1] for url in app.sockets}) == 2  # one ticket per connection
    redeemed = [line for line in keyed_gateway.log_lines() if line.get("event") == "ws_connected" and line.get("user_id") == "app-user"]
    assert len(redeemed) >= 2
    assert KEY not in keyed_gateway.log_text()


# What refuses the page when its origin is not listed: the gateway's answer, and what Chromium says of it.
REFUSALS = {
    "6-sse": ("OPTIONS", "/api/chat", 403, "blocked by CORS policy"),
    "7-sse": ("OPTIONS", "/api/chat", 403, "blocked by CORS policy"),
    # ai 6's WebSocket transport imported from the gateway: a cross-origin module import needs CORS too.
    "6-ws": ("GET", "/static/ws-transport.js", 200, "blocked by CORS policy"),
    # ... and copied into the app: then the handshake is what is refused, as for ai 7's own transport.
    "6-ws-copied": ("GET", "/api/chat/ws", 403, "Unexpected response code: 403"),
    "7-ws": ("GET", "/api/chat/ws", 403, "Unexpected response code: 403"),
}


@pytest.mark.parametrize("client", list(REFUSALS))
def test_without_the_allowed_origin_the_same_app_is_refused(
    browser: Any, stock_gateway: GatewayProcess, app_origin: str, artifact: Path, client: str
) -> None:
    method, path, status, console = REFUSALS[client]
    sdk, transport, *copied = client.split("-")
    query = f"gateway={stock_gateway.base}&sdk={sdk}&transport={transport}" + ("&ws-module=copied" if copied else "")
    context = browser.new_context(viewport={"width": 900, "height": 700}, locale="en-US")
    app = DemoPage(context, stock_gateway, artifact)
    logged = len(stock_gateway.log_lines())  # this test's lines follow (the gateway serves the package)
    try:
        app.page.goto(f"{app_origin}/index.html?{query}")
        if client != "6-ws":  # that one fails at start: its transport cannot be imported
            app.expect("the app to load", lambda: expect(app.page.locator("body[data-status=ready]")).to_be_attached())
            app.type("hello there")
        error = app.page.get_by_role("alert")
        app.expect("the app to show an error", lambda: expect(error).to_be_visible())
        app.expect("the status error", lambda: expect(app.page.locator("body")).to_have_attribute("data-status", "error"))
        app.expect("no reply", lambda: expect(app.page.locator(".messages")).not_to_contain_text("You said"))
        assert any(console in line for line in app.console), app.report(f"expected {console!r} in the console")
        if status == 403:
            refused = [
                line for line in stock_gateway.log_lines()[logged:]
                if line.get("event") == "http_request" and line.get("method") == method
                and line.get("path") == path and line.get("status") == 403
            ]
            assert refused, app.report(f"expected the gateway to log {method} {path} 403")
        app.screenshot()
    finally:
        context.close()
