"""The tests build their chat services, clocks and fake ADKs from tests/support (docs/testing.md,
"Test support"), so that a change to how a service is built, or to what ADK answers, is made once.
Checked on the source, as test_layers.py checks the gateway's imports."""

from __future__ import annotations

import os
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
SUPPORT = TESTS / "support"

# Files that still build their own, each with why; the list may only shrink (checked below).
OWN_SERVICE: set[str] = set()
OWN_CLOCK: set[str] = set()
OWN_ADK = {
    # The scenarios' replayed ADK: the scripted ADK (tests.support.adk) fed from a recording.
    "scenarios/replay.py",
}

SERVICE = re.compile(r"\bChatService\(")
CLOCK = re.compile(r"^\s*class \w*(Clock|Wall)\b", re.M)
# A class that answers `/run_sse` or `/run_live` as the agent client does is a fake ADK.
ADK = re.compile(r"^\s*(async )?def (run_sse_batches|open_live)\(", re.M)


def _sources() -> dict[str, str]:
    sources = {}
    # os.walk does not follow links: tests/js/node_modules is a link to the pinned clients.
    for folder, dirs, files in os.walk(TESTS):
        dirs[:] = [d for d in dirs if d not in ("node_modules", "__pycache__") and Path(folder, d) != SUPPORT]
        for name in files:
            path = Path(folder, name)
            if name.endswith(".py") and path != Path(__file__):
                sources[path.relative_to(TESTS).as_posix()] = path.read_text(encoding="utf-8")
    return sources


def _holding(pattern: re.Pattern[str]) -> set[str]:
    return {name for name, text in _sources().items() if pattern.search(text)}


def test_chat_services_are_built_by_the_factory() -> None:
    assert _holding(SERVICE) <= OWN_SERVICE, "build it with tests.support.service.chat_service"


def test_there_is_one_clock() -> None:
    assert _holding(CLOCK) <= OWN_CLOCK, "use tests.support.clock.Clock"


def test_there_is_one_fake_adk() -> None:
    assert _holding(ADK) <= OWN_ADK, "use tests.support.adk (add the behaviour as an option there)"


def test_the_exceptions_only_shrink() -> None:
    # An exception whose file no longer needs it is taken off the list.
    for pattern, allowed in ((SERVICE, OWN_SERVICE), (CLOCK, OWN_CLOCK), (ADK, OWN_ADK)):
        assert allowed <= _holding(pattern), allowed - _holding(pattern)


def test_the_checks_can_fail() -> None:
    assert SERVICE.search("chats = ChatService(agents=...)")
    assert CLOCK.search("class Clock:\n") and CLOCK.search("    class _Clock:\n") and CLOCK.search("class Wall:\n")
    assert ADK.search("    async def run_sse_batches(self, **_: Any) -> Any:\n")
    assert ADK.search("    async def open_live(self, **_: Any) -> Any:\n")
