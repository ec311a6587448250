"""Views of a results table for people: the functions notebooks call as ``report.<name>(df)``.

- ``figures``: plots (accuracy vs cost, comparisons, heatmaps, failure attribution, retrieval
  tuning, a metric against a tested value);
- ``tables``: numbers formatted with units, predictions, a run's provenance;
- ``planning_plots``: the planning notebook's plots;
- ``readable``: axis and figure checks every plot goes through;
- ``run_diff``: two runs question by question (``compare_runs``, ``ragbench diff``), their
  variants matched by ``run_match``.

The verdict (``verdict(df, ...)``: which variant to use, in one or two sentences; every
comparison notebook opens its results with it), the tables that decide (the summary, paired
tests, attribution, routing) and the variant labels live in ``ragbench.analysis``; their entry
points are re-exported here so a notebook needs one import.
"""

from ragbench.analysis import (
    CAUSES,
    ORACLE_LABEL,
    attribute,
    attribution_table,
    compare,
    decide,
    effective_context_length,
    pareto_front,
    router_headroom,
    self_route_diagnostics,
    self_route_warnings,
    strategy_label,
    summary,
    verdict,
    with_labels,
)
from ragbench.report.figures import (
    heatmap_table,
    plot_accuracy_vs_cost,
    plot_compare,
    plot_failure_attribution,
    plot_heatmaps,
    plot_metric_by,
    plot_retrieval_tuning,
)
from ragbench.report.planning_plots import plot_break_even, plot_kv_cache, plot_prefix_caching
from ragbench.report.run_diff import RunDiff, compare_runs
from ragbench.report.tables import formatted, predictions, provenance, verdict_detail

__all__ = [
    "CAUSES",
    "ORACLE_LABEL",
    "RunDiff",
    "attribute",
    "attribution_table",
    "compare",
    "compare_runs",
    "decide",
    "effective_context_length",
    "formatted",
    "heatmap_table",
    "pareto_front",
    "plot_accuracy_vs_cost",
    "plot_break_even",
    "plot_compare",
    "plot_failure_attribution",
    "plot_heatmaps",
    "plot_kv_cache",
    "plot_metric_by",
    "plot_prefix_caching",
    "plot_retrieval_tuning",
    "predictions",
    "provenance",
    "router_headroom",
    "self_route_diagnostics",
    "self_route_warnings",
    "strategy_label",
    "summary",
    "verdict",
    "verdict_detail",
    "with_labels",
]
