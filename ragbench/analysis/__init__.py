"""Analysis that decides: paired comparison, failure attribution, oracle-router headroom and
Self-Route diagnostics. Every function takes the results table (one row per example, strategy
and parameter point; ``label`` names the variant) and returns a table; plots live in
``ragbench.report.figures``.

- ``compare``: every pair of variants on the *same* questions. Averages with overlapping CIs hide
  a consistent per-question difference (and overlapping-looking CIs can hide none); pairing
  removes the question-difficulty variance both share. Binary metrics get an exact McNemar test
  (a two-sided binomial test on the discordant pairs), every metric a paired bootstrap CI of the
  mean difference; p-values are Holm-adjusted over the pairs, because with k variants there are
  k(k-1)/2 chances to find a "winner" by luck.
- ``attribute``: why each wrong answer was wrong (retrieval, reader, distractor, truncation),
  from the record's meta and, when given, the examples (evidence spans, needles).
- ``oracle_router``/``router_headroom``: per question the cheapest variant that answered right;
  how much any router could gain over Self-Route and every fixed strategy.
- ``self_route_diagnostics``/``self_route_warnings``: how often Self-Route fell back to long
  context and how accurate each branch was; a warning when it never did (it then equals RAG).

Pure pandas/numpy; nothing here loads a model.
"""

from ragbench.analysis._common import paired_scores
from ragbench.analysis.attribution import (
    CAUSES,
    OUTCOMES,
    attribute,
    attribution_table,
    distractor_values,
    evidence_depth,
    names_value,
)
from ragbench.analysis.paired import (
    compare,
    decide,
    holm,
    mcnemar_exact,
    paired_bootstrap,
)
from ragbench.analysis.routing import (
    COST_PREFERENCE,
    ORACLE_LABEL,
    SUMMARY_COST_COLUMNS,
    oracle_router,
    pick_cost,
    router_headroom,
    self_route_diagnostics,
    self_route_warnings,
)

__all__ = [
    "CAUSES",
    "COST_PREFERENCE",
    "ORACLE_LABEL",
    "OUTCOMES",
    "SUMMARY_COST_COLUMNS",
    "attribute",
    "attribution_table",
    "compare",
    "decide",
    "distractor_values",
    "evidence_depth",
    "holm",
    "mcnemar_exact",
    "names_value",
    "oracle_router",
    "paired_bootstrap",
    "paired_scores",
    "pick_cost",
    "router_headroom",
    "self_route_diagnostics",
    "self_route_warnings",
]
