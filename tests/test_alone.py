"""A strategy variant priced as if it ran alone (``ragbench.cost.alone``), and latency as the
request's own time (the harness's queue apart)."""

from __future__ import annotations

import dataclasses

import pytest

from ragbench import strategies as st
from ragbench.analysis import summary
from ragbench.cost import alone, money, prices
from ragbench.cost.accounting import Cost
from ragbench.cost.money import Usage
from ragbench.experiment.resources import longest_prompt
from ragbench.experiment.runner import plan_rounds
from ragbench.llm.fake import FakeLLM
from ragbench.llm.hf.schedule import common_prefix_len
from ragbench.models import get_preset
from ragbench.retrieval import build_index
from ragbench.types import Completion, Document, Example, GenerationRequest

GPU = {
    "name": "gpu",
    "kind": "gpu_hour",
    "date": "2026-01-01",
    "source": "test",
    "gpu_hour": 3.6,
    "gpus": 1,
}
API = {
    "name": "api",
    "kind": "api",
    "date": "2026-01-01",
    "source": "test",
    "input_per_million": 1.0,
    "cached_input_per_million": 0.1,
    "cache_write_per_million": 1.25,
    "output_per_million": 4.0,
}
INDEX = {"embedder": "hash", "splitter": "token", "chunk_size": 20, "chunk_overlap": 0}


# ------------------------------------------------------------------------ the ledger alone


def test_the_first_record_of_a_variant_on_a_prefix_pays_later_ones_reuse_it():
    ledger = alone.PrefixLedger()
    doc = " ".join(f"w{i}" for i in range(800))
    req = [GenerationRequest(f"{doc}\nQuestion: q{i}?", prefix=doc) for i in range(3)]

    def served(r, cached):  # whitespace tokens, as the fake counts them
        return Completion("a", len(r.prompt.split()), 1, cached_prompt_tokens=cached)

    # variant A computed the document; B's first question found it cached: B pays
    assert alone.paid_tokens(ledger.charge("A", req[0], served(req[0], 0))) == 0
    b1 = ledger.charge("B", req[1], served(req[1], 800))
    assert alone.paid_tokens(b1) == 800
    # B's second question on the same document reuses what B paid; so does A's
    assert alone.paid_tokens(ledger.charge("B", req[2], served(req[2], 800))) == 0
    assert alone.paid_tokens(ledger.charge("A", req[1], served(req[1], 800))) == 0

    # charged as computed: no cached tokens (input on an api sheet, as the record that computed
    # it was charged), the prefill's seconds on an hourly one; measured numbers kept
    c = Cost.of(b1, sheet=prices.parse_price_sheet(API))
    assert c.cached_prompt_tokens == 0 and c.prefix_paid_tokens == 800
    full = money.dollars(
        prices.parse_price_sheet(API), Usage(prompt_tokens=802, completion_tokens=1)
    )
    assert c.dollars == pytest.approx(full)
    # a backend that reports its cache writes: the paid prefix is one more write
    written = Completion(
        "a", 802, 1, cached_prompt_tokens=800, meta={**b1.meta, "cache_write_tokens": 0}
    )
    usage = Usage(prompt_tokens=802, completion_tokens=1, cache_write_tokens=800)
    full = money.dollars(prices.parse_price_sheet(API), usage)
    assert Cost.of(written, sheet=prices.parse_price_sheet(API)).dollars == pytest.approx(full)
    timed = Completion(
        "a",
        802,
        1,
        cached_prompt_tokens=800,
        prefill_seconds=0.003,
        decode_seconds=0.1,
        meta=b1.meta,
    )
    g = Cost.of(timed, sheet=prices.parse_price_sheet(GPU))
    assert g.resource_seconds == pytest.approx(0.103)  # measured: what the device did
    assert g.prefix_paid_seconds == pytest.approx(1.2)  # 800 tokens at its 1.5 ms/token prefill
    assert g.dollars == pytest.approx(3.6 * (0.103 + 1.2) / 3600)
    # repricing reads the same columns and charges the same
    assert Cost.from_dict(g.to_dict()).repriced(prices.parse_price_sheet(GPU)).dollars == (
        pytest.approx(g.dollars)
    )
    assert Cost.from_dict(c.to_dict()).repriced(prices.parse_price_sheet(API)).dollars == (
        pytest.approx(c.dollars)
    )


def test_a_calibrated_record_pays_the_prefix_prefill_in_its_modelled_seconds():
    from ragbench.llm.cost_model import Rates

    rates = Rates(a=0.01, b=1e-4, c=1e-8, d0=0.005, d1=1e-6)
    work = {
        "prompt_tokens": 700,
        "completion_tokens": 4,
        "prefix_tokens": 600,
        "prefix_computed": False,
        "shared": False,
    }
    reused = Completion(
        "a",
        700,
        4,
        cached_prompt_tokens=600,
        resource_seconds=0.2,
        meta={"work": work, "alone_seconds_estimate": 0.2},
    )
    paid = Completion(**{**reused.__dict__, "meta": {**reused.meta, alone.PAID_KEY: 600}})
    before, after = Cost.of(reused, rates=rates), Cost.of(paid, rates=rates)
    computed = rates.alone(700, 4, 600, True, False)
    assert after.modelled_seconds == pytest.approx(computed)
    assert after.prefix_paid_seconds == pytest.approx(computed - before.modelled_seconds)
    assert after.resource_seconds == before.resource_seconds == 0.2  # measured stays measured


# --------------------------------------------- alone vs beside other strategies (fake backend)


def _examples() -> list[Example]:
    """Two documents, three questions each (a later question of a variant reuses its prefix)."""
    out = []
    for d in range(2):
        text = " ".join(f"d{d}w{i}" for i in range(600))
        doc = Document(id=f"doc{d}", text=text)
        for q in range(3):
            meta = {"task": "niah", "corpus_fingerprint": f"doc{d}"}
            out.append(Example(f"d{d}q{q}", f"What is thing {q}?", ("x",), (doc,), meta))
    return out


def whitespace_index(example, settings):
    """The strategies' index builder, chunking by whitespace tokens."""
    return build_index(
        example.documents,
        retriever=settings.retriever,
        embedder=settings.embedder,
        splitter=settings.splitter,
        chunk_size=settings.chunk_size,
        chunk_overlap=settings.chunk_overlap,
        tokenizer="whitespace",
    )


class PrefixCachingFake(FakeLLM):
    """The fake as a server with automatic prefix caching (vLLM's, SGLang's radix cache): a
    prompt's longest common token prefix with any prompt sent before, in any call, is cached,
    declared or not. So Self-Route's RAG prompt finds RAG's (the same chunks), and long context's
    document is found by Self-Route's long-context call: what the alone rule must charge."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.sent: list[list[str]] = []

    def _generate(self, requests):
        out = super()._generate(requests)
        for i, (r, c) in enumerate(zip(requests, out, strict=True)):
            words = (r.system + r.prompt).split()
            seen = max((common_prefix_len(words, w) for w in self.sent), default=0)
            cached = max(c.cached_prompt_tokens, min(seen, c.prompt_tokens - 1))
            prefill = (c.prompt_tokens - cached) / self.prefill_tps
            out[i] = dataclasses.replace(c, cached_prompt_tokens=cached, prefill_seconds=prefill)
            self.sent.append(words)
        return out


def variant_rounds(items, size):
    """The runner's rounds (``plan_rounds``: one strategy variant per round) of (example, params)."""
    return plan_rounds(items, size, lambda item: item[1].label())


def _records(points, sheet, batch_size=8):
    res = st.Resources(
        # every answer declines: Self-Route always goes on to long context
        llm=PrefixCachingFake(context_window=8192, answer_fn=lambda r: "unanswerable"),
        preset=get_preset("smollm2-135m-instruct"),
        sheet=prices.parse_price_sheet(sheet),
        index=whitespace_index,
    )
    items = [(ex, p) for ex in _examples() for p in points]
    out = {}
    for chunk in variant_rounds(items, batch_size):
        for (ex, p), rec in zip(chunk, st.run_batch(chunk, res), strict=True):
            assert not isinstance(rec, Exception), rec
            out[(ex.id, p.label())] = rec
    return out


RAG = st.RagParams(**INDEX, top_k=3)
SELF_ROUTE = st.SelfRouteParams(**INDEX, top_k=3)
LONG = st.LongContextParams()


# dollars of one prompt token computed rather than found cached: the fake's prefill (1,000
# tokens/s) on the hourly sheet, input less cached input on the api sheet
ONE_TOKEN = {"gpu_hour": 3.6 / 3600 / 1000.0, "api": (1.0 - 0.1) / 1e6}


@pytest.mark.parametrize("sheet", [GPU, API], ids=["gpu_hour", "api"])
@pytest.mark.parametrize(
    "point,beside", [(RAG, [SELF_ROUTE, LONG]), (SELF_ROUTE, [RAG]), (SELF_ROUTE, [RAG, LONG])]
)
def test_a_variant_costs_the_same_alone_and_beside_others(point, beside, sheet):
    by_itself = _records([point], sheet)
    together = _records([*beside, point], sheet)
    label = point.label()
    # within 1%, or one token: the ledger knows what a variant sent before in characters and
    # converts them to tokens in proportion (cost/alone.py), so a prefix found cached beside
    # others is paid down to its estimate of the variant's own prefix, which reads one token
    # short on some of these 77-token RAG prompts (1-2% of their dollars)
    one_token = ONE_TOKEN[sheet["kind"]]
    for (ex, lb), rec in by_itself.items():
        other = together[(ex, lb)]
        tolerance = max(0.01 * rec.cost.dollars, one_token * 1.001)
        assert abs(other.cost.dollars - rec.cost.dollars) <= tolerance, (ex, label)
        assert other.cost.prompt_tokens == rec.cost.prompt_tokens
    # it did find prompt prefixes the others computed (RAG's prompt in Self-Route's, or the
    # other way round; long context's document), and paid them: without the rule it would cost
    # less beside them than alone
    paid = [together[(e, label)].cost.prefix_paid_tokens for e, _ in by_itself]
    assert sum(paid) > 0 and not any(rec.cost.prefix_paid_tokens for rec in by_itself.values())


# ----------------------------------------------------------------- latency: its own time


def _niah_config(tmp_path, batch_size):
    return {
        "name": f"lat-{batch_size}",
        "dataset": {
            "name": "niah",
            "params": {
                "context_lengths": [200, 300, 400, 500, 600, 700],
                "depth_percents": [10, 50, 90],
                "needle": "\nThe special magic number is 7463343.\n",
                "question": "What is the special magic number mentioned in the text?",
                "answer": "7463343",
                "tokenizer": "whitespace",
                "final_context_length_buffer": 50,
            },
        },
        "model": {
            "backend": "fake",
            "name": "fake",
            "preset": "smollm2-135m-instruct",
            "cache": False,
            "batch_size": batch_size,
        },
        "retrieval": {
            "embedder": "hash",
            "chunk_size": 64,
            "chunk_overlap": 8,
            "tokenizer": "whitespace",
        },
        "strategies": ["closed_book", "long_context", "rag"],
        "metrics": ["string_match_all"],
        "price_sheet": "example-hosted-api",
        "output_dir": str(tmp_path / f"b{batch_size}"),
    }


@pytest.mark.parametrize("batch_size", [1, 16])
def test_latency_is_the_request_time_at_any_batch_size(tmp_path, batch_size):
    from ragbench.experiment.runner import run

    # one slot: a call's requests run one after another, each 0.02 s (one token at 50/s, a
    # prefill too fast to count): at batch size 16 the last of a round waits for the others
    llm = FakeLLM(
        "fake", prefill_tokens_per_second=1e12, decode_tokens_per_second=50.0, serial=True
    )
    df = run(_niah_config(tmp_path, batch_size), progress=False, llm=llm)
    assert df["error"].isna().all() and len(df) == 54
    search = df["search_seconds"].fillna(0.0)
    assert (df["latency_seconds"] - search).to_numpy() == pytest.approx(0.02, abs=1e-6)
    assert (df.loc[df.strategy == "rag", "search_seconds"] > 0).all()
    assert (df.latency_basis == "own").all()
    if batch_size == 1:
        assert (df["queue_seconds"] == 0).all()
    else:  # the queue is real and apart: a round is one variant's, its 18 questions cut into
        # two rounds of 9, so the last of a round waited for the 8 before it
        assert df["queue_seconds"].max() == pytest.approx(8 * 0.02, abs=1e-6)
    table = summary(df)
    assert (table["latency_seconds"] < 0.03).all()


# ------------------------------------------- alone vs beside on the embedded model (SmolLM2)


@pytest.mark.slow
def test_on_smollm2_a_variant_costs_the_same_alone_and_beside_others():
    """The transformers backend shares prefixes for real: a call's prompts that start alike
    share one prefix KV (Self-Route's RAG prompt and RAG's hold the same chunks; two questions
    on one chunk), and long context's document is kept across calls. Each round holds one
    variant (``plan_rounds``), so RAG's and Self-Route's records have the same call mates, the
    same reuse and the same calibrated dollars beside the others as alone: within 1%, measured
    equal. (With rounds mixing the strategies, RAG beside the other three cost 0.88-1.04x its
    price alone per record here; replayed on other question sets and batch sizes, single
    records cost 0.26-4.5x their price alone.)"""
    from ragbench.llm.hf.model import HFModel

    llm = HFModel("smollm2-135m-instruct", device="cpu", batch_size=8, prefix_cache_size=2)

    words = " ".join(f"Line {i} of the report says the weather was mild." for i in range(40))
    examples = []
    for d in range(2):
        doc = Document(id=f"doc{d}", text=f"Report {d}. {words}")
        for q in range(2):
            meta = {"task": "niah", "corpus_fingerprint": f"doc{d}"}
            question = f"What is the special magic number for key {d}-{q}?"
            examples.append(Example(f"d{d}q{q}", question, ("x",), (doc,), meta))
    rag = st.RagParams(embedder="hash", splitter="token", chunk_size=40, chunk_overlap=0, top_k=4)
    self_route = st.SelfRouteParams(
        embedder="hash", splitter="token", chunk_size=40, chunk_overlap=0, top_k=4
    )

    # calibrated as a run of these points would be, to the longest request they send (about
    # 600 tokens here), not to the 2,048 tokens a bare first call probes to (minutes of probes)
    every = [st.ClosedBookParams(), LONG, self_route, rag]
    rates = llm.cost_rates(longest_prompt(llm, examples, every, max_new_tokens=8))

    def records(points):
        res = st.Resources(
            llm=llm,
            max_new_tokens=8,
            preset=llm.preset,
            sheet=prices.parse_price_sheet(GPU),
            rates=rates,
            index=whitespace_index,
            kv_dtype=llm.identity()["dtype"],
        )
        llm._prefix_kv.clear()  # each run starts cold, as a run in its own process would
        items = [(ex, p) for ex in examples for p in points]
        out = {}
        for chunk in variant_rounds(items, 8):
            for (ex, p), rec in zip(chunk, st.run_batch(chunk, res), strict=True):
                assert not isinstance(rec, Exception), rec
                out[(ex.id, p.label())] = rec
        return out

    alone = {p.strategy: records([p]) for p in (rag, self_route)}
    everything = records(every)
    beside_rag = records([rag, self_route])
    for point, together in [(rag, everything), (self_route, everything), (self_route, beside_rag)]:
        by_itself = alone[point.strategy]
        for k, rec in by_itself.items():
            other = together[k].cost
            assert other.cost_basis == rec.cost.cost_basis == "calibrated"
            assert other.dollars == pytest.approx(rec.cost.dollars, rel=0.01), k
            assert other.modelled_seconds == pytest.approx(rec.cost.modelled_seconds, rel=0.01)
            assert other.cached_prompt_tokens == rec.cost.cached_prompt_tokens
            assert together[k].prediction == rec.prediction  # the same greedy answer
        # a variant's questions share prompt prefixes within its rounds: reuse is compared too
        assert sum(r.cost.cached_prompt_tokens for r in by_itself.values()) > 0
