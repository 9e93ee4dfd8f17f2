"""The upstream client on what the stock API server of every supported ADK sends (tests/fixtures/adk*).

/run_sse bodies are rebuilt from the recorded ``data:`` payloads; the session calls are answered as
recorded in each version's sessions.json. docs/protocol.md lists what differs between versions.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from gateway.upstream.client import AdkClient, UpstreamError
from tests.support.adk_server import Routes, adk_server, sse_body
from tests.support.recordings import ROOT, SSE_FOLDERS, events, fixture_names, lines

MESSAGE = {"role": "user", "parts": [{"text": "hi"}]}
# What ADK 1.22.1 writes for a run that fails with a multi-line message: its run_sse handler
# formats f'data: {{"error": "{str(e)}"}}' without escaping, so the body is not JSON and the
# message's newlines end the data line (the recorded payload is its first line).
UNESCAPED_ERROR_BODY = (
    b'data: {"error": "1 validation error for ToolConfirmation\n'
    b"approvalId\n"
    b"  Extra inputs are not permitted [type=extra_forbidden, input_value='x', input_type=str]\n"
    b'    For further information visit https://errors.pydantic.dev/2.14/v/extra_forbidden"}\n\n'
)


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[Routes, AdkClient]]:
    async with adk_server() as (routes, client):
        yield routes, client


async def run(client: AdkClient) -> list[dict[str, Any]]:
    got = []
    async for batch in client.run_sse_batches(user_id="u1", session_id="s1", new_message=MESSAGE):
        got.extend(batch)
    return got


@pytest.mark.parametrize(("folder", "name"), [(f, n) for f in SSE_FOLDERS for n in fixture_names(f)])
async def test_every_recorded_run_reads_back_as_recorded(upstream: Any, folder: str, name: str) -> None:
    routes, client = upstream
    payload = b"".join(b"data: " + line.encode() + b"\n\n" for line in lines(name, folder))
    if folder == "adk-1.22.1" and name == "pay_hanako_extra_key":
        payload = UNESCAPED_ERROR_BODY  # the body as sent, not just its first data line
    routes[("POST", "/run_sse")] = sse_body(payload)
    assert await run(client) == events(name, folder)


async def test_adk_1_22s_unescaped_run_error_is_the_runs_error(upstream: Any) -> None:
    routes, client = upstream
    routes[("POST", "/run_sse")] = sse_body(UNESCAPED_ERROR_BODY)
    assert await run(client) == [{"error": "1 validation error for ToolConfirmation"}]
    # With a quote in the message the payload is one line, but still not JSON.
    routes[("POST", "/run_sse")] = sse_body(b'data: {"error": "No agent named "x""}\n\n')
    assert await run(client) == [{"error": 'No agent named "x"'}]


async def test_a_run_s_state_delta_rides_in_the_request_body(upstream: Any) -> None:
    # ADK's RunAgentRequest.state_delta (camelCase like the body's other fields), sent only when given.
    routes, client = upstream
    bodies: list[dict[str, Any]] = []

    async def answer(request: web.Request) -> web.StreamResponse:
        bodies.append(await request.json())
        return await sse_body(b'data: {"author": "demo_agent"}\n\n')(request)

    routes[("POST", "/run_sse")] = answer
    async for _ in client.run_sse_batches(user_id="u1", session_id="s1", new_message=MESSAGE, state_delta={"k": "v"}):
        pass
    await run(client)
    assert bodies[0]["stateDelta"] == {"k": "v"} and bodies[0]["newMessage"] == MESSAGE
    assert "stateDelta" not in bodies[1]


def sessions(folder: str) -> dict[str, Any]:
    return json.loads((ROOT / folder / "sessions.json").read_text())


@pytest.mark.parametrize("folder", SSE_FOLDERS)
def test_the_recorded_session_shapes(folder: str) -> None:
    calls = sessions(folder)
    assert calls["get_missing"]["status"] == 404
    assert calls["create"]["status"] == 200 and calls["get"]["status"] == 200
    assert calls["create_again"]["status"] == 409  # ensure_session accepts 409: another request won
    for name in ("create", "get", "create_with_state"):
        body = calls[name]["response"]
        assert set(body) >= {"id", "appName", "userId", "state", "events", "lastUpdateTime"}
    assert calls["create"]["response"]["id"] == "s-sessions"
    assert calls["create_with_state"]["response"]["state"] == {"k": 1}


@pytest.mark.parametrize("folder", SSE_FOLDERS)
async def test_ensure_session_on_the_recorded_answers(upstream: Any, folder: str) -> None:
    routes, client = upstream
    calls = sessions(folder)
    collection = calls["create"]["path"]

    def recorded(name: str) -> tuple[int, Any]:
        return calls[name]["status"], calls[name]["response"]

    # One round trip, never a lookup (which would download the session's history): a new session
    # is created; an existing one answers the create 409, which is as good.
    for answer in ("create", "create_again"):
        routes.clear()
        routes |= {("POST", collection): [recorded(answer)]}  # a GET would find no route: KeyError, a 500
        await client.ensure_session("u1", "s1")
        assert routes[("POST", collection)] == []
    # Anything else is the agent service failing.
    routes.clear()
    routes |= {("POST", collection): [(500, {"detail": "boom"})]}
    with pytest.raises(UpstreamError):
        await client.ensure_session("u1", "s1")


def test_every_recorded_version_is_tested_on_the_same_scenarios() -> None:
    from tests.support.recordings import LIVE_FOLDERS

    on_disk = {p.name for p in ROOT.iterdir() if p.is_dir() and p.name.startswith("adk")}
    assert on_disk == {*SSE_FOLDERS, *LIVE_FOLDERS}
    for folders in (SSE_FOLDERS, LIVE_FOLDERS):
        scenarios = [sorted(p.stem for p in (ROOT / f).glob("*.jsonl")) for f in folders]
        assert all(s == scenarios[0] for s in scenarios), folders
        assert all((ROOT / f / "requests.json").is_file() for f in folders)
    assert all((ROOT / f / "sessions.json").is_file() for f in SSE_FOLDERS)


def held_run(routes: dict[Any, Any]) -> asyncio.Event:
    """A `/run_sse` that sends one event, then holds the stream open until the event is set."""
    release = asyncio.Event()

    async def answer(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await response.prepare(request)
        await response.write(b'data: {"author": "demo_agent"}\n\n')
        await release.wait()
        await response.write_eof()
        return response

    routes[("POST", "/run_sse")] = answer
    return release


async def test_a_streaming_run_keeps_no_request_body(upstream: Any) -> None:
    # A held SSE stream (a run waiting for a person, a slow model) lasts minutes: the request body
    # it sent (orjson's result, a 4 KiB buffer) must not live as long (docs/performance.md, idle).
    routes, client = upstream
    release = held_run(routes)
    marker = "body-marker-" + "x" * 64
    batches = client.run_sse_batches(user_id="u1", session_id="s1", new_message={"role": "user", "parts": [{"text": marker}]})
    assert [e["author"] for e in await anext(batches)] == ["demo_agent"]
    # The suspended generators: this one, and the ones its frame holds (the stream's reader).
    frames = [batches.ag_frame]
    frames += [v.ag_frame for v in batches.ag_frame.f_locals.values() if inspect.isasyncgen(v)]
    kept = [name for frame in frames for name, v in frame.f_locals.items() if type(v) is bytes and marker.encode() in v]
    assert not kept, f"the request body is still held as {kept}"
    release.set()
    async for _ in batches:
        pass


async def test_a_streaming_run_stacks_one_generator(upstream: Any) -> None:
    # Every generator a held run stacks keeps a frame and its locals for the stream's whole life
    # (docs/performance.md, idle SSE stream): the run's batches come from one, not a chain.
    routes, client = upstream
    release = held_run(routes)
    batches = client.run_sse_batches(user_id="u1", session_id="s1", new_message=MESSAGE)
    assert [e["author"] for e in await anext(batches)] == ["demo_agent"]
    assert inspect.isasyncgen(batches)
    nested = [name for name, v in batches.ag_frame.f_locals.items() if inspect.isasyncgen(v)]
    assert not nested, f"the run's generator holds another one as {nested}"
    release.set()
    async for _ in batches:
        pass
