"""What one event costs on the gateway's hot path, stage by stage, in process (CPU us per event).

Sampling profiles (bench/profile.py) show where a loaded gateway spends its time; this measures
the same stages deterministically with the gateway's own objects, on the benchmark stream mix
(1,020 recorded events), so the owner of each stage can see its price:

- decode: gateway.eventstream.EventStreamDecoder.feed, reads of 1 event (ADK writes each event on
  its own) and of 16 events (a saturated socket);
- parse: orjson.loads of each event;
- async generator hops: the event passing AdkClient.run_sse -> ChatService._events -> _drive,
  two nested async generators (minus a plain loop over the same events);
- convert: Converter.feed on parsed events;
- publish: RunDriver.publish with the chunks of each event (chunk metrics, encode_chunk, the run
  log, the pause check), and its parts: counting chunks (GatewayMetrics.chunk_counts), encode_chunk;
- follow: Response.follow waking its follower task once per event (isolated events): a plain
  future, and with the SSE transport's keep-alive interval (one timer per follower);
- frame: the SSE transport's b"".join(map(sse_frame, batch)).

Stages that the gateway's code no longer has (it is being changed) are reported as None.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import inspect
import time
from collections.abc import Callable
from typing import Any

import orjson

from .events import burst_events


def _best(fn: Callable[[], Any], events: int, seconds: float, trials: int) -> float:
    fn()
    best = float("inf")
    for _ in range(trials):
        gc.collect()
        reps = 0
        start = time.process_time_ns()
        deadline = time.perf_counter() + seconds / trials
        while reps < 100_000 and (reps == 0 or time.perf_counter() < deadline):
            fn()
            reps += 1
        best = min(best, (time.process_time_ns() - start) / 1000 / (reps * events))
    return best


def _warm_heap() -> None:
    """Keep glibc from trimming the heap between repetitions.

    orjson.dumps allocates each result through malloc; a benchmark that frees everything between
    repetitions makes glibc hand the memory back to the kernel, and every repetition then pays a
    page fault per chunk (about 3 us of system time each here), which a long-running gateway with
    a warm heap does not. (Measured: 1 minor fault per dumps without this, ~0 with it.)
    """
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD
        libc.mallopt(-3, 1 << 30)  # M_MMAP_THRESHOLD


def breakdown(seconds: float = 1.0, trials: int = 3, raws: list[bytes] | None = None) -> dict[str, Any]:
    """Each stage's CPU us per event on `raws` (default: the benchmark stream mix, 1,020 events)."""
    _warm_heap()
    raws = list(raws if raws is not None else burst_events(1020))
    events = [orjson.loads(r) for r in raws]
    n = len(raws)
    frames1 = [b"data: " + r + b"\n\n" for r in raws]
    frames16 = [b"".join(frames1[i : i + 16]) for i in range(0, n, 16)]
    out: dict[str, Any] = {"events": n}

    def stage(name: str, fn: Callable[[], Any]) -> None:
        try:
            out[name] = _best(fn, n, seconds, trials)
        except Exception as exc:  # noqa: BLE001 - the gateway's internals move; report, do not fail
            out[name] = None
            out[f"{name}_error"] = repr(exc)

    from gateway.core.eventstream import EventStreamDecoder

    def decode(reads: list[bytes]) -> Callable[[], Any]:
        def run() -> None:
            decoder = EventStreamDecoder()
            for data in reads:
                decoder.feed(data)

        return run

    stage("decode_1_event_per_read_us", decode(frames1))
    stage("decode_16_events_per_read_us", decode(frames16))
    def parse() -> None:
        loads = orjson.loads
        for r in raws:
            loads(r)

    stage("parse_us", parse)

    async def inner():  # type: ignore[no-untyped-def]
        for e in events:
            yield e

    async def middle():  # type: ignore[no-untyped-def]
        async for e in inner():
            yield e

    async def nested() -> None:
        async for _e in middle():
            pass

    async def plain() -> None:
        for _e in events:
            pass

    loop = asyncio.new_event_loop()
    try:
        hops = _best(lambda: loop.run_until_complete(nested()), n, seconds, trials)
        base = _best(lambda: loop.run_until_complete(plain()), n, seconds, trials)
        out["async_generator_hops_us"] = hops - base
    finally:
        loop.close()

    from gateway.core.converter import Converter

    def convert() -> list[list[dict[str, Any]]]:
        c = Converter("msg-bench")
        return [c.feed(e) for e in events]

    stage("convert_us", convert)
    chunk_lists = convert()
    chunks = [c for cl in chunk_lists for c in cl]
    out["chunks_per_event"] = len(chunks) / n

    from gateway.ops.metrics import GatewayMetrics
    from gateway.core.protocol import encode_chunk, sse_frame

    metrics = GatewayMetrics()
    kinds = [c["type"] for c in chunks]
    counts = metrics.chunk_counts

    def count() -> None:
        for kind in kinds:
            counts[kind] = counts.get(kind, 0) + 1

    stage("metrics_count_chunk_us", count)
    stage("encode_chunk_us", lambda: [encode_chunk(c) for c in chunks])
    encoded = [[encode_chunk(c) for c in cl] for cl in chunk_lists]
    stage("frame_sse_us", lambda: [b"".join(map(sse_frame, batch)) for batch in encoded])

    def publish() -> None:
        from gateway.chat.driver import RunDriver, RunHooks
        from gateway.core.ledger import Ledger
        from gateway.chat.chunk_log import Run
        from gateway.core.turn import Chunks, Turn

        run = Run("msg-bench", limit=10_000_000)
        hooks = RunHooks(metrics, time.monotonic, lambda call: None)
        # The driver names its chat's agent (the `agent` label of what it counts) where the code has it.
        agent = ("bench",) if "agent" in inspect.signature(RunDriver).parameters else ()
        driver = RunDriver(Turn("msg-bench", ledger=Ledger()), run, hooks, *agent)
        for cl in chunk_lists:
            driver.apply([Chunks(cl)])

    stage("publish_us", publish)

    nonempty = [batch for batch in encoded if batch]

    def follow(idle: float | None) -> Callable[[], Any]:
        async def run() -> None:
            from gateway.chat.chunk_log import Response

            response = Response(10_000_000)
            got = 0

            async def follower() -> None:
                nonlocal got
                kwargs = {} if idle is None else {"idle": idle}
                async for batch in response.follow(**kwargs):
                    got += len(batch)

            task = asyncio.ensure_future(follower())
            await asyncio.sleep(0)
            for batch in nonempty:
                response.append(batch)
                await asyncio.sleep(0)  # the follower runs: one wake per event, as with isolated events
                await asyncio.sleep(0)
            response.close(0.0)
            await task

        return run

    async def no_follower() -> None:
        for _batch in nonempty:
            await asyncio.sleep(0)
            await asyncio.sleep(0)

    loop = asyncio.new_event_loop()
    try:
        per = n / len(nonempty)
        base = _best(lambda: loop.run_until_complete(no_follower()), n, seconds, trials)
        plain = _best(lambda: loop.run_until_complete(follow(None)()), n, seconds, trials)
        keepalive = _best(lambda: loop.run_until_complete(follow(15.0)()), n, seconds, trials)
        out["follow_wake_us"] = (plain - base) * per
        out["follow_wake_with_keepalive_timer_us"] = (keepalive - base) * per
    except Exception as exc:  # noqa: BLE001
        out["follow_wake_us"] = None
        out["follow_wake_error"] = repr(exc)
    finally:
        loop.close()
    return out


if __name__ == "__main__":
    import json

    print(json.dumps(breakdown(), indent=1))
