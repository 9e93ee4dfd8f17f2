"""Test-side helpers shared by the fault and fuzz suites: bounded HTTP requests, stream checks, config bits.

Every request here has a total deadline, not only a per-read socket timeout: a gateway that keeps
sending keep-alive comments but never ends a response must fail the test, not hang it.
"""

from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from tests.procs import Reply

__all__ = [
    "TimedReply", "bounded_request", "check_stream", "config_section", "model_has", "upstream_with",
]


@dataclass
class TimedReply(Reply):
    """A Reply plus when each piece of the body arrived (seconds since the request was sent)."""

    elapsed: float = 0.0
    pieces: list[tuple[float, bytes]] = field(default_factory=list)

    def first_at(self, needle: bytes) -> float | None:
        """When the body first contained `needle` (None: never)."""
        seen = b""
        for at, piece in self.pieces:
            seen += piece
            if needle in seen:
                return at
        return None


def bounded_request(
    base: str, method: str, path: str, body: bytes | dict[str, Any] | list[Any] | None = None,
    headers: dict[str, str] | None = None, *, total: float = 20.0, default_content_type: bool = True,
) -> TimedReply:
    """One HTTP request whose whole exchange must finish within `total` seconds (AssertionError if not)."""
    host, port = base.removeprefix("http://").split(":")
    started = time.monotonic()
    deadline = started + total
    conn = http.client.HTTPConnection(host, int(port), timeout=total)
    if body is not None and not isinstance(body, bytes):
        body = json.dumps(body).encode()
    hdrs = {"Content-Type": "application/json"} if default_content_type else {}
    hdrs.update(headers or {})
    pieces: list[tuple[float, bytes]] = []
    try:
        conn.request(method, path, body=body, headers=hdrs)
        sock = conn.sock  # getresponse() may drop conn.sock when the response closes the connection
        resp = conn.getresponse()
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(
                    f"{method} {path}: no end of response within {total}s; got so far: {b''.join(p for _, p in pieces)[-500:]!r}"
                )
            try:
                if sock is not None:
                    sock.settimeout(remaining)
            except OSError:
                pass
            try:
                piece = resp.read1(65536)
            except TimeoutError:
                continue
            if not piece:
                break
            pieces.append((time.monotonic() - started, piece))
        return TimedReply(
            resp.status, {k.lower(): v for k, v in resp.getheaders()}, b"".join(p for _, p in pieces),
            elapsed=time.monotonic() - started, pieces=pieces,
        )
    finally:
        conn.close()


def check_stream(reply: Reply) -> list[dict[str, Any]]:
    """Assert a 200 SSE response is a well-formed UI message stream ending in [DONE]; return its chunks.

    start first; finish (or abort) last; at most one error; every text/reasoning block closed and
    every step finished before the finish.
    """
    assert reply.status == 200, (reply.status, reply.body[:500])
    assert reply.headers.get("content-type", "").startswith("text/event-stream"), reply.headers
    payloads = reply.payloads
    assert payloads and payloads[-1] == "[DONE]", f"stream did not end with [DONE]: {reply.body[-500:]!r}"
    assert payloads.count("[DONE]") == 1, reply.body[-500:]
    chunks = reply.chunks
    assert chunks and chunks[0]["type"] == "start", chunks[:3]
    assert chunks[-1]["type"] in ("finish", "abort"), chunks[-3:]
    assert sum(c["type"] == "error" for c in chunks) <= 1, [c for c in chunks if c["type"] == "error"]
    open_blocks: set[str] = set()
    step_open = False
    for chunk in chunks:
        kind = chunk["type"]
        if kind in ("text-start", "reasoning-start"):
            open_blocks.add(chunk["id"])
        elif kind in ("text-end", "reasoning-end"):
            assert chunk["id"] in open_blocks, chunk
            open_blocks.discard(chunk["id"])
        elif kind == "start-step":
            assert not step_open, "start-step while a step is open"
            step_open = True
        elif kind == "finish-step":
            assert step_open, "finish-step without a step"
            step_open = False
        elif kind in ("finish", "abort"):
            assert not open_blocks, f"blocks left open at {kind}: {open_blocks}"
            assert not step_open or kind == "abort", "a step left open at finish"
    return chunks


def model_has(model: type[BaseModel], key: str) -> bool:
    return key in model.model_fields


def config_section(name: str, model: type[BaseModel], **keys: Any) -> str:
    """A YAML section with only the keys the gateway's config schema knows today (strict configs
    refuse unknown keys, and the schema grows while these tests are written)."""
    known = {k: v for k, v in keys.items() if model_has(model, k)}
    if not known:
        return ""
    return f"{name}:\n" + "".join(f"  {k}: {v}\n" for k, v in known.items())


def upstream_with(url: str, **keys: Any) -> str:
    """The `upstream` argument of tests.procs.gateway_process, carrying extra `upstream:` keys.

    gateway_process writes the `upstream:` section itself (`url`, `health_interval`, `mode`) after
    the extra config, so a second `upstream:` section in that config would be overridden whole;
    the extra keys ride on the url line instead, as sibling lines of the same section.
    """
    return url + "".join(f"\n  {k}: {v}" for k, v in keys.items())
