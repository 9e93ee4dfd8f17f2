"""Admission control: token buckets and stream caps, with the clock passed in."""

from __future__ import annotations

import pytest

from gateway.config.schema import LimitsConfig
from gateway.core.limits import Admission, Limited


def test_bucket_allows_the_burst_then_refills_at_the_rate() -> None:
    admission = Admission(LimitsConfig(rate_per_user=2, burst_per_user=3))
    for _ in range(3):
        admission.check_rate("u", now=0.0)
    with pytest.raises(Limited) as info:
        admission.check_rate("u", now=0.0)
    assert info.value.status == 429 and info.value.retry_after == 1
    admission.check_rate("u", now=0.5)  # one token back after 1 / rate seconds
    admission.check_rate("other", now=0.5)  # users do not share buckets


def test_stream_caps_per_user_and_in_total() -> None:
    admission = Admission(LimitsConfig(max_streams_per_user=2, max_streams_total=3))
    a1, a2 = admission.open_stream("a"), admission.open_stream("a")
    with pytest.raises(Limited) as per_user:
        admission.open_stream("a")
    assert per_user.value.status == 429
    b1 = admission.open_stream("b")
    with pytest.raises(Limited) as total:
        admission.open_stream("c")
    assert total.value.status == 503 and total.value.retry_after
    a1.release()
    a1.release()  # idempotent
    assert admission.streams_total == 2
    admission.open_stream("c")
    for slot in (a2, b1):
        slot.release()


def test_full_buckets_are_forgotten() -> None:
    admission = Admission(LimitsConfig(rate_per_user=10, burst_per_user=10))
    admission.check_rate("u", now=0)
    admission.forget_idle_buckets(now=0.5)
    assert "u" in admission._buckets
    admission.forget_idle_buckets(now=5)
    assert "u" not in admission._buckets
