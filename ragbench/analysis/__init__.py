"""Analysis that decides: the verdict, the summary table, paired comparison, failure attribution,
oracle-router headroom and Self-Route diagnostics. Every function takes the results table (one
row per example, strategy and parameter point; ``label`` names the variant) and returns a table;
plots live in ``ragbench.report``.

- ``verdict``: RAG or long context, under the reader's constraints (minimum score, maximum $ per
  1k queries, maximum latency): the best retrieval variant against the best long-context one,
  "not worse" as non-inferiority within a margin, closed book as the baseline line, the cost as
  a ratio with its interval, or "not decided yet" with how many more questions would decide;
  each interval and p from one procedure (``paired_difference``), Bonferroni over the
  comparisons the sentence makes (``Verdict``; ``Verdict.detail``: every comparison).
- ``summary``: accuracy with a bootstrap 95% CI and mean cost per query per variant (with the
  warnings the numbers hide), its ``pareto_front`` and RULER's ``effective_context_length``;
  ``with_labels``/``strategy_label`` name the variants.
- ``compare``: every pair of variants on the *same* questions. Averages with overlapping CIs hide
  a consistent per-question difference (and overlapping-looking CIs can hide none); pairing
  removes the question-difficulty variance both share. Each difference's interval and p come
  from the verdict's one procedure (``paired_difference``), Bonferroni-adjusted over the pairs,
  because with k variants there are k(k-1)/2 chances to find a "winner" by luck.
- ``attribute``: why each wrong answer was wrong (retrieval, reader, distractor, truncation),
  from the record's meta and, when given, the examples (evidence spans, needles).
- ``oracle_router``/``router_headroom``: per question the cheapest variant that answered right;
  how much any router could gain over Self-Route and every fixed strategy.
- ``self_route_diagnostics``/``self_route_warnings``: how often Self-Route fell back to long
  context and how accurate each branch was; a warning when it never did (every answer then came
  from its RAG step).

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
from ragbench.analysis.labels import strategy_label, with_labels
from ragbench.analysis.paired import (
    compare,
    decide,
    paired_difference,
    tango,
)
from ragbench.analysis.power import questions_needed
from ragbench.analysis.routing import (
    COST_PREFERENCE,
    ORACLE_LABEL,
    oracle_router,
    pick_cost,
    router_headroom,
)
from ragbench.analysis.self_route import self_route_diagnostics, self_route_warnings
from ragbench.analysis.summary import (
    SUMMARY_COST_COLUMNS,
    effective_context_length,
    pareto_front,
    summary,
)
from ragbench.analysis.verdict import REASONS, Verdict, verdict

__all__ = [
    "CAUSES",
    "COST_PREFERENCE",
    "ORACLE_LABEL",
    "OUTCOMES",
    "REASONS",
    "SUMMARY_COST_COLUMNS",
    "Verdict",
    "attribute",
    "attribution_table",
    "compare",
    "decide",
    "distractor_values",
    "effective_context_length",
    "evidence_depth",
    "names_value",
    "oracle_router",
    "paired_difference",
    "paired_scores",
    "pareto_front",
    "pick_cost",
    "questions_needed",
    "router_headroom",
    "self_route_diagnostics",
    "self_route_warnings",
    "strategy_label",
    "summary",
    "tango",
    "verdict",
    "with_labels",
]
