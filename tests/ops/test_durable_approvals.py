"""Issue 25's fault table: approvals that outlive every process, in confirm mode.

The production topology in miniature (stack.replicas): replicas A and B on a real redis-server, the
stock ADK API server with the plugin behind a round-robin balancer, the agent with
`upstream.approvals: confirm` (the plugin asks ADK's own tool confirmation, so a pending approval
is a record in ADK's session, docs/approvals.md "Confirm mode"), and ADK on a SQLite session file
(what `make run` gives it). Browsers reach the replicas directly or through a second balancer, as a
page behind a load balancer does. Each row starts its own replicas; the ADK server, Redis and the
plugin's balancer are the suite's `on_sqlite` (tests/ops/conftest.py), shared with
test_durable_approver_calls.py, but for row 3's, whose responses must last.

Each test is one row, with approvals pending on both replicas (chats owned by each): the fault,
then every person answers. Each row asserts with the ledger of real executions:

- 0 lost: every pending approval is still answerable, and its answer reaches ADK: an approved
  payment runs exactly once (its continuation streams `tool-output-available`), a denied one never
  (`tool-output-denied`);
- 0 double executions: a replay of each answer, on either replica, runs nothing again (410), and
  the ledger has exactly the payments ADK recorded as successful.

The whole table runs in `make chaos`; the critical rows (a replica killed, everything at once with
racing answers, and the stock ai 7 Chat clicking Approve after its replica was killed) also run in
`make test`, which deselects the rest (marker `chaos`). On this venv's ADK (2.13) unless
OPS_ADK_VERSION names another release (e.g. `OPS_ADK_VERSION=1.22.1 make chaos`; every row passes on
1.22.1 too, where ADK runs a confirmed tool again for a replayed answer, so the gateway's own
refusal of replays is what keeps the ledger at one).
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.jsdriver import run_chat
from tests.ops.checks import Browser, Stream, answer, assert_one_terminal, assert_sdk_clean, new_chat, types_of, user
from tests.ops.stack import Balancer, Replicas, Upstream, ops_adk, payment_responses, replicas, upstream, wait_until
from tests.procs import GatewayProcess, metric_value, request

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

Chunks = list[dict[str, Any]]
# The demo quotes this in ~24 deltas, one per DEMO_CHUNK_DELAY: a response that outlasts a moment.
LONG_TEXT = "please repeat after me " + " ".join(f"word{i}" for i in range(60))


@dataclass
class Pending:
    """A chat whose first response ended waiting for the person's answer to a payment."""

    chat: str
    message: dict[str, Any]
    first: Chunks
    approved: bool
    owner: str  # "a" or "b": the replica the chat started on
    amount: int

    def reply(self) -> dict[str, Any]:
        return answer(self.first, self.approved)


@dataclass
class Rig:
    r: Replicas
    front: Balancer  # the browsers' balancer over both replicas' public ports

    @property
    def front_url(self) -> str:
        return self.front.url


@contextmanager
def confirm_stack(tmp: Path, on: Upstream, *, prefer: str | None = None, idle_chat_ttl: str = "1h") -> Iterator[Rig]:
    """Replicas in confirm mode on `on` (ADK on SQLite: the suite's `on_sqlite`, or a row's own),
    the plugin and the browsers each behind a balancer."""
    with replicas(tmp, on=on, approvals="confirm", idle_chat_ttl=idle_chat_ttl) as r:
        front = Balancer({"a": r.a.port, "b": r.b.port}, prefer=prefer)
        front.start()
        try:
            yield Rig(r, front)
        finally:
            front.stop()
        r.ledger.assert_no_double_execution()


def base(r: Replicas, name: str) -> str:
    return r.replica(name).base


def ask(r: Replicas, name: str, amount: int, approved: bool) -> Pending:
    """A chat started on replica `name` whose payment of `amount` waits for the person."""
    chat, message = new_chat(), user(f"pay {amount} to Hanako")
    first = Browser(r.headers).post(base(r, name), chat, [message])
    assert first.status == 200, first.body
    chunks = assert_one_terminal(first, error=False)
    assert types_of(chunks)[-3:] == ["tool-approval-request", "finish-step", "finish"], types_of(chunks)
    request_chunk = next(c for c in chunks if c["type"] == "tool-approval-request")
    # ADK's own confirmation: the pending approval is a record in ADK's session, nothing held open.
    assert request_chunk["approvalId"].startswith("adk-"), request_chunk
    return Pending(chat, message, chunks, approved, name, amount)


def pending_on_both(r: Replicas, per_replica: int = 2) -> list[Pending]:
    """`per_replica` chats owned by each replica, approved and denied in turn."""
    out = []
    for i in range(per_replica):
        for name in ("a", "b"):
            out.append(ask(r, name, 10 + len(out), approved=i % 2 == 0))
    assert r.ledger.lines() == []
    return out


def send_answer(r: Replicas, url: str, p: Pending) -> Stream:
    reply = p.reply()
    return Browser(r.headers).post(url, p.chat, [p.message, reply], messageId=reply["id"])


def assert_continued(p: Pending, stream: Stream) -> Chunks:
    """The answer reached ADK: the continuation of the same message, the payment run or refused."""
    assert stream.status == 200, (p.chat, stream.status, stream.body[-1500:])
    chunks = assert_one_terminal(stream, error=False)
    assert chunks[0] == {"type": "start", "messageId": p.reply()["id"]}, chunks[:2]
    if p.approved:
        assert chunks[1]["type"] == "tool-output-available" and chunks[1]["output"]["success"] is True, chunks[:3]
    else:
        assert chunks[1]["type"] == "tool-output-denied", chunks[:3]
    return chunks


def assert_kept(rig: Rig, pendings: list[Pending]) -> None:
    """0 lost, 0 double: each approved payment ran once, each denied one never, as ADK recorded;
    a replay of each answer, on either replica (that runs), is refused and runs nothing."""
    r = rig.r
    for p in pendings:
        ran = r.ledger.of(p.chat)
        assert len(ran) == (1 if p.approved else 0), (p, ran)
        r.ledger.assert_matches(p.chat, payment_responses(r.adk, p.chat, r.user))
    alive = [name for name in ("a", "b") if r.replica(name).proc.poll() is None]
    for p in pendings[:2]:
        for name in alive:
            replay = send_answer(r, base(r, name), p)
            assert replay.status == 410 and replay.json()["error"]["code"] == "approval_gone", replay.body
    for p in pendings:
        assert len(r.ledger.of(p.chat)) == (1 if p.approved else 0)
    r.ledger.assert_no_double_execution()
    # Nothing counted lost either, by the replicas that run now.
    for name in alive:
        gw = r.replica(name)
        assert metric_value(gw.base, "adk_gateway_owner_lost_total", {"what": "approval"}) == 0
        assert not [line for line in gw.log_lines() if line.get("event") == "native_approval_lost"]


def answer_all(rig: Rig, pendings: list[Pending], via: dict[str, str]) -> list[Chunks]:
    """Every person answers, through `via[owner]` ("a", "b" or "front"); each continuation checked."""
    out = []
    for p in pendings:
        where = via[p.owner]
        url = rig.front_url if where == "front" else base(rig.r, where)
        out.append(assert_continued(p, send_answer(rig.r, url, p)))
    return out


def kill(gw: GatewayProcess) -> None:
    gw.proc.kill()
    gw.proc.wait()


def rolling_restart(r: Replicas) -> None:
    """SIGTERM each replica in turn (default drain), each back and ready before the next."""
    for name in ("a", "b"):
        gw = r.replica(name)
        gw.proc.send_signal(signal.SIGTERM)
        assert gw.proc.wait(timeout=40) == 0
        r.start_again(name)


def restart_adk(r: Replicas) -> None:
    """kill -9 of the ADK server, started again on the same port and the same SQLite file."""
    r.agent.kill()
    r.agent.start()
    for gw in (r.a, r.b):
        wait_until(lambda gw=gw: request(gw.base, "GET", "/readyz").status == 200, f"{gw.base} ready after ADK", 30)


# ---- the rows --------------------------------------------------------------------------------


def test_kill_9_of_one_replica_loses_no_approval(tmp_path: Path, on_sqlite: Upstream) -> None:
    """Row 1: A is killed with approvals pending on A and on B. Every one is answered at once,
    A's through B and B's through the browsers' balancer: each approved call runs exactly once."""
    with confirm_stack(tmp_path, on_sqlite) as rig:
        r = rig.r
        pendings = pending_on_both(r)
        started = time.monotonic()
        kill(r.a)
        ends = answer_all(rig, pendings, {"a": "b", "b": "front"})
        assert_sdk_clean(pendings[0].first, ends[0], approved=pendings[0].approved)
        assert_kept(rig, pendings)
        print(f"row 1: {len(pendings)} pending, answered in {time.monotonic() - started:.1f}s")


@pytest.mark.chaos
def test_kill_9_of_every_replica_then_start_them_loses_no_approval(tmp_path: Path, on_sqlite: Upstream) -> None:
    """Row 2: both replicas killed, then started again (empty memories): every approval answered."""
    with confirm_stack(tmp_path, on_sqlite) as rig:
        r = rig.r
        pendings = pending_on_both(r)
        kill(r.a)
        kill(r.b)
        r.start_again("a")
        r.start_again("b")
        answer_all(rig, pendings, {"a": "b", "b": "a"})
        assert_kept(rig, pendings)


@pytest.mark.chaos
def test_rolling_restart_loses_no_approval(tmp_path: Path) -> None:
    """Row 3: SIGTERM to A while it streams a long response, and A's approvals are answered
    through B during A's drain; A back; then the same for B, whose approvals are answered after
    it is back: every approval answered, the other replica's included. Its own ADK server, whose
    responses last (a chunk every 0.1 s)."""
    with upstream(
        tmp_path, adk_sessions=tmp_path / "sessions.db", adk=ops_adk(), adk_env={"DEMO_CHUNK_DELAY": "0.1"},
    ) as slow, confirm_stack(tmp_path, slow) as rig:
        r = rig.r
        pendings = pending_on_both(r)
        for name, during, after in (("a", "b", None), ("b", None, "front")):
            gw = r.replica(name)
            streaming = Browser(r.headers).send(gw.base, new_chat(), [user(LONG_TEXT)])
            assert streaming.status == 200, streaming.body
            streaming.until(lambda c: c["type"] == "text-delta")
            gw.proc.send_signal(signal.SIGTERM)
            wait_until(lambda gw=gw: request(gw.base, "GET", "/readyz").status == 503, f"{name} draining", 5, every=0.01)
            if during is not None:
                # The drain waits for the stream; meanwhile the chats waiting on ADK are B's to take.
                answer_all(rig, [p for p in pendings if p.owner == name], {name: during})
                assert gw.proc.poll() is None, "the drain ended before the answers: they did not test it"
            assert "word59" in "".join(c.get("delta", "") for c in assert_one_terminal(streaming.rest(), error=False))
            assert gw.proc.wait(timeout=40) == 0
            r.start_again(name)
            if after is not None:
                answer_all(rig, [p for p in pendings if p.owner == name], {name: after})
        assert_kept(rig, pendings)


@pytest.mark.chaos
def test_adk_restart_on_sqlite_loses_no_approval(tmp_path: Path, on_sqlite: Upstream) -> None:
    """Row 4: the ADK server killed (-9) and started again on the same SQLite file."""
    with confirm_stack(tmp_path, on_sqlite) as rig:
        r = rig.r
        pendings = pending_on_both(r)
        restart_adk(r)
        answer_all(rig, pendings, {"a": "a", "b": "front"})
        assert_kept(rig, pendings)


def race(rig: Rig, p: Pending) -> tuple[Stream, Stream]:
    """The same answer sent at once to A and to B (a double click, two tabs, a client retry).

    Sent again, as a person would click again, while both are refused 503 "retry in a moment": for
    `owner_timeout` after every replica was down, a chat whose owner has no heartbeat is not taken
    over (docs/scaling.md, "settling"), and the replicas, started together, are back within it.
    """
    for _ in range(20):
        results: dict[str, Stream] = {}
        go = threading.Barrier(2)

        def send(name: str) -> None:
            go.wait()
            results[name] = send_answer(rig.r, base(rig.r, name), p)

        threads = [threading.Thread(target=send, args=(name,)) for name in ("a", "b")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        if not all(s.status == 503 and s.json()["error"]["code"] == "sessions_unavailable" for s in results.values()):
            break
        time.sleep(0.25)
    return results["a"], results["b"]


def test_everything_at_once_then_racing_answers(tmp_path: Path, on_sqlite: Upstream) -> None:
    """Row 5: A killed (-9), ADK killed (-9), B stopped (SIGTERM, default drain), all started
    again, then each answer sent racing on both replicas: exactly one of each pair continues the
    message, the other is refused (409 or 410) or reads that same continuation; nothing runs
    twice, nothing is lost."""
    with confirm_stack(tmp_path, on_sqlite) as rig:
        r = rig.r
        pendings = pending_on_both(r)
        everything_at_once(r)
        outcomes = []
        for p in pendings:
            pair = race(rig, p)
            outcomes.append([(s.status, s.json()["error"]["code"] if s.status != 200 else types_of(s.chunks)[1]) for s in pair])
            won = [s for s in pair if s.status == 200 and "tool-output-available" in types_of(s.chunks) or
                   s.status == 200 and "tool-output-denied" in types_of(s.chunks)]
            assert won, [(s.status, s.body[-600:]) for s in pair]
            assert_continued(p, won[0])
            for other in pair:
                if other is won[0]:
                    continue
                if other.status == 200:
                    # The same continuation, read as the other browser reads it.
                    assert types_of(assert_one_terminal(other)) == types_of(won[0].chunks), other.body[-600:]
                else:
                    assert other.status in (409, 410), (other.status, other.body)
                    assert other.json()["error"]["code"] in ("chat_busy", "approval_gone"), other.body
        print("row 5 races:", outcomes)
        assert_kept(rig, pendings)


@pytest.mark.chaos
def test_an_approval_answered_after_a_long_wait_runs_once(tmp_path: Path, on_sqlite: Upstream) -> None:
    """Row 6, two hours scaled down: the chats' idle timer (`chat.idle_chat_ttl`, 2 s here) passes
    many times over, in the replicas' memories and in Redis, and both replicas restart, before
    the person answers: each approval still runs once (or never, denied)."""
    with confirm_stack(tmp_path, on_sqlite, idle_chat_ttl="2s") as rig:
        r = rig.r
        pendings = pending_on_both(r)
        # Forgotten everywhere: the idle sweeper dropped the chats, Redis expired their records.
        wait_until(lambda: any("idle_chats_forgotten" in gw.log_text() for gw in (r.a, r.b)), "the idle sweep", 15)
        time.sleep(3)  # past the records' TTL in Redis too
        rolling_restart(r)
        answer_all(rig, pendings, {"a": "b", "b": "front"})
        assert_kept(rig, pendings)


# ---- a stock AI SDK Chat that still shows Approve/Deny -----------------------------------------


def everything_at_once(r: Replicas) -> None:
    """Row 5's fault: kill -9 of A and of ADK, SIGTERM to B, then all started again."""
    kill(r.a)
    r.agent.kill()
    r.b.proc.send_signal(signal.SIGTERM)
    assert r.b.proc.wait(timeout=40) == 0
    r.agent.start()
    r.start_again("a")
    r.start_again("b")


@pytest.mark.js
@pytest.mark.parametrize(("version", "fault", "transport"), [
    pytest.param(6, "owner_killed", "sse", marks=pytest.mark.chaos),
    (7, "owner_killed", "sse"),
    pytest.param(7, "owner_killed", "ws", marks=pytest.mark.chaos),
    pytest.param(7, "everything_at_once", "sse", marks=pytest.mark.chaos),
])
def test_a_stock_chat_answers_after_the_fault(
    tmp_path: Path, on_sqlite: Upstream, version: int, fault: str, transport: str,
) -> None:
    """Item 5: the page's Chat (ai 6, ai 7), behind the browsers' balancer, shows the approval its
    replica (A) asked for; then the fault (`owner_killed`: row 1, A killed; `everything_at_once`:
    row 5's); the person clicks Approve: the answer reaches ADK, the continuation streams through
    the SDK's own parser, the payment runs once."""
    hold = tmp_path / "answer"
    with confirm_stack(tmp_path, on_sqlite, prefer="a") as rig:
        r = rig.r
        others = [ask(r, "b", 30, approved=True)]
        result: dict[str, Any] = {}
        driver = threading.Thread(target=lambda: result.update(run_chat(
            version, f"{rig.front_url}/api/chat", keep_going_after_error=True, timeout=90, headers=r.headers,
            steps=[{"send": "pay 50 to Hanako", "approvals": "approve", "holdAnswersUntil": str(hold)}],
            transport=transport, ws_url=rig.front_url.replace("http", "ws", 1) + "/api/chat/ws",
        )))
        driver.start()
        ready = hold.with_name(hold.name + ".ready")
        wait_until(lambda: ready.exists() or not driver.is_alive(), "the approval to reach the Chat", 60)
        assert ready.exists(), result
        assert rig.front.connections["a"] >= 1 and rig.front.connections["b"] == 0
        if fault == "owner_killed":
            kill(r.a)
        else:
            everything_at_once(r)
        hold.write_text("")
        driver.join(120)
        assert result, "the chat driver did not report"
        assert not result["schemaErrors"], result["schemaErrors"]
        assert result["stepErrors"] == [None] and result["ok"], result["error"]
        assert "Done: sent 50 USD to Hanako" in json.dumps(result["messages"][-1])
        paid = [line for line in r.ledger.lines() if line["args"]["amount"] == 50]
        assert len(paid) == 1, r.ledger.lines()
        answer_all(rig, others, {"b": "front"})
        r.ledger.assert_no_double_execution()
