"""What a test of the cluster's gates passes for the parts it does not exercise."""

from __future__ import annotations

from gateway.cluster.messages import Answer, Work


async def never_asked(owner: str, work: Work) -> Answer:
    """The `Ask` (how a replica asks a call's owner) of a test in which no owner is asked."""
    raise AssertionError("not asked in this test")
