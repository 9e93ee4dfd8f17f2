"""The approvals API's routes in process (gateway/edge/approvals_api.py, aiohttp's test client, the
memory backend): what a caller's listing holds and how it pages, the query values it refuses
(400 naming the parameter, never a 500), and what a vote's POST is held to (the chat routes' body
timeout and per-user rate). The approvals are put in the directory as the chat's owner puts them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from gateway.edge.state import GATEWAY
from tests.support.api_client import api_client
from tests.unit.test_approvals_directory import TTL, approval

CONFIG = """
internal:
  secret: s3cret
upstream:
  url: http://adk.invalid:8000
  app_name: support_agent
auth:
  mode: api_key
  api_keys:
    - {id: mallory, key: k-mallory}
    - {id: bob, key: k-bob}
approvers:
  api_keys:
    - {id: supervisor, key: k-supervisor}
  groups:
    supervisors: {users: [supervisor]}
  auditors: {users: [supervisor]}
chat:
  body_timeout: 300ms
limits:
  rate_per_user: 0.5
  burst_per_user: 3
"""
SUPERVISOR = {"Authorization": "Bearer k-supervisor"}
MALLORY = {"Authorization": "Bearer k-mallory"}


@pytest.fixture
async def client() -> AsyncIterator[TestClient]:
    async with api_client(CONFIG) as test_client:
        yield test_client


async def put(client: TestClient, record: dict[str, Any]) -> None:
    await client.app[GATEWAY].cluster.state.put_approval(record, ttl=TTL)  # type: ignore[index]


def asked(approval_id: str, created: float, requester: str, approvers: str | None) -> dict[str, Any]:
    return {**approval(approval_id, created), "requester": requester, "approvers": approvers}


async def listed(client: TestClient, headers: dict[str, str], **query: str) -> tuple[int, dict[str, Any]]:
    answer = await client.get("/api/approvals", params=query, headers=headers)
    return answer.status, await answer.json()


async def test_one_users_thousand_approvals_do_not_hide_a_new_refund_from_the_supervisor(client: TestClient) -> None:
    """Failed on main: the route read the first 1,000 pending approvals, all mallory's (hers to
    decide), and filtered them to none for the supervisor."""
    base = time.time() - 2000
    for i in range(1024):
        await put(client, asked(f"own-{i:04d}", base + i, "mallory", None))
    await put(client, asked("refund", base + 1500, "bob", "supervisors"))
    status, body = await listed(client, SUPERVISOR)
    assert status == 200 and [a["id"] for a in body["approvals"]] == ["refund"]
    assert body["next_cursor"] is None
    # Mallory reads hers a page at a time: every one once, by the cursor.
    seen: list[str] = []
    query = {"limit": "1000"}
    while True:
        status, body = await listed(client, MALLORY, **query)
        assert status == 200
        seen += [a["id"] for a in body["approvals"]]
        if body["next_cursor"] is None:
            break
        query["cursor"] = body["next_cursor"]
    assert seen == [f"own-{i:04d}" for i in range(1024)]
    assert "refund" not in seen


@pytest.mark.parametrize(("query", "parameter"), [
    ({"limit": "²"}, "limit"), ({"limit": "-1"}, "limit"), ({"limit": "1e3"}, "limit"), ({"limit": "0"}, "limit"),
    ({"limit": "1001"}, "limit"), ({"limit": "١٢"}, "limit"), ({"limit": ""}, "limit"), ({"limit": "9" * 40}, "limit"),
    ({"cursor": "not-a-cursor"}, "cursor"), ({"cursor": "A" * 4000}, "cursor"), ({"cursor": "²"}, "cursor"),
    ({"state": "sideways"}, "state"), ({"agent": "a" * 300}, "agent"), ({"tool": ""}, "tool"),
    *(({"state": "decided", key: value}, key) for key in ("since", "until")
      for value in ("nan", "inf", "-inf", "1e308", "-1", "1_000", "١٢", "0x10", "", "9" * 400)),
    ({"state": "decided", "after": "9" * 40 + "-1"}, "after"), ({"state": "decided", "after": "x"}, "after"),
])
async def test_a_bad_query_value_is_a_400_naming_it(client: TestClient, query: dict[str, str], parameter: str) -> None:
    status, body = await listed(client, SUPERVISOR, **query)
    assert status == 400, body
    assert body["error"]["code"] == "invalid_query" and body["error"]["message"].startswith(f"{parameter}: ")


async def test_good_times_and_limits_are_taken(client: TestClient) -> None:
    status, body = await listed(client, SUPERVISOR, state="decided", since="1764547200.5", until=str(int(time.time())), limit="1000")
    assert status == 200 and body == {"approvals": [], "next": None}


async def test_a_vote_whose_body_is_slow_is_408_after_the_chat_routes_body_timeout(client: TestClient) -> None:
    async def slow() -> AsyncIterator[bytes]:
        yield b'{"approved": '
        await asyncio.sleep(3)
        yield b"true}"

    answer = await client.post("/api/approvals/gw-1", data=slow(), headers={**SUPERVISOR, "Content-Type": "application/json"})
    assert answer.status == 408 and (await answer.json())["error"]["code"] == "body_timeout"
    limited = client.app[GATEWAY].metrics.registry.get_sample_value(  # type: ignore[index]
        "adk_gateway_limited_total", {"reason": "body_timeout"}
    )
    assert limited == 1


async def test_votes_spend_the_callers_rate_and_are_429_past_it(client: TestClient) -> None:
    statuses = []
    for _ in range(4):
        answer = await client.post("/api/approvals/gw-unknown", json={"approved": True}, headers=SUPERVISOR)
        statuses.append(answer.status)
    assert statuses == [404, 404, 404, 429]
    assert int(answer.headers["Retry-After"]) >= 1
    assert (await answer.json())["error"]["code"] == "rate_limited"
    # Another caller has their own budget.
    other = await client.post("/api/approvals/gw-unknown", json={"approved": True}, headers=MALLORY)
    assert other.status == 404


async def test_a_decision_kept_for_a_busy_chat_is_202_decided_and_not_yet_applied(
    client: TestClient, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where merge-i38 answered 503 `chat_busy` (and the deadline then answered ADK with `on_timeout`):
    the quorum is reached and the decision is the approval's; the chat gets it when it frees."""
    desk = client.app[GATEWAY].cluster.approvals  # type: ignore[index]

    async def queued(record: dict[str, Any], approved: bool, reason: str | None, deciders: list[dict[str, str]]) -> str:
        return "queued"  # what the desk answers once its chat stayed busy (tests/unit/test_approver_decisions.py)

    monkeypatch.setattr(desk, "decide", queued)
    await put(client, asked("adk-1", time.time(), "bob", "supervisors") | {"engine": "confirm"})
    answer = await client.post("/api/approvals/adk-1", json={"approved": True}, headers=SUPERVISOR)
    assert answer.status == 202
    decided = await answer.json()
    assert (decided["state"], decided["outcome"], decided["source"], decided["applied"]) == ("decided", "approved", "approver", False)
    assert "engine" not in decided and "decision" not in decided
    status, listing = await listed(client, SUPERVISOR)
    assert status == 200 and listing["approvals"] == []
    again = await client.post("/api/approvals/adk-1", json={"approved": False}, headers=SUPERVISOR)
    assert again.status == 409 and (await again.json())["error"]["code"] == "already_decided"
