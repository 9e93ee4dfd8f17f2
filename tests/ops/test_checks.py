"""The fault suite's own instruments must be able to fail: the ledger's, the terminal sequence's
and the AI SDK's checks on made-up evidence, and the balancer on plain sockets (no gateway, no ADK)."""

from __future__ import annotations

import json
import socket
import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.jsdriver import StreamChecker, check_streams
from tests.ops.checks import Ledger, Stream, assert_one_terminal, assert_sdk_clean
from tests.ops.balancer import Balancer


def ledger_with(tmp_path: Path, *entries: tuple[str, str, int]) -> Ledger:
    ledger = Ledger(tmp_path / "ledger.jsonl")
    ledger.path.write_text("".join(
        json.dumps({"tool": "process_payment", "session_id": chat, "function_call_id": call,
                    "args": {"amount": amount, "recipient": "Hanako", "currency": "USD"}, "at": 0.0}) + "\n"
        for chat, call, amount in entries
    ))
    return ledger


def test_the_ledger_catches_a_call_run_twice_and_a_payment_made_twice(tmp_path: Path) -> None:
    ledger_with(tmp_path, ("c1", "k1", 50), ("c1", "k2", 60), ("c2", "k1", 50)).assert_no_double_execution()
    with pytest.raises(AssertionError, match="call ran more than once"):
        ledger_with(tmp_path, ("c1", "k1", 50), ("c1", "k1", 60)).assert_no_double_execution()
    with pytest.raises(AssertionError, match="payment was made more than once"):
        ledger_with(tmp_path, ("c1", "k1", 50), ("c1", "k2", 50)).assert_no_double_execution()


def test_the_ledger_must_equal_adks_successful_results(tmp_path: Path) -> None:
    ledger = ledger_with(tmp_path, ("c1", "k1", 50))
    paid = {"success": True, "amount": 50, "recipient": "Hanako", "currency": "USD", "transaction_id": "txn-1"}
    ledger.assert_matches("c1", [paid, {"error": "not run"}])
    with pytest.raises(AssertionError):
        ledger.assert_matches("c1", [])  # it ran, but ADK never recorded a result
    with pytest.raises(AssertionError):
        ledger.assert_matches("c2", [paid])  # ADK says paid, the tool never ran


def sse(*chunks: dict[str, Any], done: int = 1) -> Stream:
    body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n" * done
    return Stream(200, {"content-type": "text/event-stream"}, body.encode(), list(chunks), ended=True)


START, FINISH = {"type": "start", "messageId": "m1"}, {"type": "finish", "finishReason": "stop"}
ERROR, ERROR_FINISH = {"type": "error", "errorText": "boom"}, {"type": "finish", "finishReason": "error"}


def test_one_terminal_sequence_and_nothing_after_it() -> None:
    assert_one_terminal(sse(START, FINISH), error=False)
    assert_one_terminal(sse(START, ERROR, ERROR_FINISH), error=True)
    bad = {
        "two errors": sse(START, ERROR, ERROR, ERROR_FINISH),
        "two finishes": sse(START, FINISH, FINISH),
        "an error after the finish": sse(START, FINISH, ERROR),
        "text after the error": sse(
            START, ERROR, {"type": "text-start", "id": "t"}, {"type": "text-end", "id": "t"}, ERROR_FINISH
        ),
        "no finish": sse(START, ERROR),
        "two [DONE]": sse(START, FINISH, done=2),
    }
    for what, stream in bad.items():
        with pytest.raises(AssertionError):
            assert_one_terminal(stream)
            pytest.fail(f"accepted {what}")
    with pytest.raises(AssertionError):
        assert_one_terminal(sse(START, FINISH), error=True)


def test_the_sdk_check_on_one_node_process_says_what_a_node_per_check_says() -> None:
    text = [START, {"type": "start-step"}, {"type": "text-start", "id": "t"},
            {"type": "text-delta", "id": "t", "delta": "hi"}, {"type": "text-end", "id": "t"}, {"type": "finish-step"}, FINISH]
    bad = [*text[:-1], {"type": "tool-output-available"}, FINISH]
    cases = [{"version": 6, "chunks": text}, {"version": 7, "chunks": bad}]
    expected = check_streams(cases)
    assert not expected[0]["schemaErrors"] and expected[1]["schemaErrors"], expected
    checker = StreamChecker()
    try:
        assert checker.check(cases) == expected
        assert checker._proc is not None
        checker._proc.kill()  # a checker that died starts again
        checker._proc.wait()
        assert checker.check(cases) == expected
    finally:
        checker.close()
    assert_sdk_clean(text)
    with pytest.raises(AssertionError):
        assert_sdk_clean(bad)


@contextmanager
def named_server(name: bytes) -> Iterator[socketserver.TCPServer]:
    class Hello(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            self.request.sendall(name)

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Hello)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def through(balancer: Balancer) -> bytes:
    with socket.create_connection(("127.0.0.1", balancer.port), timeout=5) as sock:
        return sock.recv(16)


def test_the_balancer_takes_turns_prefers_and_skips_a_dead_backend() -> None:
    with named_server(b"a") as a, named_server(b"b") as b:
        backends = {"a": a.server_address[1], "b": b.server_address[1]}
        balancer = Balancer(backends)
        balancer.start()
        try:
            assert sorted(through(balancer) for _ in range(4)) == [b"a", b"a", b"b", b"b"]
        finally:
            balancer.stop()
        balancer = Balancer(backends, prefer="b")
        balancer.start()
        try:
            assert {through(balancer) for _ in range(3)} == {b"b"}
            b.shutdown()
            b.server_close()
            assert {through(balancer) for _ in range(3)} == {b"a"}
        finally:
            balancer.stop()


def test_the_balancer_routes_to_new_backends_and_to_none() -> None:
    with named_server(b"a") as a, named_server(b"c") as c:
        balancer = Balancer({})
        balancer.start()
        try:
            assert through(balancer) == b""  # no backend: closed at once
            balancer.route({"a": a.server_address[1]})
            assert through(balancer) == b"a"
            balancer.route({"a": a.server_address[1], "c": c.server_address[1]}, prefer="c")
            assert {through(balancer) for _ in range(3)} == {b"c"} and balancer.connections == {"c": 3}
            with pytest.raises(ValueError):
                balancer.route({"a": a.server_address[1]}, prefer="c")
        finally:
            balancer.stop()
