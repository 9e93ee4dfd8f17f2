"""Reading an exported audit trail for a replay (approvals/replay.py): text in, records out (sans-IO).

Two exports are read, as they come (docs/approvals.md, "Audit trail"):
- the approvals API's answer, `GET /api/approvals?state=decided` (`{"approvals": [record, ...],
  "next": ...}`), or a JSON array of records (pages joined);
- log lines, one JSON object per line: those of event `approval_audit` are records (the logging
  fields beside them are left), lines of other events are left out, and a line without an `event`
  is taken as a record itself (a file of records, one per line).
Anything else is refused with where (`BadTrail`): a replay of a file it could not read whole would
review less than it says.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["BadTrail", "read_records"]

# What a record needs for a replay; the rest it reads when there (notice.py's fields).
_REQUIRED = ("approval_id", "agent", "tool")
# The fields structlog adds to a log line around the record's own.
_LOGGING = ("event", "level", "log_level", "logger", "timestamp")


class BadTrail(ValueError):
    """An export that is not an audit trail: what and where."""


def read_records(text: str, source: str = "<audit>") -> list[dict[str, Any]]:
    """The records of an export (either form), in its order; raises BadTrail."""
    stripped = text.strip()
    if not stripped:
        return []
    whole: Any = None
    if stripped[0] in "[{":
        try:
            whole = json.loads(stripped)
        except json.JSONDecodeError:
            whole = None  # JSON lines, each an object: read one by one below
    if isinstance(whole, dict) and "approvals" in whole:
        whole = whole["approvals"]
    if isinstance(whole, list):
        return [_checked(record, f"{source}: approvals[{i}]") for i, record in enumerate(whole)]
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BadTrail(f"{where}: not JSON ({exc.msg})") from None
        if isinstance(data, dict) and "event" in data:
            if data["event"] != "approval_audit":
                continue
            data = {key: value for key, value in data.items() if key not in _LOGGING}
        records.append(_checked(data, where))
    return records


def _checked(record: Any, where: str) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise BadTrail(f"{where}: a record is a JSON object, not {type(record).__name__}")
    if lacking := [key for key in _REQUIRED if not isinstance(record.get(key), str)]:
        raise BadTrail(f"{where}: not an audit record (no {', '.join(lacking)})")
    if record.get("kind") not in ("decided", "expired"):
        raise BadTrail(f"{where}: not a record of an ended approval (kind {record.get('kind')!r})")
    return record
