"""The operations fault suite: each test is one row of docs/operations.md's "Failure modes" table.

Two replicas on a real redis-server, the stock ADK API server with the plugin behind a round-robin
balancer (stack.Balancer), and the agent's ledger of real payments. Every scenario asserts, whatever
it breaks:

- zero double executions: the ledger has at most one line per call and per payment, and exactly
  the payments ADK recorded as successful (checks.Ledger);
- one clean end for every browser: `finish`, or one `error` then `finish`, nothing after, and
  every chunk through the AI SDK's own parser (checks.assert_one_terminal, assert_sdk_clean);
- the metric (or log event) an operator would see move.

Scenarios that leave the stack whole share one (`shared`, with API keys on); those that kill or
stop a replica or Redis get their own replicas, on an ADK server (and Redis) they share with the
other rows of its configuration (stack.Upstream: `balanced`, tests/ops/conftest.py, and `slow`
here): a pair of replicas starts in ~2 s, a whole stack in ~5 s.

The rows whose subject is a call held open while it waits (an owner killed or Redis restarted with
the plugin's request held, the plugin giving up) run on a live upstream, whose path that is; the
others on `/run_sse`'s default, where a pending approval is ADK's confirmation in its session (the
run ends with the request, the answer starts a new one; its own table: test_durable_approvals.py).
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.ops.checks import (
    Browser, Stream, answer, said, assert_one_terminal, assert_sdk_clean, new_chat, text_of, types_of, user,
)
from tests.ops.stack import Replicas, Upstream, payment_responses, redis_calls, replicas, upstream, wait_ready, wait_until
from tests.procs import GatewayProcess, metric_value, request

pytestmark = pytest.mark.integration

# The held path (the plugin's requests held open while a person decides) is a live upstream's.
HELD = "live"
MAX_WAIT = 4  # the plugin's ADK_GATEWAY_MAX_WAIT in the row where it gives up, seconds
# The demo quotes this in ~14 deltas, one per DEMO_CHUNK_DELAY: a stream that lasts long enough
# to break it mid-way.
LONG_TEXT = "please repeat after me " + " ".join(f"word{i}" for i in range(36))
KEYS = {"ops": "key-ops"}
RESET = "The agent service failed: the agent service closed the connection mid-stream"
# The demo's delay between chunks on `slow`: LONG_TEXT streams for ~3 s, longer than the short
# drain (1 s), shorter than the long one (20 s).
CHUNK_DELAY = "0.2"


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    """The ADK server that streams a chunk every CHUNK_DELAY, the plugin behind the balancer, giving
    up on a call held MAX_WAIT (only the held path holds one: the other rows here run on /run_sse,
    whose pending approval is ADK's confirmation)."""
    with upstream(
        tmp_path_factory.mktemp("ops-slow"), adk_env={"DEMO_CHUNK_DELAY": CHUNK_DELAY, "ADK_GATEWAY_MAX_WAIT": str(MAX_WAIT)},
    ) as up:
        yield up


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory, slow: Upstream) -> Iterator[Replicas]:
    with replicas(tmp_path_factory.mktemp("ops-shared"), on=slow, api_keys=KEYS) as r:
        yield r
        r.ledger.assert_no_double_execution()


# ---- helpers -----------------------------------------------------------------------------------


def metric(gw: GatewayProcess, name: str, **labels: str) -> float:
    return metric_value(gw.base, f"adk_gateway_{name}", labels)


Chunks = list[dict[str, Any]]


def start_payment(r: Replicas, gw: GatewayProcess, text: str = "pay 50 to Hanako") -> tuple[str, dict[str, Any], Chunks]:
    """A new chat on `gw` whose first response ends waiting for the person's approval."""
    chat, message = new_chat(), user(text)
    first = Browser(r.headers).post(gw.base, chat, [message])
    assert first.status == 200, first.body
    chunks = assert_one_terminal(first, error=False)
    assert types_of(chunks)[-3:] == ["tool-approval-request", "finish-step", "finish"], types_of(chunks)
    return chat, message, chunks


def approve(r: Replicas, gw: GatewayProcess, chat: str, message: dict[str, Any], first: list[dict[str, Any]]) -> Stream:
    reply = answer(first)
    return Browser(r.headers).post(gw.base, chat, [message, reply], messageId=reply["id"])


def answered(r: Replicas, chat: str, count: int = 1, timeout: float = 15) -> list[dict[str, Any]]:
    """ADK's answers to the chat's payment calls, once it has `count` of them: a call is answered
    after the tool ran or was refused, so an answer with no ledger line is a call that never ran."""
    def found() -> list[dict[str, Any]] | None:
        responses = payment_responses(r.adk, chat, r.user)
        return responses if len(responses) >= count else None

    return wait_until(found, f"ADK to answer {count} payment call(s) of {chat}", timeout)


def owned_by(r: Replicas, owner: GatewayProcess) -> tuple[str, list[dict[str, Any]]]:
    """A chat that `owner` runs (one short tool turn there), and its history."""
    chat, opening = new_chat(), user("weather in Osaka")
    first = Browser(r.headers).post(owner.base, chat, [opening])
    assert first.status == 200 and "Osaka" in text_of(first.chunks), first.body
    return chat, [opening, said(first.chunks)]


def long_stream(r: Replicas, via: GatewayProcess, chat: str, history: list[dict[str, Any]]) -> tuple[Chunks, Stream]:
    """The chat's next response (LONG_TEXT, ~14 deltas) through `via`, read up to its first text;
    the history that asked for it."""
    history = [*history, user(LONG_TEXT)]
    stream = Browser(r.headers).send(via.base, chat, history)
    assert stream.status == 200, stream.body
    stream.until(lambda c: c["type"] == "text-delta")
    return history, stream


def log_events(gw: GatewayProcess, event: str) -> list[dict[str, Any]]:
    return [line for line in gw.log_lines() if line.get("event") == event]


# ---- a replica dies (kill -9) with approvals pending -------------------------------------------


@pytest.mark.parametrize("plugin_at", ["other", "owner"])
def test_owner_killed_with_approvals_pending(tmp_path: Path, balanced: Upstream, plugin_at: str) -> None:
    """A (the owner) is killed while two payments wait for a person, each call held in its live
    session. `plugin_at`: the balancer put the plugin's requests on B (forwarded to A) or on A itself."""
    with replicas(tmp_path, on=balanced, prefer="b" if plugin_at == "other" else "a", upstream_mode=HELD) as r:
        browser = Browser(r.headers)
        lost = {what: metric(r.b, "owner_lost_total", what=what) for what in ("approval", "gated_call", "run")}
        chat1, msg1, first1 = start_payment(r, r.a, "pay 50 to Hanako")
        chat2, _, first2 = start_payment(r, r.a, "pay 60 to Kenji")
        r.a.proc.kill()
        r.a.proc.wait()
        # An Approve landing at once cannot tell a dead A from a slow one: B holds it until A is
        # known dead (owner_timeout + heartbeat_interval), then takes the chat over and answers it
        # itself: a clear 410 (the call died with A).
        early = approve(r, r.b, chat1, msg1, first1)
        assert early.status == 410 and early.json()["error"]["code"] == "approval_gone", early.body
        assert "stopped" in early.json()["error"]["message"]

        if plugin_at == "other":
            wait_until(lambda: metric(r.b, "owner_lost_total", what="gated_call") >= lost["gated_call"] + 2,
                       "B to release the two calls it held for A")
        else:
            # A's connection to ADK died with A: ADK aborts the runs. The plugin's connection broke
            # too, and a plugin that asks again before ADK cancels it (asking.py) reaches B, which
            # finds the owner dead and refuses the call, counting it: zero, one or both calls,
            # depending on that race. Nothing runs either way (the ledger, below).
            held = metric(r.b, "owner_lost_total", what="gated_call")
            assert lost["gated_call"] <= held <= lost["gated_call"] + 2

        # Its retry: the same 410, nothing runs.
        late = approve(r, r.b, chat1, msg1, first1)
        assert late.status == 410 and late.json()["error"]["code"] == "approval_gone", late.body
        # A reload of the other chat's page: the lost run, said once.
        gone = browser.resume(r.b.base, chat2)
        assert gone.status == 410 and gone.json()["error"]["code"] == "run_lost", gone.body
        assert browser.resume(r.b.base, chat2).status == 204
        assert metric(r.b, "owner_lost_total", what="approval") >= lost["approval"] + 1
        assert metric(r.b, "owner_lost_total", what="run") >= lost["run"] + 2

        # Both calls' live sessions went with A: ADK's session holds each call, never answered.
        for chat in (chat1, chat2):
            assert payment_responses(r.adk, chat, r.user) == []
        # The chats go on on B, gated payments included (the plugin now reaches B). B's new live
        # session answers the session's dangling turn first, as the model's next connection does:
        # the payment is asked anew, a new call and a new approval (the lost one stays lost).
        again = browser.post(r.b.base, chat1, [msg1, answer(first1), user("weather in Tokyo")])
        assert again.status == 200, again.body
        chunks = assert_one_terminal(again, error=False)
        asked = next(c for c in chunks if c["type"] == "tool-input-available")
        [shown] = [c for c in chunks if c["type"] == "tool-approval-request"]
        assert asked["input"] == {"amount": 50, "recipient": "Hanako", "currency": "USD"}, asked
        old = next(c for c in first1 if c["type"] == "tool-approval-request")
        assert asked["toolCallId"] != old["toolCallId"] and shown["approvalId"] not in (old["approvalId"], None)
        assert_sdk_clean(first1, chunks)
        chat3, msg3, first3 = start_payment(r, r.b, "pay 70 to Hanako")
        paid = approve(r, r.b, chat3, msg3, first3)
        assert paid.status == 200 and assert_one_terminal(paid, error=False)[1]["type"] == "tool-output-available"

        assert r.ledger.of(chat1) == [] and r.ledger.of(chat2) == []
        for chat in (chat1, chat2, chat3):
            r.ledger.assert_matches(chat, payment_responses(r.adk, chat, r.user))
        assert len(r.ledger.of(chat3)) == 1
        r.ledger.assert_no_double_execution()


# ---- Redis restarts (empty) mid-approval --------------------------------------------------------


@pytest.mark.parametrize("plugin_at", ["other", "owner"])
def test_redis_restart_mid_approval(tmp_path: Path, balanced: Upstream, plugin_at: str) -> None:
    """Redis stops while a payment waits, and comes back empty. `plugin_at`: the plugin's request
    on B (forwarded to A, the path that depends on Redis most) or on A itself."""
    with replicas(tmp_path, on=balanced, prefer="b" if plugin_at == "other" else "a", upstream_mode=HELD) as r:
        browser = Browser(r.headers)
        chat, message, first = start_payment(r, r.a)
        if plugin_at == "other":
            # Redis stops while the call waits, not while B hands the plugin's request to A: B
            # holds the call once it polls the call's record (HGETALL, which only that wait uses).
            # Stopping Redis inside the hand-off itself (a few ms) is the known gap in
            # docs/operations.md's failure modes.
            wait_until(lambda: redis_calls(r.redis, "hgetall") >= 1, "B to hold the forwarded call", 5, every=0.02)
        r.redis.stop()
        for gw in (r.a, r.b):
            wait_until(lambda gw=gw: request(gw.base, "GET", "/readyz").json()["status"] == "sessions_unavailable",
                       f"{gw.base}/readyz to report Redis down", 10)
            assert request(gw.base, "GET", "/readyz").status == 503
            assert metric(gw, "sessions_backend_up") == 0
        refused = approve(r, r.b, chat, message, first)
        assert refused.status == 503 and refused.json()["error"]["code"] == "sessions_unavailable", refused.body
        assert refused.headers.get("retry-after")
        fresh = browser.post(r.b.base, new_chat(), [user("hello there")])
        assert fresh.status == 503 and fresh.json()["error"]["code"] == "sessions_unavailable", fresh.body
        assert r.ledger.of(chat) == []

        r.redis.start()  # back, and empty
        # Ready again only once the owners have had owner_timeout to write their chats back, and
        # /readyz says why meanwhile; from then on, the answer goes through at once.
        seen = set()
        deadline = time.monotonic() + 10
        while (status := request(r.b.base, "GET", "/readyz").json()["status"]) != "ready":
            seen.add(status)
            assert time.monotonic() < deadline, seen
            time.sleep(0.05)
        assert "sessions_restoring" in seen, seen
        wait_ready(r.a)
        for gw in (r.a, r.b):
            assert metric(gw, "sessions_backend_up") == 1
        second = approve(r, r.b, chat, message, first)
        assert second.status == 200, second.body
        chunks = assert_one_terminal(second, error=False)
        assert chunks[1]["type"] == "tool-output-available" and chunks[1]["output"]["success"] is True, chunks[:3]
        assert_sdk_clean(first, chunks)
        assert any(log_events(gw, "shared_state_reset") for gw in (r.a, r.b))

        # Replayed through either replica: nothing more runs.
        for gw in (r.a, r.b):
            replay = approve(r, gw, chat, message, first)
            assert replay.status == 410 and replay.json()["error"]["code"] == "approval_gone", replay.body
        assert len(r.ledger.of(chat)) == 1
        r.ledger.assert_matches(chat, payment_responses(r.adk, chat, r.user))
        r.ledger.assert_no_double_execution()


# ---- SIGTERM on a replica with local and relayed streams (rolling restart) --------------------


@pytest.mark.parametrize("drain", ["long", "short"])
def test_sigterm_with_local_and_relayed_streams(tmp_path: Path, slow: Upstream, drain: str) -> None:
    """A is sent SIGTERM while it streams to a browser of its own and to one reading through B, and
    while a payment waits for a person (ADK's confirmation: its run has ended). `long`: the drain
    (20 s) outlasts the streams (~2.8 s); `short`: the drain (1 s) cuts them."""
    drain_timeout = "20s" if drain == "long" else "1s"
    with replicas(tmp_path, on=slow, drain_timeout=drain_timeout) as r:
        browser = Browser(r.headers)
        relayed_chat, relayed_history = owned_by(r, r.a)
        pending, pending_msg, pending_first = start_payment(r, r.a)
        local_chat = new_chat()
        local_history, local = long_stream(r, r.a, local_chat, [])
        relayed_history, relayed = long_stream(r, r.b, relayed_chat, relayed_history)
        signalled = time.monotonic()
        r.a.proc.send_signal(signal.SIGTERM)
        # Draining: out of rotation, refusing new work, still serving what runs.
        wait_until(lambda: request(r.a.base, "GET", "/readyz").status == 503, "A's /readyz to turn 503", 5, every=0.01)
        assert request(r.a.base, "GET", "/readyz").json()["status"] == "draining"
        assert metric(r.a, "draining") == 1
        refused = browser.post(r.a.base, new_chat(), [user("hello there")])
        assert refused.status == 503 and refused.json()["error"]["code"] == "draining", refused.body
        assert refused.headers.get("retry-after")

        ends = [assert_one_terminal(s.rest(), error=drain == "short") for s in (local, relayed)]
        assert r.a.proc.wait(timeout=int(drain_timeout[:-1]) + 15) == 0
        stopped_in = time.monotonic() - signalled
        # Both responses were streaming at the signal: one here, one relayed to B's browser.
        draining = log_events(r.a, "draining")
        assert draining and draining[0]["streams"] == 1 and draining[0]["relayed"] == 1, draining
        drained = log_events(r.a, "drained")
        if drain == "long":
            for chunks in ends:
                assert "word35" in text_of(chunks)
            assert drained and drained[0]["cut_short"] == 0, drained
        else:
            for chunks in ends:
                assert "shutting down" in next(c for c in chunks if c["type"] == "error")["errorText"]
            assert drained and drained[0]["cut_short"] == 2 and drained[0]["relayed_cut_short"] == 1, drained
            # The drain's 1 s, then the bounded rest of the stop: well inside drain_timeout + 12 s.
            assert stopped_in < 1 + 5, stopped_in
        assert not log_events(r.a, "stop_forced") and not log_events(r.a, "stop_step_timed_out")
        for chunks in ends:
            assert_sdk_clean(chunks)
        # The waiting payment held nothing the drain could cancel: it waits in ADK's session, unanswered
        # (ADK's placeholder response alone).
        [waiting] = payment_responses(r.adk, pending, r.user)
        assert "requires confirmation" in waiting["error"] and r.ledger.lines() == [], waiting

        # B takes A's chats over at once (a clean stop deletes A's heartbeat): the late Approve runs
        # the payment once, and new messages run on B.
        late = approve(r, r.b, pending, pending_msg, pending_first)
        assert late.status == 200, late.body
        paid = assert_one_terminal(late, error=False)
        assert paid[1]["type"] == "tool-output-available" and paid[1]["output"]["success"] is True, paid[:3]
        assert_sdk_clean(pending_first, paid)
        for chat, history, chunks in ((local_chat, local_history, ends[0]), (relayed_chat, relayed_history, ends[1])):
            messages = [*history, said(chunks), user("weather in Tokyo")]
            again = browser.post(r.b.base, chat, messages)
            assert again.status == 200, again.body
            assert "Tokyo" in text_of(assert_one_terminal(again, error=False))
        assert len(r.ledger.of(pending)) == 1 and len(r.ledger.lines()) == 1, r.ledger.lines()
        r.ledger.assert_matches(pending, payment_responses(r.adk, pending, r.user))
        r.ledger.assert_no_double_execution()


# ---- the shared stack: ADK crash, reload, the plugin giving up ---------------------------------


@pytest.fixture
def held(tmp_path: Path, slow: Upstream) -> Iterator[Replicas]:
    """A live upstream's replicas, whose plugin waits (and gives up) on its held requests."""
    with replicas(tmp_path, on=slow, api_keys=KEYS, upstream_mode=HELD) as r:
        yield r
        r.ledger.assert_no_double_execution()


def test_plugin_gives_up_waiting(held: Replicas) -> None:
    """The plugin's ADK_GATEWAY_MAX_WAIT passes before the person answers: the call is refused and
    the late Approve, through the other replica, reads that refusal."""
    r = held
    tool_wait = {"tool": "process_payment", "outcome": "abandoned"}
    before = metric(r.a, "approval_wait_seconds_count", **tool_wait)
    chat, message, first = start_payment(r, r.a, "pay 80 to Hanako")
    wait_until(lambda: metric(r.a, "approval_wait_seconds_count", **tool_wait) >= before + 1,
               "the owner to learn that the plugin stopped waiting", MAX_WAIT + 10, every=0.2)
    [response] = answered(r, chat)
    assert "ADK_GATEWAY_MAX_WAIT" in response["error"], response

    late = approve(r, r.b, chat, message, first)
    assert late.status == 200, late.body
    chunks = assert_one_terminal(late, error=False)
    assert chunks[1]["type"] == "tool-output-error", chunks[:3]
    assert chunks[1]["errorText"].startswith(
        "Nobody decided within the plugin's longest wait (ADK_GATEWAY_MAX_WAIT"
    ), chunks[1]
    assert "tool-output-available" not in types_of(chunks)
    assert text_of(chunks).endswith("the call was not run.")
    assert_sdk_clean(first, chunks)
    assert metric(r.a, "policy_bypassed_total", tool="process_payment") == 0
    assert any(line.get("reason") == "max_wait" for line in log_events(r.a, "gated_call_abandoned"))
    assert r.ledger.of(chat) == []
    r.ledger.assert_no_double_execution()


def test_reload_good_bad_and_empty(shared: Replicas) -> None:
    """A lower cap applies; an empty file and a bad file are refused (422, the old config kept,
    auth still on, the payment still gated)."""
    r = shared
    original = {gw.port: gw.config_path.read_text() for gw in (r.a, r.b)}
    browser = Browser(r.headers)
    keyless = Browser()
    three = [user("hello"), user("there"), user("weather in Tokyo")]
    try:
        # Good, by SIGHUP on A: a lower cap on a request's messages. (Not a new key: a reload may
        # only narrow who gets in, gateway/config/loosening.py.)
        ok_before = metric(r.a, "config_reloads_total", result="success")
        r.a.config_path.write_text(original[r.a.port] + "limits:\n  max_messages: 2\n")
        r.a.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: metric(r.a, "config_reloads_total", result="success") >= ok_before + 1, "A's reload")
        assert browser.post(r.a.base, new_chat(), three).status == 413

        # Empty (A) and bad (B), through the internal listener: 422 with the problems.
        failed = {gw.port: metric(gw, "config_reloads_total", result="failure") for gw in (r.a, r.b)}
        r.a.config_path.write_text("")
        r.b.config_path.write_text(original[r.b.port] + "limits:\n  max_messages: lots\n")
        for name, gw in (("a", r.a), ("b", r.b)):
            refused = r.internal_post(name, "/internal/v1/reload")
            assert refused.status == 422 and refused.json()["result"] == "failure", refused.body
            assert refused.json()["problems"], refused.body
            assert metric(gw, "config_reloads_total", result="failure") == failed[gw.port] + 1
            assert any(line.get("level") == "error" for line in log_events(gw, "config_reload_failed"))
            # Fail closed: still no entry without a key.
            assert keyless.post(gw.base, new_chat(), [user("hello there")]).status == 401
        # A kept the good reload (the lower cap), B its start config.
        assert browser.post(r.a.base, new_chat(), three).status == 413
        assert browser.post(r.b.base, new_chat(), three).status == 200

        # The payment is still gated on both: it waits for the person, and runs once when approved.
        chat, message, first = start_payment(r, r.a, "pay 90 to Hanako")
        assert r.ledger.of(chat) == []
        paid = approve(r, r.b, chat, message, first)
        assert paid.status == 200 and assert_one_terminal(paid, error=False)[1]["type"] == "tool-output-available"
        assert_sdk_clean(first, paid.chunks)
        assert len(r.ledger.of(chat)) == 1
        r.ledger.assert_matches(chat, payment_responses(r.adk, chat, r.user))
    finally:
        # Back to the start config (a higher cap is no wider access, which a reload may give).
        for name, gw in (("a", r.a), ("b", r.b)):
            gw.config_path.write_text(original[gw.port])
            assert r.internal_post(name, "/internal/v1/reload").status == 200
    r.ledger.assert_no_double_execution()


def test_adk_crash_mid_stream(shared: Replicas) -> None:
    """The ADK server is killed (-9) while A streams to its own browser and to one reading through
    B, and while a payment waits (ADK's confirmation, in ADK's memory); then it comes back on the
    same port, empty."""
    r = shared
    browser = Browser(r.headers)
    resets = metric(r.a, "upstream_errors_total", kind="reset")
    missing = metric(r.a, "upstream_errors_total", kind="session_missing")
    relayed_chat, history = owned_by(r, r.a)
    pending, pending_msg, pending_first = start_payment(r, r.a, "pay 40 to Kenji")
    local_chat = new_chat()
    _, local = long_stream(r, r.a, local_chat, [])
    _, relayed = long_stream(r, r.b, relayed_chat, history)
    r.agent.kill()
    try:
        for stream in (local, relayed):
            chunks = assert_one_terminal(stream.rest(), error=True)
            assert next(c for c in chunks if c["type"] == "error")["errorText"] == RESET, chunks[-3:]
            assert_sdk_clean(chunks)
        assert metric(r.a, "upstream_errors_total", kind="reset") >= resets + 2
        for gw in (r.a, r.b):
            wait_until(lambda gw=gw: request(gw.base, "GET", "/readyz").json()["status"] == "upstream_unreachable",
                       f"{gw.base}/readyz to report ADK down", 10)
            assert metric(gw, "upstream_up") == 0
    finally:
        r.agent.start()
    for gw in (r.a, r.b):
        wait_ready(gw)
    # The payment's confirmation went with ADK's in-memory session: the late Approve is refused
    # before it reaches ADK, saying why, and nothing runs.
    late = approve(r, r.b, pending, pending_msg, pending_first)
    assert late.status == 410 and late.json()["error"]["code"] == "approval_gone", late.body
    assert "restarted and lost this approval" in late.json()["error"]["message"], late.body
    assert r.ledger.of(pending) == []

    # ADK lost its sessions with the crash; the chats go on (the gateway opens new ones).
    for chat in (local_chat, relayed_chat):
        again = browser.post(r.b.base, chat, [user("weather in Tokyo")])
        assert again.status == 200, again.body
        assert "Tokyo" in text_of(assert_one_terminal(again, error=False))
    assert metric(r.a, "upstream_errors_total", kind="session_missing") >= missing + 2
    assert len(log_events(r.a, "session_recreated")) >= 2
    chat, message, first = start_payment(r, r.a, "pay 45 to Kenji")
    paid = approve(r, r.b, chat, message, first)
    assert paid.status == 200 and assert_one_terminal(paid, error=False)[1]["type"] == "tool-output-available"
    assert len(r.ledger.of(chat)) == 1
    r.ledger.assert_matches(chat, payment_responses(r.adk, chat, r.user))
    r.ledger.assert_no_double_execution()


def test_a_websocket_ticket_from_one_replica_opens_a_socket_on_the_other_once(shared: Replicas) -> None:
    """A page asks A for a ticket and its socket lands on B (the balancer's choice): B takes it
    from Redis, the chat runs; the same ticket is worth nothing afterwards, on either replica."""
    r = shared
    ticket = request(r.a.base, "POST", "/api/chat/ws-ticket", headers=r.headers)
    assert ticket.status == 200, ticket.body
    value = ticket.json()["ticket"]

    async def chat_on(base: str, value: str) -> list[dict[str, Any]]:
        async with aiohttp.ClientSession() as http, http.ws_connect(f"{base}/api/chat/ws?ticket={value}") as ws:
            await ws.send_str(json.dumps({
                "type": "send", "requestId": "r1", "id": f"ticket-{value[-8:]}", "trigger": "submit-message",
                "messages": [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hello there"}]}],
                "headers": {}, "body": {},
            }))
            frames = []
            while (frame := json.loads(await asyncio.wait_for(ws.receive_str(), 30)))["type"] == "chunk":
                frames.append(frame["chunk"])
            assert frame == {"type": "end", "requestId": "r1"}, frame
            return frames

    chunks = asyncio.run(chat_on(r.b.base, value))
    assert chunks[-1]["type"] == "finish" and chunks[-1]["finishReason"] == "stop"
    for gw in (r.a, r.b):
        with pytest.raises(aiohttp.WSServerHandshakeError) as spent:
            asyncio.run(chat_on(gw.base, value))
        assert spent.value.status == 401
    assert metric(r.a, "ws_tickets_total", outcome="issued") >= 1
    assert metric(r.b, "ws_tickets_total", outcome="redeemed") >= 1
    assert value not in r.a.log_text() and value not in r.b.log_text()
