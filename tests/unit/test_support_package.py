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
OWN_GATEWAY = {
    # Runs in an operator's ADK venv (test_adk_versions.py): the standard library, google-adk and
    # the plugin, no aiohttp guaranteed (google-adk 2.x does not depend on it), which FakeGateway
    # needs. Its stand-in is http.server's, which adk_confirm_probe.py reuses.
    "integration/adk_plugin_probe.py",
}

SERVICE = re.compile(r"\bChatService\(")
CLOCK = re.compile(r"^\s*class \w*(Clock|Wall)\b", re.M)
# A class that answers `/run_sse` or `/run_live` as the agent client does is a fake ADK.
ADK = re.compile(r"^\s*(async )?def (run_sse_batches|open_live)\(", re.M)
# A server answering the internal listener's routes (aiohttp's, or http.server's path check) is a fake gateway.
GATEWAY = re.compile(r"""(\.add_(get|post)|\bweb\.(get|post))\(\s*["']/internal/v1/|!= ["']/internal/v1/""")


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


def test_there_is_one_fake_gateway() -> None:
    assert _holding(GATEWAY) <= OWN_GATEWAY, "use tests.support.fake_gateway.FakeGateway (add the behaviour as an option there)"


def test_the_exceptions_only_shrink() -> None:
    # An exception whose file no longer needs it is taken off the list.
    for pattern, allowed in ((SERVICE, OWN_SERVICE), (CLOCK, OWN_CLOCK), (ADK, OWN_ADK), (GATEWAY, OWN_GATEWAY)):
        assert allowed <= _holding(pattern), allowed - _holding(pattern)


def test_the_checks_can_fail() -> None:
    assert SERVICE.search("chats = ChatService(agents=...)")
    assert CLOCK.search("class Clock:\n") and CLOCK.search("    class _Clock:\n") and CLOCK.search("class Wall:\n")
    assert ADK.search("    async def run_sse_batches(self, **_: Any) -> Any:\n")
    assert ADK.search("    async def open_live(self, **_: Any) -> Any:\n")
    assert GATEWAY.search('    app.router.add_get("/internal/v1/policy", self.policy)\n')
    assert GATEWAY.search("app.add_routes([web.post('/internal/v1/tool-calls', calls)])")
    assert GATEWAY.search('        if self.path.split("?")[0] != "/internal/v1/policy":\n')
    assert not GATEWAY.search('resp = await client.post("/internal/v1/tool-calls", json=body)')
