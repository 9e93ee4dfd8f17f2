"""The agentic shape (issue 18): short turns, approval pairs, the tool-heavy stream, time to first text.

Real agent chats are many short turns (every approval and every browser tool answer is a new
request) with many tool events. Each measurement here runs the gateway and the bare passthrough
(and, for time to first text, the fake upstream reached straight) on the same requests:

- `chat_turns`: C browsers, each sending turns back to back for about `seconds`. `new`: every turn
  is a chat's first (a fresh chat id: the gateway leaves the ADK session to the fake, which creates
  it with the run as ADK's `--auto_create_session` does; a bare proxy has no sessions). `warm`: a chat's later turns,
  the body carrying the conversation as useChat sends it (every earlier user and assistant message,
  then the new user message). CPU per turn of each process, turns/s at the client.
- `approval_pairs`: a turn pair around a gated tool. Through the gateway: the first turn streams
  the gated call, the plugin (`GatewayPlugin`, in this process as in the agent's) asks the gateway,
  the response ends with the approval request; the second POST carries the approval, the plugin's
  call returns, the tool "runs" (the fake releases the run) and the rest streams. Through a bare
  proxy: the same events as two `/run_sse` runs that end (`gate_before`, `gate_after`). The
  gateway's upstream is `/run_live` here: the held engine, the only one in which the plugin waits.
- `first_text`: sequential requests, one at a time, time from sending the request to the first
  text event (the gateway's first `text-delta` chunk; ADK's first event with text), for a new chat
  and a warm one (the `gateway_creates` route: a gateway creating each new chat's session first,
  as in front of ADK without the flag); and the fake's own round trip for a session lookup and a
  session create.
- `tool_converter`: the converter alone against the orjson floor (as the `converter` phase
  measures) on the tool-heavy stream in turns of 303 events.
"""

from __future__ import annotations

import asyncio
import random
import time
from functools import cache
from typing import Any

import aiohttp
import orjson

from .clients import APP, USER, Route, Sink, SseConversation, Totals, client_session
from .events import TOOL_TURN, StreamSpec, stream_events, tool_events
from .procs import Proc
from .scenarios import CpuWindow, _convert_all, _feed_only, _floor, _time_per_event, approval_pair, pct

_JSON = {"Content-Type": "application/json"}
# What marks the first text: the gateway's first text-delta chunk, ADK's first event with a text part.
_FIRST_TEXT = {"gw-sse": b'"type":"text-delta"', "adk-sse": b'"parts":[{"text":'}


# ---- the conversation as useChat sends it ------------------------------------------------------


@cache
def assistant_parts(spec: StreamSpec) -> tuple[dict[str, Any], ...]:
    """The parts of the assistant message useChat holds after a turn of `spec`'s events (folded
    from the ADK events, not from the gateway's chunks, so it does not depend on the code measured):
    step-start, the text streamed as partials, each tool call with its input and output."""
    parts: list[dict[str, Any]] = []
    text: dict[str, Any] | None = None
    tools: dict[str, dict[str, Any]] = {}
    new_step = True
    for raw in stream_events(spec):
        event = orjson.loads(raw)
        partial = bool(event.get("partial"))
        for part in (event.get("content") or {}).get("parts") or ():
            if "functionResponse" in part:
                response = part["functionResponse"]
                tool = tools.get(response["id"])
                if tool is not None:
                    tool.update(state="output-available", output=response.get("response"))
                new_step = True  # the model's next words are a new step
                continue
            # Text streams as partials (the final event repeats it); a call counts in its final event.
            if not (partial and "text" in part) and not (not partial and "functionCall" in part):
                continue
            if new_step:
                parts.append({"type": "step-start"})
                new_step, text = False, None
            if "text" in part:
                if text is None:
                    text = {"type": "text", "text": "", "state": "done"}
                    parts.append(text)
                text["text"] += part["text"]
            else:
                call = part["functionCall"]
                tool = {"type": f"tool-{call['name']}", "toolCallId": call["id"], "state": "input-available", "input": call.get("args") or {}}
                tools[call["id"]] = tool
                parts.append(tool)
                text = None
    return tuple(parts)


class ChatTurns(SseConversation):
    """One browser's turns over an SSE route: through the gateway as useChat posts them, through a
    bare proxy as ADK's client does (`/run_sse`, the new message only).

    `new`: every turn opens a fresh chat (session). Warm: the chat's history grows by the user's
    message and the assistant's answer each turn; after `history_turns` turns it starts over from its
    first exchange (same chat: the gateway keeps no copy of the history to compare), so a warm turn
    carries 1 to history_turns - 1 earlier exchanges.
    """

    def __init__(self, route: Route, http: aiohttp.ClientSession, chat_id: str, *, new: bool, history_turns: int = 8) -> None:
        super().__init__(route, http, chat_id)
        self.prefix = chat_id
        self.new = new
        self.history_turns = max(2, history_turns)
        self.history: list[dict[str, Any]] = []
        self.gateway = route.kind.startswith("gw")

    def _request(self, spec: StreamSpec) -> tuple[str, bytes]:
        if self.new:
            self.chat_id = f"{self.prefix}-{self.turns}"
        if not self.gateway:
            body: dict[str, Any] = {
                "appName": APP, "userId": USER, "sessionId": self.chat_id, "streaming": True,
                "newMessage": {"role": "user", "parts": [{"text": spec.text()}]},
            }
            return self.route.base + "/run_sse", orjson.dumps(body)
        user = {"id": f"u{self.turns}", "role": "user", "parts": [{"type": "text", "text": spec.text()}]}
        messages = [user] if self.new else [*self.history, user]
        if not self.new:
            if len(self.history) >= 2 * (self.history_turns - 1):
                del self.history[2:]
            self.history += [user, {"id": f"a{self.turns}", "role": "assistant", "parts": list(assistant_parts(spec))}]
        return self.route.base + "/api/chat", orjson.dumps({"id": self.chat_id, "messages": messages, "trigger": "submit-message"})


# ---- short turns --------------------------------------------------------------------------------


async def chat_turns(
    route: Route, *, concurrency: int, spec: StreamSpec, new: bool, seconds: float, measure: dict[str, Proc],
    history_turns: int = 8, tag: str = "turns", max_turns: int = 200_000,
) -> dict[str, Any]:
    """`concurrency` browsers each sending turns of `spec` back to back for about `seconds`."""
    events_per_turn = len(stream_events(spec))
    async with client_session() as http:
        chats = [
            ChatTurns(route, http, f"{tag}-{route.name}-{concurrency}-{i}-{random.randrange(1 << 30)}", new=new, history_turns=history_turns)
            for i in range(concurrency)
        ]
        # One unmeasured turn each: connections pooled; a warm chat's session made, its first exchange held.
        warm = Totals()

        async def first(c: ChatTurns) -> None:
            sink = Sink()
            warm.add(sink, await c.turn(spec, sink))

        await asyncio.gather(*(first(c) for c in chats))
        totals = Totals()
        budget = {"left": max_turns}
        window = CpuWindow(measure)
        deadline = time.perf_counter() + seconds

        async def worker(c: ChatTurns) -> None:
            while budget["left"] > 0:
                budget["left"] -= 1
                sink = Sink()
                totals.add(sink, await c.turn(spec, sink))
                if time.perf_counter() >= deadline:
                    return

        window.start()
        await asyncio.gather(*(worker(c) for c in chats))
        cpu = window.stop()
    turns = totals.streams + totals.failed
    row: dict[str, Any] = {
        "concurrency": concurrency, "chats": "new" if new else "warm", "events_per_turn": events_per_turn,
        "turns": totals.streams, "failed": totals.failed + warm.failed, "errors": totals.errors + warm.errors,
        "frames": totals.frames, "bytes_out": totals.bytes, "turns_per_s": totals.streams / cpu["wall_s"],
        "events_per_s": totals.streams * events_per_turn / cpu["wall_s"],
    }
    row.update(cpu)
    for k in (*measure, "client"):
        row[f"cpu_us_per_turn_{k}"] = cpu[f"cpu_s_{k}"] * 1e6 / max(turns, 1)
        row[f"cpu_us_per_event_{k}"] = cpu[f"cpu_s_{k}"] * 1e6 / max(turns * events_per_turn, 1)
    return row


# ---- approval round trips as turn pairs ---------------------------------------------------------


async def _gateway_pair(http: aiohttp.ClientSession, gateway: str, fake: str, plugin: Any, chat: str, seq: int) -> int:
    """One approval pair through the gateway (the `approval` phase's flow); returns the events it carried."""
    await approval_pair(http, gateway, fake, plugin, chat, seq)
    return 8


async def _proxy_pair(http: aiohttp.ClientSession, base: str, chat: str) -> int:
    """The same events through a bare proxy: two `/run_sse` runs that end."""
    for mode in ("gate_before", "gate_after"):
        spec = StreamSpec(mode=mode, tool="process_payment")
        body = {"appName": APP, "userId": USER, "sessionId": chat, "streaming": True, "newMessage": {"role": "user", "parts": [{"text": spec.text()}]}}
        async with http.post(base + "/run_sse", data=orjson.dumps(body), headers=_JSON) as resp:
            data = await resp.read()
            if resp.status != 200 or b"data: " not in data:
                raise RuntimeError(f"{mode} answered HTTP {resp.status}: {data[:300]!r}")
    return 8


async def approval_pairs(
    route: Route, *, concurrency: int, seconds: float, measure: dict[str, Proc], fake: str,
    internal: str = "", secret: str = "", tag: str = "pair", max_pairs: int = 100_000,
) -> dict[str, Any]:
    """`concurrency` browsers each running approval pairs (a new chat each) back to back for about `seconds`."""
    plugin = None
    if route.kind.startswith("gw"):
        from gateway.agent_plugin import GatewayPlugin

        plugin = GatewayPlugin(url=internal, secret=secret)
    pairs = failures = 0
    errors: list[str] = []
    seq = 0

    async def one(http: aiohttp.ClientSession, worker: int) -> bool:
        nonlocal seq
        seq += 1
        chat = f"{tag}-{route.name}-{concurrency}-{worker}-{seq}-{random.randrange(1 << 30)}"
        try:
            if plugin is not None:
                await asyncio.wait_for(_gateway_pair(http, route.base, fake, plugin, chat, seq), 20)
            else:
                await asyncio.wait_for(_proxy_pair(http, route.base, chat), 20)
        except Exception as exc:  # noqa: BLE001 - counted and reported
            errors.append(repr(exc)[:300])
            return False
        return True

    try:
        async with client_session() as http:
            # One unmeasured pair each: connections pooled (the plugin's to the gateway too).
            warm = await asyncio.gather(*(one(http, i) for i in range(concurrency)))
            failures += warm.count(False)
            window = CpuWindow(measure)
            deadline = time.perf_counter() + seconds
            budget = {"left": max_pairs}

            async def worker(i: int) -> None:
                nonlocal pairs, failures
                while budget["left"] > 0 and failures <= 20:
                    budget["left"] -= 1
                    if await one(http, i):
                        pairs += 1
                    else:
                        failures += 1
                    if time.perf_counter() >= deadline:
                        return

            window.start()
            await asyncio.gather(*(worker(i) for i in range(concurrency)))
            cpu = window.stop()
    finally:
        if plugin is not None:
            await plugin.close()
    row: dict[str, Any] = {
        "concurrency": concurrency, "pairs": pairs, "failed": failures, "errors": errors[:3],
        "requests_per_pair": 2, "events_per_pair": 8, "pairs_per_s": pairs / cpu["wall_s"],
        "turns_per_s": 2 * pairs / cpu["wall_s"],
    }
    row.update(cpu)
    for k in (*measure, "client"):
        row[f"cpu_us_per_pair_{k}"] = cpu[f"cpu_s_{k}"] * 1e6 / max(pairs, 1)
    return row


# ---- time to first text ---------------------------------------------------------------------------


async def _first_text(chat: ChatTurns, spec: StreamSpec) -> float:
    """Send one turn; microseconds from sending it to the first text arriving (the rest is read too)."""
    url, body = chat._request(spec)
    chat.turns += 1
    needle = _FIRST_TEXT[chat.route.kind]
    buf = b""
    first = 0
    t0 = time.perf_counter_ns()
    async with chat.http.post(url, data=body, headers=_JSON) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{chat.route.name} answered HTTP {resp.status}: {(await resp.read())[:300]!r}")
        async for data in resp.content.iter_any():
            if not first:
                buf = buf[-len(needle):] + data
                if needle in buf:
                    first = time.perf_counter_ns()
    if not first:
        raise RuntimeError(f"{chat.route.name}: no text in the turn")
    return (first - t0) / 1000


async def first_text(routes: list[Route], fake: Proc, *, iterations: int, spec: StreamSpec, history_turns: int = 8) -> dict[str, Any]:
    """Time to first text, sequential, new and warm chats, every route in turn per iteration (so
    drift on a noisy machine hits them alike); "added" is over the direct route (the fake reached
    straight). Also the fake's own round trip for the session calls a new chat makes the gateway do."""
    out: dict[str, Any] = {"new": {}, "warm": {}}
    samples: dict[tuple[str, str], list[float]] = {}
    async with client_session() as http:
        chats = {
            (route.name, kind): ChatTurns(
                route, http, f"ttft-{kind}-{route.name}-{random.randrange(1 << 30)}", new=kind == "new", history_turns=history_turns
            )
            for route in routes for kind in ("new", "warm")
        }
        for chat in chats.values():  # warm-up: connections pooled, the warm chats' sessions made
            await _first_text(chat, spec)
        for _ in range(iterations):
            for key, chat in chats.items():
                samples.setdefault(key, []).append(await _first_text(chat, spec))
        # The fake's own round trips for what a new chat costs the gateway upstream: a session
        # lookup (404 for a new chat) and a session create.
        lookups: list[float] = []
        creates: list[float] = []
        base = f"{fake.base}/apps/{APP}/users/anonymous/sessions"
        for i in range(max(iterations, 1)):
            sid = f"rtt-{i}-{random.randrange(1 << 30)}"
            t0 = time.perf_counter_ns()
            async with http.get(f"{base}/{sid}") as resp:
                await resp.read()
            t1 = time.perf_counter_ns()
            async with http.post(base, data=orjson.dumps({"sessionId": sid}), headers=_JSON) as resp:
                await resp.read()
            t2 = time.perf_counter_ns()
            lookups.append((t1 - t0) / 1000)
            creates.append((t2 - t1) / 1000)
    for (name, kind), values in samples.items():
        out[kind][name] = {"requests": len(values), "first_text_us_p50": pct(values, 50), "first_text_us_p90": pct(values, 90),
                           "first_text_us_p99": pct(values, 99)}
    for kind in ("new", "warm"):
        direct = out[kind].get("direct")
        for row in out[kind].values():
            if direct is not None:
                row["added_us_p50"] = row["first_text_us_p50"] - direct["first_text_us_p50"]
    out["upstream_session_rtt"] = {
        "lookup_us_p50": pct(lookups, 50), "create_us_p50": pct(creates, 50), "lookup_us_p90": pct(lookups, 90),
        "create_us_p90": pct(creates, 90), "requests": len(creates),
    }
    return out


# ---- the converter on the tool-heavy events ---------------------------------------------------------


def tool_converter(*, seconds: float, trials: int, events: int, per_turn: int = TOOL_TURN) -> dict[str, Any]:
    """Converter vs the orjson floor on the tool-heavy stream, in runs (turns) of `per_turn` events:
    a fresh converter per run, start and finish included, as the `converter` phase measures."""
    stream = tool_events(events)
    runs = [(f"turn{i}", tuple(stream[i : i + per_turn])) for i in range(0, len(stream), per_turn)]
    parsed = [(n, tuple(orjson.loads(r) for r in e)) for n, e in runs]
    floor = conv = feed = float("inf")
    for _ in range(trials):  # interleaved, so drift hits both sides alike
        floor = min(floor, _time_per_event(_floor, runs, len(stream), seconds / trials, 1))
        conv = min(conv, _time_per_event(_convert_all, runs, len(stream), seconds / trials, 1))
        feed = min(feed, _time_per_event(_feed_only, parsed, len(stream), seconds / trials, 1))  # type: ignore[arg-type]
    return {
        "events": len(stream), "runs": len(runs), "bytes_per_event": sum(map(len, stream)) / len(stream),
        "floor_us_per_event": floor, "converter_us_per_event": conv, "feed_only_us_per_event": feed,
        "converter_events_per_s": 1e6 / conv, "ratio_to_floor": conv / floor,
    }
