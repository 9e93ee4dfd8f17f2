"""Every response the converter makes from recorded ADK runs passes the AI SDK's own checks.

Each chunk is validated with `uiMessageChunkSchema` of ai 6 and ai 7, and the whole response is
assembled by the SDK's `readUIMessageStream`, which enforces ordering (deltas inside blocks, tool
chunks for known calls). Continuations are assembled onto the message the first response built,
with the approval answered, as a Chat would hold it.
"""

from __future__ import annotations

import copy

import pytest

from gateway.core.converter import Converter
from tests.jsdriver import check_streams
from tests.support.recordings import LIVE_FOLDERS, SSE_FOLDERS, continuing, convert, fixture_names

pytestmark = pytest.mark.js

# continuation fixture -> (fixture that asked for the approval, decisions in call order)
CONTINUATIONS = {
    "pay_hanako_approve": ("pay_hanako", [True]),
    "pay_hanako_deny": ("pay_hanako_deny_setup", [False]),
    "pay_two_approve_one_deny_other": ("pay_two", [True, False]),
    "pay_hanako_pending_late_approve": ("pay_hanako_pending_setup", [True]),
    "pay_hanako_extra_key_then_approve": ("pay_hanako_extra_key_setup", [True]),
    "typed_reject": ("typed_setup", [False]),
    # Empty from 2.13 on; ADK 1.x runs the confirmed tool again for an answer it already had.
    "typed_late_approve": ("typed_setup", [True]),
    "confirm_pay_deny": ("confirm_pay", [False]),
}


def _answer(message: dict, decisions: list[bool]) -> tuple[dict, list[str], list[str]]:
    parts = [p for p in message["parts"] if p.get("state") == "approval-requested"]
    assert len(parts) == len(decisions)
    for part, approved in zip(parts, decisions):
        part["state"] = "approval-responded"
        part["approval"]["approved"] = approved
    known = [p["toolCallId"] for p in message["parts"] if "toolCallId" in p]
    denied = [p["toolCallId"] for p, ok in zip(parts, decisions) if not ok]
    return message, known, denied


@pytest.mark.parametrize("folder", SSE_FOLDERS)
@pytest.mark.parametrize("version", [6, 7])
def test_all_recorded_runs_pass_the_sdk(version: int, folder: str) -> None:
    """On the recordings of every supported ADK (tests/support/recordings.py VERSIONS)."""
    first = [n for n in fixture_names(folder) if n not in CONTINUATIONS]
    converted = {n: convert(n, folder=folder) for n in first}
    results = dict(zip(first, check_streams([{"version": version, "chunks": converted[n]} for n in first])))
    for name, result in results.items():
        assert result["schemaErrors"] == [], (name, result["schemaErrors"])
        # An `error` chunk is the one way a response may fail, and the SDK must report its text.
        errors = [c["errorText"] for c in converted[name] if c["type"] == "error"]
        assert result["streamError"] == (errors[0] if errors else None), (name, result["streamError"])

    cases, names = [], []
    for name, (setup, decisions) in CONTINUATIONS.items():
        if name not in fixture_names(folder):
            continue  # ADK answered it with nothing (a recording that is empty)
        # A copy: two continuations may answer the same first response (typed_reject, typed_late_approve).
        message, known, denied = _answer(copy.deepcopy(results[setup]["message"]), decisions)
        converter = continuing(message["id"], version=version, known=known, denied=denied)
        cases.append({"version": version, "chunks": convert(name, converter, folder), "message": message})
        names.append(name)
    for name, result in zip(names, check_streams(cases)):
        assert result["schemaErrors"] == [], (name, result["schemaErrors"])
        assert result["streamError"] is None, (name, result["streamError"])
        states = [p.get("state") for p in result["message"]["parts"] if "toolCallId" in p]
        assert "approval-requested" not in states and "approval-responded" not in states, (name, states)
        assert result["message"]["id"] == "m1"


@pytest.mark.parametrize("folder", LIVE_FOLDERS)
@pytest.mark.parametrize("version", [6, 7])
def test_recorded_live_sessions_pass_the_sdk(version: int, folder: str) -> None:
    names = fixture_names(folder)
    converted = {n: convert(n, Converter("m1", version=version), folder=folder) for n in names}
    for name, result in zip(names, check_streams([{"version": version, "chunks": converted[n]} for n in names])):
        assert result["schemaErrors"] == [], (name, result["schemaErrors"])
        errors = [c["errorText"] for c in converted[name] if c["type"] == "error"]
        assert result["streamError"] == (errors[0] if errors else None), (name, result["streamError"])
    finish = converted["interrupt"][-1]
    assert finish["finishReason"] == ("interrupted" if version == 7 else "other")
