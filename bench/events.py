"""ADK event streams for the benchmarks, built from events recorded from the real API server.

Everything here is bytes exactly as ADK sends them (compact JSON, one event per `data:` line on
`/run_sse`, one per text frame on `/run_live`), taken from tests/fixtures/adk (run_sse) and
tests/fixtures/adk_live (run_live), which tests/fixtures/*/record.py recorded from the stock ADK
API server running the demo agent.

A benchmark stream of n events repeats two recorded turns: a streamed text answer ("hello there":
partial text deltas, then the aggregated final event with usage) and a tool turn ("weather in
Tokyo": the function call streamed and final, its function response, then streamed text). Each
repetition gets fresh function call ids, so the converter sees a new tool call every time, as it
would in a long conversation. `size` pads the text of text events so each event's JSON is about
that many bytes (0 keeps the recorded sizes, about 400-700 bytes).

The tool-heavy stream (`tool_events`, issue 18) is turns of 303 events: 100 rounds of a partial
text, a function call with its recorded arguments and its function response with the recorded
result (get_weather and process_payment in turn, fresh call ids), then two partial texts and the
final text; about 500 bytes an event.

The fake upstream learns what to stream from the user's message text: `StreamSpec.text()`
("bench mode=burst n=500 ..."), which the gateway forwards upstream unchanged.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from functools import cache
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"

# Paced events carry the upstream's send time (CLOCK_MONOTONIC, shared by every process on the
# machine) in their text: "@T<19 digits>@". It survives the gateway's conversion (it is in the
# text delta) and the passthroughs (bytes unchanged), so the client computes each event's latency.
MARK_PLACEHOLDER = b"@T" + b"0" * 19 + b"@"
MARK_PATTERN = rb"@T(\d{19})@"

_FILLER = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "


@dataclass(frozen=True)
class StreamSpec:
    """What the fake upstream streams for one run (or one live turn)."""

    mode: str = "burst"  # burst: n events at full speed; paced: n events interval_ms apart;
    # hold: one event, then the stream stays open hold_s seconds; gate: a function call to
    # `tool`, held until /bench/release, then its response and text; gate_before / gate_after:
    # those two halves as two runs that end; tools: n events of the tool-heavy stream; text: one
    # long answer, n - 1 streamed text events and the final one.
    n: int = 500
    size: int = 0
    batch: int = 1  # burst: events per write (ADK writes each event on its own)
    interval_ms: float = 0.0
    hold_s: float = 0.0
    tool: str = "process_payment"

    def text(self) -> str:
        return "bench " + " ".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))

    @classmethod
    def parse(cls, text: str) -> StreamSpec:
        if not text.startswith("bench"):
            return cls(mode="burst", n=9)
        kinds = {f.name: f.type for f in fields(cls)}
        values: dict[str, Any] = {}
        for item in text.split()[1:]:
            key, _, value = item.partition("=")
            if key in kinds:
                default = getattr(cls, key)
                values[key] = type(default)(value)
        return cls(**values)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@cache
def recorded(name: str, folder: str = "adk") -> tuple[bytes, ...]:
    """One recorded run (or live session) as its raw event payloads."""
    path = FIXTURES / folder / f"{name}.jsonl"
    return tuple(line for line in path.read_bytes().splitlines() if line.strip())


def recorded_runs(folder: str = "adk") -> list[tuple[str, tuple[bytes, ...]]]:
    """Every non-empty recording of a folder: the 'recorded event mix'."""
    names = sorted(p.stem for p in (FIXTURES / folder).glob("*.jsonl") if p.stat().st_size)
    return [(name, recorded(name, folder)) for name in names]


def _call_ids(events: tuple[bytes, ...]) -> list[bytes]:
    ids: list[bytes] = []
    for raw in events:
        for part in (orjson.loads(raw).get("content") or {}).get("parts") or ():
            for key in ("functionCall", "functionResponse"):
                if key in part and part[key].get("id"):
                    call_id = part[key]["id"].encode()
                    if call_id not in ids:
                        ids.append(call_id)
    return ids


def _instance(segment: tuple[bytes, ...], k: int) -> list[bytes]:
    """A segment with fresh function call ids (repetition k)."""
    out = list(segment)
    for i, call_id in enumerate(_call_ids(segment)):
        fresh = b"bench-call-%d-%d" % (k, i)
        out = [raw.replace(call_id, fresh) for raw in out]
    return out


def _pad(raw: bytes, size: int) -> bytes:
    """Grow the text of a text event until its JSON is about `size` bytes."""
    missing = size - len(raw)
    if missing <= 0:
        return raw
    event = orjson.loads(raw)
    for part in (event.get("content") or {}).get("parts") or ():
        if "text" in part:
            part["text"] += (_FILLER * (missing // len(_FILLER) + 1))[:missing]
            return orjson.dumps(event)
    return raw


def _segments(live: bool) -> tuple[tuple[bytes, ...], tuple[bytes, ...], bytes | None]:
    if not live:
        return recorded("hello_there"), recorded("weather_tokyo"), None
    text = recorded("hello_there", "adk_live")
    tool = recorded("weather_tokyo", "adk_live")
    complete = b'"turnComplete":true'
    return (
        tuple(e for e in text if complete not in e),
        tuple(e for e in tool if complete not in e),
        next(e for e in text if complete in e),
    )


@cache
def burst_events(n: int, size: int = 0, live: bool = False) -> tuple[bytes, ...]:
    """n events of the recorded mix (live: the last one is `turnComplete`)."""
    text, tool, complete = _segments(live)
    room = n - (1 if complete else 0)
    out: list[bytes] = []
    k = 0
    while True:
        segment = (text, tool)[k % 2]
        if len(out) + len(segment) > room:
            break
        out += _instance(segment, k)
        k += 1
    # The rest: streamed text and its final event, so a stream always ends with the model speaking.
    rest = room - len(out)
    partials, final = text[:-1], text[-1]
    if rest > 0:
        out += [partials[i % len(partials)] for i in range(rest - 1)] + [final]
    if size:
        out = [_pad(raw, size) for raw in out]
    if complete:
        out.append(complete)
    return tuple(out)


@cache
def paced_template(size: int = 0, live: bool = False) -> tuple[bytes, bytes, bytes, bytes | None]:
    """(prefix, suffix, final, complete): a paced event is prefix + b"%019d" % send_ns + suffix."""
    text, _tool, complete = _segments(live)
    event = orjson.loads(text[0])
    event["content"]["parts"][0]["text"] = MARK_PLACEHOLDER.decode() + " " + event["content"]["parts"][0]["text"]
    raw = _pad(orjson.dumps(event), size) if size else orjson.dumps(event)
    start = raw.index(MARK_PLACEHOLDER) + 2
    return raw[:start], raw[start + 19 :], text[-1], complete


def hold_events(live: bool = False) -> tuple[bytes, ...]:
    text, _tool, _complete = _segments(live)
    return (text[0],)


def gate_events(call_id: str, tool: str, live: bool = False) -> tuple[list[bytes], list[bytes]]:
    """A gated tool turn: (before the plugin's verdict, after it), from the recorded tool turn (live:
    the `/run_live` recording, whose call has no partial event and whose turn ends `turnComplete`)."""
    events = recorded("weather_tokyo", "adk_live") if live else recorded("weather_tokyo")
    original = _call_ids(events)[0]
    if live:
        fc, fr, *after = events
        before = [fc]
    else:
        fc_partial, fc_final, fr, *after = events
        before = [fc_partial, fc_final]

    def rename(raw: bytes) -> bytes:
        event = orjson.loads(raw.replace(original, call_id.encode()))
        for part in event["content"]["parts"]:
            if "functionCall" in part:
                part["functionCall"].update(name=tool, args={"amount": 50, "recipient": "Hanako", "currency": "USD"})
            if "functionResponse" in part:
                part["functionResponse"].update(name=tool, response={"success": True, "transaction_id": "tx-1"})
        return orjson.dumps(event)

    return [rename(raw) for raw in before], [rename(fr), *after]


# ---- the tool-heavy stream (issue 18) -------------------------------------------------------------

# One tool-heavy turn: 100 rounds of (partial text, function call, function response), then two
# partial texts and the aggregated final text: 100 calls, 100 responses, 102 partial texts, 303
# events. The long tool-heavy stream is ten of these back to back (3,030 events).
TOOL_TURN = 303


@cache
def _tool_material() -> tuple[tuple[tuple[bytes, bytes], ...], tuple[bytes, ...], bytes]:
    """(function call event, its response event) pairs, partial text events and a final text event,
    all recorded from the stock ADK server (tests/fixtures/adk)."""
    weather, pay, paid, hello = (recorded(n) for n in ("weather_tokyo", "pay_hanako", "pay_hanako_approve", "hello_there"))
    # The final (partial: false) call events: the call as ADK runs it, with the model's usage.
    calls = ((weather[1], weather[2]), (pay[1], paid[0]))
    partials = (*weather[3:-1], *paid[1:-1], *hello[:-1])
    return calls, partials, weather[-1]


def tool_turn(m: int, k: int = 0) -> list[bytes]:
    """A tool-heavy turn of m events (instance k: fresh function call ids)."""
    calls, partials, final = _tool_material()
    rounds = max(0, (m - 3) // 3)
    out: list[bytes] = []
    for j in range(rounds):
        call, response = calls[j % len(calls)]
        (original,) = _call_ids((call,))
        fresh = b"bench-tool-%d-%d" % (k, j)
        out += [partials[j % len(partials)], call.replace(original, fresh), response.replace(original, fresh)]
    tail = m - len(out)
    out += [partials[(rounds + i) % len(partials)] for i in range(tail - 1)] + [final] * (tail > 0)
    return out


@cache
def tool_events(n: int) -> tuple[bytes, ...]:
    """The tool-heavy stream of n events: tool turns of TOOL_TURN events (the last one cut to fit)."""
    out: list[bytes] = []
    k = 0
    while len(out) < n:
        out += tool_turn(min(TOOL_TURN, n - len(out)), k)
        k += 1
    return tuple(out)


@cache
def text_events(n: int, size: int = 0) -> tuple[bytes, ...]:
    """One long text answer of n events: the recorded streamed text events in turn, then its final event."""
    text, _tool, _complete = _segments(False)
    partials, final = text[:-1], text[-1]
    out = [partials[i % len(partials)] for i in range(max(0, n - 1))] + [final]
    return tuple(_pad(raw, size) for raw in out) if size else tuple(out)


def stream_events(spec: StreamSpec, live: bool = False) -> tuple[bytes, ...]:
    """The events the fake upstream streams for a burst-like spec (burst, tools, text; text is SSE only)."""
    if spec.mode == "tools":
        return tool_events(spec.n)
    if spec.mode == "text":
        return text_events(spec.n, spec.size)
    return burst_events(spec.n, spec.size, live)
