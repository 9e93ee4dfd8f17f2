"""Log lines: what they say of the caller's user id (`logging.user_id`)."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from gateway.logs import configure_logging, user_id_digest, user_id_rewriter

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
