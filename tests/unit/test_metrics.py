"""GatewayMetrics parts that are not exercised through a running gateway."""

from __future__ import annotations

import gc

from gateway.metrics import GatewayMetrics


def _pauses(metrics: GatewayMetrics, generation: int) -> float:
    value = metrics.registry.get_sample_value("adk_gateway_gc_pause_seconds_count", {"generation": str(generation)})
    return value or 0.0


def test_gc_pauses_are_timed_by_generation_while_watched() -> None:
    metrics = GatewayMetrics()
    metrics.watch_gc()
    metrics.watch_gc()  # twice: still one callback, one observation per collection
    try:
        gc.collect()
        assert _pauses(metrics, 2) == 1
        total = metrics.registry.get_sample_value("adk_gateway_gc_pause_seconds_sum", {"generation": "2"})
        assert total is not None and 0 < total < 10
        gc.collect(0)
        assert _pauses(metrics, 0) >= 1
    finally:
        metrics.unwatch_gc()
    gc.collect()
    assert _pauses(metrics, 2) == 1
    assert metrics._on_gc not in gc.callbacks
