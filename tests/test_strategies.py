"""Strategies with the FakeLLM and HashEmbedder: prompts, truncation, routing, records."""

from __future__ import annotations

from collections import Counter

import pytest
from openai_server import client, ok, send_json, serving, user_text

from ragbench import strategies as st
from ragbench.llm.base import ContextOverflowError
from ragbench.llm.cache import CachedLLM
from ragbench.llm.fake import FakeLLM
from ragbench.llm.openai.http import LLMRequestError
from ragbench.models import get_preset
from ragbench.strategies import prompts
from ragbench.strategies.fit import long_context_prompt
from ragbench.types import Document, Example, Record

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


def make_index():
    """The index the strategies get: built from the record's own retrieval settings."""
    from ragbench.retrieval import build_index

    def index(example, settings):
        return build_index(
            example.documents,
            retriever=settings.retriever,
            embedder=settings.embedder,
            splitter=settings.splitter,
            chunk_size=settings.chunk_size,
            chunk_overlap=settings.chunk_overlap,
            tokenizer="whitespace",
        )

    return index


# small chunks of the fast hash embedder: every test's retrieval settings
INDEX = {"embedder": "hash", "splitter": "token", "chunk_size": 20, "chunk_overlap": 0}


def run1(name, example, resources, **params):
    """One strategy on one example, one request at a time."""
    strategy = st.get_strategy(name)
    extra = INDEX if strategy.needs_retrieval else {}
    return strategy.run(example, resources, strategy.params(**{**extra, **params}))


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
    assert prompts.clean_answer("  \n7463343\nmore text") == "7463343"
    assert prompts.clean_answer("Answer: Paris") == "Paris"
    q = "What is the special magic number?"
    assert prompts.clean_answer(f"{q} It is 42.", q) == "It is 42."
    assert prompts.clean_answer('"quoted"') == "quoted"
    assert prompts.clean_answer("Answer: A: Paris\nmore") == "Paris"
    assert prompts.clean_answer("") == "" and prompts.clean_answer("Answer:\n\n  ") == ""


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
    assert prompts.clean_answer(text) == "Paris"


def test_clean_answer_label_line_then_restated_question():
    q = "What is the capital of France?"
    assert prompts.clean_answer(f"Answer:\n{q} Paris", q) == "Paris"


def test_task_type_and_templates():
    ex = needle_example()
    assert prompts.task_type(ex) == "needle"
    qa = Example("q", "Who wrote Hamlet?", ("Shakespeare",), (Document("d", "x"),))
    assert prompts.task_type(qa) == "qa"
    tail = prompts.question_part(ex, decline=True)
    assert tail.endswith("Question: What is the special magic number?\nAnswer:")
    assert '"unanswerable"' in tail


@pytest.mark.parametrize("policy", ["truncate_head", "truncate_tail", "truncate_middle"])
def test_truncate_policies(policy):
    count = FakeLLM().count_tokens
    text = " ".join(f"t{i}" for i in range(100))
    out = prompts.truncate(text, 10, policy, count)
    assert count(out) <= 10 and count(out) >= 9
    words = out.split()
    if policy == "truncate_head":  # the end survives
        assert words[-1] == "t99"
    elif policy == "truncate_tail":  # the start survives
        assert words[0] == "t0"
    else:  # LongBench: both ends survive
        assert words[0] == "t0" and words[-1] == "t99" and "t50" not in words


def test_closed_book_declines_without_context():
    r = run1("closed_book", needle_example(), res())
    assert r.prediction == "unanswerable" and r.scores["string_match_all"] == 0.0
    assert r.cost.prompt_tokens < 40 and r.cost.flops > 0


def test_long_context_finds_needle_and_sets_prefix():
    ex = needle_example()
    r = run1("long_context", ex, res())
    assert r.prediction == "7463343" and r.scores == {"string_match_all": 1.0, "exact_match": 1.0}
    assert r.meta["truncated_tokens"] == 0 and r.meta["input_context_tokens"] == 406
    prompt, prefix, _ = long_context_prompt(ex, res())
    assert prompt.startswith(prefix) and prefix.strip() == ex.context  # document first
    assert prompt.endswith("Answer:")
    # cost fields from ragbench.cost.accounting: FLOPs and KV bytes at this prompt
    assert r.cost.prompt_tokens > 406 and r.cost.kv_cache_bytes > 0
    assert r.cost.flops_attention < r.cost.flops


def test_long_context_overflow_error_and_truncation():
    ex = needle_example(depth_words=200)
    with pytest.raises(ContextOverflowError, match="exceeds the 300-token context window"):
        run1("long_context", ex, res(window=300))
    # middle truncation drops the needle at the middle; head truncation keeps the end
    mid = run1("long_context", ex, res(window=300), overflow="truncate_middle")
    assert mid.prediction == "unanswerable" and mid.meta["truncated_tokens"] > 100
    late = needle_example(depth_words=390, ex_id="late")
    head = run1("long_context", late, res(window=300), overflow="truncate_head")
    assert head.prediction == "7463343"
    assert head.cost.prompt_tokens + 32 <= 300


def test_matched_budget_caps_every_strategy():
    ex = needle_example()
    r = run1("long_context", ex, res(budget=150), overflow="truncate_tail")
    assert r.cost.prompt_tokens <= 150
    g = run1("rag", ex, res(budget=150), top_k=None, budget=150)
    assert g.cost.prompt_tokens <= 150 and len(g.meta["retrieved"]) >= 3


def test_rag_records_gold_hit_and_order():
    ex = needle_example()
    r = run1("rag", ex, res(), top_k=3)
    assert r.meta["gold_hit"] is True and r.prediction == "7463343"
    assert r.meta["gold_chunks"] and set(r.meta["gold_chunks"]) & set(r.meta["retrieved"])
    assert len(r.meta["retrieved"]) == 3 and r.cost.retrieval_seconds >= 0
    assert r.params == st.RagParams(**INDEX, top_k=3, budget=None, order="score", cite=True)
    d = run1("rag", ex, res(), top_k=3, order="document")
    ids = [int(c.split("#")[1]) for c in d.meta["retrieved"]]
    assert ids == sorted(ids) and set(d.meta["retrieved"]) == set(r.meta["retrieved"])


def test_self_route_routes_declined_queries_to_long_context():
    ex = needle_example()
    # the RAG leg sees only the chunk budget: a 1-token budget retrieves nothing useful
    routed = run1("self_route", ex, res(), top_k=1, budget=5)
    assert routed.meta["route"] == "long_context" and routed.prediction == "7463343"
    rag_only = run1("rag", ex, res(), top_k=1, budget=5)
    lc = run1("long_context", ex, res())
    assert routed.cost.llm_calls == 2
    assert routed.cost.prompt_tokens > lc.cost.prompt_tokens
    assert routed.cost.flops == pytest.approx(rag_only.cost.flops + lc.cost.flops, rel=0.05)
    direct = run1("self_route", ex, res(), top_k=3)
    assert direct.meta["route"] == "rag" and direct.cost.llm_calls == 1


def test_registry_and_params():
    with pytest.raises(ValueError, match="unknown strategy 'ragg'; did you mean 'rag'"):
        st.get_strategy("ragg")
    with pytest.raises(ValueError, match="unknown rag parameter 'topk'; did you mean 'top_k'"):
        st.RagParams.from_dict({"topk": 3})
    with pytest.raises(ValueError, match="did you mean 'truncate_middle'"):
        st.LongContextParams(overflow="truncate_midle")
    with pytest.raises(ValueError, match="set top_k, budget or both"):
        st.RagParams(top_k=None)
    points = st.get_strategy("rag").grid({"top_k": [2, 4], "order": ["score", "document"]})
    assert len(points) == 4 and points[0] == st.RagParams(
        budget=None, cite=True, order="score", top_k=2
    )
    assert st.get_strategy("closed_book").grid({}) == [st.ClosedBookParams()]


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
    rec = run1("long_context", needle_example(depth_words=200), r, overflow=policy)
    assert rec.error is None and rec.cost.prompt_tokens + 32 <= 300
    rag = run1("rag", needle_example(depth_words=200), r, top_k=None, budget=10_000)
    assert rag.cost.prompt_tokens + 32 <= 300


def test_kv_cache_bytes_use_the_resources_dtype():
    ex = needle_example()
    bf16 = run1("long_context", ex, res()).cost  # dtype unknown: 2 bytes/value assumed
    f32 = run1("long_context", ex, res(kv_dtype="float32")).cost
    positions = f32.prompt_tokens + f32.completion_tokens - 1
    assert f32.kv_bytes_per_value == 4 and bf16.kv_bytes_per_value == 2
    assert f32.kv_cache_bytes == 2 * 30 * 3 * 64 * positions * 4 == 2 * bf16.kv_cache_bytes
    routed = run1("self_route", ex, res(kv_dtype="float32")).cost
    assert routed.kv_bytes_per_value == 4


def test_run_batch_equals_one_at_a_time_in_few_llm_calls():
    class Counting(FakeLLM):
        batches: list[int]

        def _generate(self, requests):
            self.batches.append(len(requests))
            return super()._generate(requests)

    examples = [needle_example(d, f"ex{d}") for d in (20, 200, 380)]
    items = [
        (ex, params)
        for ex in examples
        for params in [
            st.ClosedBookParams(),
            st.LongContextParams(overflow="error"),
            st.RagParams(**INDEX, top_k=3),
            st.SelfRouteParams(**INDEX, top_k=1, budget=5),  # declines: a second round
        ]
    ]
    r = res()
    r.llm = Counting(context_window=8192)
    r.llm.batches = []
    batched = st.run_batch(items, r)
    one_by_one = [st.get_strategy(p.strategy).run(ex, res(), p) for ex, p in items]

    def view(rec):
        return (rec.example_id, rec.strategy, rec.prediction, rec.scores, rec.cost.prompt_tokens)

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
        (needle_example(ex_id="ok"), st.ClosedBookParams()),
        (long, st.LongContextParams(overflow="error")),
        (needle_example(ex_id="bad"), st.ClosedBookParams()),
        (needle_example(ex_id="ok2"), st.ClosedBookParams()),
    ]
    out = st.run_batch(items, r)
    assert isinstance(out[1], ContextOverflowError)
    assert isinstance(out[2], TimeoutError)  # the batch failed; retried alone, only it fails
    assert [o.example_id for o in (out[0], out[3])] == ["ok", "ok2"]


serve = pytest.fixture(serving, name="serve")


def test_run_batch_sends_a_failing_request_only_its_own_retries(serve, tmp_path):
    """Retries live in the backend: a request it gave up on is not sent again by the driver,
    and each failed request gets its own error, with the attempts it really had."""

    def behave(h, body, n):
        text = user_text(body)
        if "FAIL" in text:
            question = text[text.index("FAIL") :].split("\n")[0]
            return send_json(h, 500, {"error": {"message": f"worker crashed on {question}"}})
        return ok()(h, body, n)

    srv = serve(behave)
    llm = CachedLLM(client(srv, max_retries=2, max_concurrency=4), tmp_path / "c.sqlite")
    r = res()
    r.llm = llm

    def item(ex_id: str, question: str):
        doc = Document(f"{ex_id}/doc", "Some text.")
        return Example(ex_id, question, ("x",), (doc,), {"task": "qa"}), st.ClosedBookParams()

    assert isinstance(st.run_batch([item("hit", "Who is cached?")], r)[0], Record)
    before = len(srv.requests)
    items = [
        item("hit", "Who is cached?"),  # served by the completion cache
        item("bad1", "FAIL one?"),
        item("ok", "Who answers?"),
        item("bad2", "FAIL two?"),
    ]
    out = st.run_batch(items, r)
    sent = Counter(
        next(q for q in ("cached", "FAIL one", "answers", "FAIL two") if q in user_text(body))
        for _, _, body in srv.requests[before:]
    )
    assert sent == {"FAIL one": 3, "FAIL two": 3, "answers": 1}  # (max_retries + 1) each, once
    assert isinstance(out[0], Record) and isinstance(out[2], Record)
    assert out[0].error is None and out[2].error is None
    for i, question in ((1, "FAIL one?"), (3, "FAIL two?")):
        assert isinstance(out[i], LLMRequestError) and out[i].attempts == 3
        assert f"failed after 3 attempt(s): HTTP 500: worker crashed on {question}" in str(out[i])


def test_labels_tell_every_variant_apart():
    # regression: cite=True and cite=False were both labelled "rag k=5"
    assert st.RagParams().label() == "rag k=5"
    assert st.RagParams(cite=False).label() == "rag k=5 cite=False"
    assert st.RagParams(top_k=None, budget=512).label() == "rag budget=512"
    assert (
        st.RagParams(retriever="bm25", chunk_size=64).label() == "rag k=5 retriever=bm25 chunk=64"
    )
    assert (
        st.LongContextParams(overflow="truncate_middle").label() == "long_context truncate_middle"
    )
    assert (
        st.SelfRouteParams(overflow="truncate_head").label()
        == "self_route k=5 overflow=truncate_head"
    )
    grid = st.get_strategy("rag").grid({"cite": [True, False], "order": ["score", "document"]})
    labels = [p.label() for p in grid]
    assert len(set(labels)) == len(grid) == 4


def test_params_grid_crosses_the_run_retrieval_settings():
    run_wide = {"retriever": ["dense", "bm25"], "chunk_size": 64, "chunk_overlap": 8}
    points = st.get_strategy("rag").grid({"top_k": [2, 4]}, run_wide)
    assert [(p.retriever, p.top_k, p.chunk_size) for p in points] == [
        ("dense", 2, 64),
        ("dense", 4, 64),
        ("bm25", 2, 64),
        ("bm25", 4, 64),
    ]
    # a strategy's own params override the run-wide value; closed book ignores retrieval
    assert st.get_strategy("rag").grid({"chunk_size": 32}, run_wide)[0].chunk_size == 32
    assert st.get_strategy("closed_book").grid({}, run_wide) == [st.ClosedBookParams()]
    with pytest.raises(ValueError, match="did you mean 'dense'"):
        st.RagParams(retriever="dnese")
    with pytest.raises(ValueError, match="chunk_overlap"):
        st.RagParams(chunk_size=16, chunk_overlap=16)
    # a stored point comes back as its class
    p = st.SelfRouteParams(top_k=2, overflow="truncate_tail")
    assert st.params_from_dict("self_route", p.to_dict()) == p


# --------------------------------------------------------------------------- what a cut kept


@pytest.mark.parametrize("policy", ["truncate_head", "truncate_tail", "truncate_middle"])
def test_kept_ranges_are_what_truncate_keeps(policy):
    count = FakeLLM().count_tokens
    text = " ".join(f"t{i}" for i in range(100))
    ranges = prompts.kept_ranges(text, 10, policy, count)
    assert "".join(text[s:e] for s, e in ranges) == prompts.truncate(text, 10, policy, count)
    assert len(ranges) == (2 if policy == "truncate_middle" else 1)
    assert prompts.kept_ranges(text, 1000, policy, count) == [(0, len(text))]  # all: one range
    assert prompts.kept_ranges(text, 0, policy, count) == []
    with pytest.raises(ValueError, match="overflow policy 'error'.*truncate_middle"):
        prompts.truncate(text, 10, "error", count)


def ten_documents(evidence_doc: int) -> Example:
    """Ten titled 40-word documents; the needle (the evidence) sits in document ``evidence_doc``."""
    docs = []
    for i in range(10):
        words = [f"d{i}w{j}" for j in range(40)]
        text = " ".join(words[:20] + ([NEEDLE] if i == evidence_doc else []) + words[20:])
        docs.append(Document(id=f"doc{i}", text=text, title=f"Title {i}"))
    start = docs[evidence_doc].text.index(NEEDLE)
    meta = {"evidence": [[f"doc{evidence_doc}", start, start + len(NEEDLE)]]}
    return Example(
        f"e{evidence_doc}", "What is the special magic number?", ("7463343",), tuple(docs), meta
    )


def test_truncation_names_the_dropped_and_cut_documents_and_whether_the_evidence_stayed():
    # ~430 context tokens into a 200-token window: the middle documents go
    inside, outside = ten_documents(0), ten_documents(5)
    kept = run1("long_context", inside, res(window=200), overflow="truncate_middle")
    lost = run1("long_context", outside, res(window=200), overflow="truncate_middle")
    for r in (kept, lost):
        assert r.meta["truncated_tokens"] > 200
        dropped, cut = r.meta["dropped_documents"], r.meta["cut_documents"]
        assert "doc5" in dropped and "doc0" not in dropped + cut and "doc9" not in dropped + cut
        assert len(cut) == 2 and not set(cut) & set(dropped)  # the head's and the tail's last
        ids = [d.id for d in inside.documents]  # dropped ones: a run between the cut ones
        assert ids.index(cut[0]) < min(map(ids.index, dropped)) <= max(map(ids.index, dropped))
        assert max(map(ids.index, dropped)) < ids.index(cut[1])
    assert kept.meta["evidence_truncated"] is False and kept.prediction == "7463343"
    assert lost.meta["evidence_truncated"] is True and lost.prediction == "unanswerable"
    # nothing cut: nothing dropped, the evidence kept; without evidence spans: unknown
    whole = run1("long_context", inside, res())
    assert whole.meta["truncated_tokens"] == 0 and whole.meta["evidence_truncated"] is False
    assert whole.meta["dropped_documents"] == whole.meta["cut_documents"] == []
    bare = Example("b", inside.question, inside.answers, inside.documents)
    assert (
        run1("long_context", bare, res(window=200), overflow="truncate_middle").meta[
            "evidence_truncated"
        ]
        is None
    )


def test_self_route_long_context_branch_says_what_it_kept():
    ex = ten_documents(5)
    routed = run1("self_route", ex, res(window=200), top_k=1, budget=5, overflow="truncate_head")
    assert routed.meta["route"] == "long_context"
    assert routed.meta["lc_evidence_truncated"] is True and routed.meta["lc_truncated_tokens"] > 0
    assert "doc0" in routed.meta["lc_dropped_documents"] and routed.meta["lc_cut_documents"]
    assert "evidence_truncated" not in routed.meta  # only the branch's, prefixed


def test_a_shared_corpus_is_cut_once_and_each_question_checks_its_own_evidence():
    docs = ten_documents(0).documents
    early, late = ten_documents(0), ten_documents(9)
    meta = {"corpus_fingerprint": "c1"}
    early = Example("q1", early.question, early.answers, docs, {**early.meta, **meta})
    start = docs[9].text.index("d9w30")
    late = Example(
        "q2", late.question, ("d9w30",), docs, {"evidence": [["doc9", start, start + 5]], **meta}
    )
    r = res(window=400)
    a = run1("long_context", early, r, overflow="truncate_tail")
    b = run1("long_context", late, r, overflow="truncate_tail")
    assert len(r.fitted) == 1  # one cut for both questions
    assert a.meta["kept_tokens"] == b.meta["kept_tokens"]
    assert (
        a.meta["dropped_documents"] == b.meta["dropped_documents"]
        and "doc9" in a.meta["dropped_documents"]
    )
    assert a.meta["evidence_truncated"] is False and b.meta["evidence_truncated"] is True


def test_a_query_that_fails_after_a_paid_call_keeps_its_cost(tmp_path):
    """Self-Route's RAG call answers (declines), then its long-context call fails: the error
    row carries the RAG call's cost (the money was spent; a budget counts it)."""
    from test_runner import niah_config

    from ragbench.experiment.budget import spend_of
    from ragbench.experiment.config.run import load_config
    from ragbench.experiment.results import RECORDS, read_records
    from ragbench.experiment.runner import run, run_dir_for

    def answer(request):
        if "unanswerable" in request.prompt:  # the RAG prompt with its decline option
            return "unanswerable"
        raise RuntimeError("the server went away")

    cfg = niah_config(tmp_path, strategies=["self_route"], price_sheet="example-hosted-api")
    df = run(cfg, progress=False, llm=FakeLLM(answer_fn=answer))
    assert df["error"].str.contains("the server went away").all() and len(df) == 4
    records = read_records(run_dir_for(load_config(cfg)) / RECORDS).values()
    costs = [r.cost for r in records]
    assert all(c is not None and c.llm_calls == 1 and c.dollars > 0 for c in costs)
    assert all(c.prompt_tokens > 0 and c.completion_tokens == 1 for c in costs)
    assert spend_of(records).dollars == pytest.approx(sum(c.dollars for c in costs))
    assert (df["dollars"] > 0).all()  # in the table too, beside the error


def test_a_failure_after_a_paid_call_reads_as_its_own_error_with_its_cost():
    """Every reader of run_batch outcomes unwraps FailedAfterPaying the same way: the noise
    pass names the real error (not "FailedAfterPaying") and keeps what the finished call cost;
    ``outcome_parts`` (what the dry run and the error record read) gives the error itself, so
    an over-window failure stays one."""
    from ragbench.cost import Cost
    from ragbench.experiment.noise_pass import _with_noisy
    from ragbench.strategies.driver import FailedAfterPaying, outcome_parts

    paid = Cost(prompt_tokens=40, completion_tokens=2, dollars=0.5)
    overflow = ContextOverflowError(9000, 32, 8192, "m")
    wrapped = FailedAfterPaying(overflow, paid)
    assert outcome_parts(wrapped) == (overflow, paid)
    assert outcome_parts(overflow) == (overflow, None)
    record = Record("q", "self_route", None, "a", scores={"contains": 1.0})
    noisy = _with_noisy(record, [], wrapped, 0)
    assert noisy.meta["noise_error"].startswith("ContextOverflowError: prompt of 9000 tokens")
    assert noisy.meta["noise_dollars"] == 0.5 and noisy.meta["noise_prompt_tokens"] == 40
