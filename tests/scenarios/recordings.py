"""The recorded ADK runs that scenarios replay, one fixture set per google-adk release, and which
releases the project supports.

A fixture set is a folder of tests/fixtures named `adk*` (tests/support/recordings.py VERSIONS names them):
`<run>.jsonl` (every `data:` payload ADK's `/run_sse` answered, byte for byte), `requests.json` (the
exact `/run_sse` body each run was started with), and `adk_version.json`, the release that answered,
written by the recorder (tests/fixtures/adk/record.py, tests/fixtures/adk_live/record.py).
"""

from __future__ import annotations

import importlib.metadata
import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1] / "fixtures"
REPO = ROOT.parents[1]
VERSION_FILE = "adk_version.json"
# The newest ADK's `/run_sse` set (the project venv's release).
NEWEST = "adk"


def recording_folders() -> list[str]:
    """Every fixture set of recorded ADK runs, `/run_sse` and `/run_live` alike."""
    return sorted(p.name for p in ROOT.iterdir() if p.is_dir() and p.name.startswith("adk"))


def supported_adk_versions() -> set[str]:
    """The google-adk releases the project supports: `make compat`'s COMPAT_ADK (the older ones,
    the Makefile being where the project lists them) and the project venv's own, the newest."""
    text = (REPO / "Makefile").read_text(encoding="utf-8")
    match = re.search(r"^COMPAT_ADK\s*\?=\s*(\S+)\s*$", text, re.M)
    assert match, "the Makefile sets no COMPAT_ADK"
    return {v.strip() for v in match.group(1).split(",") if v.strip()} | {importlib.metadata.version("google-adk")}


def version_of(folder: str) -> str:
    """The release a fixture set was recorded from, as its recorder wrote it."""
    return str(json.loads((ROOT / folder / VERSION_FILE).read_text(encoding="utf-8"))["google-adk"])


@dataclass(frozen=True)
class Recordings:
    """One `/run_sse` fixture set."""

    folder: str = NEWEST

    @property
    def adk_version(self) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"\d+", version_of(self.folder))[:3])

    def payloads(self, run: str) -> list[bytes]:
        """The run's `data:` payloads, as ADK sent them."""
        return _payloads(self.folder, run)

    def request(self, run: str) -> dict[str, Any]:
        """The `/run_sse` body the recorder started `run` with (ADK answered it with the recording)."""
        return dict(_requests(self.folder)[run]["body"])

    def plugin_asks(self, run: str) -> list[dict[str, Any]]:
        """What the gateway's plugin in ADK asked the gateway during `run` (`body`, as posted to the
        internal listener) and the `verdict` it was answered, in order (none outside the demo's topology)."""
        return list(_requests(self.folder)[run].get("pluginAsks", ()))


@cache
def _payloads(folder: str, run: str) -> list[bytes]:
    lines = (ROOT / folder / f"{run}.jsonl").read_bytes().splitlines()
    return [line for line in lines if line.strip()]


@cache
def _requests(folder: str) -> dict[str, Any]:
    return dict(json.loads((ROOT / folder / "requests.json").read_text(encoding="utf-8")))
