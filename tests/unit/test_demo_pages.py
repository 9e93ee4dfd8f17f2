"""The demo's pages on the gateway: the AI SDK chat at `/`, the AG-UI chat at `/agui` and the
approvals inbox at `/inbox`, all behind `demo.page`, all a JSON 404 when the bundle is not built."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gateway.config.schema import parse_config
from gateway.edge import app as edge_app

PAGES = ["/", "/agui", "/inbox"]
BASE = "upstream: {url: 'http://127.0.0.1:9', health_interval: 1h}\n"


async def get(text: str, path: str) -> tuple[int, str, str]:
    client = TestClient(TestServer(edge_app.create_app(parse_config(text, env={}))))
    await client.start_server()
    try:
        response = await client.get(path)
        return response.status, response.content_type, await response.text()
    finally:
        await client.close()


@pytest.fixture
def built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    demo = tmp_path / "demo"
    demo.mkdir()
    (demo / "index.html").write_text("<title>chat</title>")
    (demo / "agui.html").write_text("<title>agui</title>")
    (demo / "inbox.html").write_text("<title>inbox</title>")
    monkeypatch.setattr(edge_app, "STATIC_DIR", tmp_path)
    return demo


@pytest.mark.parametrize(("path", "title"), [("/", "chat"), ("/agui", "agui"), ("/inbox", "inbox")])
async def test_every_page_is_served_when_the_demo_is_on(built: Path, path: str, title: str) -> None:
    status, kind, body = await get(BASE + "demo: {page: true}\n", path)
    assert (status, kind) == (200, "text/html") and f"<title>{title}</title>" in body


@pytest.mark.parametrize("path", PAGES)
async def test_no_page_exists_when_the_demo_is_off(built: Path, path: str) -> None:
    status, kind, _ = await get(BASE, path)
    assert (status, kind) == (404, "application/json")


@pytest.mark.parametrize("path", PAGES)
async def test_an_unbuilt_page_is_a_json_404_that_says_how_to_build_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    monkeypatch.setattr(edge_app, "STATIC_DIR", tmp_path)
    status, kind, body = await get(BASE + "demo: {page: true}\n", path)
    assert (status, kind) == (404, "application/json") and '"demo_not_built"' in body


async def headers_of(path: str) -> dict[str, str]:
    client = TestClient(TestServer(edge_app.create_app(parse_config(BASE + "demo: {page: true}\n", env={}))))
    await client.start_server()
    try:
        response = await client.get(path)
        assert response.status == 200
        return dict(response.headers)
    finally:
        await client.close()


@pytest.mark.parametrize("path", PAGES)
async def test_every_page_refuses_framing_sniffing_and_any_script_but_their_own(built: Path, path: str) -> None:
    """The inbox shows and decides approvals with an approver's key: a page that framed it could
    trick a click (clickjacking), and a script injected into it would act with the key."""
    headers = await headers_of(path)
    policy = {d.split()[0]: d.split()[1:] for d in headers["Content-Security-Policy"].split(";") if d.strip()}
    assert policy["default-src"] == ["'none'"]
    assert policy["script-src"] == ["'self'"] and policy["style-src"] == ["'self'"]
    assert policy["frame-ancestors"] == ["'none'"] and policy["base-uri"] == ["'none'"]
    assert policy["connect-src"] == ["'self'"]
    assert headers["X-Frame-Options"] == "DENY"
    assert headers["X-Content-Type-Options"] == "nosniff"


@pytest.mark.parametrize("page", ["index.html", "agui.html", "inbox.html"])
def test_the_pages_need_nothing_inline_that_the_policy_refuses(page: str) -> None:
    """What the policy allows is the page's own files: no inline script, style or handler in the
    source the build copies (web/src), so the pages work under it (tests/browser run them)."""
    html = (Path(__file__).parents[2] / "web" / "src" / page).read_text()
    assert re.findall(r"<script(?![^>]*\bsrc=)[^>]*>", html) == []
    assert "<style" not in html and re.search(r"\sstyle=", html) is None
    assert re.search(r"\son[a-z]+=", html) is None
