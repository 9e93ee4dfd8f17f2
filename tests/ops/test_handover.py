"""A replica that stops does not take another replica's approvals down with it, on the blocking
path: the plugin's held requests, which live upstreams use (on `/run_sse` a pending approval is ADK's
confirmation and holds no request: tests/ops/test_durable_approvals.py).

Two replicas on a real redis-server, the stock ADK API server with the plugin behind the
round-robin balancer (stack.Balancer, preferring A), and the agent's ledger of real payments. B
owns the chats; the plugin's requests go through A, which forwards them to B and holds them. Then
A stops (SIGTERM with the default drain, or kill -9): the plugin asks again, reaches B, and B takes
each ask as the call it already shows. The person's Approve, on B, runs each payment exactly once.
Each test has its own replicas; the ADK server, Redis and the balancer are the suite's `balanced`
(tests/ops/conftest.py).
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from tests.ops.checks import Browser, Stream, answer, assert_one_terminal, assert_sdk_clean, new_chat, types_of, user
from tests.ops.stack import Replicas, Upstream, payment_responses, replicas, wait_until
from tests.procs import GatewayProcess, metric_value

pytestmark = pytest.mark.integration

PAYMENTS = ("pay 50 to Hanako", "pay 60 to Kenji")
Chunks = list[dict[str, Any]]


def metric(gw: GatewayProcess, name: str, **labels: str) -> float:
    return metric_value(gw.base, f"adk_gateway_{name}", labels)


def log_events(gw: GatewayProcess, event: str) -> list[dict[str, Any]]:
    return [line for line in gw.log_lines() if line.get("event") == event]


def start_payment(r: Replicas, gw: GatewayProcess, text: str) -> tuple[str, dict[str, Any], Chunks]:
    """A new chat on `gw` whose first response ends waiting for the person's approval."""
    chat, message = new_chat(), user(text)
    first = Browser(r.headers).post(gw.base, chat, [message])
    assert first.status == 200, first.body
    chunks = assert_one_terminal(first, error=False)
    assert types_of(chunks)[-3:] == ["tool-approval-request", "finish-step", "finish"], types_of(chunks)
    return chat, message, chunks


def approve(r: Replicas, gw: GatewayProcess, chat: str, message: dict[str, Any], first: Chunks) -> Stream:
    reply = answer(first)
    return Browser(r.headers).post(gw.base, chat, [message, reply], messageId=reply["id"])


def held_by_a(r: Replicas) -> list[tuple[str, dict[str, Any], Chunks]]:
    """Two payments in chats B owns, each waiting for the person, their plugin requests held by A."""
    forwarded = metric(r.a, "forwarded_total", direction="out")
    pending = [start_payment(r, r.b, text) for text in PAYMENTS]
    wait_until(lambda: metric(r.a, "forwarded_total", direction="out") >= forwarded + len(PAYMENTS),
               "A to forward the plugin's requests to B", 10)
    assert metric(r.b, "approvals_pending", agent="demo_agent") == len(PAYMENTS)
    return pending


def approved_once_each(r: Replicas, pending: list[tuple[str, dict[str, Any], Chunks]]) -> None:
    """Approve every payment on B: each runs exactly once, and the browser reads its result."""
    for chat, message, first in pending:
        paid = approve(r, r.b, chat, message, first)
        assert paid.status == 200, paid.body
        chunks = assert_one_terminal(paid, error=False)
        assert chunks[1]["type"] == "tool-output-available" and chunks[1]["output"]["success"] is True, chunks[:3]
        assert_sdk_clean(first, chunks)
    for chat, _, _ in pending:
        assert len(r.ledger.of(chat)) == 1, r.ledger.of(chat)
        r.ledger.assert_matches(chat, payment_responses(r.adk, chat, r.user))
    r.ledger.assert_no_double_execution()


def test_sigterm_of_the_replica_holding_the_plugins_requests_keeps_the_other_replicas_approvals(
    tmp_path: Path, balanced: Upstream,
) -> None:
    """The gateway's runs are ADK live sessions, which have no confirmations: the blocking path is theirs."""
    with replicas(tmp_path, on=balanced, prefer="a", upstream_mode="live") as r:
        pending = held_by_a(r)
        r.a.proc.send_signal(signal.SIGTERM)
        assert r.a.proc.wait(timeout=30) == 0
        # A handed each request back as its drain began; the plugin asked again and reached B,
        # which re-attached each ask to the call it shows (no second approval, nothing decided).
        handed = log_events(r.a, "gated_call_handed_over")
        assert len(handed) == len(PAYMENTS), handed
        wait_until(lambda: len(log_events(r.b, "gate_reattached")) >= len(PAYMENTS), "B to take the plugin's asks again")
        assert len(log_events(r.b, "gate_opened")) == len(PAYMENTS)
        assert metric(r.b, "approvals_pending", agent="demo_agent") == len(PAYMENTS)
        assert r.ledger.lines() == []

        approved_once_each(r, pending)
        assert metric(r.b, "approvals_pending", agent="demo_agent") == 0


def test_kill_of_the_replica_holding_the_plugins_requests_keeps_the_other_replicas_approvals(
    tmp_path: Path, balanced: Upstream,
) -> None:
    with replicas(tmp_path, on=balanced, prefer="a", upstream_mode="live") as r:
        pending = held_by_a(r)
        r.a.proc.kill()
        r.a.proc.wait()
        # The plugin's connections were cut before any verdict: it asked again, through the balancer, of B.
        wait_until(lambda: len(log_events(r.b, "gate_reattached")) >= len(PAYMENTS), "B to take the plugin's asks again")
        assert len(log_events(r.b, "gate_opened")) == len(PAYMENTS)
        assert r.ledger.lines() == []

        approved_once_each(r, pending)
