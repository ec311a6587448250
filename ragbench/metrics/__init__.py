"""Answer metrics: SQuAD-style and RULER string metrics (``answer``) and LongBench's official
per-dataset metrics (``longbench``), all in one ``Registry`` (``METRICS``).

The public names of ``answer`` are re-exported here (``ragbench.metrics.score``).
"""

from ragbench.metrics.answer import (
    KINDS,
    METRICS,
    Metric,
    aggregate,
    bootstrap_ci,
    contains,
    declined,
    deferred_metrics,
    exact_match,
    f1,
    get_metric,
    score,
    string_match_all,
    string_match_part,
    string_metrics,
)
from ragbench.metrics.normalize import NO_ANSWER, normalize_answer

__all__ = [
    "KINDS",
    "METRICS",
    "NO_ANSWER",
    "Metric",
    "aggregate",
    "bootstrap_ci",
    "contains",
    "declined",
    "deferred_metrics",
    "exact_match",
    "f1",
    "get_metric",
    "normalize_answer",
    "score",
    "string_match_all",
    "string_match_part",
    "string_metrics",
]
