"""What every failure-mode scenario asserts, whatever the fault: no double execution, and one clean
end for every browser.

- `Ledger`: the lines the demo's `process_payment` appends for each real execution
  (DEMO_TOOL_LEDGER, gateway/demo/tools.py). A payment runs at most once per call, and exactly
  as often as ADK recorded a successful result for it: the ledger is the agent's own word, not
  the gateway's.
- `Browser` / `Stream`: an SSE client that reads a response as it arrives (so a test can act
  mid-stream) under a total deadline, and keeps every byte for the checks.
- `assert_one_terminal` and `assert_sdk_clean`: a response ends with exactly one terminal sequence
  (`finish`, or one `error` then `finish`; nothing after it, one `[DONE]`), and every chunk passes
  the AI SDK's own schema and message assembly (tests/jsdriver.check_streams, ai 6 and 7), on one
  Node process for the whole run (`sdk_checker`).
"""

from __future__ import annotations

import collections
import functools
import http.client
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.chatflow import assistant_message
from tests.faults.client import check_stream
from tests.jsdriver import StreamChecker
from tests.procs import Reply

__all__ = [
    "Browser", "Ledger", "Stream", "answer", "said", "assert_one_terminal", "assert_sdk_clean", "new_chat", "terminals",
    "text_of", "types_of", "user",
]

TERMINAL = ("finish", "error", "abort")


# ---- the ledger of real executions -------------------------------------------------------------


@dataclass
class Ledger:
    path: Path

    def lines(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def of(self, chat: str) -> list[dict[str, Any]]:
        return [line for line in self.lines() if line["session_id"] == chat]

    def assert_no_double_execution(self) -> None:
        """No call ran twice, and no chat paid the same payment twice (the scenarios never ask for
        one payment twice in a chat, so a repeat is a run that should not have happened)."""
        lines = self.lines()
        by_call = collections.Counter((line["session_id"], line["function_call_id"]) for line in lines)
        by_args = collections.Counter((line["session_id"], json.dumps(line["args"], sort_keys=True)) for line in lines)
        assert all(n == 1 for n in by_call.values()), f"a call ran more than once: {by_call.most_common(3)}"
        assert all(n == 1 for n in by_args.values()), f"a payment was made more than once: {by_args.most_common(3)}"

    def assert_matches(self, chat: str, adk_results: list[dict[str, Any]]) -> None:
        """The chat's executions are exactly ADK's successful results for it, call by call."""
        ran = sorted(json.dumps(line["args"], sort_keys=True) for line in self.of(chat))
        paid = sorted(
            json.dumps({k: r[k] for k in ("amount", "currency", "recipient")}, sort_keys=True)
            for r in adk_results if r.get("success") is True
        )
        assert ran == paid, f"chat {chat}: the ledger has {ran}, ADK's successful results {paid}"


# ---- a browser ---------------------------------------------------------------------------------


def new_chat() -> str:
    return "ops-" + secrets.token_hex(6)


def user(text: str) -> dict[str, Any]:
    return {"id": "u-" + secrets.token_hex(4), "role": "user", "parts": [{"type": "text", "text": text}]}


def types_of(chunks: list[dict[str, Any]]) -> list[str]:
    return [c["type"] for c in chunks]


def terminals(chunks: list[dict[str, Any]]) -> list[str]:
    return [c["type"] for c in chunks if c["type"] in TERMINAL]


def text_of(chunks: list[dict[str, Any]]) -> str:
    return "".join(c.get("delta", "") for c in chunks if c["type"] == "text-delta")


def said(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant message a Chat holds after a text response, as it posts it back in the history."""
    return {"id": chunks[0]["messageId"], "role": "assistant", "parts": [{"type": "text", "text": text_of(chunks)}]}


def answer(first: list[dict[str, Any]], approved: bool = True) -> dict[str, Any]:
    """The assistant message a Chat holds after `first` (an approval request), with every approval
    answered: what the browser posts back."""
    requested = sum(1 for chunk in first if chunk["type"] == "tool-approval-request")
    return assistant_message(first, [approved] * requested)


@dataclass
class Stream:
    """One SSE response, read as it arrives. Every read has the response's total deadline."""

    status: int
    headers: dict[str, str]
    body: bytes = b""
    chunks: list[dict[str, Any]] = field(default_factory=list)
    ended: bool = False
    _response: http.client.HTTPResponse | None = None
    _conn: http.client.HTTPConnection | None = None
    _sock: Any = None
    _deadline: float = 0.0

    def until(self, stop: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """Read until a chunk satisfies `stop`; that chunk (AssertionError if the stream ends first)."""
        start = len(self.chunks)
        self._read(stop)
        found = [c for c in self.chunks[start:] if stop(c)]
        assert found, f"the stream ended without the chunk waited for: {types_of(self.chunks)}"
        return found[0]

    def rest(self) -> Stream:
        """Read to the end of the response."""
        self._read(lambda _: False)
        return self

    @property
    def reply(self) -> Reply:
        return Reply(self.status, self.headers, self.body)

    def json(self) -> Any:
        return json.loads(self.body)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()

    def _read(self, stop: Callable[[dict[str, Any]], bool]) -> None:
        while not self.ended:
            remaining = self._deadline - time.monotonic()
            assert remaining > 0, f"no end of response in time; so far: {types_of(self.chunks)}"
            if self._sock is not None:
                try:
                    self._sock.settimeout(remaining)
                except OSError:
                    pass
            assert self._response is not None
            line = self._response.readline()
            if not line:
                self.ended = True
                self.close()
                return
            self.body += line
            if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                chunk = json.loads(line[6:])
                self.chunks.append(chunk)
                if stop(chunk):
                    return


@dataclass
class Browser:
    """What a browser's AI SDK Chat sends, to any replica, with the stack's credentials."""

    headers: dict[str, str] = field(default_factory=dict)
    total: float = 30.0

    def open(self, base: str, method: str, path: str, body: dict[str, Any] | None = None,
             headers: dict[str, str] | None = None) -> Stream:
        """Send the request and read its status and headers; the body is read by the caller (an
        error answer is read whole here)."""
        host, port = base.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=self.total)
        payload = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=payload, headers={
            "Content-Type": "application/json", **self.headers, **(headers or {}),
        })
        sock = conn.sock  # getresponse() may drop conn.sock when the response closes the connection
        response = conn.getresponse()
        stream = Stream(
            response.status, {k.lower(): v for k, v in response.getheaders()}, _response=response, _conn=conn,
            _sock=sock, _deadline=time.monotonic() + self.total,
        )
        if not stream.headers.get("content-type", "").startswith("text/event-stream"):
            stream.body = response.read()
            stream.ended = True
            conn.close()
        return stream

    def send(self, base: str, chat: str, messages: list[dict[str, Any]], **extra: Any) -> Stream:
        """POST /api/chat, not yet read."""
        return self.open(base, "POST", "/api/chat", {"id": chat, "messages": messages, "trigger": "submit-message", **extra})

    def post(self, base: str, chat: str, messages: list[dict[str, Any]], **extra: Any) -> Stream:
        """POST /api/chat, read whole."""
        return self.send(base, chat, messages, **extra).rest()

    def resume(self, base: str, chat: str) -> Stream:
        return self.open(base, "GET", f"/api/chat/{chat}/stream").rest()


# ---- one clean end per browser -----------------------------------------------------------------


def assert_one_terminal(stream: Stream, *, error: bool | None = None) -> list[dict[str, Any]]:
    """Exactly one terminal sequence: `finish`, or one `error` then `finish`, and nothing after it
    but one `[DONE]`; the stream well formed (tests/faults/client.check_stream). `error` requires
    (True) or forbids (False) the error. Returns the chunks."""
    chunks = check_stream(stream.reply)
    seen = terminals(chunks)
    assert seen in (["finish"], ["error", "finish"]), f"terminal sequence {seen}: {types_of(chunks)}"
    assert chunks[-1]["type"] == "finish", types_of(chunks)
    if seen == ["error", "finish"]:
        # The error closes the response: after it only what closes the step and the message.
        after = types_of(chunks)[types_of(chunks).index("error") + 1 :]
        assert set(after) <= {"finish-step", "finish"}, types_of(chunks)
        assert chunks[-1].get("finishReason") == "error", chunks[-1]
    if error is not None:
        assert (seen == ["error", "finish"]) is error, f"expected {'an' if error else 'no'} error: {types_of(chunks)}"
    return chunks


@functools.cache
def sdk_checker() -> StreamChecker:
    """The run's stream checker (one per process, as procs.worker_ports): a row checks several
    responses, each of which would otherwise start Node and load both SDKs again (~0.5 s). It ends
    with the run (its stdin closes)."""
    return StreamChecker()


def assert_sdk_clean(*responses: list[dict[str, Any]], approved: bool = True) -> None:
    """The responses of one chat, in order, through ai 6's and ai 7's own parsers: no schema error,
    no stream error but the one an `error` chunk reports, each continuing the message the one
    before built when it continues it (an approval's answer), with the approvals answered as the
    browser answered them."""
    messages: dict[int, dict[str, Any] | None] = {6: None, 7: None}
    for chunks in responses:
        cases: list[dict[str, Any]] = []
        for version, message in messages.items():
            case: dict[str, Any] = {"version": version, "chunks": chunks}
            if message is not None and chunks and chunks[0].get("messageId") == message["id"]:
                case["message"] = message
            cases.append(case)
        # An `error` chunk is how the gateway tells the browser a response failed: the SDK
        # reports exactly that text, and nothing else.
        said = next((c["errorText"] for c in chunks if c["type"] == "error"), None)
        for version, result in zip(messages, sdk_checker().check(cases)):
            assert not result["schemaErrors"] and result["streamError"] == said, (version, result)
            message = messages[version] = result["message"]
            for part in message["parts"]:
                if part.get("state") == "approval-requested":
                    part["state"] = "approval-responded"
                    part["approval"]["approved"] = approved
