"""A preloaded corpus (long_context preload): the corpus KV once per run, its one-time cost apart
from the per-query cost and amortised; the essay corpus the runner benchmark uses; prefix reuse
switched off for baselines."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from ragbench.cost.accounting import Cost
from ragbench.datasets import build_dataset
from ragbench.datasets.corpus.shared import write_essay_corpus
from ragbench.experiment.runner import run
from ragbench.llm.fake import FakeLLM
from ragbench.strategies import LongContextParams

N = 6


@pytest.fixture
def corpus(tmp_path) -> tuple[Path, Path]:
    return write_essay_corpus(tmp_path / "corpus", questions=N, tokens=900, tokenizer="whitespace")


def corpus_config(tmp_path, corpus, strategies, name="t-preload") -> dict:
    return {
        "name": name,
        "dataset": {
            "name": "corpus",
            "params": {"corpus": str(corpus[0]), "questions": str(corpus[1])},
        },
        "model": {"backend": "fake", "name": "fake", "cache": False, "batch_size": 2},
        "strategies": strategies,
        "metrics": ["string_match_all"],
        "price_sheet": "example-hosted-api",
        "output_dir": str(tmp_path / "runs"),
    }


def test_essay_corpus_has_one_findable_needle_per_question(corpus):
    examples = build_dataset("corpus", corpus=str(corpus[0]), questions=str(corpus[1]))
    assert len(examples) == N and len({e.id for e in examples}) == N
    context = examples[0].context
    assert 880 <= len(context.split()) <= 920  # the whitespace tokens asked for, give or take
    for e in examples:
        assert context.count(f"number for {e.id} is {e.answers[0]}.") == 1
    again = write_essay_corpus(corpus[0].parent / "again", N, 900, tokenizer="whitespace")
    assert again[0].read_bytes() == corpus[0].read_bytes()  # deterministic


def test_preload_costs_the_corpus_once_apart_from_each_question(tmp_path, corpus):
    fake = FakeLLM(prefix_cache_size=1)  # keeps the corpus across calls, like HFModel
    cfg = corpus_config(tmp_path, corpus, [{"name": "long_context", "params": {"preload": True}}])
    df = run(cfg, progress=False, llm=fake)
    assert df["error"].isna().all() and set(df["label"]) == {"long_context preload"}
    assert df["string_match_all"].mean() == 1.0  # the fake reads every needle
    # one preload call before the questions, then N/2 rounds of 2
    assert fake.calls == 1 + N // 2
    corpus_tokens = fake.count_tokens(
        build_dataset("corpus", corpus=str(corpus[0]), questions=str(corpus[1]))[0].context
    )
    # every question found the corpus cached: its own cost is its question and answer only
    assert (df["cached_prompt_tokens"] >= corpus_tokens).all()
    own = (df["prompt_tokens"] - df["cached_prompt_tokens"]) / fake.prefill_tps
    own += df["completion_tokens"] / fake.decode_tps
    assert df["resource_seconds"].tolist() == pytest.approx(own.tolist())
    assert (df["resource_seconds"] < corpus_tokens / fake.prefill_tps).all()
    # the one-time cost is the preload call, measured: the corpus prefill (+ an empty question
    # and one token), the same on every record, in the manifest, amortised over the N questions
    manifest = json.loads((Path(df.attrs["run_dir"]) / "manifest.json").read_text())
    (pre,) = manifest["sessions"][0]["preloaded"]
    assert pre["amortised_over"] == N and pre["error"] is None
    assert pre["prompt_tokens"] > corpus_tokens
    assert pre["one_time_seconds"] == pytest.approx(
        pre["prompt_tokens"] / fake.prefill_tps + 1 / fake.decode_tps
    )
    assert (df["one_time_seconds"] == pre["one_time_seconds"]).all()
    assert (df["amortised_over"] == N).all()
    assert df["amortised_resource_seconds"].tolist() == pytest.approx(
        (df["resource_seconds"] + pre["one_time_seconds"] / N).tolist()
    )
    assert (df["one_time_dollars"] == pre["one_time_dollars"]).all()
    assert df["amortised_dollars"].tolist() == pytest.approx(
        (df["dollars"] + pre["one_time_dollars"] / N).tolist()
    )


def test_without_preload_the_first_question_pays_for_the_corpus(tmp_path, corpus):
    fake = FakeLLM(prefix_cache_size=1)
    df = run(corpus_config(tmp_path, corpus, ["long_context"]), progress=False, llm=fake)
    assert fake.calls == N // 2  # no preload call
    assert sorted(df["cached_prompt_tokens"] > 0) == [False] + [True] * (N - 1)
    assert df["one_time_seconds"].isna().all() and df["amortised_over"].isna().all()
    # no one-time cost: the amortised columns are the per-query cost itself
    assert (df["amortised_resource_seconds"] == df["resource_seconds"]).all()
    assert (df["amortised_dollars"] == df["dollars"]).all()


def test_summary_shows_per_query_cost_with_and_without_the_amortised_share(tmp_path, corpus):
    from ragbench import report
    from ragbench.report.readable import readable_table

    strategies = [{"name": "long_context", "params": {"preload": True}}]
    df = run(
        corpus_config(tmp_path, corpus, strategies),
        progress=False,
        llm=FakeLLM(prefix_cache_size=1),
    )
    table = report.summary(df).set_index("label")
    row = table.loc["long_context preload"]
    assert row["amortised_resource_seconds"] > row["resource_seconds"]
    assert row["amortised_dollars"] > row["dollars"]
    headers = readable_table(table.reset_index()).to_html()
    assert "amortised_dollars ($ / 1k queries)" in headers


def test_preload_parameter_is_stored_labelled_and_refuses_kv_variants():
    plain = LongContextParams()
    assert plain.to_dict()["preload"] is False  # every parameter is stored (schema 2)
    assert LongContextParams.from_dict(plain.to_dict()) == plain
    pre = LongContextParams(preload=True)
    assert pre.to_dict()["preload"] is True and pre.label() == "long_context preload"
    assert LongContextParams.from_dict(pre.to_dict()) == pre
    with pytest.raises(ValueError, match="preload"):
        LongContextParams(preload=True, kv="offloaded")
    with pytest.raises(ValueError, match="preload"):
        LongContextParams(preload="yes")
    for not_a_bool in (1, 0, 1.0):  # 1 == True: `in (True, False)` let them through
        with pytest.raises(ValueError, match="preload"):
            LongContextParams(preload=not_a_bool)


def test_cost_amortise_adds_the_share_and_old_records_get_the_columns():
    own = Cost(resource_seconds=0.5, dollars=0.002, llm_calls=1)
    once = Cost(resource_seconds=8.0, dollars=0.04, llm_calls=1)
    a = own.amortise(once, over=4)
    assert (a.resource_seconds, a.dollars) == (0.5, 0.002)  # its own cost is unchanged
    assert (a.one_time_seconds, a.one_time_dollars, a.amortised_over) == (8.0, 0.04, 4)
    assert a.amortised_resource_seconds == pytest.approx(2.5)
    assert a.amortised_dollars == pytest.approx(0.012)
    assert Cost.from_dict(a.to_dict()) == a
    # a record written before the columns existed: amortised = its own cost
    old = {k: v for k, v in own.to_dict().items() if "amortised" not in k and "one_time" not in k}
    back = Cost.from_dict(old)
    assert (back.amortised_resource_seconds, back.amortised_dollars) == (0.5, 0.002)
    both = a + own  # a query of two calls: the shares add like the own costs
    assert both.amortised_resource_seconds == pytest.approx(3.0)
    assert both.one_time_seconds == 8.0
    with pytest.raises(ValueError, match=">= 1"):
        own.amortise(once, over=0)


@pytest.mark.slow
def test_embedded_model_prefix_reuse_off_recomputes_every_prompt_with_the_same_answers():
    from ragbench.llm.hf.model import HFModel
    from ragbench.types import GenerationRequest

    prefix = " ".join(f"Note {i}: the pier opens at {i}:00." for i in range(60)) + "\n\n"
    questions = ["When does the pier open in note 3?", "When in note 7?", "When in note 9?"]

    def ask(model):
        return [
            model.generate([GenerationRequest(prompt=prefix + q, prefix=prefix, max_new_tokens=6)])[
                0
            ]
            for q in questions  # one call each: reuse must span calls
        ]

    with_reuse = HFModel("smollm2-135m-instruct", device="cpu")
    without = HFModel("smollm2-135m-instruct", device="cpu", prefix_reuse=False)
    # both calibrated (one calibration: prefix reuse is not in its key) to the longest request
    # asked here, not to the 2,048 tokens a first call probes to (a third more probing)
    longest = 6 + max(
        with_reuse.prompt_tokens(GenerationRequest(prompt=prefix + q)) for q in questions
    )
    assert with_reuse.cost_rates(longest) is without.cost_rates(longest)
    # the completion cache keys on the identity: one setting's accounting never serves the other
    assert "prefix_reuse" not in with_reuse.identity()
    assert without.identity() == {**with_reuse.identity(), "prefix_reuse": False}
    on, off = ask(with_reuse), ask(without)
    assert on[0].cached_prompt_tokens == 0 and min(c.cached_prompt_tokens for c in on[1:]) > 400
    assert all(c.cached_prompt_tokens == 0 for c in off)
    assert [c.text for c in on] == [c.text for c in off]


def test_preload_without_a_shared_corpus_runs_as_plain_long_context(tmp_path, corpus):
    # each example its own documents (RULER): nothing is shared, so nothing is preloaded; a
    # preload per example, all sent before the questions, evicted one another
    # (prefix_cache_size=1) and left most records paying the corpus *and* a one-time cost
    multikey = {
        "context_lengths": [600],
        "num_examples": 8,
        "tokenizer": "whitespace",
        "haystack": "needles",
        "final_context_length_buffer": 50,
    }
    cfg = corpus_config(tmp_path, corpus, [{"name": "long_context", "params": {"preload": True}}])
    cfg["dataset"] = {"name": "ruler/niah_multikey", "params": multikey}
    cfg["model"]["batch_size"] = 4
    fake = FakeLLM(prefix_cache_size=1)
    df = run(cfg, progress=False, llm=fake)
    assert df["error"].isna().all() and len(df) == 8
    assert fake.calls == 2  # two rounds of 4 questions, no preload call
    assert df["one_time_seconds"].isna().all() and df["amortised_over"].isna().all()
    assert (df["amortised_resource_seconds"] == df["resource_seconds"]).all()
    manifest = json.loads((Path(df.attrs["run_dir"]) / "manifest.json").read_text())
    assert manifest["sessions"][0]["preloaded"] == []


def test_preload_bypasses_the_completion_cache(tmp_path, corpus):
    # an extended run finds its preload request in the completion cache: answered from there,
    # no KV would be computed and the first new question would pay the corpus. Its questions
    # are never answered from the cache either: a stored answer carries the corpus prefill
    # its own run paid, and the preload's one-time share would charge the corpus twice
    from ragbench.llm.cache import CachedLLM

    strategies = [{"name": "long_context", "params": {"preload": True}}]
    db = tmp_path / "completions.sqlite"
    cfg = corpus_config(tmp_path, corpus, strategies, name="first")
    cfg["dataset"]["limit"] = 2
    first = run(cfg, progress=False, llm=CachedLLM(FakeLLM(prefix_cache_size=1), db))
    assert first["error"].isna().all() and len(first) == 2
    fake = FakeLLM(prefix_cache_size=1)  # a new process: no KV kept
    df = run(
        corpus_config(tmp_path, corpus, strategies, name="second"),
        progress=False,
        llm=CachedLLM(fake, db),
    )
    assert fake.calls == 1 + N // 2  # the preload reached the model, then every question
    corpus_tokens = fake.count_tokens(
        build_dataset("corpus", corpus=str(corpus[0]), questions=str(corpus[1]))[0].context
    )
    assert (df["cached_prompt_tokens"] >= corpus_tokens).all()
    assert (df["one_time_seconds"] > 0).all()


def test_reprice_recomputes_the_one_time_and_amortised_dollars(tmp_path, corpus):
    import pandas as pd

    from ragbench.cost.reprice import reprice_run

    strategies = ["long_context", {"name": "long_context", "params": {"preload": True}}]
    df = run(
        corpus_config(tmp_path, corpus, strategies),
        progress=False,
        llm=FakeLLM(prefix_cache_size=1),
    )
    run_dir = Path(df.attrs["run_dir"])
    hourly = reprice_run(run_dir, "example-h100-hour")  # 2.5 $/h of device seconds
    new = pd.read_parquet(hourly.table_path)
    # a record's own device seconds, plus a prefix another variant computed that it paid for as
    # if it had run alone (cost/alone.py: the first plain long_context record after the preload)
    paid = new["prefix_paid_seconds"].fillna(0.0)
    assert new["dollars"].tolist() == pytest.approx(
        (2.5 * (new["resource_seconds"] + paid) / 3600).tolist()
    )
    pre = new["label"] == "long_context preload"
    assert new.loc[pre, "one_time_dollars"].tolist() == pytest.approx(
        (2.5 * new.loc[pre, "one_time_seconds"] / 3600).tolist()
    )
    assert new["amortised_dollars"].tolist() == pytest.approx(
        (new["dollars"] + (new["one_time_dollars"] / new["amortised_over"]).fillna(0)).tolist()
    )
    assert new.loc[~pre, "one_time_dollars"].isna().all()
    assert not hourly.warnings
    records = [json.loads(line)["record"]["cost"] for line in hourly.records_path.open()]
    for cost in records:
        back = Cost.from_dict(cost)
        share = back.one_time_dollars / back.amortised_over if back.amortised_over else 0.0
        assert back.amortised_dollars == pytest.approx(back.dollars + share)
    # an api sheet prices tokens, and a record keeps its one-time seconds, not its tokens: the
    # one-time and amortised dollars of the preload rows are unknown, never the old sheet's
    api = reprice_run(run_dir, "openai-gpt-4.1-mini")
    new = pd.read_parquet(api.table_path)
    assert new.loc[pre, ["one_time_dollars", "amortised_dollars"]].isna().all().all()
    assert (new.loc[~pre, "amortised_dollars"] == new.loc[~pre, "dollars"]).all()
    assert any("one-time" in w for w in api.warnings)
    records = [json.loads(line)["record"] for line in api.records_path.open()]
    for rec in records:
        back = Cost.from_dict(rec["cost"])
        if back.one_time_seconds is not None:  # read back: unknown, not its own dollars
            assert back.one_time_dollars is None and back.amortised_dollars is None
        else:
            assert back.amortised_dollars == back.dollars


def test_a_preloaded_run_after_a_plain_one_is_charged_as_with_the_cache_off(tmp_path, corpus):
    from ragbench.llm.cache import CachedLLM

    db = tmp_path / "completions.sqlite"
    plain = corpus_config(tmp_path, corpus, ["long_context"], name="plain")
    run(plain, progress=False, llm=CachedLLM(FakeLLM(prefix_cache_size=1), db))
    preload = [{"name": "long_context", "params": {"preload": True}}]
    cached = run(
        corpus_config(tmp_path, corpus, preload, name="after"),
        progress=False,
        llm=CachedLLM(FakeLLM(prefix_cache_size=1), db),
    )
    alone = run(
        corpus_config(tmp_path, corpus, preload, name="alone"),
        progress=False,
        llm=FakeLLM(prefix_cache_size=1),
    )
    assert cached["amortised_dollars"].tolist() == alone["amortised_dollars"].tolist()
    assert cached["prompt_tokens"].tolist() == alone["prompt_tokens"].tolist()
    assert (cached["cached_prompt_tokens"] > 0).all()  # every question read the preloaded KV


@pytest.mark.parametrize("sheet", ["example-cpu-hour", "example-hosted-api"])
def test_the_one_time_cost_is_the_same_beside_a_plain_long_context(tmp_path, corpus, sheet):
    # batch_size 1: plain long_context's first question computes the corpus and the fake keeps
    # it (prefix_cache_size=1), so the preload call after it finds it cached. Charged as if it
    # ran alone (cost/alone.py), the preload costs what it costs in a run of its own (it cost
    # 0.036 s and $8.0e-7 instead of 0.936 s and $2.08e-5 on the hourly sheet)
    preload = {"name": "long_context", "params": {"preload": True}}
    got = {}
    for name, strategies in (("alone", [preload]), ("beside", ["long_context", preload])):
        cfg = corpus_config(tmp_path, corpus, strategies, name=name)
        cfg["model"]["batch_size"], cfg["price_sheet"] = 1, sheet
        df = run(cfg, progress=False, llm=FakeLLM(prefix_cache_size=1))
        assert "stopped" not in df.attrs
        manifest = json.loads((Path(df.attrs["run_dir"]) / "manifest.json").read_text())
        got[name] = (df[df["label"] == "long_context preload"], manifest["sessions"][0])
    (alone, _), (beside, beside_session) = got["alone"], got["beside"]
    for col in (
        "one_time_seconds",
        "one_time_dollars",
        "amortised_over",
        "dollars",
        "amortised_resource_seconds",
        "amortised_dollars",
    ):
        assert beside[col].tolist() == pytest.approx(alone[col].tolist()), col
    assert alone["one_time_dollars"].iloc[0] > 0
    (pre,) = beside_session["preloaded"]
    assert pre["one_time_seconds"] == pytest.approx(alone["one_time_seconds"].iloc[0])
    assert pre["one_time_dollars"] == pytest.approx(alone["one_time_dollars"].iloc[0])


def test_a_run_stopped_early_amortises_the_preload_over_the_questions_it_answered(tmp_path, corpus):
    # the budget stops it after its first round (2 of N questions; the fake has no calibration,
    # so an hourly sheet gives no first-round estimate): the preload was paid for 2 answers, not
    # N (amortised_over was N, the amortised dollars N/2 times too low). Resumed to the end, every
    # question shares a preload: amortised over all N
    cfg = corpus_config(tmp_path, corpus, [{"name": "long_context", "params": {"preload": True}}])
    cfg["price_sheet"], cfg["max_dollars"] = "example-cpu-hour", 1e-9
    df = run(cfg, progress=False, llm=FakeLLM(prefix_cache_size=1))
    assert "stopped: budget" in df.attrs["stopped"] and len(df) == 2
    assert (df["amortised_over"] == 2).all()
    assert df["amortised_dollars"].tolist() == pytest.approx(
        (df["dollars"] + df["one_time_dollars"] / 2).tolist()
    )
    stored = pd.read_parquet(Path(df.attrs["run_dir"]) / "results.parquet")
    assert (stored["amortised_over"] == 2).all()
    manifest = json.loads((Path(df.attrs["run_dir"]) / "manifest.json").read_text())
    assert manifest["sessions"][0]["preloaded"][0]["amortised_over"] == 2
    cfg["max_dollars"] = None  # not in the config hash: the same folder, the rest answered
    df = run(cfg, progress=False, llm=FakeLLM(prefix_cache_size=1))
    assert "stopped" not in df.attrs and len(df) == N and df["error"].isna().all()
    assert (df["amortised_over"] == N).all()
    assert df["amortised_resource_seconds"].tolist() == pytest.approx(
        (df["resource_seconds"] + df["one_time_seconds"] / N).tolist()
    )
    assert df["amortised_dollars"].tolist() == pytest.approx(
        (df["dollars"] + df["one_time_dollars"] / N).tolist()
    )


def test_sequential_looks_amortise_the_preload_over_the_questions_answered_so_far(tmp_path, corpus):
    # the looks decide from amortised dollars (analysis.verdict): a look after 2 of N questions
    # read amortised_over N, the preload N/2 times too cheap
    from ragbench.analysis.verdict import sequential_look

    seen = []

    def look(df, state):
        pre = df[df["label"] == "long_context preload"]
        seen.append((len(pre), set(pre["amortised_over"])))
        return sequential_look(df, state)

    strategies = [
        {"name": "long_context", "params": {"preload": True}},
        {"name": "rag", "params": {"top_k": 2}},
    ]
    cfg = corpus_config(tmp_path, corpus, strategies)
    cfg["retrieval"] = {"embedder": "hash", "tokenizer": "whitespace", "chunk_size": 64}
    cfg["sequential"] = {"rounds": 3}
    df = run(cfg, progress=False, llm=FakeLLM(prefix_cache_size=1), until_decided=look)
    assert seen and seen[0][0] < N  # a look before every question was answered
    assert all(over == {answered} for answered, over in seen), seen
    pre = df[df["label"] == "long_context preload"]
    assert set(pre["amortised_over"]) == {len(pre)}


def test_a_capped_run_is_charged_as_an_uncapped_one(tmp_path, corpus):
    # the cap's first-round estimate counts the round's prompts as the dry run does (nothing
    # sent): on the run's own prefix ledger it once left a long_context that found the corpus
    # another variant computed uncharged for it (prefix_paid_tokens 0), in capped runs only.
    # Each round holds one variant now, the plain long_context's first: in both runs it computes
    # the corpus itself (nothing to pay) and the preload after it finds the corpus kept and pays
    # for it in its one-time cost; the same dollars either way
    strategies = ["long_context", {"name": "long_context", "params": {"preload": True}}]
    got, paid = [], []
    for cap in (None, 1.0):
        cfg = corpus_config(tmp_path, corpus, strategies, name=f"cap-{cap}")
        cfg["max_dollars"] = cap
        df = run(cfg, progress=False, llm=FakeLLM(prefix_cache_size=1))
        got.append(df[["dollars", "one_time_dollars"]])
        paid.append(df["prefix_paid_tokens"].iloc[0])
    assert paid == [0, 0]
    pd.testing.assert_frame_equal(got[1], got[0])
    # the preload found the corpus kept and paid it: its one-time cost is the one it has alone
    cfg = corpus_config(tmp_path, corpus, strategies[1:], name="alone")
    by_itself = run(cfg, progress=False, llm=FakeLLM(prefix_cache_size=1))
    assert got[0]["one_time_dollars"].iloc[1] == by_itself["one_time_dollars"].iloc[0] > 0
