"""The decision links an approval's mail carries: signed, expiring, bound to one approver, used once.

A link is `<link_base>/approve/<token>`; the token is `<payload>.<mac>`, both base64url without
padding: the payload is the JSON of the approval's id, the approver (a `Principal` as votes keep
it), the expiry (UNIX seconds) and a random nonce; the mac is HMAC-SHA256 over the payload's bytes
under a key derived from `notifications.email.signing_key` for this one use. Verifying checks the mac
(in constant time) before reading anything, then the expiry. That the nonce is used once is the
shared store's business (the sender keeps each link's nonce there until it is used or expires;
edge/decision_page.py takes it out as it votes). Pure: the clock and the nonce are given.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from dataclasses import dataclass
from typing import Literal

import orjson

__all__ = ["LinkRefused", "LinkToken", "link_key", "nonce_key", "sign_link", "verify_link"]

_DERIVATION = b"adk-gateway/email-decision-link/v1"
# A token past this is no token of ours (ids are at most a few hundred characters): refused unread.
MAX_TOKEN = 2048


class LinkRefused(Exception):
    """A token that decides nothing: `bad` (not ours, or altered: 403) or `expired` (410)."""

    def __init__(self, why: Literal["bad", "expired"]) -> None:
        super().__init__(why)
        self.why = why


@dataclass(frozen=True, slots=True)
class LinkToken:
    approval_id: str
    # The approver it was sent to, as `str(Principal)` (`approver_key:supervisor`).
    approver: str
    expires: int
    nonce: str


def link_key(signing_key: str) -> bytes:
    """The HMAC key of the links, derived from the configured secret (a secret also used elsewhere
    yields unrelated macs here)."""
    return hmac.digest(signing_key.encode(), _DERIVATION, "sha256")


def nonce_key(nonce: str) -> str:
    """Where the shared store keeps a link's nonce until it is used: a digest, so the store holds
    nothing that opens the page (and a WebSocket ticket's key, the digest of `wst_…`, never collides)."""
    return hashlib.sha256(b"email-link:" + nonce.encode()).hexdigest()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def sign_link(key: bytes, token: LinkToken) -> str:
    payload = orjson.dumps({"a": token.approval_id, "u": token.approver, "e": token.expires, "n": token.nonce})
    return f"{_b64(payload)}.{_b64(hmac.new(key, payload, hashlib.sha256).digest())}"


def verify_link(key: bytes, text: str, now: float) -> LinkToken:
    """The token `text` carries; raises LinkRefused('bad') unless it is ours and unaltered, and
    LinkRefused('expired') once its expiry passed."""
    if len(text) > MAX_TOKEN or text.count(".") != 1:
        raise LinkRefused("bad")
    encoded, mac = text.split(".")
    try:
        payload, given = _unb64(encoded), _unb64(mac)
    except (binascii.Error, ValueError):
        raise LinkRefused("bad") from None
    if not hmac.compare_digest(hmac.new(key, payload, hashlib.sha256).digest(), given):
        raise LinkRefused("bad")
    data = orjson.loads(payload)  # ours (the mac holds), so well formed
    token = LinkToken(data["a"], data["u"], int(data["e"]), data["n"])
    if now >= token.expires:
        raise LinkRefused("expired")
    return token
