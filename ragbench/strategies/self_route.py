"""Self-Route (Li et al. 2024): the RAG prompt with an explicit "unanswerable" option; a declined
query goes to long context. Its cost is the RAG call's plus, when routed, the long-context call's.

A routed record keeps the long-context branch's facts with an ``lc_`` prefix: ``lc_kept_tokens``,
``lc_truncated_tokens``, ``lc_dropped_documents``, ``lc_cut_documents`` and
``lc_evidence_truncated`` (``strategies.fit.kept_facts``), which failure attribution reads."""

from __future__ import annotations

from ragbench.strategies.base import Resources, Steps, make_record
from ragbench.strategies.fit import long_context_prompt
from ragbench.strategies.params import SelfRouteParams
from ragbench.strategies.prompt_format import prompt_format
from ragbench.strategies.rag import rag_prompt, with_retrieval
from ragbench.types import Example


def self_route_steps(example: Example, res: Resources, params: SelfRouteParams) -> Steps:
    fmt = prompt_format(example)
    prompt, meta = rag_prompt(example, res, params, decline=True)
    first = yield res.request(prompt, rid=f"{example.id}:self_route:rag", fmt=fmt)
    rag_cost = with_retrieval(res.cost(first), meta)
    if not fmt.declined(example, first.text):
        return make_record(example, params, first, res, {**meta, "route": "rag"}, rag_cost)
    lc_prompt, prefix, lc_meta = long_context_prompt(example, res, params.overflow)
    rid = f"{example.id}:self_route:long_context"
    second = yield res.request(lc_prompt, prefix, rid, fmt=fmt)
    lc_meta = {f"lc_{k}": v for k, v in lc_meta.items()}
    meta = {**meta, **lc_meta, "route": "long_context", "rag_raw": first.text}
    return make_record(example, params, second, res, meta, rag_cost + res.cost(second))
