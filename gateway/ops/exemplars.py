"""Where the latency histograms' exemplars come from: the metrics' port to the tracer.

`GatewayMetrics` asks an `Exemplars` for the sampled trace's id to attach to an observation
(docs/metrics.md#exemplars). With traces off nothing is attached: `NO_EXEMPLARS`. The tracer
(ops/tracing.py `Tracing`) is one, given to the metrics once by the app (`attach_exemplars`).
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["NO_EXEMPLARS", "Exemplars", "WithExemplars"]


class Exemplars(Protocol):
    def exemplar(self) -> dict[str, str] | None:
        """The current span's trace id, when it is sampled."""
        ...

    def approval_exemplar(self, approval_id: str) -> dict[str, str] | None:
        """The trace id of an approval's wait, when it is sampled."""
        ...


class _None:
    def exemplar(self) -> dict[str, str] | None:
        return None

    def approval_exemplar(self, approval_id: str) -> dict[str, str] | None:
        return None


NO_EXEMPLARS: Exemplars = _None()


class WithExemplars:
    """The metrics' side (`GatewayMetrics`): exemplars from the source attached, none before."""

    _exemplars: Exemplars

    def attach_exemplars(self, source: Exemplars) -> None:
        """Where exemplars come from; once, by edge/app.py when traces are on."""
        if self._exemplars is not NO_EXEMPLARS:
            raise RuntimeError("the metrics' exemplars are attached already")
        self._exemplars = source

    def exemplar(self) -> dict[str, str] | None:
        return self._exemplars.exemplar()

    def approval_exemplar(self, approval_id: str) -> dict[str, str] | None:
        return self._exemplars.approval_exemplar(approval_id)
