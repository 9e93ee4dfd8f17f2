"""The demo's pages on the gateway: the chat at `/` and the approvals inbox at `/inbox`, both behind
`demo.page`, both a JSON 404 when the bundle is not built."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gateway.config.schema import parse_config
from gateway.edge import app as edge_app

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
    (demo / "inbox.html").write_text("<title>inbox</title>")
    monkeypatch.setattr(edge_app, "STATIC_DIR", tmp_path)
    return demo


@pytest.mark.parametrize(("path", "title"), [("/", "chat"), ("/inbox", "inbox")])
async def test_both_pages_are_served_when_the_demo_is_on(built: Path, path: str, title: str) -> None:
    status, kind, body = await get(BASE + "demo: {page: true}\n", path)
    assert (status, kind) == (200, "text/html") and f"<title>{title}</title>" in body


@pytest.mark.parametrize("path", ["/", "/inbox"])
async def test_neither_page_exists_when_the_demo_is_off(built: Path, path: str) -> None:
    status, kind, _ = await get(BASE, path)
    assert (status, kind) == (404, "application/json")


@pytest.mark.parametrize("path", ["/", "/inbox"])
async def test_an_unbuilt_page_is_a_json_404_that_says_how_to_build_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    monkeypatch.setattr(edge_app, "STATIC_DIR", tmp_path)
    status, kind, body = await get(BASE + "demo: {page: true}\n", path)
    assert (status, kind) == (404, "application/json") and '"demo_not_built"' in body
