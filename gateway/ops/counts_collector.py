"""Counters kept as plain counts and read at scrape time: the ones counted on the streaming hot path.

A `prometheus_client` Counter child's `inc()` takes a lock and checks observability each call;
the gateway counts on one event loop, so a dict entry per label set is enough, and this collector
exports it as a counter family (without `_created`, see docs/metrics.md). Measured on the
tool-heavy stream, where a third of the events carry an LLM call's usage (docs/performance.md,
issue 29).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Final

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

__all__ = ["TOKENS_HELP", "CountsCollector"]

TOKENS_HELP: Final = (
    "Tokens the agents' LLM calls used, as ADK reports them, by agent, model (metrics.models, else other) "
    "and kind (input, output, total, cached, thinking)."
)


class CountsCollector(Collector):
    """`<name>_total{labels}` from `counts`: label values (a string, or a tuple of them) -> count."""

    def __init__(self, name: str, documentation: str, labels: Sequence[str], counts: Mapping[object, int]) -> None:
        self._name, self._documentation, self._labels = name, documentation, list(labels)
        self._counts = counts

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(self._name, self._documentation, labels=self._labels)
        for values, count in list(self._counts.items()):
            family.add_metric(list(values) if isinstance(values, tuple) else [values], count)
        yield family

    def describe(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(self._name, self._documentation, labels=self._labels)
