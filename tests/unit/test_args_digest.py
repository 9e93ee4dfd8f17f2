"""The arguments' digest in approval notices (audit records, their log lines, webhook bodies): keyed.

`include_args: false` promises that the arguments stay out of the audit and the webhooks, but a
digest stays, so a record can be matched with the arguments kept elsewhere. Tool arguments are
often few enough to guess (an amount, one of a few payees), and a bare SHA-256 of their JSON is
found by hashing the guesses: the digest is an HMAC under `audit.args_digest_key`, else under
`internal.secret`, and absent when neither is set. Through approvals/reports.py, which makes every
notice the sinks receive.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

import orjson
import pytest

from gateway.approvals.reports import Notices
from gateway.config.schema import ConfigError, parse_config
from gateway.approvals.notice import ApprovalNotice
from gateway.core.ledger import NativeConfirmation
from gateway.ops.metrics import GatewayMetrics

BASE = "upstream: {url: 'http://adk:8000', app_name: shop}\n"
INTERNAL = "internal:\n  secret: internal-secret-0123456789\n"
KEY = "audit:\n  args_digest_key: args-digest-key-0123456789\n"


def digest_of(config_text: str, args: dict[str, Any]) -> Any:
    """The `args_digest` of a notice about a call with `args`, as an audit record or a webhook body carries it."""
    config = parse_config(config_text, env={})
    notices = Notices(GatewayMetrics(), lambda: config, wall=lambda: 1_700_000_000.0)
    told: list[ApprovalNotice] = []
    notices.add_sink(told.append)
    notices.native_waiting("shop", "chat-1", "alice", NativeConfirmation("adk-1", "call-1", "pay", args=args))
    (notice,) = told
    return notice.as_json(with_args=False)["args_digest"]


def documented(secret: str, args: dict[str, Any]) -> str:
    """docs/approvals.md#audit-trail's recipe, written apart from the gateway's code."""
    key = hmac.new(secret.encode(), b"adk-gateway/args-digest/v1", hashlib.sha256).digest()
    canonical = json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    return "hmac-sha256:" + hmac.new(key, canonical, hashlib.sha256).hexdigest()


def test_the_digest_cannot_be_found_by_hashing_guesses_of_the_arguments() -> None:
    digest = digest_of(BASE + INTERNAL, {"amount": 417, "to": "Hanako"})
    guesses = ({"amount": amount, "to": to} for amount in range(1000) for to in ("Alice", "Bob", "Hanako"))
    for guess in guesses:
        canonical = orjson.dumps(guess, option=orjson.OPT_SORT_KEYS)
        assert digest not in (hashlib.sha256(canonical).hexdigest(), "sha256:" + hashlib.sha256(canonical).hexdigest())


@pytest.mark.parametrize(("text", "secret"), [
    (BASE + INTERNAL + KEY, "args-digest-key-0123456789"),
    (BASE + KEY, "args-digest-key-0123456789"),
    (BASE + INTERNAL, "internal-secret-0123456789"),
])
def test_the_digest_is_an_hmac_under_the_audit_key_else_the_internal_secret(text: str, secret: str) -> None:
    args = {"amount": 417, "to": "Hanako", "note": "café", "n": 2**70}
    assert digest_of(text, args) == documented(secret, args)
    # Stable: the same arguments in another order are the same call.
    assert digest_of(text, dict(reversed(list(args.items())))) == documented(secret, args)


def test_without_a_key_there_is_no_digest_rather_than_a_reversible_one() -> None:
    assert digest_of(BASE, {"amount": 417}) is None


def test_a_short_key_is_refused_at_load() -> None:
    with pytest.raises(ConfigError, match="args_digest_key is at least 16 characters"):
        parse_config(BASE + "audit:\n  args_digest_key: short\n", env={})
