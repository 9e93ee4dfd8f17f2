"""The fault table's approver rows: approvals that wait for a supervisors group outlive every process.

The rig of test_durable_approvals.py (replicas A and B on a real redis-server, the stock ADK API
server with the plugin behind a balancer, ADK on a SQLite session file, a ledger of real
executions; all but the replicas the suite's `on_sqlite`), with a rule that hands payments above 1,000 to the supervisors, two of whom must approve
(`quorum: 2`, four-eyes). Each row: four such approvals pending (chats on A and on B; each requester
left its page), the first supervisor's vote cast on each, then the fault. Afterwards each approval is
still listed by `GET /api/approvals` with the same id and that vote; the second supervisor's answer,
through either replica, decides it (one needs no third vote); an approved payment runs exactly once,
a denied one never; and the requester's resume reads the outcome (docs/approvals.md, "What survives
what").
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.ops.checks import new_chat, user
from tests.ops.stack import Replicas, Upstream, replicas
from tests.ops.test_durable_approvals import kill, restart_adk, rolling_restart
from tests.procs import DEMO_TOOLS, request

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

KEYS = {"sup1": "supervisor-one-key-for-tests", "sup2": "supervisor-two-key-for-tests"}
APPROVERS = f"""approvers:
  api_keys:
    - {{id: sup1, key: {KEYS['sup1']}}}
    - {{id: sup2, key: {KEYS['sup2']}}}
  groups:
    supervisors:
      users: [sup1, sup2]
"""
LARGE = """      - name: large
        when: args.amount > 1000
        decide: ask
        approvers: supervisors
        self_approval: false
        quorum: 2
"""


def tools_with_supervisors() -> str:
    denied = "        reason: Payments of 10,000 or more are refused.\n"
    assert denied in DEMO_TOOLS
    return DEMO_TOOLS.replace(denied, denied + LARGE, 1)


def approvers_api(base: str, method: str, path: str, who: str, body: dict[str, Any] | None = None) -> Any:
    return request(base, method, path, body, headers={"Authorization": f"Bearer {KEYS[who]}"})


def _ask_and_leave(r: Replicas, name: str, amount: int) -> str:
    """A requester on replica `name` asks for a large payment, sees it wait for the supervisors, and leaves."""
    chat = new_chat()
    gw = r.replica(name)
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
    body = json.dumps({"id": chat, "messages": [user(f"pay {amount} to Hanako")]})
    conn.request("POST", "/api/chat", body, {"Content-Type": "application/json", "x-ai-sdk-version": "7", **r.headers})
    stream = conn.getresponse()
    assert stream.status == 200
    seen = b""
    while b'"data-approval"' not in seen:
        got = stream.read1(4096)
        assert got, seen[-500:]
        seen += got
    assert b"tool-approval-request" not in seen, "the requester must not be asked"
    conn.close()
    return chat


def listed(base: str, count: int, timeout: float = 30) -> dict[str, dict[str, Any]]:
    """The pending approvals by chat, once `count` are listed (the replicas list them as ADK asks)."""
    deadline = time.monotonic() + timeout
    while True:
        reply = approvers_api(base, "GET", "/api/approvals?state=pending&limit=100", "sup1")
        assert reply.status == 200, reply.body
        found = {a["chat_id"]: a for a in reply.json()["approvals"]}
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def _resumed(base: str, chat: str, timeout: float = 30) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        reply = request(base, "GET", f"/api/chat/{chat}/stream", headers={"x-ai-sdk-version": "7"})
        kinds = [json.loads(line[6:])["type"] for line in reply.body.decode().splitlines() if line.startswith("data: {")]
        if any(k in kinds for k in ("tool-output-available", "tool-output-denied")) or time.monotonic() > deadline:
            return kinds
        time.sleep(0.3)


def _all_at_once(r: Replicas) -> None:
    kill(r.a)
    kill(r.b)
    r.agent.kill()
    r.agent.start()
    r.start_again("a")
    r.start_again("b")


def _both_killed(r: Replicas) -> None:
    kill(r.a)
    kill(r.b)
    r.start_again("a")
    r.start_again("b")


FAULTS: dict[str, Callable[[Replicas], None]] = {
    "kill_9_of_both_replicas": _both_killed, "rolling_restart": rolling_restart, "adk_restart": restart_adk,
    "all_at_once": _all_at_once,
}


@pytest.mark.chaos  # about 30 s a row: `make chaos`
@pytest.mark.parametrize("fault", list(FAULTS))
def test_approvals_waiting_for_supervisors_survive(tmp_path: Path, on_sqlite: Upstream, fault: str) -> None:
    with replicas(tmp_path, on=on_sqlite, approvals="confirm", tools=tools_with_supervisors(), extra=APPROVERS) as r:
        chats = [_ask_and_leave(r, name, 2000 + i) for i, name in enumerate(("a", "b", "a", "b"))]
        before = listed(r.a.base, len(chats))
        assert set(before) == set(chats), before
        for chat in chats:  # the first supervisor approves each: counted, not decided (quorum 2)
            first = approvers_api(r.b.base, "POST", f"/api/approvals/{before[chat]['id']}", "sup1", {"approved": True})
            assert first.status == 200 and first.json()["state"] == "pending", first.body
        assert r.ledger.lines() == []

        FAULTS[fault](r)

        after = listed(r.b.base, len(chats))
        assert {c: a["id"] for c, a in after.items()} == {c: a["id"] for c, a in before.items()}, "same ids"
        assert all(len(a["votes"]) == 1 for a in after.values()), "the first vote survived"
        for i, chat in enumerate(chats):
            approved = i != 3
            via = r.replica("ab"[i % 2]).base
            second = approvers_api(via, "POST", f"/api/approvals/{after[chat]['id']}", "sup2", {"approved": approved})
            assert second.status == 200 and second.json()["outcome"] == ("approved" if approved else "denied"), second.body
        for i, chat in enumerate(chats):
            kinds = _resumed(r.replica("ba"[i % 2]).base, chat)
            assert ("tool-output-available" if i != 3 else "tool-output-denied") in kinds, (chat, kinds)
            assert len(r.ledger.of(chat)) == (1 if i != 3 else 0), chat
        time.sleep(1.0)  # no late second run
        for i, chat in enumerate(chats):
            assert len(r.ledger.of(chat)) == (1 if i != 3 else 0), chat
        r.ledger.assert_no_double_execution()
        assert approvers_api(r.a.base, "GET", "/api/approvals?state=pending", "sup1").json()["approvals"] == []
