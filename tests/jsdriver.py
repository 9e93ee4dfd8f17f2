"""Runs tests/js/chat-driver.mjs: the stock AI SDK Chat (ai 6 or ai 7) talking to a server under test.

The driver is the browser stand-in for conformance tests: it validates every chunk with the SDK's own
schema and runs the SDK's own automatic continuation logic, so a pass means a real useChat would work.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from collections import Counter
from pathlib import Path

JS_DIR = Path(__file__).parent / "js"
DRIVER = JS_DIR / "chat-driver.mjs"


def _driver_request(
    version: int,
    api: str,
    steps: list[dict],
    *,
    chat_id: str | None = None,
    headers: dict | None = None,
    body: dict | None = None,
    timeout: float = 30,
    transport: str = "sse",
    ws_url: str | None = None,
    keep_going_after_error: bool = False,
) -> dict:
    if transport not in ("sse", "ws"):
        raise ValueError(f"transport must be 'sse' or 'ws', not {transport!r}")
    request = {"version": version, "api": api, "steps": steps, "timeoutMs": int(timeout * 1000)}
    if keep_going_after_error:
        request["keepGoingAfterError"] = True
    for key, value in (("chatId", chat_id), ("headers", headers), ("body", body)):
        if value is not None:
            request[key] = value
    if transport == "ws":
        request["transport"] = "ws"
        request["wsUrl"] = ws_url or api
    return request


def _run_driver(request: dict | list[dict], timeout: float) -> dict | list[dict]:
    node = shutil.which("node")
    if node is None:
        raise AssertionError("node is not on PATH; the JS conformance driver needs Node 20+")
    if not (JS_DIR / "node_modules").is_dir():
        raise AssertionError(f"run `npm ci` in {JS_DIR} first")
    # The driver enforces each run's timeout itself and still reports; the margin covers node start-up.
    limit = timeout + 15
    try:
        proc = subprocess.run(
            [node, str(DRIVER)], cwd=JS_DIR, input=json.dumps(request), capture_output=True, text=True, timeout=limit
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"chat driver hung past {limit}s; stderr:\n{exc.stderr}") from exc
    if proc.returncode != 0:
        raise AssertionError(f"chat driver crashed (exit {proc.returncode}); stderr:\n{proc.stderr}")
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise AssertionError(
            f"chat driver printed no JSON report; stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        ) from exc


def run_chat(
    version: int,
    api: str,
    steps: list[dict],
    *,
    chat_id: str | None = None,
    headers: dict | None = None,
    body: dict | None = None,
    timeout: float = 30,
    transport: str = "sse",
    ws_url: str | None = None,
    keep_going_after_error: bool = False,
) -> dict:
    """Send each step's text through a real Chat and return the driver's report.

    A step is {"send": str, "approvals"?: "approve" | "deny" | [..], "toolOutputs"?: {tool_name: output},
    "abortAfterChunks"?: n, "dropSocketAfterChunks"?: n, "dropContinuationAfterChunks"?: n (ws only)} or
    {"resume": True} (chat.resumeStream()). A step's "holdAnswersUntil": path makes the driver write
    path + ".ready" once the step's approvals are on screen and answer them only once `path` exists.
    `keep_going_after_error`: a step that ends in a Chat error does not end the run; the report's
    stepErrors holds each step's error (None if none).
    Approvals are answered once the turn has ended, in order, one decision per approval-requested part.
    `abortAfterChunks` calls chat.stop() after n chunks of the step's first response; `dropSocketAfterChunks`
    closes the WebSocket after n chunk frames of it and then calls chat.resumeStream() (a `resume` frame).
    `dropContinuationAfterChunks` does the same in the response that follows the step's first answers.
    The report holds ok, transport, status, error, messages, toolCalls, chunks ([request_index, chunk]),
    schemaErrors and requests. For SSE: requests are {method, url, body, status, contentType, headers} and
    doneMarkers counts [DONE] per request.

    transport="ws" talks to `ws_url` (default: `api`) with ai 7's WebSocketChatTransport, or for ai 6 with
    gateway/static/ws-transport.js. Then requests are one per send/resume frame: {type, requestId, url,
    body: <the frame>, started, chunkFrames, firstSequence, lastSequence, gapless, duplicates, terminal,
    errorText, aborted, dropped, closedWithSocket}; terminals lists each request's terminal frame type
    ("end" | "error" | "no-active" | None); frames is {"in", "out"}; sequenceErrors lists frame protocol
    violations (gaps, a first sequence other than 0, frames after the terminal, malformed frames); sockets
    lists each socket opened ({url, opened, close: {code, reason}, droppedByDriver}).
    """
    request = _driver_request(
        version, api, steps, chat_id=chat_id, headers=headers, body=body, timeout=timeout,
        transport=transport, ws_url=ws_url, keep_going_after_error=keep_going_after_error,
    )
    return _run_driver(request, timeout)


def run_chats(runs: list[dict], *, timeout: float = 30) -> list[dict]:
    """Like run_chat for each dict of run_chat's keyword arguments, concurrently in one node process."""
    requests = [_driver_request(**{"timeout": timeout, **run}) for run in runs]
    return _run_driver(requests, max(r["timeoutMs"] for r in requests) / 1000 if requests else timeout)


def assert_clean(result: dict) -> None:
    """Assert the run is what a browser would accept without a hitch."""
    summary = {k: result.get(k) for k in ("version", "status", "error", "timedOut", "schemaErrors", "sequenceErrors")}
    assert result["ok"], f"chat run not ok: {json.dumps(summary, indent=2)}"
    assert not result["schemaErrors"], f"schema errors: {result['schemaErrors']}"
    assistant_ids = Counter(m["id"] for m in result["messages"] if m["role"] == "assistant")
    duplicated = [i for i, n in assistant_ids.items() if n > 1]
    assert not duplicated, f"duplicate assistant message ids {duplicated}"
    if result.get("transport") == "ws":
        assert not result["sequenceErrors"], f"frame protocol errors: {result['sequenceErrors']}"
        for index, req in enumerate(result["requests"]):
            if req["aborted"] or req["dropped"]:  # the driver itself cut these short
                continue
            expected = ("end", "no-active") if req["type"] == "resume" else ("end",)
            assert req["terminal"] in expected, (
                f"{req['type']} request {index} ({req['requestId']}) ended with {req['terminal']!r}"
                + (f" ({req['errorText']})" if req.get("errorText") else "")
                + (", its socket closed first" if req["closedWithSocket"] else "")
            )
        return
    for index, (req, done) in enumerate(zip(result["requests"], result["doneMarkers"])):
        if req.get("aborted"):  # the driver stopped it (chat.stop()): no [DONE] reaches the Chat
            continue
        if "text/event-stream" in (req.get("contentType") or ""):
            assert done == 1, f"response {index} ({req['method']} {req['url']}) had {done} [DONE] markers"


AGUI_DRIVER = JS_DIR / "agui-driver.mjs"


def run_agui(runs: list[dict], *, timeout: float = 30, concurrency: int = 4) -> list[dict]:
    """Drive @ag-ui/client's HttpAgent through each run, concurrently in one Node process
    (tests/js/agui-driver.mjs), at most `concurrency` at once (the gateway caps one user's open
    streams), and return one report per run, in order. `timeout` bounds each run.

    A run is {"url": base, "agent"?: "/ag-ui" | "/agents/<name>/ag-ui", "headers"?, "threadId"?,
    "messages"?: [the thread to start with], "tools"?: [{"name", "description", "parameters"}], "steps":
    [...]}; a step {"send"?: text, "approvals"?: "approve" | "deny" | [...], "toolOutputs"?: {tool_name:
    output}, "cancelInterrupts"?: True, "resume"?: [entries], "resendResume"?: True} (the driver's
    header says what each does). A report holds the run's events off the wire (`events`, and
    per run `runs`), `schemaErrors` (@ag-ui/core's EventSchema), `pipelineErrors` (what the client's
    own pipeline threw), `runErrors` ({message, code} of each RUN_ERROR), `outcomes` (per run: the
    outcome, its interrupts and pendingToolCallIds), the agent's final `messages`, `activities`,
    `handed` (the browser tool calls the driver answered), `httpStatuses` and `timedOut`; and
    `warnings`: what the client logged (console.warn) in the whole batch.
    """
    requests = [{"agent": "/ag-ui", "timeoutMs": int(timeout * 1000), **run} for run in runs]
    node = shutil.which("node")
    if node is None:
        raise AssertionError("node is not on PATH; the AG-UI driver needs Node 20+")
    # The driver bounds each run itself; a batch takes at most as many rounds of runs as fit.
    limit = timeout * -(-len(requests) // max(1, concurrency)) + 15
    try:
        proc = subprocess.run(
            [node, str(AGUI_DRIVER)], cwd=JS_DIR, input=json.dumps({"runs": requests, "concurrency": concurrency}),
            capture_output=True, text=True, timeout=limit,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"AG-UI driver hung past {limit}s; stderr:\n{exc.stderr}") from exc
    if proc.returncode != 0:
        raise AssertionError(f"AG-UI driver crashed (exit {proc.returncode}); stderr:\n{proc.stderr}")
    try:
        output = json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise AssertionError(f"AG-UI driver printed no JSON; stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}") from exc
    for report in output["reports"]:
        report["warnings"] = output["warnings"]
    return output["reports"]


def assert_agui_clean(result: dict) -> None:
    """Assert an AG-UI run is what an app on @ag-ui/client accepts without a hitch: every event valid,
    the client's pipeline never threw, no run failed or timed out, each response an event stream,
    and the client stripped or dropped nothing it was sent."""
    assert not result["timedOut"], f"the AG-UI run timed out; outcomes: {result['outcomes']}"
    assert not result["schemaErrors"], f"schema errors: {json.dumps(result['schemaErrors'])[:2000]}"
    assert not result["pipelineErrors"], f"the client's pipeline threw: {result['pipelineErrors']}"
    assert not result["runErrors"], f"RUN_ERROR: {result['runErrors']}"
    assert all(status == 200 for status in result["httpStatuses"]), result["httpStatuses"]
    assert not result["warnings"], f"the client warned: {result['warnings']}"
    for run in result["runs"]:
        types = [e["type"] for e in run["events"]]
        assert types[:1] == ["RUN_STARTED"] and types[-1:] == ["RUN_FINISHED"], types


def _check_with(script: str, cases: list[dict]) -> list[dict]:
    """One Node run of a checker in tests/js that reads a JSON list of cases and prints one result each."""
    node = shutil.which("node")
    if node is None:
        raise AssertionError("node is not on PATH; the stream checker needs Node 20+")
    proc = subprocess.run(
        [node, str(JS_DIR / script)], cwd=JS_DIR, input=json.dumps(cases),
        capture_output=True, text=True, timeout=120,
    )
    if proc.returncode != 0:
        raise AssertionError(f"{script} crashed (exit {proc.returncode}); stderr:\n{proc.stderr}")
    return json.loads(proc.stdout)


def check_streams(cases: list[dict]) -> list[dict]:
    """Run chunk sequences through the SDK's own schema and message assembler (tests/js/check-stream.mjs).

    Each case is `{"version": 6|7, "chunks": [...], "message"?: <assistant UIMessage to continue>}`;
    each result is `{"schemaErrors": [...], "streamError": str | None, "message": <final UIMessage>}`.
    """
    return _check_with("check-stream.mjs", cases)


def check_agui_streams(streams: list[list[dict]], threads: list[list[dict]] | None = None) -> list[dict]:
    """Run AG-UI event streams through `@ag-ui/core`'s schemas and `@ag-ui/client`'s pipeline
    (tests/js/check-agui.mjs). Each result is `{"schemaErrors": [...], "verifyError": str | None,
    "runError": str | None, "runErrorEvent": <RUN_ERROR's message> | None, "messages": [...]}`:
    the messages the client holds after the run, from `threads[i]` (what it held before; none
    without `threads`)."""
    if threads is not None and len(threads) != len(streams):
        raise ValueError("one thread per stream")
    return _check_with("check-agui.mjs", [
        {"events": events, "messages": threads[i] if threads is not None else []} for i, events in enumerate(streams)
    ])


class StreamChecker:
    """`check_streams` on one Node process (check-stream.mjs --lines), started at the first check:
    a suite that checks many responses pays Node's and the SDKs' start once. A checker that died
    is started again at the next check; `close` ends it."""

    def __init__(self, timeout: float = 120) -> None:
        self.timeout = timeout
        self._proc: subprocess.Popen[str] | None = None

    def check(self, cases: list[dict]) -> list[dict]:
        """What check_streams(cases) returns."""
        proc = self._running()
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(cases) + "\n")
        proc.stdin.flush()
        # Bounded: a checker that hangs is killed, which ends the read.
        timer = threading.Timer(self.timeout, proc.kill)
        timer.start()
        try:
            line = proc.stdout.readline()
        finally:
            timer.cancel()
        if not line:
            self.close()
            raise AssertionError(f"stream checker ended (exit {proc.returncode}) without an answer")
        return json.loads(line)

    def close(self) -> None:
        if self._proc is not None:
            proc, self._proc = self._proc, None
            if proc.stdin is not None:
                proc.stdin.close()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def _running(self) -> subprocess.Popen[str]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        node = shutil.which("node")
        if node is None:
            raise AssertionError("node is not on PATH; the stream checker needs Node 20+")
        self._proc = subprocess.Popen(
            [node, str(JS_DIR / "check-stream.mjs"), "--lines"], cwd=JS_DIR, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True,
        )
        return self._proc


def check_ws_transport_parity() -> dict:
    """Run tests/js/ws-transport-parity.mjs: scripted exchanges over an in-memory socket through ai 7's
    WebSocketChatTransport ("7") and gateway/static/ws-transport.js ("6"); returns {"6": {...}, "7": {...}}
    with one outcome per scenario (frames sent, sockets opened/closed, what the reader got)."""
    node = shutil.which("node")
    if node is None:
        raise AssertionError("node is not on PATH; the parity check needs Node 20+")
    proc = subprocess.run(
        [node, str(JS_DIR / "ws-transport-parity.mjs")], cwd=JS_DIR, capture_output=True, text=True, timeout=60
    )
    if proc.returncode != 0:
        raise AssertionError(f"parity check crashed (exit {proc.returncode}); stderr:\n{proc.stderr}")
    return json.loads(proc.stdout)

