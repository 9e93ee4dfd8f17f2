"""The cookie credential in Chromium (issue 17): an app that signs its users in on the same site
puts the credential in a cookie; the stock ai 7 transports of the demo page (DefaultChatTransport
and WebSocketChatTransport) then chat with no token in any URL or script.

The gateway runs as `make run` runs it, with `AUTH_MODE=api_key`, a key, and
`GATEWAY_AUTH_COOKIE=gw_session`; the test sets the cookie as the app's sign-in would.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.demopage import DemoPage
from tests.procs import GatewayProcess, make_run, request

pytestmark = pytest.mark.browser

KEY = "k-cookie-" + "x" * 16
COOKIE = "gw_session"


@pytest.fixture(scope="module")
def cookie_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    env = {"AUTH_MODE": "api_key", "GATEWAY_API_KEY": KEY, "API_KEY_USER": "cookie-user", "GATEWAY_AUTH_COOKIE": COOKIE}
    with make_run(tmp_path_factory.mktemp("cookie"), env, unset=("GATEWAY_ALLOWED_ORIGINS",)) as gateway:
        yield gateway


@pytest.mark.parametrize("transport", ["sse", "ws"])
def test_the_stock_transports_chat_with_the_cookie_and_no_token_in_any_url(
    browser: Any, cookie_gateway: GatewayProcess, artifact: Path, transport: str
) -> None:
    context = browser.new_context(viewport={"width": 1000, "height": 760}, locale="en-US")
    urls: list[str] = []
    try:
        context.add_cookies([{"name": COOKIE, "value": KEY, "url": cookie_gateway.base, "sameSite": "Strict", "httpOnly": True}])
        demo = DemoPage(context, cookie_gateway, artifact)
        demo.page.on("request", lambda r: urls.append(r.url))
        demo.page.on("websocket", lambda ws: urls.append(ws.url))
        demo.open(transport)
        demo.example("hello there")
        demo.sees('You said: "hello there"')
        demo.idle()
        demo.used_transport(transport)
        demo.clean_console()
        demo.screenshot()
    finally:
        context.close()
    assert urls and not [u for u in urls if "access_token" in u or KEY in u], urls


def test_without_the_cookie_the_page_is_refused(cookie_gateway: GatewayProcess) -> None:
    assert request(cookie_gateway.base, "GET", "/api/agents").status == 401
    # A forged cross-site POST would carry the cookie: refused by its Origin, or for lacking one.
    body = {"id": "c1", "messages": [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}]}
    cookie = {"Cookie": f"{COOKIE}={KEY}"}
    forged = request(cookie_gateway.base, "POST", "/api/chat", body, {**cookie, "Origin": "https://evil.example"})
    assert forged.status == 403 and forged.json()["error"]["code"] == "origin_not_allowed"
    bare = request(cookie_gateway.base, "POST", "/api/chat", body, cookie)
    assert bare.status == 403 and bare.json()["error"]["code"] == "origin_required"
    # A read needs no Origin; the header credential needs none either (not a browser's).
    assert request(cookie_gateway.base, "GET", "/api/agents", headers=cookie).status == 200
    header = request(cookie_gateway.base, "POST", "/api/chat", body, {"Authorization": f"Bearer {KEY}"})
    assert header.status == 200, header.body
