"""A module's logger replaced in a test, to read what it logged."""

from __future__ import annotations

from typing import Any


class RecordingLog:
    """Stands in for a module's structlog logger: what was logged, by event name."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def _record(self, event: str, **fields: Any) -> None:
        self.events.append((event, fields))

    debug = info = warning = error = exception = _record

    def named(self, event: str) -> list[dict[str, Any]]:
        return [fields for name, fields in self.events if name == event]
