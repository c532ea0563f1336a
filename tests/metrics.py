"""Reading a Prometheus metric's value in tests, through prometheus-client's public API."""

from __future__ import annotations

from prometheus_client.metrics import MetricWrapperBase


def metric_value(metric: MetricWrapperBase) -> float:
    """The value of an unlabelled counter or gauge (a counter's `_total` sample)."""
    for family in metric.collect():
        for sample in family.samples:
            if sample.name in (family.name, f"{family.name}_total"):
                return float(sample.value)
    raise LookupError(f"no value sample in {metric!r}")
