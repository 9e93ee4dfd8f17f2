"""Each refusal carries its own HTTP answer; edge/errors.py needs no table of the layers above it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gateway.chat.service import ChatBusy, Forbidden, Gone
from gateway.cluster.shared import SharedStateDown
from gateway.core.refusals import HttpError, refusal
from gateway.core.limits import Limited
from gateway.core.chat_request import InvalidRequest
from gateway.chat.registry import ChatNotFound
from gateway.upstream.client import UpstreamError


@pytest.mark.parametrize(("exc", "status", "code", "message", "headers"), [
    (InvalidRequest("messages: empty"), 400, "invalid_request", "messages: empty", {}),
    (Forbidden("another chat's approval"), 403, "forbidden", "another chat's approval", {}),
    (ChatNotFound("chat-of-bob"), 404, "chat_not_found", "no such chat", {}),
    (ChatBusy("streaming"), 409, "chat_busy", "streaming", {"Retry-After": "1"}),
    (Gone("expired"), 410, "approval_gone", "expired", {}),
    (Limited(429, "rate_limited", "slow down", retry_after=2.2), 429, "rate_limited", "slow down", {"Retry-After": "3"}),
    (Limited(413, "too_many_messages", "too many"), 413, "too_many_messages", "too many", {}),
    (UpstreamError("http", "ADK answered 500", 500), 502, "upstream_unavailable", "ADK answered 500", {}),
    (SharedStateDown("redis down"), 503, "sessions_unavailable", "redis down", {"Retry-After": "1"}),
])
def test_each_refusal_answers_for_itself(exc: Exception, status: int, code: str, message: str, headers: dict[str, str]) -> None:
    answer = refusal(exc)
    assert answer is not None
    assert (answer.status, answer.code, answer.message, answer.headers) == (status, code, message, headers)


def test_an_http_error_is_its_own_answer_and_a_bug_is_no_refusal() -> None:
    decided = HttpError(410, "run_lost", "gone", {"X": "1"})
    assert refusal(decided) is decided
    assert refusal(RuntimeError("bug")) is None


def test_the_upstreams_own_status_stays_on_the_error() -> None:
    assert UpstreamError("http", "x", 500).status == 500  # logged as the upstream's answer


def test_refusals_import_no_gateway_module_and_errors_only_them() -> None:
    """The old refusal() imported five modules lazily, a tangle the layers above now spare it: what a
    refusal is depends on nothing, and how HTTP answers one on that alone."""
    def relative(name: str) -> list[str | None]:
        tree = ast.parse((Path(__file__).parents[2] / "gateway" / name).read_text())
        return [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level > 0]

    assert relative("core/refusals.py") == []
    assert relative("edge/errors.py") == ["core.refusals"]
