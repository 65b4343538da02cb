"""The metric catalog (design §5): one module per metric, one registry.

A new metric is a new module with a `METRIC` object (a `common.metrics.base.Metric`)
listed here; nothing else in the system names a metric.
"""
from __future__ import annotations

from common.errors import InputError
from common.metrics.base import Metric

_MODULES = ("ero", "lot", "mqos_ndcg", "pot", "mqos_auc", "output", "prob_count")


def _load() -> dict[str, Metric]:
    import importlib
    metrics = (importlib.import_module(f"common.metrics.{module}").METRIC for module in _MODULES)
    return {metric.name: metric for metric in metrics}


METRICS: dict[str, Metric] = _load()


def get_metric(name: str) -> Metric:
    try:
        return METRICS[name]
    except KeyError:
        raise InputError(f"unknown metric '{name}' (known: {', '.join(METRICS)})", parameter="metric") from None


def correcting_metrics() -> list[str]:
    """The metrics with an attenuation correction (`common.stats.correction`)."""
    return [name for name, metric in METRICS.items() if metric.corrects]
