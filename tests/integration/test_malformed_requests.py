"""Malformed HTTP on the gateway's listeners, over raw sockets to a real gateway process.

aiohttp refuses a request it cannot parse before any gateway code runs, and both logs the refusal
and answers it itself. The credential of a request it refuses (an over-long Cookie line, a bearer
key followed by a control byte, a key in an unparsable request line) must reach neither the log nor
the answer. Run with both of aiohttp's HTTP parsers: their error messages differ.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from tests.procs import free_port, gateway_process

pytestmark = pytest.mark.integration

KEY = "sk-live-4f1d8e0c2b9a7d6e5f40"
INTERNAL = "internal-7c3e9b2d4a1f0e8d6c5b"
COOKIE = "gw_session"

CONFIG = f"""
auth:
  mode: api_key
  cookie_name: {COOKIE}
  api_keys:
    - id: alice
      key: {KEY}
internal:
  port: {{internal}}
  secret: {INTERNAL}
"""


def malformed(secret: str) -> dict[str, bytes]:
    """Requests aiohttp cannot parse, each carrying `secret` in the part it cannot parse."""
    key = secret.encode()
    return {
        "oversized cookie": b"GET /healthz HTTP/1.1\r\nHost: gw\r\nCookie: " + COOKIE.encode() + b"=" + key
        + b"; pad=" + b"a" * 9000 + b"\r\n\r\n",
        "control byte after the bearer key": b"GET /healthz HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer " + key + b"\x01\r\n\r\n",
        "NUL in x-api-key": b"GET /healthz HTTP/1.1\r\nHost: gw\r\nx-api-key: " + key + b"\x00\r\n\r\n",
        "key in a bad header name": b"GET /healthz HTTP/1.1\r\nHost: gw\r\nX-" + key + b"\x01: 1\r\n\r\n",
        "oversized header line": b"GET /healthz HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer " + key + b"a" * 9000 + b"\r\n\r\n",
        "key in an oversized request line": b"GET /api/agents?access_token=" + key + b"&pad=" + b"a" * 9000 + b" HTTP/1.1\r\nHost: gw\r\n\r\n",
        "key in a bad request line": b"GET /api/agents?access_token=" + key + b"\x01 HTTP/1.1\r\nHost: gw\r\n\r\n",
        "key in a bad method": b"G\x01T" + key + b" / HTTP/1.1\r\nHost: gw\r\n\r\n",
        "key in a bad version": b"GET / HTTP/" + key + b"\r\nHost: gw\r\n\r\n",
        "folded header": b"GET /healthz HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer\r\n " + key + b"\r\n\r\n",
        "bad chunk size": b"POST /api/chat HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer " + key
        + b"\r\nTransfer-Encoding: chunked\r\n\r\nzz" + key + b"\r\n",
    }


def exchange(port: int, data: bytes) -> bytes:
    """Send `data`, then read until the gateway closes (or 5 s pass)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    return answer


@pytest.mark.parametrize("parser", ["c", "python"])
def test_no_secret_reaches_the_log_or_the_answer_of_a_malformed_request(parser: str, tmp: Path) -> None:
    internal = free_port()
    env = {"AIOHTTP_NO_EXTENSIONS": "1"} if parser == "python" else {}
    with gateway_process(tmp, "http://127.0.0.1:1", CONFIG.format(internal=internal), env=env) as gw:
        answers = {}
        for name, data in malformed(KEY).items():
            answers[f"public: {name}"] = exchange(gw.port, data)
        for name, data in malformed(INTERNAL).items():
            answers[f"internal: {name}"] = exchange(internal, data)
        time.sleep(0.3)  # the last lines written
        log = gw.log_text()
    refused = {name: answer for name, answer in answers.items() if answer.startswith(b"HTTP/1.")}
    assert len(refused) >= len(answers) // 2, answers  # aiohttp answered most itself: the path under test ran
    assert "malformed_request" in log
    for secret in (KEY, INTERNAL):
        assert secret not in log, [line for line in log.splitlines() if secret in line]
        leaked = [name for name, answer in answers.items() if secret.encode() in answer]
        assert not leaked, {name: answers[name][:600] for name in leaked}
