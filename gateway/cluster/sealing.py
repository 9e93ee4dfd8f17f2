"""The seal on what replicas exchange through Redis: an HMAC-SHA256 under `sessions.secret`.

Whoever can write to Redis could otherwise forge what one replica tells another: a verdict that
runs a gated call, a ticket record that opens a socket, a relayed chunk, a refusal whose headers
reach a browser, a chat's state that approves a call. The Redis backend (redis.py) seals every inbox
message, gated-call record field, relay entry, ticket record and chat state it writes, and opens each
before use; what does not open is logged and treated as absent (docs/security.md, "Trust boundary:
Redis").

A sealed value is a version byte, the 32-byte tag, then the payload, which stays readable: the seal
gives integrity, not secrecy. The tag covers a context as well as the payload, the Redis key or
channel the value is written to (and a hash field's name), so a genuine value copied to another
place (another call's record, another replica's inbox) does not open there.

Keys rotate without downtime: the first secret signs, every listed secret is accepted
(docs/scaling.md has the procedure). Sans IO; the memory backend, one process, needs no seal.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

__all__ = ["Seal", "Tampered", "fingerprint"]

_VERSION = b"\x01"
_TAG = hashlib.sha256().digest_size
# The secrets are derived into keys for this one use, so a secret an operator also uses elsewhere
# (internal.secret, say) yields unrelated tags here.
_DERIVATION = b"adk-gateway/sessions-seal/v1"


class Tampered(ValueError):
    """A value that was not sealed by a replica holding an accepted secret, for this place; the
    text says nothing of the value."""


class Seal:
    """Seals with the first secret; opens what any of them sealed."""

    def __init__(self, secrets: Sequence[str | bytes]) -> None:
        keys = [s.encode() if isinstance(s, str) else s for s in secrets]
        if not keys or not all(keys):
            raise ValueError("a seal needs at least one non-empty secret")
        # Keyed once: each tag then starts from a copy, not from the key (half the cost of a
        # one-shot HMAC on a short value, which a relayed batch of a few chunks is).
        self._keys = [hmac.new(hmac.digest(key, _DERIVATION, "sha256"), digestmod=hashlib.sha256) for key in keys]

    def seal(self, payload: bytes, context: str) -> bytes:
        """`payload` sealed for `context` (where it is written)."""
        return _VERSION + _tag(self._keys[0], context, payload) + payload

    def open(self, sealed: bytes, context: str) -> bytes:
        """The payload of a value sealed for `context`; Tampered if it was not."""
        if len(sealed) < 1 + _TAG or sealed[:1] != _VERSION:
            raise Tampered("not a sealed value")
        tag, payload = sealed[1:1 + _TAG], sealed[1 + _TAG:]
        # The signing key first: during a rotation most values open at the first try.
        for key in self._keys:
            if hmac.compare_digest(tag, _tag(key, context, payload)):
                return payload
        raise Tampered("the seal does not match")


def fingerprint(sealed: bytes) -> bytes:
    """What tells one sealed value from every other (its tag), short whatever the value's size:
    what a receiver remembers to spot the same value coming again."""
    return sealed[1:1 + _TAG]


def _tag(key: hmac.HMAC, context: str, payload: bytes) -> bytes:
    where = context.encode()
    mac = key.copy()
    # The context's length first, so that no context and payload pair reads as another.
    mac.update(len(where).to_bytes(4, "big") + where)
    mac.update(payload)
    return mac.digest()
