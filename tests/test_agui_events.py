"""Every AG-UI stream the gateway makes from recorded ADK runs passes AG-UI's own checks (issue #40).

A recording goes the way a run of the AG-UI route goes: ADK's events through the chat's converter
(ai 7's chunks, core/converter.py), the chunks through `AguiStream` (core/agui_stream.py). Each event is validated with `@ag-ui/core`'s `EventSchema`; each stream goes through
`@ag-ui/client`'s `verifyEvents` (which refuses events out of order) and through the whole client
pipeline of an agent's `runAgent`, which assembles the messages. All of it in ONE Node call
(tests/js/check-agui.mjs). The same recordings through the AI SDK converter give the same words
and the same error sentences.
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway.core.agui_stream import AguiStream
from gateway.core.converter import Converter
from tests.jsdriver import check_agui_streams
from tests.support.recordings import LIVE_FOLDERS, SSE_FOLDERS, convert, fixture_names, lines

pytestmark = pytest.mark.js

# Deliberately broken streams, checked in the same Node call: the checker must see what is wrong.
OUT_OF_ORDER = [
    {"type": "RUN_STARTED", "threadId": "t1", "runId": "r1"},
    {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "no start"},
]
BAD_SCHEMA = [
    {"type": "RUN_STARTED", "threadId": "t1", "runId": "r1"},
    {"type": "RUN_FINISHED", "threadId": "t1", "runId": 5},
]


def _agui(name: str, folder: str) -> list[dict[str, Any]]:
    stream = AguiStream("t1", "r1")
    out = stream.start()
    for chunk in convert(name, Converter("m1", version=7), folder):
        out += stream.feed(chunk)
    return out + stream.end()


def _asks_confirmation(name: str, folder: str) -> bool:
    return any('"adk_request_confirmation"' in line for line in lines(name, folder))


def _sdk_text(chunks: list[dict[str, Any]]) -> str:
    return "".join(c["delta"] for c in chunks if c["type"] == "text-delta")


def _agui_text(messages: list[dict[str, Any]]) -> str:
    return "".join(m["content"] for m in messages if m["role"] == "assistant" and isinstance(m.get("content"), str))


def test_every_recorded_run_passes_ag_ui() -> None:
    cases = [(folder, name) for folder in SSE_FOLDERS + LIVE_FOLDERS for name in fixture_names(folder)]
    streams = [_agui(name, folder) for folder, name in cases]
    results = check_agui_streams([*streams, OUT_OF_ORDER, BAD_SCHEMA])
    broken, bad_schema = results[-2:]
    assert "No active text message found with ID 'm1'" in broken["verifyError"]
    assert [e["index"] for e in bad_schema["schemaErrors"]] == [1]

    for (folder, name), stream, result in zip(cases, streams, results):
        where = (folder, name)
        assert result["schemaErrors"] == [], (where, result["schemaErrors"])
        assert result["verifyError"] is None, (where, result["verifyError"])
        assert result["runError"] is None, (where, result["runError"])
        last = stream[-1]
        assert [e["type"] for e in stream].count(last["type"]) == 1, where
        if folder in LIVE_FOLDERS:
            continue  # transcriptions and audio are not mapped yet (docs/ag-ui.md, "Not yet")
        chunks = convert(name, Converter("m1", version=7), folder)
        sdk_errors = [c["errorText"] for c in chunks if c["type"] == "error"]
        if _asks_confirmation(name, folder) and not sdk_errors:
            # ADK asks a person: the run ends with the interrupt the next input's resume answers.
            assert last["type"] == "RUN_FINISHED" and last["outcome"]["type"] == "interrupt", where
            asked = [c for c in chunks if c["type"] == "tool-approval-request"]
            assert [i["toolCallId"] for i in last["outcome"]["interrupts"]] == [c["toolCallId"] for c in asked], where
        elif sdk_errors:
            # The same sentence the AI SDK routes show for the same failure.
            assert last["type"] == "RUN_ERROR" and last["message"] == sdk_errors[0], where
            assert result["runErrorEvent"] == sdk_errors[0], where
        else:
            assert last["type"] == "RUN_FINISHED" and last["outcome"] == {"type": "success"}, where
            assert _agui_text(result["messages"]) == _sdk_text(chunks), where
