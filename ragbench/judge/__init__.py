"""LLM-as-judge and embedding metrics, scored after generation (see ``judging``), with the
agreement numbers that say how far to trust them (``agreement``).

``judge_correct`` asks a judge LLM whether an answer means the same as a gold answer,
``judge_faithful`` whether it is supported by the context the strategy gave the model, and
``semantic_similarity`` compares embeddings (a cheap middle ground between string metrics and a
judge). ``context_metrics`` adds RAGAS's ``context_precision``, ``context_recall`` and
``answer_relevancy`` for rows that read contexts (``strategies.contexts_of``: a pipeline's, or
the built-in RAG's chunks). Each metric is one class (``metric.JudgeMetric``: what it needs, its
prompt, its parsing, its score), registered in ``metric.JUDGE_METRICS``. The judge is its own
model config (the run's ``judge`` section); its calls (``calls``) are cached and costed in their
own columns, apart from the strategy's cost per query.
"""

from __future__ import annotations

from ragbench.judge.agreement import (
    cohen_kappa,
    fleiss_kappa,
    judge_agreement,
    judge_warnings,
    repeat_agreement,
)
from ragbench.judge.calls import COST_KEYS, Judge
from ragbench.judge.judging import judge_records
from ragbench.judge.metric import (
    JUDGE_METRICS,
    JudgeMetric,
    get_judge_metric,
    register_judge_metric,
    unregister_judge_metric,
)
from ragbench.judge.prompts import (
    JudgePrompt,
    available_prompts,
    load_prompt,
    parse_verdict,
)

__all__ = [
    "COST_KEYS",
    "JUDGE_METRICS",
    "Judge",
    "JudgeMetric",
    "JudgePrompt",
    "available_prompts",
    "cohen_kappa",
    "fleiss_kappa",
    "get_judge_metric",
    "judge_agreement",
    "judge_records",
    "judge_warnings",
    "load_prompt",
    "parse_verdict",
    "register_judge_metric",
    "repeat_agreement",
    "unregister_judge_metric",
]
