"""What every fuzz case shares: hypothesis profiles, the checks run after each case, and the victims.

Profiles (env `HYPOTHESIS_PROFILE`, default `ci`):

- `ci`: a few hundred cases in all, derandomized (the same cases every run, so CI is stable), no
  example database; the whole fuzz directory runs in well under a minute. `make test` uses it.
- `full`: over 10,000 cases in all, random, failing examples kept in .pytest_cache/hypothesis.
  `make fuzz` uses it.

Every case must leave the gateway as it found it: no 5xx answer, no crash in its log (a JSON line at
level error, or a Traceback), and no pending approval changed. Every `HEALTH_EVERY` cases, and at
the end, a good chat turn must still stream to the end.

Victims: before the fuzz, real approvals are left pending (`pay 50 to Hanako` and friends, in the
demo agent behind the plugin) and a few are answered for good (their ids make replays). Fuzz input
may name them from other chats, forge ids inside their chats, replay spent ones; none of that may
change them. test_zz_after_fuzz.py answers them properly at the end and checks they complete.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase

from gateway.config.schema import ChatConfig, GatewayConfig, WebSocketConfig
from tests.chatflow import assistant_from, new_chat, types, user
from tests.faults.client import TimedReply, bounded_request, check_stream, config_section
from tests.fuzz.tally import TALLY
from tests.procs import GatewayProcess, Reply, metric_value

ROOT = Path(__file__).resolve().parents[2]

_SUPPRESS = [
    HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
    HealthCheck.large_base_example, HealthCheck.function_scoped_fixture,
]
# ci does not shrink: a failure shows the first failing input as generated (derandomized, so the
# same one every run); `make fuzz` shrinks.
settings.register_profile(
    "ci", deadline=None, derandomize=True, database=None, suppress_health_check=_SUPPRESS, print_blob=False,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target],
)
settings.register_profile(
    "full", deadline=None, database=DirectoryBasedExampleDatabase(str(ROOT / ".pytest_cache" / "hypothesis")),
    suppress_health_check=_SUPPRESS, print_blob=True,
)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
settings.load_profile(PROFILE if PROFILE in ("ci", "full") else "ci")
FULL = PROFILE == "full"


# FUZZ_SKIP_KNOWN=1 steers the generated cases around the bugs already reported (their plain
# reproductions stay in test_regressions.py), so a run can look for new ones meanwhile.
SKIP_KNOWN = os.environ.get("FUZZ_SKIP_KNOWN") == "1"


def known_bug(kind: str, value: Any) -> bool:
    """The input hits a bug already reproduced in test_regressions.py (only with FUZZ_SKIP_KNOWN=1)."""
    if not SKIP_KNOWN:
        return False
    if kind == "encoding":  # invalid gzip/deflate bodies: 500, or no answer
        return value in ("gzip", "deflate", "gzip, gzip")
    if kind == "ws_frame":  # a frame whose `type` is not a string kills the socket
        return isinstance(value, str) and re.search(r'"type":\s*[\[{]', value) is not None
    if kind == "answer_plan":  # a non-gw answer inside a chat whose gated run waits cancels its calls
        return value["target"] == "victim" and value["id_kind"] in ("random_native", "random_text")
    return False


def budget(ci: int, full: int) -> settings:
    """Examples for one test: `ci` in the ci profile, `full` in the full one."""
    return settings(max_examples=full if FULL else ci)


HEALTH_EVERY = 50
REQUEST_DEADLINE = 30.0
CRASH_EVENTS = {"handler_crashed", "run_crashed", "ws_request_crashed"}
# Texts the demo agent answers with a gated tool call: fuzz input must not create approvals of its
# own (it would blur the approval bookkeeping this suite checks).
GATING_TEXT = re.compile(r"\b(pay|send|transfer)\b|where\s+am\s+i|\bplay\s+(track|song|bgm)", re.IGNORECASE)


# The log lines that say a call waits for a person or the browser, and those that change one, on
# either engine: `/run_sse`'s confirmations (ADK's `adk-` ids) and a live upstream's held calls (`gw-`).
# (`native_approval_unknown` is a refused answer naming an id its chat never asked, which changes
# nothing: a forged answer in another chat logs it with the victim's id.)
WAITING_EVENTS = frozenset({"gate_opened", "approval_requested", "browser_tool_requested"})
CHANGED_EVENTS = frozenset({"gate_changed", "approval_answered", "browser_tool_answered", "approval_timed_out"})


@dataclass
class Pending:
    """A gated call left waiting for a person, and what its owner needs to answer it."""

    chat_id: str
    history: list[dict[str, Any]]
    first: Reply
    approval_ids: list[str]  # what the browser was shown (tool-approval-request)
    tool_call_ids: list[str]
    text: str
    gate_ids: list[str]  # the gateway's ids of every gated call, shown or not (from its log)

    @property
    def browser_output(self) -> bool:
        return not self.approval_ids


@dataclass
class Spent:
    """An approval answered for good: its answer can only be replayed."""

    chat_id: str
    history: list[dict[str, Any]]
    answer: dict[str, Any]
    approval_id: str


class Fuzz:
    """The gateway under fuzz, its victims, and the checks each case ends with (a plain class:
    hypothesis prints its repr with every failing example)."""

    def __init__(self, gateway: GatewayProcess, auth: dict[str, str] | None = None) -> None:
        self.gateway = gateway
        # Credentials of the victims' owner (and of the health checks), when the gateway wants them.
        self.auth = auth or {}
        self.victims: list[Pending] = []
        self.spent: list[Spent] = []
        self.baseline: dict[str, float] = {}
        # Victim approvals that changed state under fuzz input (replaced by fresh ones when found).
        self.lost: list[str] = []
        self._log_offset = 0
        self._cases = 0
        self._serial = 0
        self._recent: dict[str, Any] = {}
        # Crash lines that could not be pinned on one case: (likely input, line).
        self.unattributed: list[tuple[str, dict[str, Any]]] = []

    def timed(self, seconds: float, what: Any) -> None:
        TALLY.slowest.append((seconds, repr(what)[:200]))
        TALLY.slowest.sort(key=lambda t: -t[0])
        del TALLY.slowest[3:]

    @property
    def base(self) -> str:
        return self.gateway.base

    def __repr__(self) -> str:  # hypothesis prints the fixture with every failing example
        return f"Fuzz({self.base}, {len(self.victims)} victims)"

    # ---- per-case bookkeeping ------------------------------------------------------------

    def case(self, name: str) -> None:
        """Count a case; every HEALTH_EVERY cases, check the gateway still serves a good turn."""
        TALLY.cases[name] += 1
        self._cases += 1
        if self._cases % HEALTH_EVERY == 0:
            self.assert_healthy()

    def assert_healthy(self) -> None:
        assert bounded_request(self.base, "GET", "/healthz", total=10).status == 200
        reply = bounded_request(
            self.base, "POST", "/api/chat",
            {"id": new_chat(), "messages": [user("hello there")], "trigger": "submit-message"}, self.auth,
            total=REQUEST_DEADLINE,
        )
        chunks = check_stream(reply)
        assert chunks[-1].get("finishReason") == "stop", chunks[-3:]
        TALLY.health_checks += 1

    def new_log_lines(self) -> list[dict[str, Any]]:
        """Gateway log lines written since the last call (complete lines only)."""
        with self.gateway.log.open("rb") as f:
            f.seek(self._log_offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self._log_offset += end
        lines = []
        for raw in data[:end].decode("utf-8", "replace").splitlines():
            try:
                line = json.loads(raw)
                lines.append(line if isinstance(line, dict) else {"raw": raw})
            except json.JSONDecodeError:
                lines.append({"raw": raw})
        return lines

    def next_request_id(self, what: Any) -> str:
        """An X-Request-Id for the next case: the gateway binds it to every log line of the request
        (and of the run it starts), so a crash is pinned on the input that caused it."""
        self._serial += 1
        rid = f"fz-{self._serial}"
        self._recent[rid] = repr(what)[:1500]
        if len(self._recent) > 200:
            self._recent.pop(next(iter(self._recent)))
        return rid

    def after_case(self, what: Any, request_id: str | None = None, *, owner: bool = False) -> None:
        """The checks every case ends with: no crash logged for it, no victim touched.

        A crash line bound to this case's request id fails the case. One bound to an earlier case,
        or to none (aiohttp's own lines), cannot be pinned reliably (log lines land a moment after
        the answer): it is kept in `unattributed`, with the recent inputs, and fails the final test.
        """
        crashes, touched = [], []
        victim_ids = {a for v in self.victims for a in v.gate_ids}
        for line in self.new_log_lines():
            if not owner and line.get("event") in CHANGED_EVENTS and line.get("approval_id") in victim_ids:
                touched.append(line)
            if not is_crash(line):
                continue
            if request_id is not None and line.get("request_id") == request_id:
                crashes.append(line)
            else:
                origin = self._recent.get(str(line.get("request_id")), "unknown (no request id)")
                self.unattributed.append((repr(origin)[:1500], line))
        if touched:
            self._replace_touched(touched)
        assert not crashes, f"the gateway logged a crash for {what!r:.2000}: {crashes[:3]}"
        assert not touched, f"a pending approval changed state under fuzz input {what!r:.2000}: {touched[:3]}"

    def _replace_touched(self, touched: list[dict[str, Any]]) -> None:
        """Record the loss and put fresh victims in place, so the rest of the run still checks something."""
        ids = {line.get("approval_id") for line in touched}
        for victim in list(self.victims):
            if ids & set(victim.gate_ids):
                self.lost.extend(a for a in victim.gate_ids if a in ids)
                self.victims.remove(victim)
                fresh = make_pending(self.gateway, victim.text, self.auth)
                self.victims.append(fresh)
        TALLY.lost[self.base] = len(self.lost)
        self.baseline = approval_metrics(self.gateway)

    # ---- answers -------------------------------------------------------------------------

    def check_answer(self, reply: TimedReply, what: Any, method: str = "POST") -> None:
        """No 5xx; a 200 is a well-formed stream; an error answer has the JSON error shape."""
        assert reply.status < 500, f"{reply.status} for {what!r:.2000}: {reply.body[:500]!r}"
        if reply.status == 200 and reply.headers.get("content-type", "").startswith("text/event-stream"):
            check_stream(reply)
        elif reply.status >= 400 and method != "HEAD":
            try:
                error = json.loads(reply.body)["error"]
                assert isinstance(error["code"], str) and isinstance(error["message"], str)
            except (ValueError, KeyError, TypeError, AssertionError):
                TALLY.notes[f"{method} {reply.status} answer without the JSON error shape: {reply.body[:60]!r}"] += 1


# Every gated tool waits far longer than a full run takes: a deadline passing mid-fuzz would look
# like fuzz input changing an approval.
FUZZ_TOOLS = """
tools:
  process_payment:
    approval: true
    timeout: 3h
    hint: Money leaves the account when you approve.
  get_location:
    approval: true
    runs_in: browser
    timeout: 3h
  change_bgm:
    runs_in: browser
    timeout: 3h
"""


def fuzz_config() -> str:
    out = config_section("websocket", WebSocketConfig, max_frame_bytes="256KiB")
    out += config_section("chat", ChatConfig, run_retention="60s")
    return out + limits_config()


def limits_config() -> str:
    """One anonymous user sends everything: production caps would turn most cases into 429s."""
    if "limits" not in GatewayConfig.model_fields:
        return ""
    from gateway.config.schema import LimitsConfig

    return config_section(
        "limits", LimitsConfig, max_chats_per_user=10_000_000, rate_per_user=1_000_000,
        burst_per_user=1_000_000, max_streams_per_user=10_000,
    )


# ---- victims --------------------------------------------------------------------------------


def make_pending(gw: GatewayProcess, text: str, auth: dict[str, str] | None = None) -> Pending:
    chat, message = "victim-" + new_chat(), user(text)
    first = bounded_request(gw.base, "POST", "/api/chat", {"id": chat, "messages": [message]}, auth, total=REQUEST_DEADLINE)
    chunks = check_stream(first)
    approvals = [c["approvalId"] for c in chunks if c["type"] == "tool-approval-request"]
    calls = [c["toolCallId"] for c in chunks if c["type"] == "tool-input-start"]
    assert calls and chunks[-1]["finishReason"] == "tool-calls", types(first)
    gates = [
        line["approval_id"] for line in gw.log_lines()
        if line.get("event") in WAITING_EVENTS and (line.get("tool_call_id") in calls or (
            line.get("event") != "gate_opened" and line.get("chat_id") == chat))
    ]
    assert len(gates) == len(calls), (calls, gates)
    return Pending(chat, [message], first, approvals, calls, text, gates)


def make_spent(gw: GatewayProcess, approved: bool, auth: dict[str, str] | None = None) -> Spent:
    victim = make_pending(gw, "pay 50 to Hanako", auth)
    answer = assistant_from(victim.first, [approved])
    body = {"id": victim.chat_id, "messages": [*victim.history, answer], "messageId": answer["id"]}
    done = check_stream(bounded_request(gw.base, "POST", "/api/chat", body, auth, total=REQUEST_DEADLINE))
    assert done[-1]["finishReason"] == "stop", done[-3:]
    return Spent(victim.chat_id, victim.history, answer, victim.approval_ids[0])


VICTIM_TEXTS = ["pay 50 to Hanako", "pay 50 to Hanako", "pay 10 to Alice and 20 to Bob", "where am I", "play track 2"]
TOOLS = ("process_payment", "get_location", "change_bgm")
OUTCOMES = ("approved", "denied", "timeout", "cancelled")
BROWSER_OUTCOMES = ("output", "error", "timeout", "cancelled")


def approval_metrics(gw: GatewayProcess) -> dict[str, float]:
    out = {"pending": metric_value(gw.base, "adk_gateway_approvals_pending")}
    for tool in TOOLS:
        for outcome in OUTCOMES:
            out[f"approval:{tool}:{outcome}"] = metric_value(
                gw.base, "adk_gateway_approval_wait_seconds_count", {"tool": tool, "outcome": outcome}
            )
        for outcome in BROWSER_OUTCOMES:
            out[f"browser:{tool}:{outcome}"] = metric_value(
                gw.base, "adk_gateway_browser_tool_wait_seconds_count", {"tool": tool, "outcome": outcome}
            )
    return out


def setup_victims(gw: GatewayProcess, auth: dict[str, str] | None = None, texts: list[str] = VICTIM_TEXTS) -> Fuzz:
    fuzz = Fuzz(gw, auth)
    fuzz.spent = [make_spent(gw, True, auth), make_spent(gw, False, auth)]
    fuzz.victims = [make_pending(gw, text, auth) for text in texts]
    fuzz.baseline = approval_metrics(gw)
    assert fuzz.baseline["pending"] == sum(len(v.approval_ids) for v in fuzz.victims), fuzz.baseline
    fuzz.new_log_lines()  # the fuzz checks start here
    TALLY.approvals_checked += sum(len(v.gate_ids) for v in fuzz.victims)
    return fuzz


# ---- sending -------------------------------------------------------------------------------


def send(
    fuzz: Fuzz, name: str, method: str, path: str, body: bytes | None, headers: dict[str, str] | None = None,
    *, what: Any = None,
) -> TimedReply | None:
    """One fuzz request, checked: no 5xx, well-formed answers, no crash logged, no victim touched.

    None when the gateway closed the connection without answering, which is accepted for
    requests it may refuse while they are still being sent (bodies over the limit, oversized headers).
    """
    what = what if what is not None else (method, path, headers, body[:300] if body else body)
    request_id = fuzz.next_request_id(what)
    headers = {"X-Request-Id": request_id, **(headers or {})}
    started = time.monotonic()
    try:
        reply = bounded_request(
            fuzz.base, method, path, body, headers, total=REQUEST_DEADLINE,
            default_content_type="Content-Type" not in headers,
        )
    except TimeoutError:
        raise AssertionError(f"no answer within {REQUEST_DEADLINE}s to {what!r:.2000}") from None
    except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected) as exc:
        oversized = (body is not None and len(body) > 4 * 1024 * 1024) or sum(
            len(k) + len(v) for k, v in (headers or {}).items()
        ) > 8000
        TALLY.notes[f"connection closed without an answer ({type(exc).__name__})"] += 1
        assert oversized, f"the gateway closed the connection without answering {what!r:.2000}: {exc!r}"
        reply = None
    fuzz.timed(time.monotonic() - started, what)
    if reply is not None:
        fuzz.check_answer(reply, what, method)
    fuzz.after_case(what, request_id)
    fuzz.case(name)
    return reply


def is_crash(line: dict[str, Any]) -> bool:
    """A log line that says something failed unhandled (aiohttp's 400 for a malformed HTTP message
    is logged at error level with a traceback too; that is counted as a note, not a crash)."""
    if line.get("logger") == "aiohttp.server" and str(line.get("event", "")).startswith("Error handling request"):
        TALLY.notes["aiohttp logs a malformed request at level error with a traceback"] += 1
        return False
    if "raw" in line:
        return "Traceback" in line["raw"]
    return (
        line.get("level") in ("error", "critical", "exception") or line.get("event") in CRASH_EVENTS
        or "exception" in line
    )


def gating(data: bytes | str) -> bool:
    """The input would make the demo agent call a gated tool (fuzz input must not create approvals)."""
    text = data.decode("latin-1") if isinstance(data, bytes) else data
    return GATING_TEXT.search(text) is not None


async def ws_exchange(
    base: str, frames: list[str | bytes], *, query: str = "", headers: dict[str, str] | None = None,
    max_frame: int = 256 * 1024, deadline: float = REQUEST_DEADLINE, wait_for: set[str] = frozenset(),  # type: ignore[assignment]
) -> list[dict[str, Any]]:
    """Send frames on a fresh socket, then a sentinel `resume` whose `no-active` proves the socket
    still reads and answers. Returns the frames received (checked for shape) once the sentinel and
    every request in `wait_for` got a terminal frame (error, end, no-active)."""
    import asyncio

    import aiohttp

    received: list[dict[str, Any]] = []
    sentinel = "sentinel-" + secrets.token_hex(4)
    async with aiohttp.ClientSession() as http_, http_.ws_connect(
        base + "/api/chat/ws" + query, headers=headers or {}, max_msg_size=0, heartbeat=None
    ) as ws:
        too_big = False
        for frame in frames:
            too_big = len(frame.encode() if isinstance(frame, str) else frame) > max_frame
            try:
                if isinstance(frame, bytes):
                    await ws.send_bytes(frame)
                else:
                    await ws.send_str(frame)
            except ConnectionError:
                assert too_big, f"the gateway dropped the socket while frames {frames!r:.1500} were sent"
            if too_big:
                break
        if not too_big:
            await ws.send_str(json.dumps({"type": "resume", "requestId": sentinel, "id": "fz-sentinel-none"}))
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline
        sentinel_seen, pending = False, set(wait_for)
        while True:
            remaining = end - loop.time()
            assert remaining > 0, f"no answer to the sentinel (or to {pending}) within {deadline}s; got {received[-5:]}"
            try:
                msg = await asyncio.wait_for(ws.receive(), remaining)
            except TimeoutError:
                raise AssertionError(
                    f"no answer to the sentinel (or to {pending}) within {deadline}s after {frames!r:.1500}; got {received[-5:]}"
                ) from None
            if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.ERROR):
                assert too_big, f"socket closed ({ws.close_code}, {msg.data!r}) after frames {frames!r:.1500}"
                # 1009 when the close frame made it; 1006 / a reset when the client was still sending.
                TALLY.notes[f"socket closed for a frame over the limit (code {ws.close_code})"] += 1
                return received
            assert msg.type is aiohttp.WSMsgType.TEXT, (msg.type, msg.data)
            frame_in = json.loads(msg.data)
            assert isinstance(frame_in, dict) and frame_in.get("type") in WS_TYPES, frame_in
            if frame_in["type"] == "error":
                assert isinstance(frame_in.get("errorText"), str) and "Traceback" not in frame_in["errorText"], frame_in
            received.append(frame_in)
            if frame_in.get("requestId") == sentinel:
                assert frame_in["type"] == "no-active", frame_in
                sentinel_seen = True
            if frame_in["type"] in ("error", "end", "no-active"):
                pending.discard(frame_in.get("requestId"))
            if sentinel_seen and not pending:
                break
    check_ws_sequences(received)
    return received


WS_TYPES = {"chunk", "end", "start", "no-active", "error"}


def check_ws_sequences(frames: list[dict[str, Any]]) -> None:
    """Chunk frames of one request are numbered without gaps."""
    last: dict[str, int] = {}
    for frame in frames:
        if frame["type"] != "chunk":
            continue
        rid, seq = frame["requestId"], frame["sequence"]
        if rid in last:
            assert seq == last[rid] + 1, f"gap in request {rid!r}: {last[rid]} then {seq}"
        last[rid] = seq


# ---- the end: the owner answers ------------------------------------------------------------

LOCATION = {"latitude": 35.6812, "longitude": 139.7671}


def _text(chunks: list[dict[str, Any]]) -> str:
    return "".join(c.get("delta", "") for c in chunks if c["type"] == "text-delta")


def answer_victims(fuzz: Fuzz) -> list[str]:
    """Answer every victim as its owner would (approve some, deny others, run the browser tools);
    return what did not complete as it should (empty: all did)."""
    problems: list[str] = []

    def post(victim: Pending, message: dict[str, Any]) -> list[dict[str, Any]] | None:
        body = {"id": victim.chat_id, "messages": [*victim.history, message], "messageId": message["id"]}
        reply = bounded_request(fuzz.base, "POST", "/api/chat", body, fuzz.auth, total=REQUEST_DEADLINE)
        if reply.status != 200:
            problems.append(f"{victim.text!r} in {victim.chat_id}: answer got {reply.status} {reply.body[:200]!r}")
            return None
        return check_stream(reply)

    def output_message(victim: Pending, tool: str, output: dict[str, Any], approval: str | None) -> dict[str, Any]:
        part: dict[str, Any] = {
            "type": f"tool-{tool}", "toolCallId": victim.tool_call_ids[0], "state": "output-available",
            "input": {}, "output": output,
        }
        if approval:
            part["approval"] = {"id": approval, "approved": True}
        return {"id": victim.first.chunks[0]["messageId"], "role": "assistant", "parts": [{"type": "step-start"}, part]}

    for i, victim in enumerate(fuzz.victims):
        if victim.browser_output:  # play track 2: the browser runs change_bgm
            chunks = post(victim, output_message(victim, "change_bgm", {"playing": 2}, None))
            if chunks is not None and (chunks[-1].get("finishReason") != "stop" or "track 2" not in _text(chunks)):
                problems.append(f"{victim.text!r}: the output did not complete the turn: {chunks}")
            continue
        decisions = [(i + j) % 2 == 0 for j in range(len(victim.approval_ids))]
        chunks = post(victim, assistant_from(victim.first, decisions))
        if chunks is None:
            continue
        kinds = [c["type"] for c in chunks]
        if victim.text == "where am I" and decisions[0]:
            if "tool-input-available" not in kinds:
                problems.append(f"{victim.text!r}: approved, but the browser tool was not handed over: {kinds}")
                continue
            chunks = post(victim, output_message(victim, "get_location", LOCATION, victim.approval_ids[0]))
            if chunks is not None and (chunks[-1].get("finishReason") != "stop" or "35.6812" not in _text(chunks)):
                problems.append(f"{victim.text!r}: the location did not complete the turn: {chunks}")
            continue
        if victim.text == "where am I":
            want_available, want_denied = 0, 1
        else:
            want_available, want_denied = sum(decisions), len(decisions) - sum(decisions)
        if (kinds.count("tool-output-available"), kinds.count("tool-output-denied")) != (want_available, want_denied) or (
            chunks[-1].get("finishReason") != "stop"
        ):
            problems.append(f"{victim.text!r} answered {decisions}: got {kinds}")
    return problems


def final_check(fuzz: Fuzz) -> None:
    """No victim changed under fuzz (metrics and log), then each completes when its owner answers."""
    fuzz.after_case("(the final check)")
    now = approval_metrics(fuzz.gateway)
    changed = {k: (fuzz.baseline[k], v) for k, v in now.items() if v != fuzz.baseline.get(k)}
    problems = answer_victims(fuzz)
    after = approval_metrics(fuzz.gateway)
    answered = sum(len(v.approval_ids) for v in fuzz.victims)
    decided = sum(
        after[f"approval:{tool}:{outcome}"] - now[f"approval:{tool}:{outcome}"]
        for tool in TOOLS for outcome in ("approved", "denied")
    )
    if after["pending"] != now["pending"] - answered:
        problems.append(f"adk_gateway_approvals_pending went {now['pending']} -> {after['pending']}, expected -{answered}")
    if decided != answered:
        problems.append(f"approved+denied went up by {decided}, expected {answered}")
    fuzz.after_case("(the owner's answers)", owner=True)
    TALLY.lost[fuzz.base] = len(fuzz.lost) + len(problems) + (1 if changed else 0)
    assert not fuzz.lost, f"approvals changed by fuzz input: {fuzz.lost}"
    assert not changed, f"approval metrics changed during the fuzz run (no valid answer was sent): {changed}"
    assert not problems, problems
    assert not fuzz.unattributed, f"crashes logged that could not be pinned on one case: {fuzz.unattributed[:3]}"
    fuzz.assert_healthy()
