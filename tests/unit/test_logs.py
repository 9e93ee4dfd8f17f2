"""Log lines: what they say of the caller's user id (`logging.user_id`), and that no credential reaches them."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from aiohttp.http_exceptions import BadHttpMessage, BadStatusLine, HttpProcessingError, InvalidHeader, InvalidURLError, LineTooLong
from aiohttp.http_parser import HttpRequestParser

from gateway.config.schema import parse_config
from gateway.ops.logs import LogScrubber, configure_logging, safe_error_summary, secret_values, user_id_digest, user_id_rewriter

KEY = "k" * 32


def test_plain_needs_no_processor() -> None:
    assert user_id_rewriter("plain", None) is None


def test_omit_drops_the_user_id() -> None:
    rewrite = user_id_rewriter("omit", None)
    assert rewrite is not None
    assert rewrite(None, "info", {"event": "x", "user_id": "alice@example.com", "chat_id": "c"}) == {"event": "x", "chat_id": "c"}
    assert rewrite(None, "info", {"event": "x"}) == {"event": "x"}


def test_hash_is_a_keyed_digest_stable_for_one_key() -> None:
    rewrite = user_id_rewriter("hash", KEY)
    assert rewrite is not None
    line = rewrite(None, "info", {"event": "x", "user_id": "alice@example.com"})
    assert "user_id" not in line
    digest = line["user_id_hash"]
    assert digest == hmac.new(KEY.encode(), b"alice@example.com", hashlib.sha256).hexdigest()[:16]
    assert digest == user_id_digest(KEY, "alice@example.com")  # what an operator computes to search
    assert rewrite(None, "info", {"user_id": "alice@example.com"})["user_id_hash"] == digest
    assert rewrite(None, "info", {"user_id": "bob@example.com"})["user_id_hash"] != digest
    # Not the bare SHA-256 a dictionary of emails would find, and another deployment's key differs.
    assert digest != hashlib.sha256(b"alice@example.com").hexdigest()[:16]
    assert user_id_digest("x" * 32, "alice@example.com") != digest


def test_hash_leaves_a_missing_user_id_missing() -> None:
    rewrite = user_id_rewriter("hash", KEY)
    assert rewrite is not None
    # A forwarded request may bind `user_id=None`.
    assert rewrite(None, "info", {"event": "x", "user_id": None}) == {"event": "x"}


def test_hash_without_a_key_is_refused() -> None:
    with pytest.raises(ValueError):
        user_id_rewriter("hash", None)


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """configure_logging sets process-wide state: put it back for the tests that follow."""
    config = structlog.get_config()
    root, server, access = logging.getLogger(), logging.getLogger("aiohttp.server"), logging.getLogger("aiohttp.access")
    saved = root.handlers[:], root.level, server.filters[:], access.level
    yield
    structlog.reset_defaults()
    structlog.configure(**config)
    structlog.contextvars.clear_contextvars()
    root.handlers[:], root.level, server.filters[:], access.level = saved


@pytest.mark.parametrize(("mode", "fields"), [
    ("plain", {"user_id": "alice@example.com"}),
    ("hash", {"user_id_hash": user_id_digest(KEY, "alice@example.com")}),
    ("omit", {}),
])
def test_every_line_bound_to_a_user_follows_the_mode(
    mode: str, fields: dict[str, str], restore_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("info", "json", user_ids=mode, user_id_key=KEY if mode == "hash" else None)
    structlog.contextvars.bind_contextvars(request_id="r1", user_id="alice@example.com")
    structlog.get_logger("test").info("http_request", status=200)
    logging.getLogger("aiohttp.server").warning("from stdlib")
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert len(lines) == 2
    for line in lines:
        assert {k: line[k] for k in ("user_id", "user_id_hash") if k in line} == fields
        assert line["request_id"] == "r1"
        assert "alice@example.com" not in json.dumps(line) or mode == "plain"


# ---- no credential in a line, whoever writes it ---------------------------------------------------

SECRET = "sk-live-0a1b2c3d4e5f6a7b"


class _Protocol:
    """What the HTTP parser needs of its protocol to raise on a request head."""

    transport = None


def _parse_error(data: bytes) -> BaseException:
    """The error aiohttp's HTTP parser (the one this process loaded) raises for `data`."""
    loop = asyncio.new_event_loop()
    try:
        parser = HttpRequestParser(_Protocol(), loop, 2**16, max_line_size=8190, max_field_size=8190)
        with pytest.raises(HttpProcessingError) as caught:
            parser.feed_data(data)
    finally:
        loop.close()
    return caught.value


@pytest.mark.parametrize("data", [
    b"GET / HTTP/1.1\r\nCookie: gw_session=" + SECRET.encode() + b"; pad=" + b"a" * 9000 + b"\r\n\r\n",
    b"GET / HTTP/1.1\r\nAuthorization: Bearer " + SECRET.encode() + b"\x01\r\n\r\n",
    b"GET /?access_token=" + SECRET.encode() + b"\x01 HTTP/1.1\r\n\r\n",
    b"G\x01T" + SECRET.encode() + b" / HTTP/1.1\r\n\r\n",
], ids=["oversized-cookie", "control-byte", "request-line", "method"])
def test_a_malformed_request_is_logged_without_its_bytes(
    data: bytes, restore_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    exc = _parse_error(data)
    configure_logging("info", "json")
    assert SECRET in str(exc) or SECRET in repr(exc.args)  # what aiohttp would log
    logging.getLogger("aiohttp.server").exception("Error handling request from %s", "127.0.0.1", exc_info=exc)
    (line,) = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert SECRET not in json.dumps(line)
    assert line["level"] == "warning" and "exception" not in line
    assert line["event"].startswith(f"malformed_request: {type(exc).__name__}")


def test_the_summary_keeps_a_fixed_phrase_and_drops_the_rest() -> None:
    assert safe_error_summary(LineTooLong(b"Cookie: x=" + SECRET.encode(), 8190)) == "LineTooLong: Got more than 8190 bytes when reading"
    assert safe_error_summary(InvalidHeader(SECRET.encode())) == "InvalidHeader: Invalid HTTP header"
    assert safe_error_summary(BadHttpMessage(f"Invalid header value char:\n\n  b'{SECRET}'\n  ^")) == (
        "BadHttpMessage: Invalid header value char"
    )
    # A message that is the request data itself keeps nothing of it.
    assert safe_error_summary(InvalidURLError("only words here")) == "InvalidURLError"
    assert safe_error_summary(BadHttpMessage(SECRET)) == "BadHttpMessage"
    assert safe_error_summary(BadStatusLine(f"GET /{SECRET}")) == "BadStatusLine"


def test_every_secret_of_the_config_is_masked_by_value_in_every_line(
    restore_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    config = parse_config(f"""
auth:
  mode: api_key
  api_keys: [{{id: alice, key: {SECRET}}}, {{id: bob, key: 'quote"d-key-1'}}]
internal: {{secret: internal-0123456789}}
sessions: {{backend: redis, redis_url: 'redis://:redis-pass-99@redis:6379/0'}}
logging: {{user_id: hash, user_id_key: {KEY}}}
""", env={})
    assert set(secret_values(config)) >= {SECRET, 'quote"d-key-1', "internal-0123456789", "redis-pass-99", KEY}
    scrubber = configure_logging("info", "json")
    current = [config]
    scrubber.follow(lambda: current[0])
    jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJl"
    structlog.get_logger("test").info("oops", detail=f"x {SECRET} y", jwt=jwt, note='quote"d-key-1')
    logging.getLogger("aiohttp.web").warning("raw %s and redis-pass-99 and internal-0123456789", SECRET)
    before = capsys.readouterr().err
    # A reload's new key is masked from its first line on.
    current[0] = parse_config("auth:\n  mode: api_key\n  api_keys: [{id: carol, key: carol-new-key-77}]\n", env={})
    structlog.get_logger("test").info("after reload", detail="carol-new-key-77", old=SECRET)
    after = capsys.readouterr().err
    for secret in (SECRET, "quote", "internal-0123456789", "redis-pass-99", jwt, "carol-new-key-77"):
        assert secret not in before, before
    first, second = (json.loads(line) for line in before.splitlines())
    assert first["detail"] == "x [redacted] y" and first["jwt"] == "[redacted]" and first["note"] == "[redacted]"
    assert second["event"] == "raw [redacted] and [redacted] and [redacted]"
    (line,) = (json.loads(line) for line in after.splitlines())
    assert line["detail"] == "[redacted]"
    assert line["old"] == SECRET  # no longer configured: no longer looked for


def test_a_line_without_a_secret_is_left_alone() -> None:
    scrubber = LogScrubber()
    config = parse_config(f"auth:\n  mode: api_key\n  api_keys: [{{id: a, key: {SECRET}}}, {{id: b, key: abc}}]\n", env={})
    scrubber.follow(lambda: config)
    line = '{"event": "http_request", "method": "GET", "path": "/abc", "status": 200}'
    assert scrubber(line) is line  # a secret of 3 characters is too short to look for
