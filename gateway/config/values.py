"""The values a configuration is written in: durations (`30s`, `5m`), sizes (`4MiB`), base URLs
(`http_base`), and `Section`, the strict base of every section (config/schema.py, config/agent.py);
`agents_problem`, the one wording of a filter naming an agent the file does not have.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import BaseModel, BeforeValidator, ConfigDict

__all__ = ["ClaimValues", "Duration", "Section", "Size", "agents_problem", "http_base", "parse_duration", "parse_size"]


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(value: Any) -> float:
    """Seconds from `30s`, `5m`, `250ms`, `1.5h` or a bare number of seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 30s, 5m or 250ms")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ValueError(f"invalid duration {value!r}: use a number with ms, s, m, h or d (e.g. 30s)")
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    return seconds


_SIZE = re.compile(r"^\s*(\d+)\s*(B|KiB|MiB|GiB|KB|MB|GB)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"b": 1, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "kb": 1000, "mb": 1000**2, "gb": 1000**3}


def parse_size(value: Any) -> int:
    """Bytes from `1MiB`, `64KiB`, `500KB` or a bare number of bytes."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as 1MiB")
    if isinstance(value, int):
        return value
    match = _SIZE.match(str(value))
    if not match:
        raise ValueError(f"invalid size {value!r}: use bytes or a unit such as 64KiB, 1MiB")
    return int(match.group(1)) * _SIZE_UNITS[(match.group(2) or "b").lower()]


def http_base(url: str, what: str) -> str:
    """`url` when it is `http(s)://host[:port][/path]` without query or fragment (a base the gateway
    appends paths to: the public URL, the mailed links', Slack's), else ValueError naming `what`."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ValueError(f"{what} is http(s)://host[:port][/path], without query or fragment")
    return url


def agents_problem(key: str, named: Collection[str], agents: Collection[str]) -> str | None:
    """The problem of a filter at `key` naming agents not among `agents` (the file's), or None."""
    unknown = [a for a in named if a not in agents]
    return f"{key}: {', '.join(unknown)} not among the agents ({', '.join(agents)})" if unknown else None


def _values_as_lists(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: [v] if isinstance(v, str) else v for k, v in value.items()}
    return value


Duration = Annotated[float, BeforeValidator(parse_duration)]
Size = Annotated[int, BeforeValidator(parse_size)]
# Claims and the values each may have (`{groups: staff}` or `{groups: [staff, ops]}`); access/auth.py `claim_holds` matches them.
ClaimValues = Annotated[dict[str, list[str]], BeforeValidator(_values_as_lists)]


class Section(BaseModel):
    # Strict about keys (a typo must not silently become a default), lax about "8080" vs 8080,
    # because ${PORT:-8080} substitution always produces strings.
    model_config = ConfigDict(extra="forbid", frozen=True)
