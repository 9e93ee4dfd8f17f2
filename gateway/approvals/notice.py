"""What the gateway tells the world about one approval: a notice when it starts waiting, is decided or expires.

A notice is plain data (sans-IO): the chat layer makes one whenever an approval changes, and the
sinks that outlive the chat take it from there: the audit trail (one record per decided approval)
and the webhooks (a signed call per notice). Neither may change what happens to the call: they are
told after the fact, and a sink that fails never blocks or undoes a decision.

Who decided (`source`):
- `person`: the chatting user, in the chat's own stream;
- `approver`: someone else, through the approvals API;
- `rule`: a rule of the tool's policy, automatically (`rule` names it);
- `timeout`: the deadline passed unanswered;
- `cancel`: nobody will answer any more (the user moved on, the run or the replica stopped);
- `give_up`: the plugin stopped waiting and answered ADK itself (the tool did not run).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import orjson

__all__ = ["NOTICE_KINDS", "SOURCES", "Approver", "ApprovalNotice", "args_digest", "args_digest_key"]

NoticeKind = Literal["waiting", "decided", "expired"]
Source = Literal["person", "approver", "rule", "timeout", "cancel", "give_up"]
NOTICE_KINDS: tuple[NoticeKind, ...] = ("waiting", "decided", "expired")
SOURCES: tuple[Source, ...] = ("person", "approver", "rule", "timeout", "cancel", "give_up")


# The secret a digest is keyed with is derived into a key for this one use, so a secret also used
# elsewhere (internal.secret) yields unrelated values here.
_DIGEST_DERIVATION = b"adk-gateway/args-digest/v1"


def args_digest_key(secret: str) -> bytes:
    """The HMAC key of `args_digest` from the configured secret (docs/approvals.md#audit-trail)."""
    return hmac.digest(secret.encode(), _DIGEST_DERIVATION, "sha256")


def args_digest(key: bytes, args: Any) -> str:
    """A stable digest of a call's arguments, keyed: HMAC-SHA256 of their canonical JSON (sorted
    keys). What an audit or a webhook shows where the arguments themselves may not be kept;
    keyed, because arguments are often few enough to guess (an amount, an account number) and a
    bare hash of them is found by hashing the guesses."""
    try:
        canonical = orjson.dumps(args, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        # orjson stops at 64-bit integers; the standard encoder writes any, in the same form.
        canonical = json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    return "hmac-sha256:" + hmac.new(key, canonical, hashlib.sha256).hexdigest()


@dataclass(frozen=True, slots=True)
class Approver:
    """One person who answered: their user id and how they authenticated (`none`, `api_key`, `jwt`, `cookie`)."""

    user: str
    auth: str


@dataclass(frozen=True, slots=True)
class ApprovalNotice:
    kind: NoticeKind
    approval_id: str
    agent: str
    app_name: str
    tool: str
    tool_call_id: str
    chat_id: str
    # The chatting user whose agent run asked for the call.
    requester: str
    args: dict[str, Any]
    # Wall-clock seconds (UNIX time) when this happened.
    at: float
    # Set on `decided` and `expired`: who or what decided, and how it came out
    # (`approved`, `denied`, `timeout`, `cancelled`, `abandoned`, `output`, `output_error`).
    source: Source | None = None
    outcome: str | None = None
    approvers: tuple[Approver, ...] = ()
    # The rule of the tool's policy that decided or asked, by name; and the rule's or the person's reason.
    rule: str | None = None
    reason: str | None = None
    # The configuration in force (a digest of the loaded file's policy): which policy applied.
    policy_version: str = ""
    # Seconds from the approval's start to this notice (None on `waiting`).
    waited: float | None = None
    trace_id: str | None = None
    # Who may answer, for `waiting` (e.g. ["the chatting user"] or approver groups), shown to notified people.
    asks: tuple[str, ...] = field(default=())
    # `args_digest` of the arguments under the configured key; None when no key is configured.
    args_digest: str | None = None
    # Who was asked when a group of approvers was (`approvers`, `self_approval`, `quorum`); None: the
    # chatting user, or nobody (a rule decided). What a replay of the trail compares (approvals/replay.py).
    asked: dict[str, Any] | None = None
    # What each shadow rule of the tool would have decided for this call (config/shadow_rules.py).
    shadow: tuple[dict[str, Any], ...] = ()

    def as_json(self, *, with_args: bool = True) -> dict[str, Any]:
        """Plain JSON data; the arguments themselves only `with_args` (their digest always)."""
        data = asdict(self)
        data["approvers"] = [asdict(a) for a in self.approvers]
        data["asks"] = list(self.asks)
        data["shadow"] = [dict(finding) for finding in self.shadow]
        if not with_args:
            del data["args"]
        return data
