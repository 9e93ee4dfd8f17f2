"""The `audit:` section: what the audit trail of approvals keeps, and for how long (docs/approvals.md#audit-trail)."""

from __future__ import annotations

from pydantic import Field

from .values import Duration, Section

__all__ = ["AuditConfig"]


class AuditConfig(Section):
    """One record per decided approval, written as a JSON log line (the long-term copy, kept as
    long as the logs are) and to the shared store (bounded: what the approvals API reads)."""

    # Keep the call's arguments in the record (log line and store). Their sha256 digest is always
    # kept; the arguments may hold anything (personal data, a card number), so that is the
    # operator's choice.
    include_args: bool = False
    # Records kept in the shared store; the oldest go first.
    keep: int = Field(100_000, ge=1, le=10_000_000)
    # And none older than this (from the time the store places it at: docs/approvals.md).
    max_age: Duration = Field(30 * 86400.0, gt=0)
