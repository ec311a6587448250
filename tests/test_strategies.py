"""Strategies with the FakeLLM and HashEmbedder: prompts, truncation, routing, records."""

from __future__ import annotations

import pytest

from ragbench import strategies as st
from ragbench.llm.base import ContextOverflowError
from ragbench.llm.fake import FakeLLM
from ragbench.llm.presets import get_preset
from ragbench.types import Document, Example

FILLER = " ".join(f"w{i}" for i in range(400))  # 400 whitespace tokens
NEEDLE = "The special magic number is 7463343."


def needle_example(depth_words: int = 200, ex_id: str = "ex") -> Example:
    words = FILLER.split()
    head = " ".join(words[:depth_words])
    text = f"{head} {NEEDLE} {' '.join(words[depth_words:])}"
    start = text.index(NEEDLE)
    doc = Document(id=f"{ex_id}/doc", text=text)
    meta = {"task": "niah", "evidence": [[doc.id, start, start + len(NEEDLE)]]}
    return Example(ex_id, "What is the special magic number?", ("7463343",), (doc,), meta)


def make_index(chunk_size: int = 20):
    from ragbench.retrieval.chunking import chunk_documents
    from ragbench.retrieval.embedders import get_embedder
    from ragbench.retrieval.retrievers import build_retriever

    embedder = get_embedder("hash")

    def index(example):
        chunks = chunk_documents(example.documents, "token", chunk_size, 0, tokenizer="whitespace")
        return chunks, build_retriever("dense", chunks, embedder=embedder)

    return index


def res(window=8192, budget=None, **kw):
    return st.Resources(
        llm=FakeLLM(context_window=window),
        metrics=("string_match_all", "exact_match"),
        prompt_budget=budget,
        preset=get_preset("smollm2-135m-instruct"),
        index=make_index(),
        **kw,
    )


def test_clean_answer():
    assert st.clean_answer("  \n7463343\nmore text") == "7463343"
    assert st.clean_answer("Answer: Paris") == "Paris"
    q = "What is the special magic number?"
    assert st.clean_answer(f"{q} It is 42.", q) == "It is 42."
    assert st.clean_answer('"quoted"') == "quoted"
    assert st.clean_answer("Answer: A: Paris\nmore") == "Paris"
    assert st.clean_answer("") == "" and st.clean_answer("Answer:\n\n  ") == ""


@pytest.mark.parametrize(
    "text",
    [
        "Answer:\nParis",
        "Answer:   \n\n  Paris  \nLondon",
        "ANSWER:\nParis",
        "answer:\r\nParis",
        "A:\nParis",
        "  a: \n Paris",
        "Answer:\nA:\nParis",
    ],
)
def test_clean_answer_label_on_its_own_line(text):
    # a bare label line is skipped: the answer is the next non-empty line (was "")
    assert st.clean_answer(text) == "Paris"


def test_clean_answer_label_line_then_restated_question():
    q = "What is the capital of France?"
    assert st.clean_answer(f"Answer:\n{q} Paris", q) == "Paris"


def test_task_type_and_templates():
    ex = needle_example()
    assert st.task_type(ex) == "needle"
    qa = Example("q", "Who wrote Hamlet?", ("Shakespeare",), (Document("d", "x"),))
    assert st.task_type(qa) == "qa"
    tail = st.question_part(ex, decline=True)
    assert tail.endswith("Question: What is the special magic number?\nAnswer:")
    assert '"unanswerable"' in tail


@pytest.mark.parametrize("policy", ["truncate_head", "truncate_tail", "truncate_middle"])
def test_truncate_policies(policy):
    count = FakeLLM().count_tokens
    text = " ".join(f"t{i}" for i in range(100))
    out = st.truncate(text, 10, policy, count)
    assert count(out) <= 10 and count(out) >= 9
    words = out.split()
    if policy == "truncate_head":  # the end survives
        assert words[-1] == "t99"
    elif policy == "truncate_tail":  # the start survives
        assert words[0] == "t0"
    else:  # LongBench: both ends survive
        assert words[0] == "t0" and words[-1] == "t99" and "t50" not in words


def test_closed_book_declines_without_context():
    r = st.closed_book(needle_example(), res())
    assert r.prediction == "unanswerable" and r.scores["string_match_all"] == 0.0
    assert r.cost["prompt_tokens"] < 40 and r.cost["flops"] > 0


def test_long_context_finds_needle_and_sets_prefix():
    ex = needle_example()
    r = st.long_context(ex, res())
    assert r.prediction == "7463343" and r.scores == {"string_match_all": 1.0, "exact_match": 1.0}
    assert r.meta["truncated_tokens"] == 0 and r.meta["input_context_tokens"] == 406
    prompt, prefix, _ = st.long_context_prompt(ex, res())
    assert prompt.startswith(prefix) and prefix.strip() == ex.context  # document first
    assert prompt.endswith("Answer:")
    # cost fields from ragbench.cost: FLOPs and KV bytes at this prompt
    assert r.cost["prompt_tokens"] > 406 and r.cost["kv_cache_bytes"] > 0
    assert r.cost["flops_attention"] < r.cost["flops"]


def test_long_context_overflow_error_and_truncation():
    ex = needle_example(depth_words=200)
    with pytest.raises(ContextOverflowError, match="exceeds the 300-token context window"):
        st.long_context(ex, res(window=300))
    # middle truncation drops the needle at the middle; head truncation keeps the end
    mid = st.long_context(ex, res(window=300), overflow="truncate_middle")
    assert mid.prediction == "unanswerable" and mid.meta["truncated_tokens"] > 100
    late = needle_example(depth_words=390, ex_id="late")
    head = st.long_context(late, res(window=300), overflow="truncate_head")
    assert head.prediction == "7463343"
    assert head.cost["prompt_tokens"] + 32 <= 300


def test_matched_budget_caps_every_strategy():
    ex = needle_example()
    r = st.long_context(ex, res(budget=150), overflow="truncate_tail")
    assert r.cost["prompt_tokens"] <= 150
    g = st.rag(ex, res(budget=150), top_k=None)
    assert g.cost["prompt_tokens"] <= 150 and len(g.meta["retrieved"]) >= 3


def test_rag_records_gold_hit_and_order():
    ex = needle_example()
    r = st.rag(ex, res(), top_k=3)
    assert r.meta["gold_hit"] is True and r.prediction == "7463343"
    assert set(r.meta["gold_chunks"]) <= set(r.meta["retrieved"]) or r.meta["gold_hit"]
    assert len(r.meta["retrieved"]) == 3 and r.cost["retrieval_seconds"] >= 0
    assert r.params == {"top_k": 3, "budget": None, "order": "score", "cite": True}
    d = st.rag(ex, res(), top_k=3, order="document")
    ids = [int(c.split("#")[1]) for c in d.meta["retrieved"]]
    assert ids == sorted(ids) and set(d.meta["retrieved"]) == set(r.meta["retrieved"])


def test_self_route_routes_declined_queries_to_long_context():
    ex = needle_example()
    # the RAG leg sees only the chunk budget: a 1-token budget retrieves nothing useful
    routed = st.self_route(ex, res(), top_k=1, budget=5)
    assert routed.meta["route"] == "long_context" and routed.prediction == "7463343"
    rag_only = st.rag(ex, res(), top_k=1, budget=5)
    lc = st.long_context(ex, res())
    assert routed.cost["llm_calls"] == 2
    assert routed.cost["prompt_tokens"] > lc.cost["prompt_tokens"]
    assert routed.cost["flops"] == pytest.approx(
        rag_only.cost["flops"] + lc.cost["flops"], rel=0.05
    )
    direct = st.self_route(ex, res(), top_k=3)
    assert direct.meta["route"] == "rag" and direct.cost["llm_calls"] == 1


def test_registry_and_params():
    with pytest.raises(ValueError, match="unknown strategy 'ragg'; did you mean 'rag'"):
        st.get_strategy("ragg")
    with pytest.raises(ValueError, match="unknown rag parameter 'topk'; did you mean 'top_k'"):
        st.check_params("rag", {"topk": 3})
    with pytest.raises(ValueError, match="did you mean 'truncate_middle'"):
        st.check_params("long_context", {"overflow": "truncate_midle"})
    with pytest.raises(ValueError, match="set top_k, budget or both"):
        st.check_params("rag", {"top_k": None})
    points = st.expand("rag", {"top_k": [2, 4], "order": ["score", "document"]})
    assert len(points) == 4 and points[0] == {
        "budget": None,
        "cite": True,
        "order": "score",
        "top_k": 2,
    }
    assert st.expand("closed_book", {}) == [{}]


class _JoinMergingLLM(FakeLLM):
    """Like SmolLM2's chat template: joining context and question costs one more token than
    the parts counted apart, so a fit computed from the parts overshoots by one."""

    def prompt_tokens(self, request):
        context = request.prompt.split("\n\n")[0]
        return super().prompt_tokens(request) + (1 if context.strip() else 0)


@pytest.mark.parametrize("policy", ["truncate_middle", "truncate_head", "truncate_tail"])
def test_truncation_fits_even_when_the_join_adds_a_token(policy):
    r = res(window=300)
    r.llm = _JoinMergingLLM(context_window=300)
    rec = st.long_context(needle_example(depth_words=200), r, overflow=policy)
    assert rec.error is None and rec.cost["prompt_tokens"] + 32 <= 300
    rag = st.rag(needle_example(depth_words=200), r, top_k=None, budget=None)
    assert rag.cost["prompt_tokens"] + 32 <= 300


def test_kv_cache_bytes_use_the_resources_dtype():
    ex = needle_example()
    bf16 = st.long_context(ex, res()).cost  # dtype unknown: 2 bytes/value assumed
    f32 = st.long_context(ex, res(kv_dtype="float32")).cost
    positions = f32["prompt_tokens"] + f32["completion_tokens"] - 1
    assert f32["kv_bytes_per_value"] == 4 and bf16["kv_bytes_per_value"] == 2
    assert f32["kv_cache_bytes"] == 2 * 30 * 3 * 64 * positions * 4 == 2 * bf16["kv_cache_bytes"]
    routed = st.self_route(ex, res(kv_dtype="float32")).cost
    assert routed["kv_bytes_per_value"] == 4


def test_run_batch_equals_one_at_a_time_in_few_llm_calls():
    class Counting(FakeLLM):
        batches: list[int]

        def _generate(self, requests):
            self.batches.append(len(requests))
            return super()._generate(requests)

    examples = [needle_example(d, f"ex{d}") for d in (20, 200, 380)]
    items = [
        (name, ex, params)
        for ex in examples
        for name, params in [
            ("closed_book", {}),
            ("long_context", {"overflow": "error"}),
            ("rag", {"top_k": 3}),
            ("self_route", {"top_k": 1, "budget": 5}),  # declines: a second round, long context
        ]
    ]
    r = res()
    r.llm = Counting(context_window=8192)
    r.llm.batches = []
    batched = st.run_batch(items, r)
    one_by_one = [st.get_strategy(n).run(ex, res(), **p) for n, ex, p in items]

    def view(rec):
        return (rec.example_id, rec.strategy, rec.prediction, rec.scores, rec.cost["prompt_tokens"])

    assert [view(b) for b in batched] == [view(o) for o in one_by_one]
    routed = sum(b.meta.get("route") == "long_context" for b in batched)
    assert routed == 3 and r.llm.batches == [12, 3]  # one call per round, not per request


def test_run_batch_keeps_one_failure_to_its_item():
    class Failing(FakeLLM):
        def _generate(self, requests):
            if any(q.id.startswith("bad:") for q in requests):
                raise TimeoutError("server hung")
            return super()._generate(requests)

    r = res(window=300)  # the long example overflows the window: long_context raises
    r.llm = Failing(context_window=300)
    long = Example("long", "q?", ("x",), (Document("long/doc", FILLER * 2),), {"task": "qa"})
    items = [
        ("closed_book", needle_example(ex_id="ok"), {}),
        ("long_context", long, {"overflow": "error"}),
        ("closed_book", needle_example(ex_id="bad"), {}),
        ("closed_book", needle_example(ex_id="ok2"), {}),
    ]
    out = st.run_batch(items, r)
    assert isinstance(out[1], ContextOverflowError)
    assert isinstance(out[2], TimeoutError)  # the batch failed; retried alone, only it fails
    assert [o.example_id for o in (out[0], out[3])] == ["ok", "ok2"]
