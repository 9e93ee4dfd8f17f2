"""The plain-JSON form of a chat's ledger (core/ledger.py): its version and the checks that read it back.

A ledger's state is plain JSON data (`Ledger.snapshot`: objects with string keys, lists, strings,
numbers, booleans, null) so that a chat can be stored and rebuilt elsewhere (issue 25). Reading it
back fails closed: whatever `snapshot` could not have written raises `MalformedLedger`, a
ValueError naming where in the snapshot it is wrong, and never becomes a ledger. The readers here
check one value each; `GatedCall.from_json` (core/approvals.py), `NativeConfirmation.from_json`
and `Ledger.restore` put them together.

Sans-IO, and importing nothing of the gateway: the ledger and its calls import it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from enum import Enum
from typing import Any, TypeVar

__all__ = [
    "MAX_DEPTH", "SNAPSHOT_VERSION", "MalformedLedger", "flag", "indices", "items", "json_object", "json_objects", "keyed",
    "member", "names", "number", "record", "refer", "text",
]

SNAPSHOT_VERSION = 1
# How deep a call's arguments or response may nest: orjson writes at most 254 levels, of which the
# snapshot takes a few, so whatever is restored can be written again.
MAX_DEPTH = 200
# orjson writes integers of at most 64 bits.
_INT_RANGE = (-(2**63), 2**64 - 1)

T = TypeVar("T")
E = TypeVar("E", bound=Enum)


class MalformedLedger(ValueError):
    """A ledger snapshot that does not validate: no ledger is made of it."""


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def record(data: Any, keys: Iterable[str], where: str) -> dict[str, Any]:
    """`data` as an object with exactly `keys`."""
    if not isinstance(data, dict):
        raise MalformedLedger(f"{where}: expected an object, got {_kind(data)}")
    wanted = tuple(keys)
    if missing := [k for k in wanted if k not in data]:
        raise MalformedLedger(f"{where}: missing {', '.join(missing)}")
    if unknown := [repr(k) for k in data if k not in wanted]:
        raise MalformedLedger(f"{where}: unknown keys {', '.join(unknown)}")
    return data


def text(fields: dict[str, Any], key: str, where: str, *, optional: bool = False) -> Any:
    """A string (or null, `optional`)."""
    value = fields[key]
    if isinstance(value, str) or (optional and value is None):
        return value
    raise MalformedLedger(f"{where}.{key}: expected a string, got {_kind(value)}")


def flag(fields: dict[str, Any], key: str, where: str) -> bool:
    value = fields[key]
    if isinstance(value, bool):
        return value
    raise MalformedLedger(f"{where}.{key}: expected true or false, got {_kind(value)}")


def number(fields: dict[str, Any], key: str, where: str, *, optional: bool = False) -> Any:
    """A finite number, as a float (or null, `optional`)."""
    value = fields[key]
    if optional and value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    raise MalformedLedger(f"{where}.{key}: expected a finite number, got {_kind(value)}")


def member(kind: type[E], fields: dict[str, Any], key: str, where: str, *, optional: bool = False) -> Any:
    """One of `kind`'s values, as its member (or null, `optional`)."""
    value = fields[key]
    if optional and value is None:
        return None
    for candidate in kind:
        if isinstance(value, str) and candidate.value == value:
            return candidate
    raise MalformedLedger(f"{where}.{key}: expected one of {', '.join(repr(c.value) for c in kind)}, got {value!r:.60}")


def json_object(fields: dict[str, Any], key: str, where: str, *, optional: bool = False) -> Any:
    """A JSON object of plain JSON values, copied (or null, `optional`)."""
    value = fields[key]
    if optional and value is None:
        return None
    if not isinstance(value, dict):
        raise MalformedLedger(f"{where}.{key}: expected an object, got {_kind(value)}")
    return _plain(value, f"{where}.{key}", 1)


def json_objects(fields: dict[str, Any], key: str, where: str) -> list[dict[str, Any]]:
    """A list of JSON objects of plain JSON values, copied; none when `key` is absent (a snapshot
    written before it)."""
    if key not in fields:
        return []
    return [json_object({"item": item}, "item", f"{where}.{key}[{i}]") for i, item in enumerate(items(fields, key, where))]


def _plain(value: Any, where: str, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise MalformedLedger(f"{where}: nested deeper than {MAX_DEPTH}")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        if not _INT_RANGE[0] <= value <= _INT_RANGE[1]:
            raise MalformedLedger(f"{where}: an integer beyond 64 bits")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise MalformedLedger(f"{where}: a number that is not finite")
        return value
    if isinstance(value, list):
        return [_plain(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    if isinstance(value, dict):
        for k in value:
            if not isinstance(k, str):
                raise MalformedLedger(f"{where}: a key that is not a string ({_kind(k)})")
        return {k: _plain(v, f"{where}.{k}", depth + 1) for k, v in value.items()}
    raise MalformedLedger(f"{where}: {_kind(value)} is not plain JSON")


def items(fields: dict[str, Any], key: str, where: str, *, most: int | None = None) -> list[Any]:
    """A list (of at most `most` items)."""
    value = fields[key]
    if not isinstance(value, list):
        raise MalformedLedger(f"{where}.{key}: expected a list, got {_kind(value)}")
    if most is not None and len(value) > most:
        raise MalformedLedger(f"{where}.{key}: more than {most} items")
    return value


def names(fields: dict[str, Any], key: str, where: str, *, most: int | None = None) -> list[str]:
    """A list of distinct strings, in order."""
    value = items(fields, key, where, most=most)
    for i, name in enumerate(value):
        if not isinstance(name, str):
            raise MalformedLedger(f"{where}.{key}[{i}]: expected a string, got {_kind(name)}")
    if len(set(value)) != len(value):
        raise MalformedLedger(f"{where}.{key}: a name listed twice")
    return value


def indices(fields: dict[str, Any], key: str, where: str, pool: list[T]) -> list[T]:
    """A list of positions in `pool`, as the objects there."""
    found = []
    for i, index in enumerate(items(fields, key, where)):
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(pool):
            raise MalformedLedger(f"{where}.{key}[{i}]: expected a position in a list of {len(pool)}, got {index!r:.60}")
        found.append(pool[index])
    return found


def refer(listed: list[str], known: dict[str, T], what: str) -> list[T]:
    """The objects `listed` names, each of which must be `known`."""
    for name in listed:
        if name not in known:
            raise MalformedLedger(f"{what}: names {name!r:.60}, which is not there")
    return [known[name] for name in listed]


def keyed(objects: Iterable[T], key: Callable[[T], str], what: str) -> dict[str, T]:
    """`objects` by `key`, in order; two with the same key are malformed (a dict holds one)."""
    found: dict[str, T] = {}
    for obj in objects:
        if key(obj) in found:
            raise MalformedLedger(f"{what}: {key(obj)!r:.60} listed twice")
        found[key(obj)] = obj
    return found
