"""The recorded ADK event streams (tests/fixtures/adk*, per ADK release), read as the upstream client
reads them, converted, and the ordering rules every converted response must keep."""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

from gateway.core.converter import Converter
from gateway.core.ledger import Ledger
from gateway.core.protocol import ClientVersion
from gateway.upstream.client import _parsed

ROOT = Path(__file__).resolve().parents[1] / "fixtures"
# Recorded from `/run_sse` (tests/fixtures/adk) and from `/run_live` (tests/fixtures/adk_live) of the
# newest ADK; VERSIONS below adds the same recordings from older ones.
FIXTURES = ROOT / "adk"
LIVE = "adk_live"
# The same scenarios recorded from every supported ADK (tests/fixtures/adk/record.py --adk V):
# ADK version -> (/run_sse folder, /run_live folder). The unversioned folders are the newest ADK.
VERSIONS: dict[str, tuple[str, str]] = {
    "2.13": ("adk", LIVE),
    "1.39.1": ("adk-1.39.1", "adk_live-1.39.1"),
    "1.22.1": ("adk-1.22.1", "adk_live-1.22.1"),
}
SSE_FOLDERS = [sse for sse, _live in VERSIONS.values()]
LIVE_FOLDERS = [live for _sse, live in VERSIONS.values()]


@cache
def lines(name: str, folder: str) -> tuple[str, ...]:
    """A recording's lines as recorded (one event each)."""
    return tuple((ROOT / folder / f"{name}.jsonl").read_text().splitlines())


def events(name: str, folder: str = "adk") -> list[dict[str, Any]]:
    """A recording's events, parsed as the upstream client parses /run_sse payloads."""
    if folder.startswith(LIVE):
        return [json.loads(line) for line in lines(name, folder) if line.strip()]
    return list(_parsed([line.encode() for line in lines(name, folder) if line.strip()]))


def fixture_names(folder: str = "adk") -> list[str]:
    return sorted(p.stem for p in (ROOT / folder).glob("*.jsonl") if p.stat().st_size)


def continuing(message_id: str, *, version: ClientVersion = 6, known: Iterable[str] = (), denied: Iterable[str] = ()) -> Converter:
    """A converter for a run that continues a message after native answers (`denied`: the calls denied)."""
    ledger = Ledger()
    ledger.begin_run(denied)
    return Converter(message_id, version, known_tool_calls=known, ledger=ledger)


def convert(name: str, converter: Converter | None = None, folder: str = "adk") -> list[dict[str, Any]]:
    converter = converter or Converter("m1")
    out = converter.start()
    for event in events(name, folder):
        out += converter.feed(event)
    return out + converter.finish()


def types(chunks: list[dict[str, Any]]) -> list[str]:
    return [c["type"] for c in chunks]


def check_stream_rules(chunks: list[dict[str, Any]], known: Iterable[str] = ()) -> None:
    """The ordering rules the AI SDK client enforces (its schema check runs in tests/js)."""
    assert chunks[0]["type"] == "start" and chunks[-1]["type"] == "finish"
    open_blocks: set[str] = set()
    tools = set(known)
    step_open = False
    for i, chunk in enumerate(chunks):
        kind = chunk["type"]
        where = f"chunk {i} {chunk}"
        if kind in ("text-start", "reasoning-start"):
            assert chunk["id"] not in open_blocks, where
            open_blocks.add(chunk["id"])
        elif kind in ("text-delta", "reasoning-delta"):
            assert chunk["id"] in open_blocks, f"delta outside its block: {where}"
        elif kind in ("text-end", "reasoning-end"):
            assert chunk["id"] in open_blocks, where
            open_blocks.discard(chunk["id"])
        elif kind == "start-step":
            assert not step_open, f"step opened twice: {where}"
            step_open = True
        elif kind in ("finish-step", "finish"):
            assert not open_blocks, f"{kind} with open blocks {open_blocks}"
            if kind == "finish-step":
                assert step_open, f"finish-step without start-step: {where}"
                step_open = False
            else:
                assert not step_open, "finish with a step still open"
        elif kind in ("tool-input-start", "tool-input-available"):
            tools.add(chunk["toolCallId"])
        elif kind.startswith("tool-"):
            assert chunk["toolCallId"] in tools, f"tool chunk for an unknown call: {where}"
