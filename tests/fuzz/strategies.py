"""Hypothesis strategies for what a hostile or broken browser can send the gateway.

Bodies are Python values encoded by `encode`, which lets a strategy place `Raw` JSON text where a
value goes: NaN, 1e999, lone surrogate escapes, invalid UTF-8 bytes, nesting deeper than any
JSON library accepts (json.dumps itself would refuse to write those).
"""

from __future__ import annotations

import base64
import copy
import functools
import gzip
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from hypothesis import strategies as st

__all__ = [
    "Raw", "answer_plans", "chat_ids", "encode", "header_sets", "json_values", "near_valid_bodies",
    "raw_bodies", "resume_targets", "safe_texts", "ws_frames",
]


@dataclass(frozen=True)
class Raw:
    """JSON text inserted verbatim where a value goes."""

    text: bytes


def encode(value: Any) -> bytes:
    """JSON bytes for a value that may hold Raw pieces."""
    raws: list[bytes] = []

    def swap(v: Any) -> Any:
        if isinstance(v, Raw):
            raws.append(v.text)
            return f"\x00RAW{len(raws) - 1}\x00"
        if isinstance(v, dict):
            return {str(k): swap(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [swap(x) for x in v]
        return v

    text = json.dumps(swap(value), ensure_ascii=False).encode("utf-8", "surrogatepass")
    for i, raw in enumerate(raws):
        text = text.replace(f'"\\u0000RAW{i}\\u0000"'.encode(), raw, 1)
    return text


def approx_size(value: Any) -> int:
    """Roughly the bytes `encode` would write, without writing them."""
    if isinstance(value, str):
        return len(value) + 2
    if isinstance(value, Raw):
        return len(value.text)
    if isinstance(value, dict):
        return 2 + sum(approx_size(k) + approx_size(v) + 2 for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return 2 + sum(approx_size(v) + 2 for v in value)
    return 8


def nested(depth: int, kind: str = "list") -> Raw:
    if kind == "list":
        return Raw(b"[" * depth + b"]" * depth)
    return Raw(b'{"a":' * depth + b"1" + b"}" * depth)


# ---- values ------------------------------------------------------------------------------------

WEIRD_STRINGS = [
    "", " ", "\x00", "\u202e", "😀", "a" * 129, "a" * 257, "../../etc/passwd", "<script>alert(1)</script>",
    "%00", "\r\n\r\n", "gw-", "adk-", "null", "true", "0", "-1", "tool-", "dynamic-tool", "\ufeff", "\\",
    "data:", "data:image/png;base64,", "data:text/plain,hello", "javascript:alert(1)", "file:///etc/passwd",
]
SPECIAL_RAW = [
    Raw(b"NaN"), Raw(b"Infinity"), Raw(b"-Infinity"), Raw(b"1e999"), Raw(b"-0"), Raw(b"123456789012345678901234567890"),
    Raw(b'"\\ud800"'), Raw(b'"\\udc00\\ud800"'), Raw(b'"\xff\xfe"'), Raw(b'"\xc3\x28"'), Raw(b'"\xed\xa0\x80"'),
    Raw(b'"\x00"'), Raw(b"undefined"), Raw(b"'single'"), Raw(b'{"a":1,"a":2}'), Raw(b"[1,]"), Raw(b"{,}"),
]
HUGE_SIZES = [70_000, 300_000, 1_000_000, 4_200_000, 6_000_000]

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40), st.sampled_from(WEIRD_STRINGS),
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=12), children, max_size=6),
    max_leaves=25,
)
# Many words only above the body limit: below it the demo agent quotes them back a few words per
# event, and a 70 KB text is already a 6 s run (slow for a fuzz case, and no news about the gateway).
huge_strings = st.sampled_from(HUGE_SIZES).flatmap(
    lambda n: st.sampled_from(["x", "é", "ab "] if n > 4_000_000 else ["x", "é"]).map(lambda c: c * (n // len(c)))
)
deep_values = st.tuples(st.sampled_from([10, 100, 250, 600, 1023, 1100, 5000]), st.sampled_from(["list", "dict"])).map(
    lambda t: nested(*t)
)
wild_values = st.one_of(
    json_values, json_values, json_values, st.sampled_from(SPECIAL_RAW), deep_values, huge_strings,
)
# Without multi-megabyte strings (WebSocket frames have their own `big` kind).
small_wild_values = st.one_of(json_values, json_values, json_values, st.sampled_from(SPECIAL_RAW), deep_values)

# Texts for user messages. None of them may make the demo agent call a gated tool (harness.GATING_TEXT).
SAFE_TEXTS = ["hello there", "weather in Tokyo", "trigger error", "crash", "hi", "日本語で", "hello\x00there", "   "]
safe_texts = st.one_of(st.sampled_from(SAFE_TEXTS), st.text(max_size=200))

POOL = [f"fz-{i}" for i in range(8)]
chat_ids = st.one_of(
    st.sampled_from(POOL), st.from_regex(r"fz-[A-Za-z0-9_-]{1,40}", fullmatch=True),
)
message_ids = st.one_of(st.just("u-1"), st.text(min_size=1, max_size=20), st.sampled_from(WEIRD_STRINGS))
tool_types = st.one_of(
    st.sampled_from(["tool-process_payment", "tool-get_location", "tool-change_bgm", "tool-get_weather", "dynamic-tool"]),
    st.text(max_size=20).map(lambda t: "tool-" + t),
)
approval_ids = st.one_of(
    st.binary(min_size=16, max_size=16).map(lambda b: "gw-" + base64.urlsafe_b64encode(b).decode().rstrip("=")),
    st.binary(min_size=8, max_size=8).map(lambda b: "adk-" + b.hex()),
    st.text(min_size=1, max_size=40), st.sampled_from(["gw-", "adk-", "x" * 256, "x" * 257]),
)


def user_message(text: str, mid: str = "u-1") -> dict[str, Any]:
    return {"id": mid, "role": "user", "parts": [{"type": "text", "text": text}]}


# ---- near-valid bodies ---------------------------------------------------------------------


@st.composite
def valid_bodies(draw: st.DrawFn) -> dict[str, Any]:
    """Bodies the AI SDK could send (for fuzz chats; never touching the victims)."""
    chat = draw(chat_ids)
    text = draw(safe_texts)
    kind = draw(st.sampled_from(["user", "history", "file", "regenerate", "answer", "output", "extras"]))
    messages: list[dict[str, Any]] = [user_message(text)]
    body: dict[str, Any] = {"id": chat, "messages": messages, "trigger": "submit-message"}
    if kind == "history":
        messages[:0] = [
            user_message("hello there", "u-0"),
            {"id": "a-0", "role": "assistant", "parts": [{"type": "step-start"}, {"type": "text", "text": "hi", "state": "done"}]},
        ]
    elif kind == "file":
        url = draw(st.sampled_from([
            "data:image/png;base64,iVBORw0KGgo=", "data:text/plain;base64,aGVsbG8=", "https://example.com/a.png",
            "data:image/png;base64,!!notbase64", "data:text/plain,hello",
        ]))
        messages[0]["parts"].append({"type": "file", "mediaType": draw(st.sampled_from(["image/png", "text/plain", ""])), "url": url})
    elif kind == "regenerate":
        body["trigger"] = "regenerate-message"
        body["messageId"] = "a-0"
    elif kind in ("answer", "output"):
        part: dict[str, Any] = {"type": draw(tool_types), "toolCallId": "adk-" + draw(st.binary(min_size=6, max_size=6)).hex(), "input": {}}
        if kind == "answer":
            part.update(state="approval-responded", approval={"id": draw(approval_ids), "approved": draw(st.booleans())})
        else:
            part.update(state=draw(st.sampled_from(["output-available", "output-error"])), output={"ok": True}, errorText="x")
        messages.append({"id": "a-1", "role": "assistant", "parts": [{"type": "step-start"}, part]})
        body["messageId"] = "a-1"
    elif kind == "extras":
        body.update(draw(st.dictionaries(st.sampled_from(["aiSdkVersion", "metadata", "body", "headers", "x"]), json_values, max_size=3)))
    return body


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


MUTATIONS = ["delete", "replace", "replace", "wild", "wrong_type", "add_key", "unknown_part", "wrap", "repeat"]


@st.composite
def mutated(draw: st.DrawFn, value: Any) -> Any:
    value = copy.deepcopy(value)
    path = draw(st.sampled_from(_paths(value)))
    op = draw(st.sampled_from(MUTATIONS))
    if not path:
        return draw(wild_values) if op in ("delete", "replace", "wild") else value
    parent = value
    for key in path[:-1]:
        parent = parent[key]
    key = path[-1]
    current = parent[key]
    if op == "delete":
        del parent[key]
    elif op == "replace":
        parent[key] = draw(json_values)
    elif op == "wild":
        parent[key] = draw(wild_values)
    elif op == "wrong_type":
        parent[key] = draw(st.sampled_from([None, 0, 1.5, True, "", [], {}, [current], {"v": current}, str(current)]))
    elif op == "add_key" and isinstance(current, dict):
        current[draw(st.text(max_size=15))] = draw(wild_values)
    elif op == "unknown_part" and isinstance(current, list):
        current.append(draw(st.one_of(
            st.fixed_dictionaries({"type": st.text(max_size=20)}, optional={"text": json_values, "state": json_values}),
            json_values,
        )))
    elif op == "wrap":
        parent[key] = [current]
    elif op == "repeat" and isinstance(current, list) and current:
        factor = draw(st.sampled_from([2, 50, 499, 501, 2000]))
        # Keep the body within a few times the gateway's limit: past it every size is the same 413.
        factor = max(2, min(factor, 12_000_000 // max(1, approx_size(current))))
        parent[key] = current * factor
    return value


@st.composite
def near_valid_bodies(draw: st.DrawFn) -> Any:
    body = draw(valid_bodies())
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        body = draw(mutated(body))
    return body


# ---- raw bytes -----------------------------------------------------------------------------


@st.composite
def raw_bodies(draw: st.DrawFn) -> bytes:
    """Bytes that are almost, or not at all, a JSON body."""
    kind = draw(st.sampled_from(["binary", "truncated", "flipped", "bom", "utf16", "invalid_utf8", "concat", "ws"]))
    if kind == "binary":
        return draw(st.binary(max_size=3000))
    good = encode(draw(valid_bodies()))
    if kind == "truncated":
        return good[: draw(st.integers(min_value=0, max_value=max(0, len(good) - 1)))]
    if kind == "flipped":
        data = bytearray(good)
        for _ in range(draw(st.integers(min_value=1, max_value=5))):
            i = draw(st.integers(min_value=0, max_value=len(data) - 1))
            data[i] = draw(st.integers(min_value=0, max_value=255))
        return bytes(data)
    if kind == "bom":
        return b"\xef\xbb\xbf" + good
    if kind == "utf16":
        return good.decode("utf-8", "replace").encode(draw(st.sampled_from(["utf-16", "utf-16-le", "utf-32"])))
    if kind == "invalid_utf8":
        bad = draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80"]))
        return good.replace(b'"text":"', b'"text":"' + bad, 1) if b'"text":"' in good else good + bad
    if kind == "concat":
        return good + draw(st.sampled_from([b" ", b"\n{}", good, b"\x00"]))
    return draw(st.sampled_from([b"", b" ", b"null", b"[]", b"{}", b'"x"', b"0", b"{" * 5000]))


# ---- headers and query strings -------------------------------------------------------------

header_text = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF, blacklist_characters="\x7f"), max_size=60
)
header_names = st.from_regex(r"[A-Za-z][A-Za-z0-9-]{0,30}", fullmatch=True)


@st.composite
def header_sets(draw: st.DrawFn) -> dict[str, str]:
    headers: dict[str, str] = {}
    if draw(st.booleans()):
        headers["x-ai-sdk-version"] = draw(st.one_of(header_text, st.sampled_from(["6", "7", "v7", "7.0.1", "8", "", "7" * 500])))
    if draw(st.booleans()):
        headers["Content-Type"] = draw(st.one_of(header_text, st.sampled_from([
            "application/json", "text/plain", "multipart/form-data; boundary=x", "application/x-www-form-urlencoded",
            "", "application/json; charset=utf-16", "text/event-stream",
        ])))
    if draw(st.integers(min_value=0, max_value=9)) == 0:
        size = draw(st.sampled_from([4000, 8100, 8190, 8191, 9000, 20_000, 100_000]))
        headers[draw(st.sampled_from(["x-huge", "x-ai-sdk-version", "Cookie", "Authorization"]))] = "v" * size
    if draw(st.integers(min_value=0, max_value=9)) == 0:
        for i in range(draw(st.sampled_from([20, 100, 120, 200]))):
            headers[f"x-many-{i}"] = "1"
    for name, value in draw(st.dictionaries(header_names, header_text, max_size=3)).items():
        if name.lower() not in ("content-length", "transfer-encoding", "host", "connection", "content-encoding", "expect"):
            headers[name] = value
    return headers


query_strings = st.one_of(
    st.just(""),
    st.text(max_size=80).map(lambda t: "?" + quote(t, safe="=&")),
    st.sampled_from(["?aiSdkVersion=7", "?aiSdkVersion=" + "9" * 5000, "?a=%zz", "?%", "?a=1&a=2", "?access_token=x"]),
)
content_encodings = st.sampled_from([
    None, "gzip", "deflate", "br", "zstd", "identity", "gzip, gzip", "x-unknown", "bomb",
])


@functools.cache
def _gzip_bomb() -> bytes:
    """40 MiB of JSON whitespace in ~40 KiB of gzip: must hit the body limit, not the memory."""
    return gzip.compress(b"{" + b" " * (40 * 1024 * 1024) + b"}", compresslevel=6)


def apply_content_encoding(body: bytes, encoding: str | None) -> tuple[bytes, dict[str, str]]:
    """Body bytes and headers for a Content-Encoding case (some lie about the encoding)."""
    if encoding is None:
        return body, {}
    if encoding == "bomb":
        return _gzip_bomb(), {"Content-Encoding": "gzip"}
    if encoding == "gzip" and body[:2] != b"\x1f\x8b" and len(body) % 2:
        return gzip.compress(body), {"Content-Encoding": "gzip"}  # honest half of the time
    return body, {"Content-Encoding": encoding}


# ---- resume GETs ---------------------------------------------------------------------------

resume_targets = st.one_of(
    st.sampled_from(["$victim", "$spent", "$pool"]),
    st.from_regex(r"[A-Za-z0-9_-]{1,128}", fullmatch=True),
    st.from_regex(r"[A-Za-z0-9_-]{129,200}", fullmatch=True),
    st.text(max_size=60).map(lambda t: quote(t, safe="")),
    st.text(max_size=30),
    st.sampled_from(["..", "%2e%2e", "a%2Fb", "%00", "a/b", "", "%", "%zz", "a?b", "a#b", "ü"]),
)


# ---- approval answers ----------------------------------------------------------------------


@st.composite
def answer_plans(draw: st.DrawFn) -> dict[str, Any]:
    """What a forged answer looks like; tests resolve it against the live victims (see test_approvals)."""
    return {
        "target": draw(st.sampled_from(["fuzz", "fuzz", "victim", "victim", "spent"])),
        "victim": draw(st.integers(min_value=0, max_value=1000)),
        "id_kind": draw(st.sampled_from(["victim", "other_victim", "spent", "random_gw", "random_native", "random_text", "empty"])),
        "state": draw(st.one_of(
            st.sampled_from(["approval-responded"] * 4 + ["approval-requested", "output-available", "output-error"]),
            st.text(max_size=20),
        )),
        "approved": draw(st.one_of(st.booleans(), st.booleans(), st.booleans(), json_values)),
        "part_type": draw(tool_types),
        "call_id": draw(st.sampled_from(["victim", "random", "missing"])),
        "reason": draw(st.one_of(st.none(), st.text(max_size=50))),
        "then_user": draw(st.booleans()),
        "message_id": draw(st.one_of(st.none(), st.just("$reply"), message_ids)),
        "random_id": draw(approval_ids),
        "mutations": draw(st.integers(min_value=0, max_value=2)),
        "transport": draw(st.sampled_from(["sse", "sse", "ws"])),
    }


# ---- WebSocket frames ----------------------------------------------------------------------

request_ids = st.one_of(st.sampled_from(["r1", "r2", "r3"]), st.text(max_size=20), st.just("r" * 129), json_values)


@st.composite
def ws_frames(draw: st.DrawFn) -> str | bytes:
    """One frame from the browser: text (JSON or not) or binary."""
    kind = draw(st.sampled_from(["text", "json", "send", "send", "resume", "abort", "audio", "binary", "big"]))
    if kind == "text":
        return draw(st.text(max_size=200))
    if kind == "json":
        return encode(draw(small_wild_values)).decode("utf-8", "replace")
    if kind == "binary":
        return draw(st.binary(max_size=500))
    if kind == "big":
        return json.dumps({"type": "send", "requestId": "big", "pad": "x" * draw(st.sampled_from([200_000, 300_000]))})
    frame: dict[str, Any] = {"type": kind, "requestId": draw(request_ids)}
    if kind == "send":
        body = draw(near_valid_bodies())
        if isinstance(body, dict):
            frame.update({k: body[k] for k in ("id", "messages", "trigger", "messageId") if k in body})
        frame["headers"] = draw(st.one_of(st.just({}), st.dictionaries(st.sampled_from(["x-ai-sdk-version", "X-AI-SDK-VERSION", "a"]), json_values, max_size=2), json_values))
        frame["body"] = draw(st.one_of(st.just({}), st.dictionaries(st.sampled_from(["aiSdkVersion", "id", "messages"]), json_values, max_size=2), json_values))
    elif kind == "resume":
        frame["id"] = draw(st.one_of(chat_ids, json_values))
        if draw(st.booleans()):
            frame["lastSequence"] = draw(st.one_of(st.integers(), json_values))
    elif kind == "audio":
        frame["id"] = draw(st.one_of(chat_ids, json_values))
        frame["mimeType"] = draw(st.one_of(st.just("audio/pcm;rate=16000"), st.text(max_size=20), json_values))
        frame["data"] = draw(st.one_of(st.binary(max_size=64).map(lambda b: base64.b64encode(b).decode()), st.text(max_size=20), json_values))
    for _ in range(draw(st.integers(min_value=0, max_value=2))):
        frame = draw(mutated(frame))
    return encode(frame).decode("utf-8", "replace")
