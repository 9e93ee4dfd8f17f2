"""The `audit:` section: what the audit trail of approvals keeps, and for how long (docs/approvals.md#audit-trail)."""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator

from .values import Duration, Section

__all__ = ["MIN_DIGEST_KEY", "AuditConfig"]

# `audit.args_digest_key`: as `logging.user_id_key`, a key short enough to guess is refused.
MIN_DIGEST_KEY = 16


class AuditConfig(Section):
    """One record per decided approval, written as a JSON log line (the long-term copy, kept as
    long as the logs are) and to the shared store (bounded: what the approvals API reads)."""

    # Keep the call's arguments in the record (log line and store). Their keyed digest is always
    # kept; the arguments may hold anything (personal data, a card number), so that is the
    # operator's choice.
    include_args: bool = False
    # The key of `args_digest` in records and webhook bodies (an HMAC, so the arguments cannot be
    # found by hashing guesses). Unset: derived from internal.secret, which the replicas share;
    # with neither, no digest at all. The same on every replica.
    args_digest_key: SecretStr | None = None
    # Records kept in the shared store; the oldest go first.
    keep: int = Field(100_000, ge=1, le=10_000_000)
    # And none older than this (from the time the store places it at: docs/approvals.md).
    max_age: Duration = Field(30 * 86400.0, gt=0)

    @field_validator("args_digest_key")
    @classmethod
    def _long_enough(cls, key: SecretStr | None) -> SecretStr | None:
        if key is not None and len(key.get_secret_value()) < MIN_DIGEST_KEY:
            raise ValueError(f"audit.args_digest_key is at least {MIN_DIGEST_KEY} characters (a random string, from the environment)")
        return key
