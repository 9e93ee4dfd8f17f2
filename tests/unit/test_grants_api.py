"""The grants API in process (gateway/edge/grants_api.py, aiohttp's test client, the memory
backend): who may grant what (a chatting user for their own calls in one chat, an approver for
their group), what is refused and how (400 naming the field, CEL's message for a bad condition, 403,
404 for someone else's grant), listing and revoking."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tests.support.api_client import api_client

CONFIG = """
internal:
  secret: s3cret
upstream:
  url: http://adk.invalid:8000
  app_name: support_agent
tools:
  pay: {approval: true}
  issue_refund:
    approval: true
    rules:
      - {name: large_refund, when: args.amount > 100, decide: ask, approvers: supervisors, self_approval: false}
  wire: {approval: true, approvers: leads}
  lookup: {approval: false}
auth: {mode: api_key, api_keys: [{id: alice, key: k-alice}, {id: bob, key: k-bob}]}
approvers:
  api_keys: [{id: supervisor, key: k-supervisor}, {id: lead, key: k-lead}]
  groups: {supervisors: {users: [supervisor]}, leads: {users: [lead]}}
grants: {max_ttl: 2h, max_per_owner: 2}
"""
ALICE = {"Authorization": "Bearer k-alice"}
BOB = {"Authorization": "Bearer k-bob"}
SUPERVISOR = {"Authorization": "Bearer k-supervisor"}
LEAD = {"Authorization": "Bearer k-lead"}


@pytest.fixture
async def client() -> AsyncIterator[TestClient]:
    async with api_client(CONFIG) as test_client:
        yield test_client


async def grant(client: TestClient, headers: dict[str, str], **body: Any) -> tuple[int, dict[str, Any]]:
    answer = await client.post("/api/grants", json={"agent": "support_agent", "ttl": 600, **body}, headers=headers)
    return answer.status, await answer.json()


async def listed(client: TestClient, headers: dict[str, str]) -> list[str]:
    answer = await client.get("/api/grants", headers=headers)
    assert answer.status == 200
    return [g["id"] for g in (await answer.json())["grants"]]


async def test_a_chatting_user_grants_for_their_own_calls_in_one_chat(client: TestClient) -> None:
    status, body = await grant(client, ALICE, tool="pay", chat_id="chat-1", uses=3, condition="args.amount < 50")
    assert status == 201, body
    assert (body["user_id"], body["chat_id"], body["authority"], body["uses_left"]) == ("alice", "chat-1", "user", 3)
    assert body["granted_by"] == {"user": "alice", "auth": "api_key", "principal": "api_key:alice"} and body["id"].startswith("gr-")
    assert await listed(client, ALICE) == [body["id"]]
    assert await listed(client, BOB) == [] and await listed(client, SUPERVISOR) == []


REFUSED = [
    # (why, who, body, status, code, what the message says)
    ("for another user's calls", ALICE, {"tool": "pay", "chat_id": "c", "user": "bob"}, 403, "not_an_approver", "your own"),
    ("for a group the user is not in", ALICE, {"tool": "issue_refund", "group": "supervisors"}, 403, "not_an_approver", "member"),
    ("without its chat", ALICE, {"tool": "pay"}, 400, "invalid_request", "chat_id"),
    ("a tool only approvers answer", ALICE, {"tool": "wire", "chat_id": "c"}, 400, "invalid_request", "no call of wire"),
    ("a tool nobody is asked about", ALICE, {"tool": "lookup", "chat_id": "c"}, 400, "invalid_request", "no call of lookup"),
    ("an approver key without its group", SUPERVISOR, {"tool": "issue_refund"}, 400, "invalid_request", "group"),
    ("an approver for another group", SUPERVISOR, {"tool": "wire", "group": "leads"}, 403, "not_an_approver", "member"),
    ("for a tool the group never answers", SUPERVISOR, {"tool": "pay", "group": "supervisors"}, 400, "invalid_request",
     "no call of pay is asked of the group supervisors"),
    ("a condition that does not compile", ALICE, {"tool": "pay", "chat_id": "c", "condition": "args.amount <"}, 400,
     "invalid_request", "Syntax error"),
    ("a condition that is not true or false", ALICE, {"tool": "pay", "chat_id": "c", "condition": "1 + 1"}, 400,
     "invalid_request", "must be true or false"),
    ("longer than grants.max_ttl", ALICE, {"tool": "pay", "chat_id": "c", "ttl": 7201}, 400, "invalid_request", "max_ttl"),
    ("an unknown agent", ALICE, {"tool": "pay", "chat_id": "c", "agent": "nope"}, 400, "invalid_request", "agent"),
    ("no uses", ALICE, {"tool": "pay", "chat_id": "c", "uses": 0}, 400, "invalid_request", "uses"),
    ("an unknown key", ALICE, {"tool": "pay", "chat_id": "c", "quorum": 1}, 400, "invalid_request", "quorum"),
]


@pytest.mark.parametrize(("why", "who", "body", "status", "code", "says"), REFUSED, ids=[c[0] for c in REFUSED])
async def test_what_is_refused(
    client: TestClient, why: str, who: dict[str, str], body: dict[str, Any], status: int, code: str, says: str,
) -> None:
    got, answer = await grant(client, who, **body)
    assert (got, answer["error"]["code"]) == (status, code), answer
    assert says in answer["error"]["message"]
    assert await listed(client, who) == []


async def test_an_approver_grants_for_their_group_over_every_user(client: TestClient) -> None:
    status, body = await grant(client, SUPERVISOR, tool="issue_refund", group="supervisors", uses=1)
    assert status == 201, body
    assert (body["user_id"], body["chat_id"], body["authority"]) == (None, None, "supervisors")
    assert await listed(client, SUPERVISOR) == [body["id"]]
    # It covers every user's calls: each sees it; the other group does not.
    assert await listed(client, ALICE) == [body["id"]] and await listed(client, LEAD) == []


async def test_revoked_by_its_granter_only(client: TestClient) -> None:
    _, mine = await grant(client, ALICE, tool="pay", chat_id="c")
    _, theirs = await grant(client, SUPERVISOR, tool="issue_refund", group="supervisors", user="alice")
    for who, grant_id in ((BOB, mine["id"]), (LEAD, theirs["id"]), (ALICE, theirs["id"]), (SUPERVISOR, mine["id"])):
        answer = await client.delete(f"/api/grants/{grant_id}", headers=who)
        assert answer.status == 404 and (await answer.json())["error"]["code"] == "grant_not_found"
    for who, grant_id in ((ALICE, mine["id"]), (SUPERVISOR, theirs["id"])):
        answer = await client.delete(f"/api/grants/{grant_id}", headers=who)
        assert answer.status == 200
        assert (await client.delete(f"/api/grants/{grant_id}", headers=who)).status == 404
    assert await listed(client, ALICE) == [] and await listed(client, SUPERVISOR) == []


async def test_at_most_max_per_owner_grants(client: TestClient) -> None:
    for chat in ("a", "b"):
        assert (await grant(client, ALICE, tool="pay", chat_id=chat))[0] == 201
    status, body = await grant(client, ALICE, tool="pay", chat_id="c")
    assert (status, body["error"]["code"]) == (429, "too_many_grants")
    # Another user's are their own.
    assert (await grant(client, BOB, tool="pay", chat_id="c"))[0] == 201


async def test_unauthenticated_is_refused(client: TestClient) -> None:
    answer = await client.post("/api/grants", json={"agent": "support_agent", "tool": "pay", "ttl": 60, "chat_id": "c"})
    assert answer.status == 401
    assert (await client.get("/api/grants")).status == 401


STAFF_ONLY = """
internal:
  secret: s3cret
auth: {mode: api_key, api_keys: [{id: alice, key: k-alice}, {id: staff, key: k-staff}]}
agents:
  support_agent:
    upstream: {url: http://adk.invalid:8000, app_name: support_agent}
    tools: {pay: {approval: true}}
    access: {api_keys: [staff]}
"""


async def test_a_user_cannot_grant_on_an_agent_they_may_not_use() -> None:
    # Their calls could never come from that agent: refused as the chat routes refuse it, nothing kept.
    async with api_client(STAFF_ONLY) as client:
        status, answer = await grant(client, ALICE, tool="pay", chat_id="c")
        assert (status, answer["error"]["code"]) == (403, "agent_not_allowed"), answer
        assert await listed(client, ALICE) == []
        status, answer = await grant(client, {"Authorization": "Bearer k-staff"}, tool="pay", chat_id="c")
        assert status == 201, answer
