"""The verdict on synthetic results tables with known answers, and its power estimate against
simulated tests."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from ragbench import analysis, report
from ragbench.analysis import REASONS, Verdict, questions_needed, verdict
from ragbench.cost import planning

SONNET = "anthropic-claude-sonnet-4-5"


def results(scores, dollars, *, metric="string_match_all", latency=None, tokens=None,
            sheet="example-hosted-api", model="tiny-model", context=5_000):  # fmt: skip
    """A results table: ``scores`` {label: per-question scores}; the strategy is the label's
    first word; ``dollars`` {label: $ per query}; optional latency and prompt tokens per label."""
    rows = []
    for label, values in scores.items():
        strategy = label.split()[0]
        prompt = (tokens or {}).get(label, 1_000)
        for i, x in enumerate(values):
            rows.append({
                "example_id": f"q{i:03d}", "strategy": strategy, "label": label, "error": None,
                metric: float(x), "prompt_tokens": prompt, "completion_tokens": 10,
                "kept_tokens": prompt - 20 if strategy == "long_context" else np.nan,
                "latency_seconds": (latency or {}).get(label, 1.0), "price_sheet": sheet,
                "model": model, "context_tokens": context,
                **({"dollars": dollars[label], "amortised_dollars": dollars[label]}
                   if dollars else {}),
            })  # fmt: skip
    return pd.DataFrame(rows)


def flip(values, ones_to_zero=0, zeros_to_one=0):
    """``values`` with the first ``ones_to_zero`` ones set to 0 and the first ``zeros_to_one``
    zeros set to 1 (controlled discordant pairs)."""
    out = list(values)
    ones = [i for i, x in enumerate(out) if x == 1][:ones_to_zero]
    zeros = [i for i, x in enumerate(out) if x == 0][:zeros_to_one]
    for i in ones:
        out[i] = 0
    for i in zeros:
        out[i] = 1
    return out


LC, RAG, CB = "long_context", "rag k=3", "closed_book"
PRICES = {LC: 0.002, RAG: 0.0005, CB: 0.00005}  # $ per query: $2, $0.50, $0.05 per 1k


def clear_winner():
    lc = [1] * 180 + [0] * 20  # 90%
    return results({CB: [1] * 20 + [0] * 180, LC: lc, RAG: flip(lc, ones_to_zero=60)}, PRICES)


def test_a_clear_winner_is_the_most_accurate_when_every_cheaper_one_is_worse():
    v = verdict(clear_winner())
    assert (v.choice, v.reason, v.best) == (LC, "most_accurate_within_budget", LC)
    assert v.rival == RAG and v.test == "mcnemar_exact" and v.n_pairs == 200
    assert v.p_value < 1e-10 and v.diff == pytest.approx(-0.30)
    assert v.ci_low < -0.30 < v.ci_high < 0
    for number in ("90%", "$2.00", "60%", "$0.50", "-30 points", "200 paired questions"):
        assert number in v.text, number
    assert v.text.startswith(f"Use {LC}: the most accurate")


def test_a_tie_goes_to_the_cheaper_variant():
    lc = [1] * 320 + [0] * 80  # 80%; RAG disagrees on 10 questions, 6 of them it gets wrong
    df = results({LC: lc, RAG: flip(lc, ones_to_zero=6, zeros_to_one=4)}, PRICES)
    v = verdict(df)
    assert (v.choice, v.reason, v.best, v.rival) == (RAG, "cheapest_not_worse", LC, RAG)
    assert v.diff == pytest.approx(-2 / 400) and v.p_value > 0.5 and v.more_questions is None
    for number in ("$0.50", "$2.00", "79.5% vs 80%", "-0.5 points", "p=0.75", "400 paired"):
        assert number in v.text, number
    assert v.text.startswith(f"Use {RAG}: it costs $0.50 per 1k queries against $2.00 for {LC}")
    # an exact tie: the cheaper one is the most accurate, and the dearer one is not better
    v = verdict(results({LC: lc, RAG: flip(lc, ones_to_zero=5, zeros_to_one=5)}, PRICES))
    assert (v.choice, v.reason, v.best, v.rival) == (RAG, "most_accurate_within_budget", RAG, LC)
    assert "the most accurate (80% on string_match_all) and the cheapest ($0.50" in v.text


def test_a_prefix_cache_break_even_is_stated_where_it_could_change_the_answer():
    lc = [1] * 320 + [0] * 80
    df = results({CB: [0] * 400, LC: lc, RAG: flip(lc, ones_to_zero=6, zeros_to_one=4)},
                 PRICES, tokens={LC: 5_000, RAG: 600, CB: 40}, sheet=SONNET)  # fmt: skip
    v = verdict(df)
    assert v.choice == RAG
    table, _ = planning.prefix_cache_break_even(df[df["label"] != CB], [SONNET])
    expected = int(table["lc_cheaper_from"].iloc[0])
    assert 1 < expected < 1_000 and v.break_even_questions == expected
    assert f"from {expected:,} questions per document" in v.text
    # a sheet on which long context never catches up: nothing said
    cheap = verdict(df.assign(price_sheet="example-hosted-api"))
    assert cheap.break_even_questions is None and "prefix cache" not in cheap.text


def test_constraints_nobody_meets_name_the_one_that_binds():
    df = clear_winner()
    v = verdict(df, min_accuracy=0.95)
    assert (v.choice, v.reason, v.binding) == (None, "none_meets_constraints", ("min_accuracy",))
    assert "95%" in v.text and f"{LC}: 90%" in v.text
    v = verdict(df, max_dollars_per_1k=0.01)
    assert v.binding == ("max_dollars_per_1k",) and "$0.010 per 1k" in v.text and "$0.050" in v.text
    # each alone is met by someone, not both together: both bind
    v = verdict(df, min_accuracy=0.85, max_dollars_per_1k=1.0)
    assert v.reason == "none_meets_constraints"
    assert v.binding == ("min_accuracy", "max_dollars_per_1k")
    v = verdict(df.assign(latency_seconds=5.0), max_latency_s=2)
    assert v.binding == ("max_latency_s",) and "2 s" in v.text


def test_constraints_pick_within_the_budget():
    df = clear_winner()
    v = verdict(df, max_dollars_per_1k=1.0)  # long context ($2) is out: RAG beats closed book
    assert (v.choice, v.reason, v.rival) == (RAG, "most_accurate_within_budget", CB)
    assert "within the constraints" in v.text
    v = verdict(df, max_dollars_per_1k=0.1)  # only closed book is left
    assert (v.choice, v.reason) == (CB, "most_accurate_within_budget") and "only variant" in v.text
    lat = {LC: 9.0, RAG: 1.0, CB: 0.5}
    v = verdict(results({LC: [1] * 180 + [0] * 20, RAG: [1] * 120 + [0] * 80}, PRICES,
                        latency=lat), max_latency_s=2.0)  # fmt: skip
    assert v.choice == RAG and v.variants.loc[LC, "meets"] == False  # noqa: E712
    assert verdict(clear_winner(), min_accuracy=0, max_dollars_per_1k=0.0).choice == LC  # 0: none


def test_too_few_questions_gives_a_power_estimate():
    df = results({LC: [1, 1, 1, 1], RAG: [1, 1, 0, 0]}, PRICES)
    v = verdict(df)
    assert (v.choice, v.reason, v.best, v.rival) == (None, "too_few_questions", LC, RAG)
    assert v.n_pairs == 4 and v.diff == pytest.approx(-0.5) and v.p_value == 0.5
    # Connor's formula at psi = 0.5 discordant, delta = 0.5: 13.06 -> 14 questions, 10 more
    assert questions_needed(0.5, discordant=0.5) == 14 and v.more_questions == 10
    assert v.text.startswith(f"Too few questions to tell {LC} (100% on string_match_all")
    assert "About 10 more questions would separate them at this effect size" in v.text
    assert "4 paired questions" in v.text and "-50 points" in v.text
    # no disagreement on 4 questions is no proof of no difference either: the cheaper RAG ties,
    # and whether long context is better by 5 points needs about 151 more questions
    v = verdict(results({LC: [1, 1, 1, 0], RAG: [1, 1, 1, 0]}, PRICES))
    assert (v.reason, v.choice, v.best, v.rival) == ("too_few_questions", None, RAG, LC)
    assert v.more_questions == questions_needed(0.05, discordant=0.05) - 4 == 151
    assert "would detect a difference of 5 points or more" in v.text


def test_continuous_metric_uses_the_paired_bootstrap():
    rng = np.random.default_rng(3)
    base = rng.uniform(0.3, 1.0, 300)
    noise = rng.normal(0, 0.02, 300)
    close = np.clip(base + noise - noise.mean() - 0.0005, 0, 1)  # 0.0005 below on average
    df = results({LC: base, RAG: close}, PRICES, metric="f1")
    v = verdict(df)
    assert (v.choice, v.reason, v.test) == (RAG, "cheapest_not_worse", "paired_bootstrap")
    assert f"{df[df.label == RAG].f1.mean():.3f}" in v.text and "paired bootstrap" in v.text
    worse = verdict(results({LC: base, RAG: base * 0.7}, PRICES, metric="f1"))
    assert (worse.choice, worse.reason, worse.rival) == (LC, "most_accurate_within_budget", RAG)
    assert worse.p_value < 0.01 and f"{worse.diff:+.3f}" in worse.text
    mixed = np.clip(base[:5] + [-0.3, 0.1, -0.2, 0.05, -0.1], 0, 1)
    few = verdict(results({LC: base[:5], RAG: mixed}, PRICES, metric="f1"))
    assert few.reason == "too_few_questions" and few.more_questions > 0


def test_default_metric_conditions_and_display():
    df = clear_winner().assign(contains=lambda d: d["string_match_all"])
    v = report.verdict(df)  # the first metric column: string_match_all
    assert v.metric == "string_match_all" and report.verdict is analysis.verdict
    assert v.conditions == {
        "questions": 200, "model": "tiny-model", "context_tokens": (5_000, 5_000),
        "context": "a 5,000-token context", "price_sheet": "example-hosted-api",
        "price_sheet_date": "2025-01-15",
    }  # fmt: skip
    assert v.conditions_text == (
        "Holds for model tiny-model, a 5,000-token context, 200 "
        "questions, price sheet example-hosted-api (dated 2025-01-15)."
    )
    assert str(v) == v.text + "\n" + v.conditions_text
    assert v._repr_markdown_().startswith(f"**Verdict:** Use {LC}: ")
    assert isinstance(v, Verdict) and v.reason in REASONS
    assert "e-0" not in str(v)  # dollars in fixed notation
    with pytest.raises(ValueError, match="metric column"):
        verdict(df, metric="f1")


def test_without_dollars_the_cost_is_prompt_tokens():
    lc = [1] * 320 + [0] * 80
    df = results({LC: lc, RAG: flip(lc, 1)}, {}, tokens={LC: 5_000, RAG: 600})
    v = verdict(df)
    assert v.cost == "prompt_tokens" and v.choice == RAG
    assert "600 prompt tokens per query against 5,000 prompt tokens" in v.text
    with pytest.raises(ValueError, match="needs dollars"):
        verdict(df, max_dollars_per_1k=1.0)


def test_mcnemar_sample_size_matches_a_simulated_test():
    """Connor's n gives the McNemar test at least its 80% power, and not much more (the formula
    is known to be slightly conservative): simulate the normal-approximation test and the exact
    one that ``compare`` runs."""
    n = questions_needed(0.1, discordant=0.2)
    assert n == 155  # (1.96 sqrt(.2) + 0.8416 sqrt(.19))^2 / .01 = 154.6
    rng = np.random.default_rng(0)
    # p10 = 0.15, p01 = 0.05: the discordant share is 0.2 and the difference 0.1
    counts = rng.multinomial(n, [0.15, 0.05, 0.80], size=20_000)
    b, c = counts[:, 0], counts[:, 1]
    z = (b - c) / np.sqrt(np.maximum(b + c, 1))
    power = float(np.mean(np.abs(z) > 1.959964))
    assert 0.79 < power < 0.85, power
    # the exact test is a little more conservative still: about 75% at that n
    exact = [
        analysis.mcnemar_exact(int(x), int(y)) < 0.05
        for x, y in zip(b[:4000], c[:4000], strict=True)
    ]
    assert 0.72 < float(np.mean(exact)) < 0.80
    smaller = rng.multinomial(int(0.8 * n), [0.15, 0.05, 0.80], size=20_000)
    z = (smaller[:, 0] - smaller[:, 1]) / np.sqrt(np.maximum(smaller[:, :2].sum(axis=1), 1))
    assert float(np.mean(np.abs(z) > 1.959964)) < 0.78  # fewer questions: less power


def test_paired_z_sample_size_matches_a_simulated_test():
    n = questions_needed(0.05, sd=0.3)
    assert n == math.ceil((2.8016 * 0.3 / 0.05) ** 2 - 1e-6)
    rng = np.random.default_rng(1)
    d = rng.normal(0.05, 0.3, size=(10_000, n))
    z = d.mean(axis=1) / (d.std(axis=1, ddof=1) / math.sqrt(n))
    power = float(np.mean(np.abs(z) > 1.959964))
    assert abs(power - 0.80) < 0.02, power
