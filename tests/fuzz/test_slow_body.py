"""Clients that send their POST body (or headers) a few bytes per second must not hold up anyone else."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from tests.chatflow import new_chat, user
from tests.faults.client import bounded_request, check_stream
from tests.fuzz.harness import Fuzz
from tests.fuzz.strategies import encode
from tests.fuzz.tally import TALLY

pytestmark = pytest.mark.integration

SLOW_CLIENTS = 12
TRICKLE_SECONDS = 4.0
BYTES_PER_SECOND = 3


def test_slow_bodies_and_headers_do_not_block_other_requests(fuzz: Fuzz) -> None:
    host, port = fuzz.base.removeprefix("http://").split(":")
    slow: list[tuple[socket.socket, bytes]] = []
    for i in range(SLOW_CLIENTS):
        body = encode({"id": new_chat(), "messages": [user("hello there")], "trigger": "submit-message"})
        head = (
            f"POST /api/chat HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        sock = socket.create_connection((host, int(port)), timeout=10)
        if i % 3 == 2:
            slow.append((sock, head + body))  # slow headers too
        else:
            sock.sendall(head)
            slow.append((sock, body))
    sent = [0] * len(slow)
    stop = threading.Event()

    def trickle() -> None:
        while not stop.is_set():
            for i, (sock, data) in enumerate(slow):
                if sent[i] < len(data) - 1:  # the last byte only at the end
                    try:
                        sock.sendall(data[sent[i] : sent[i] + 1])
                        sent[i] += 1
                    except OSError:
                        pass
            stop.wait(1 / BYTES_PER_SECOND)

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        started = time.monotonic()
        good = 0
        while time.monotonic() - started < TRICKLE_SECONDS:
            reply = bounded_request(
                fuzz.base, "POST", "/api/chat",
                {"id": new_chat(), "messages": [user("hello there")], "trigger": "submit-message"}, total=3,
            )
            assert check_stream(reply)[-1]["finishReason"] == "stop"
            assert reply.elapsed < 2.0, f"a normal turn took {reply.elapsed:.2f}s while slow clients were sending"
            good += 1
        assert good >= 5, good
    finally:
        stop.set()
        thread.join(5)
    # Now the slow clients finish: each gets an answer (or the gateway gave up on it), never a 5xx.
    statuses = []
    for i, (sock, data) in enumerate(slow):
        try:
            sock.sendall(data[sent[i] :])
            sock.settimeout(10)
            first = sock.recv(4096)
            statuses.append(int(first.split(b" ", 2)[1]) if first.startswith(b"HTTP/1.1 ") else 0)
        except OSError:
            statuses.append(0)  # the gateway closed it (a body/header read timeout): fine
        finally:
            sock.close()
    assert all(s < 500 for s in statuses), statuses
    TALLY.notes[f"slow clients answered {sorted(set(statuses))} after trickling for {TRICKLE_SECONDS:.0f}s"] += 1
    fuzz.after_case("slow bodies")
    fuzz.case("slow_body")
