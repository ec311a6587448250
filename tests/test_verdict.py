"""The verdict on synthetic results tables with known answers (a scenario table: the sentence
each should give), its statistics (one procedure per interval and p; Tango's score interval
against a numerical maximum likelihood; Bonferroni), and its power estimate against simulated
tests."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pandas as pd
import pytest

from ragbench import analysis, report
from ragbench.analysis import REASONS, Verdict, questions_needed, verdict
from ragbench.analysis.paired import (
    _tango_z,
    bootstrap_difference,
    compare,
    decide,
    paired_difference,
    tango,
)

SONNET = "anthropic-claude-sonnet-4-5"


def results(
    scores,
    dollars,
    *,
    metric="string_match_all",
    latency=None,
    tokens=None,
    params=None,
    routes=None,
    sheet="example-hosted-api",
    model="tiny-model",
    context=5_000,
    cut=0,
):
    """A results table: ``scores`` {label: per-question scores}; the strategy is the label's
    first word; ``dollars`` {label: $ per query (a number, or one per question)}; optional
    latency, prompt tokens, params and a router's routes per label; long context read
    ``context`` tokens and cut ``cut`` of them."""
    rows = []
    for label, values in scores.items():
        strategy = label.split()[0]
        prompt = (tokens or {}).get(label, 1_000)
        default = {"top_k": 3} if strategy in ("rag", "self_route") else {}
        point = (params or {}).get(label, default)
        lc = strategy == "long_context"
        for i, x in enumerate(values):
            cost = np.broadcast_to(dollars[label], len(values))[i] if dollars else None
            rows.append(
                {
                    "example_id": f"q{i:03d}",
                    "strategy": strategy,
                    "label": label,
                    "error": None,
                    "params": json.dumps(point),
                    metric: float(x),
                    "prompt_tokens": prompt,
                    "completion_tokens": 10,
                    "kept_tokens": prompt - 20 if lc else np.nan,
                    "latency_seconds": (latency or {}).get(label, 1.0),
                    "price_sheet": sheet,
                    "model": model,
                    "context_tokens": context,
                    "input_context_tokens": context if lc else np.nan,
                    "truncated_tokens": cut if lc else np.nan,
                    "route": ((routes or {}).get(label) or ["rag"] * len(values))[i]
                    if strategy == "self_route"
                    else None,
                    **(
                        {"dollars": float(cost), "amortised_dollars": float(cost)}
                        if dollars
                        else {}
                    ),
                }
            )
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
SR, KV, PIPE = "self_route k=3", "long_context kv=quantized", "pipeline my:engine"
PRICES = {LC: 0.002, RAG: 0.0005, CB: 0.00005, SR: 0.0006, KV: 0.0015}  # $2, $0.50, $0.05 / 1k


def clear_winner():
    lc = [1] * 180 + [0] * 20  # 90%
    return results({CB: [1] * 20 + [0] * 180, LC: lc, RAG: flip(lc, ones_to_zero=60)}, PRICES)


# ---------------------------------------------------------------------------- the scenario table


def _scenarios():
    """name -> (results table, verdict keywords, reason, choice, the sentence's pieces)."""
    lc60, lc80 = [1] * 120 + [0] * 80, [1] * 320 + [0] * 80
    folder_a_lc, folder_a_rag = [1] + [0] * 17, [1, 1, 1, 1] + [0] * 14
    rng = np.random.default_rng(3)
    base, noise = rng.uniform(0.3, 1.0, 300), rng.normal(0, 0.02, 300)
    close = np.clip(base + noise - noise.mean() - 0.0005, 0, 1)  # 0.0005 below on average
    kv = {KV: {"kv": {"name": "quantized", "bits": 4}}}
    return {
        "rag clearly better and cheaper": (
            results({CB: [1] * 20 + [0] * 180, LC: lc60, RAG: flip(lc60, 0, 50)}, PRICES),
            {},
            "more_accurate",
            RAG,
            [
                "Use rag k=3 rather than long_context: more accurate on string_match_all (85% vs "
                "60%), cheaper: 0.25x the cost of long_context ($0.50 vs $2.00 per 1k queries).",
                "rag k=3 - long_context = +25 points, 95% simultaneous CI +18.8 to +32.4, Tango "
                "score test p<0.001 (Bonferroni over 2 comparisons), 200 paired questions",
                "Without the documents, closed_book scores 10%: the documents matter",
            ],
        ),
        "long context clearly better": (
            clear_winner(),
            {},
            "more_accurate",
            LC,
            [
                "Use long_context rather than rag k=3: more accurate on string_match_all (90% vs "
                "60%), dearer: 4x the cost of rag k=3 ($2.00 vs $0.50 per 1k queries).",
                "long_context - rag k=3 = +30 points",
            ],
        ),
        "a tie": (
            results({CB: [0] * 400, LC: lc80, RAG: flip(lc80, 5, 5)}, PRICES),
            {},
            "not_worse",
            RAG,
            [
                "Use rag k=3 rather than long_context: not worse by more than 5 points on "
                "string_match_all (80% vs 80%), cheaper: 0.25x the cost of long_context",
                "rag k=3 - long_context = 0 points, 95% simultaneous CI -2.1 to +2.1, Tango score "
                "test p=1 (Bonferroni over 2 comparisons), 400 paired questions",
            ],
        ),
        "a tie on too few questions": (
            results({LC: [1] * 20, RAG: [1] * 20}, PRICES),
            {},
            "undecided",
            None,
            [
                "Not decided yet: rag k=3 ties with long_context on string_match_all (both 100%), "
                "cheaper: 0.25x the cost of long_context",
                "rag k=3 - long_context = 0 points",
            ],
        ),
        "too few questions": (
            results({CB: [0] * 4, LC: [1, 1, 1, 1], RAG: [1, 1, 0, 0]}, PRICES),
            {},
            "undecided",
            None,
            [
                "Not decided yet between rag k=3 and long_context: long_context scores higher on "
                "string_match_all (100% vs 50%) and rag k=3 is cheaper: 0.25x the cost of "
                "long_context",
                "more questions would show whether long_context is more accurate",
                "whether the documents matter is not yet shown",
            ],
        ),
        "self-route never routed (folder A)": (
            results(
                {CB: [0] * 18, LC: folder_a_lc, RAG: folder_a_rag, SR: folder_a_rag},
                {CB: 2.3e-5, LC: 2.48e-4, RAG: 6.6e-5, SR: 4.7e-5},
                metric="contains",
            ),
            {},
            "undecided",
            None,
            [
                "Not decided yet: rag k=3 leads long_context on contains (22.2% vs 5.56%), "
                "cheaper: 0.27x the cost of long_context ($0.066 vs $0.25 per 1k queries), but 18 "
                "questions cannot yet show it is not worse by more than 5 points",
                "self_route k=3 also scored 22.2% but never routed (every answer came from its "
                "RAG step): rag k=3 does the same without the routing step",
            ],
        ),
        "a pipeline dearer and not better": (
            results(
                {LC: folder_a_lc, PIPE: [0] * 18},
                {LC: 2.5e-4, PIPE: 4.1e-4},
                metric="contains",
                params={PIPE: {"target": "my:engine"}},
            ),
            {},
            "undecided",
            None,
            [
                "Not decided yet: long_context leads pipeline my:engine on contains (5.56% vs 0%), "
                "cheaper: 0.61x the cost of pipeline my:engine ($0.25 vs $0.41 per 1k queries)",
                "No",
            ],
        ),
        "closed book as good as both": (
            results({CB: flip(lc80, 2, 2), LC: lc80, RAG: flip(lc80, 3, 3)}, PRICES),
            {},
            "not_worse",
            RAG,
            [
                "Use rag k=3 rather than long_context: not worse by more than 5 points",
                "Without the documents, closed_book scores 80%, within 5 points of rag k=3: the "
                "documents do not matter for these questions",
            ],
        ),
        "long context cut most of the corpus (folder B)": (
            results(
                {CB: [1] + [0] * 25, LC: [1] + [0] * 25, RAG: [1] * 4 + [0] * 22},
                PRICES,
                context=20_000,
                cut=14_000,
            ),
            {},
            "undecided",
            None,
            [
                "Not decided yet: rag k=3 leads long_context on string_match_all (15.4% vs 3.85%)",
                "long_context cut 70% of the corpus to fit the window: it answered "
                "from 30% of the documents.",
            ],
        ),
        "nothing meets the constraints": (
            clear_winner(),
            {"min_accuracy": 0.95},
            "none_meets_constraints",
            None,
            [
                "No variant meets the constraints: the minimum string_match_all of 95% (the most "
                "accurate, long_context: 90%)."
            ],
        ),
        "equal cost": (
            results({LC: lc60, RAG: flip(lc60, 0, 50)}, {LC: 0.0005, RAG: 0.0005}),
            {},
            "more_accurate",
            RAG,
            [
                "Use rag k=3 rather than long_context: more accurate on string_match_all (85% vs "
                "60%), at the same cost ($0.50 per 1k queries).",
                "95% CI +19.5 to +31.4, Tango score test p<0.001, 200 paired questions",
            ],
        ),
        "a KV variant beside plain long context": (
            results({LC: lc80[:200], KV: lc80[:200], RAG: flip(lc80[:200], 60)}, PRICES, params=kv),
            {},
            "more_accurate",
            LC,
            [
                "Use long_context rather than rag k=3: more accurate",
                "long_context kv=quantized also scored 100% but adds the quantized KV cache: "
                "long_context is the simpler.",
            ],
        ),
        "continuous (judge) scores": (
            results({LC: base, RAG: close}, PRICES, metric="judge_correct"),
            {},
            "not_worse",
            RAG,
            [
                "Use rag k=3 rather than long_context: not worse by more than 0.050 on "
                "judge_correct (0.661 vs 0.661), cheaper: 0.25x the cost",
                "paired bootstrap p=",
            ],
        ),
        "long context over the budget": (
            results({CB: [1] * 20 + [0] * 180, LC: lc60, RAG: flip(lc60, 0, 50)}, PRICES),
            {"max_dollars_per_1k": 1.0},
            "only_variant",
            RAG,
            [
                "Use rag k=3: the only retrieval or long-context variant that meets the "
                "constraints, string_match_all 85% at $0.50 per 1k queries",
                "long_context, the best long context variant, does not meet the maximum of $1.00 "
                "per 1k queries.",
            ],
        ),
        "one family only": (
            results(
                {RAG: flip(lc60, 0, 50), "rag k=5": flip(lc60, 0, 60)},
                {RAG: 0.0005, "rag k=5": 0.0007},
            ),
            {},
            "more_accurate",
            "rag k=5",
            [
                "Use rag k=5 rather than rag k=3: more accurate on string_match_all (90% vs 85%), "
                "dearer: 1.4x the cost of rag k=3",
                "No long context variant in the table.",
            ],
        ),
    }


SCENARIOS = _scenarios()


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario_table(name):
    df, kwargs, reason, choice, pieces = SCENARIOS[name]
    v = verdict(df, **kwargs)
    assert (v.reason, v.choice) == (reason, choice), v.text
    for piece in pieces:
        assert piece in v.text, (piece, v.text)
    check_words_match_numbers(v)


def check_words_match_numbers(v: Verdict) -> None:
    """No sentence shows an interval that excludes 0 beside a p that says otherwise; a dearer
    variant is never called cheaper; "more accurate" only where the interval excludes 0."""
    assert "not significant" not in v.text
    for low, high, p in re.findall(
        r"CI ([-+]?[\d.]+|0) to ([-+]?[\d.]+|0)[^;]*?p([<=][\d.e-]+)", v.text
    ):
        excludes = float(low) > 0 or float(high) < 0
        value = float(p[1:])
        assert excludes == (value < 0.05 if p[0] == "=" else True), (low, high, p, v.text)
    if v.detail is not None and len(v.detail):
        d = v.detail
        excludes = (d["ci_low"] > 0) | (d["ci_high"] < 0)
        assert (excludes == (d["p_value"] < 0.05)).all(), d
        assert (excludes == d["significant"]).all()
    if v.compared is not None:
        first = v.text.split(" Evidence:")[0]
        if "cheaper:" in first:  # the ratio is always the first named over the second
            assert v.cost_ratio_high < 1, v.text
        if "dearer:" in first:
            assert v.cost_ratio_low > 1
        if v.reason == "more_accurate":
            assert v.ci_low > 0
        if v.reason == "not_worse":
            assert v.ci_low > -v.margin


@pytest.mark.parametrize("seed", range(40))
def test_no_interval_excludes_zero_beside_a_p_that_says_otherwise(seed):
    """Random tables (0/1 and continuous scores, 5 to 120 questions, two families and closed
    book, costs varying per question): every verdict's sentence and detail keep the invariant."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 121))
    binary = seed % 3 != 0
    p = rng.uniform(0.1, 0.9, 3)

    def draw(q):
        return (rng.random(n) < q).astype(float) if binary else np.clip(rng.normal(q, 0.2, n), 0, 1)

    dollars = {label: rng.uniform(0.5, 1.5, n) * PRICES[label] for label in (CB, LC, RAG)}
    df = results(
        {CB: draw(p[0] / 3), LC: draw(p[1]), RAG: draw(p[2])},
        dollars,
        metric="string_match_all" if binary else "f1",
    )
    v = verdict(df, n_boot=500, seed=seed)
    check_words_match_numbers(v)
    assert v.comparisons == 2 and v.detail["role"].tolist()[:2] == ["verdict", "baseline"]
    assert math.isclose(
        v.cost_ratio,
        df[df.label == v.compared[0]].dollars.mean() / df[df.label == v.compared[1]].dollars.mean(),
    )
    assert v.cost_ratio_low <= v.cost_ratio <= v.cost_ratio_high


# ---------------------------------------------------------------------------- a weak model


def ones(k, n):
    """``k`` correct answers of ``n`` (0/1 scores)."""
    return [1] * k + [0] * (n - k)


WEAK = (
    "the model is too weak for these questions to tell how a stronger one would compare; try a "
    "stronger model."
)


def _weak_scenarios():
    """name -> (scores per variant, the weak-model line's pieces; None: not weak)."""
    return {
        # the real folder: 78 questions, every variant 0-15.4%; the verdict recommended
        # Self-Route as more accurate than long context at 0%, with no word of the model
        "every variant near 0 (the real folder)": (
            {CB: ones(5, 78), LC: ones(0, 78), RAG: ones(10, 78), SR: ones(12, 78)},
            [
                "Every variant answered at most 15.4% of the questions (the highest upper 95% "
                "bound, 25%, is below 30%): " + WEAK
            ],
        ),
        "all zero": (
            {CB: ones(0, 60), LC: ones(0, 60), RAG: ones(1, 60)},
            ["Every variant answered at most 1.67% of the questions", WEAK],
        ),
        # every score under 30%, but 7 of 30 could be 41%: not shown to be weak
        "all under the floor, one interval above it": (
            {CB: ones(0, 30), LC: ones(2, 30), RAG: ones(7, 30)},
            None,
        ),
        "closed book best": (
            {CB: ones(50, 100), LC: ones(40, 100), RAG: ones(45, 100)},
            [
                "No variant beats closed book: closed_book scored 50% without the documents, "
                "more than every variant that reads them (best rag k=3: 45%): the model does "
                "not use the documents, so it is too weak for these questions",
                "try a stronger model.",
            ],
        ),
        # closed book level with both: the documents do not matter, the model is not weak
        "closed book tied at 80%": (
            {CB: flip(ones(320, 400), 2, 2), LC: ones(320, 400), RAG: flip(ones(320, 400), 3, 3)},
            None,
        ),
        "a strong run": ({CB: ones(20, 200), LC: ones(180, 200), RAG: ones(120, 200)}, None),
    }


@pytest.mark.parametrize("name", list(_weak_scenarios()))
def test_a_weak_model_leads_the_verdict(name):
    scores, pieces = _weak_scenarios()[name]
    df = results(scores, PRICES)
    v = verdict(df)
    plain = verdict(df, weak_floor=0)  # no floor: the same decision
    assert (v.reason, v.choice, v.compared) == (plain.reason, plain.choice, plain.compared)
    if pieces is None:
        assert v.weak_model is None and v.text == plain.text
        assert v.text.startswith(("Use ", "Not decided")), v.text
        return
    assert v.weak_model is not None and v.text.startswith(v.weak_model + " "), v.text
    for piece in pieces:
        assert piece in v.weak_model, (piece, v.weak_model)
    rest = v.text.removeprefix(v.weak_model + " ")
    assert rest.startswith(("Use ", "Not decided")) and rest in plain.text, v.text  # marked
    check_words_match_numbers(v)


def test_the_weak_floor_is_a_parameter_and_checked():
    df = results({LC: ones(20, 200), RAG: ones(30, 200)}, PRICES)  # 10% and 15%, n = 200
    assert verdict(df).weak_model is not None
    assert verdict(df, weak_floor=0.15).weak_model is None  # RAG's upper bound is about 21%
    assert verdict(df, weak_floor=0.25).weak_model.startswith("Every variant answered at most 15%")
    with pytest.raises(ValueError, match="error: weak_floor must be from 0 to 1.*got 30"):
        verdict(df, weak_floor=30)
    # scores beyond 0-1 are no share of questions: nothing to be weak at
    scaled = results({LC: [0.0] * 30, RAG: [2.0] * 30}, PRICES, metric="f1")
    assert verdict(scaled).weak_model is None


# ---------------------------------------------------------------------------- empty answers

BLANKS = ["", "  ", "\n", None]  # blank after strip, or no answer at all


def answered(df, empty):
    """``df`` with a prediction per row: the first ``empty[label]`` of each label's rows blank,
    the rest an answer."""
    out = df.assign(prediction="4444444").astype({"prediction": object})
    for label, k in empty.items():
        rows = out.index[out["label"] == label][:k]
        out.loc[rows, "prediction"] = pd.Series([BLANKS[i % 4] for i in range(k)], index=rows)
    return out


def test_many_empty_answers_are_said_per_variant():
    lc = ones(60, 72)
    df = results({CB: ones(5, 72), LC: lc, RAG: flip(lc, 0, 5)}, PRICES)
    v = verdict(answered(df, {LC: 62, RAG: 7}))  # RAG's 7 of 72 is under a tenth
    line = (
        "62 of 72 answers empty for long_context: check the server's chat template and stop "
        "strings."
    )
    assert v.empty_answers == (line,) and v.text.startswith(line + " Use "), v.text
    assert v.text.removeprefix(line + " ") == verdict(df).text  # the same verdict after it
    assert verdict(answered(df, {LC: 7, RAG: 7})).empty_answers == ()


def test_empty_answer_counts_leave_errors_and_answerless_strategies_out():
    from ragbench.analysis.answers import count_empty_answers

    labels = (LC, RAG, "retrieve_only k=3")
    df = answered(
        results({label: ones(10, 20) for label in labels}, {label: 0.001 for label in labels}),
        {LC: 3, RAG: 1, labels[2]: 20},
    )
    # 3 of 20 empty is more than a tenth, 1 of 20 is not; retrieve_only answers nothing by design
    assert [(e.label, e.empty, e.answered) for e in count_empty_answers(df)] == [(LC, 3, 20)]
    failed = df.index[df["label"] == RAG][5:9]  # four failed calls: no answer to count
    df.loc[failed, "error"] = "LLMRequestError: timed out"
    df.loc[failed, "prediction"] = ""  # counted, they would make 5 of 20
    assert [(e.label, e.empty, e.answered) for e in count_empty_answers(df)] == [(LC, 3, 20)]
    df.loc[df.index[df["label"] == RAG][10], "prediction"] = " "  # 2 of the 16 answered
    counts = [(e.label, e.empty, e.answered) for e in count_empty_answers(df)]
    assert counts == [(LC, 3, 20), (RAG, 2, 16)]
    assert count_empty_answers(df.drop(columns="prediction")) == []


# ---------------------------------------------------------------------------- the statistics


def _constrained_mle(b, c, n, delta):
    """P(a wrong, b right) maximising the multinomial likelihood under p_a - p_b = delta."""
    from scipy.optimize import minimize_scalar

    def nll(q):
        cells = (q + delta, q, 1 - 2 * q - delta)
        return -sum(
            k * math.log(max(x, 1e-300)) for k, x in zip((b, c, n - b - c), cells, strict=True)
        )

    lo, hi = max(0.0, -delta) + 1e-12, (1 - delta) / 2 - 1e-12
    return minimize_scalar(nll, bounds=(lo, hi), method="bounded", options={"xatol": 1e-13}).x


@pytest.mark.parametrize(
    ("b", "c", "n", "delta"),
    [(4, 1, 18, 0.1), (4, 1, 18, -0.2), (10, 3, 50, 0.3), (2, 7, 30, -0.05), (0, 0, 20, 0.1)],
)
def test_tango_statistic_uses_the_constrained_maximum_likelihood(b, c, n, delta):
    q = _constrained_mle(b, c, n, delta)
    z = (b - c - n * delta) / math.sqrt(n * (2 * q + delta * (1 - delta)))
    assert _tango_z(b, c, n, delta) == pytest.approx(z, rel=1e-5)
    if b + c:  # at 0 it is McNemar's statistic
        assert _tango_z(b, c, n, 0.0) == pytest.approx((b - c) / math.sqrt(b + c))


def test_tango_interval_is_the_set_the_test_does_not_reject():
    from scipy.stats import norm

    for b, c, n in [(4, 1, 18), (5, 0, 18), (0, 0, 4), (30, 12, 200), (18, 0, 18)]:
        lo, hi, p = tango(b, c, n, 0.05)
        crit = norm.ppf(0.975)
        if lo > -1:
            assert _tango_z(b, c, n, lo) == pytest.approx(crit, abs=1e-6)
        if hi < 1:
            assert _tango_z(b, c, n, hi) == pytest.approx(-crit, abs=1e-6)
        assert lo <= (b - c) / n <= hi and ((lo > 0 or hi < 0) == (p < 0.05))
    lo, hi, _ = tango(0, 0, 4)  # no disagreement on 4 questions is no proof of no difference
    assert lo < -0.4 and hi > 0.4


def test_tango_interval_covers_at_about_its_level_at_small_n():
    rng = np.random.default_rng(0)
    for n, cells in [(30, [0.15, 0.05, 0.8]), (60, [0.1, 0.1, 0.8]), (20, [0.3, 0.1, 0.6])]:
        truth = cells[0] - cells[1]
        counts = rng.multinomial(n, cells, size=2000)
        hit = [lo <= truth <= hi for lo, hi, _ in (tango(int(b), int(c), n) for b, c, _ in counts)]
        assert 0.925 < float(np.mean(hit)) < 0.99, (n, float(np.mean(hit)))


def test_bootstrap_interval_and_p_agree_at_any_level():
    rng = np.random.default_rng(5)
    for i in range(60):
        d = rng.normal(rng.uniform(-0.2, 0.2), 0.3, int(rng.integers(3, 40)))
        for level in (0.05, 0.025, 0.01):
            lo, hi, p = bootstrap_difference(d, 400, i, level)
            assert (lo > 0 or hi < 0) == (p < level), (lo, hi, p, level)


def test_bonferroni_widens_the_interval_and_multiplies_the_p():
    x = [1] * 30 + [0] * 30
    y = flip(x, 9, 2)
    one, two = paired_difference(x, y), paired_difference(x, y, comparisons=2)
    assert two["ci_low"] < one["ci_low"] and two["ci_high"] > one["ci_high"]
    assert two["p_value"] == pytest.approx(min(1, 2 * one["p_value"]))
    assert (one["test"], one["a_only"], one["b_only"], one["n"]) == ("tango", 9, 2, 60)


# ---------------------------------------------------------------------------- the rest


def test_ties_and_a_router_that_never_routed_go_to_the_simpler_variant():
    lc = [1] * 150 + [0] * 50
    rag = flip(lc, 0, 30)  # 90%, RAG step of the router the same
    df = results({LC: lc, RAG: rag, SR: rag}, PRICES)
    v = verdict(df)
    assert v.choice == RAG and v.compared == (RAG, LC)
    assert "self_route k=3 also scored 90% but never routed" in v.text
    # a router whose RAG step scored higher than RAG, never routing: kept, and said so
    sr = flip(rag, 0, 6)
    v = verdict(results({LC: lc, RAG: rag, SR: sr}, PRICES))
    assert v.compared[0] == SR
    assert "self_route k=3 never routed: every answer came from its RAG step" in v.text
    assert "scored 93%, against 90% for rag k=3" in v.text
    # a router that did route is just a variant
    routes = ["long_context"] * 10 + ["rag"] * 190
    v = verdict(results({LC: lc, RAG: rag, SR: sr}, PRICES, routes={SR: routes}))
    assert "never routed" not in v.text
    # at the same cost and score, the simpler of the two families' best
    v = verdict(
        results(
            {KV: lc, RAG: flip(lc, 3, 3)},
            {KV: 0.001, RAG: 0.001},
            params={KV: {"kv": {"name": "quantized", "bits": 4}}},
        )
    )
    assert (v.reason, v.choice) == ("not_worse", RAG)
    assert (
        "at the same cost ($1.00 per 1k queries), and simpler (long_context kv=quantized "
        "adds the quantized KV cache)" in v.text
    )


def test_cost_per_query_counts_every_question_asked_as_the_summary_does():
    """A question without a gold answer (no score) was still asked and paid for: the verdict's
    cost per query is the summary table's, over every question; the accuracy is over the
    scored ones; both say what each is over."""
    df = results(
        {LC: [1, 1, 0, 1], RAG: [1, 0, 1, 1]}, {LC: [0.001, 0.001, 0.001, 0.003], RAG: 0.0005}
    )
    df.loc[df["example_id"] == "q003", "string_match_all"] = np.nan
    v, table = verdict(df), analysis.summary(df).set_index("label")
    assert v.variants.loc[LC, "cost_per_1k"] == pytest.approx(1.5)  # $0.0015 over all 4
    assert table.loc[LC, "dollars"] * 1000 == pytest.approx(1.5)
    assert (v.variants.loc[LC, "n"], v.variants.loc[LC, "asked"]) == (3, 4)
    assert "3 scored questions of 4 asked (cost per query over all 4)" in str(v)
    assert "($0.50 vs $1.50 per 1k queries" in v.text, v.text
    notes = analysis.summary(df).attrs["notes"]
    assert any("(every variant 3 of 4); cost and latency per query" in n for n in notes), notes


def test_margin_is_a_parameter():
    lc = [1] * 320 + [0] * 80
    df = results({LC: lc, RAG: flip(lc, 8, 4)}, PRICES)  # RAG 1 point below
    assert verdict(df).reason == "not_worse"  # the lower end, about -3, is above -5
    tight = verdict(df, margin=0.02)
    assert tight.reason == "undecided" and tight.more_questions > 0
    assert "would show whether rag k=3 is within 2 points of long_context" in tight.text


def test_cost_ratio_has_a_bootstrap_interval_when_costs_vary():
    rng = np.random.default_rng(2)
    lc = [1] * 160 + [0] * 40
    df = results(
        {LC: lc, RAG: flip(lc, 0, 30)},
        {LC: rng.uniform(0.001, 0.003, 200), RAG: rng.uniform(0.0004, 0.0006, 200)},
    )
    v = verdict(df)
    assert v.cost_ratio_low < v.cost_ratio < v.cost_ratio_high < 1
    assert re.search(
        r"cheaper: 0\.\d+x the cost of long_context \(\$[\d.]+ vs \$[\d.]+ per 1k "
        r"queries, 95% CI 0\.\d+x to 0\.\d+x\)",
        v.text,
    ), v.text


def test_a_prefix_cache_break_even_is_stated_where_it_could_change_the_answer():
    lc = [1] * 320 + [0] * 80
    df = results(
        {CB: [0] * 400, LC: lc, RAG: flip(lc, ones_to_zero=6, zeros_to_one=4)},
        PRICES,
        tokens={LC: 5_000, RAG: 600, CB: 40},
        sheet=SONNET,
    )
    v = verdict(df)
    assert (v.choice, v.reason) == (RAG, "not_worse")
    # by hand, at Sonnet 4.5's $ per million tokens (input 3, cache read 0.30, cache write
    # 3.75, output 15): long context's 5,000-token prompt is its 4,980 kept document tokens
    # plus 20 more, each answer 10 tokens; RAG's prompt is 600 tokens
    first = 4_980 * 3.75 + 20 * 3 + 10 * 15  # the question that writes the cache (x 1e-6 $)
    later = 4_980 * 0.30 + 20 * 3 + 10 * 15  # each question that reads it
    rag = 600 * 3 + 10 * 15
    expected = math.ceil((first - later) / (rag - later))  # 17,181 / 246 = 69.8
    assert expected == 70 and v.break_even_questions == 70
    assert "from 70 questions per document" in v.text
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
    v = verdict(df, max_dollars_per_1k=0.1)  # only closed book is left
    assert (v.choice, v.reason) == (CB, "only_variant") and "the only variant" in v.text
    lat = {LC: 9.0, RAG: 1.0, CB: 0.5}
    v = verdict(
        results({LC: [1] * 180 + [0] * 20, RAG: [1] * 120 + [0] * 80}, PRICES, latency=lat),
        max_latency_s=2.0,
    )
    assert v.choice == RAG and v.variants.loc[LC, "meets"] == False  # noqa: E712
    assert (
        "long_context, the best long context variant, does not meet the maximum latency" in v.text
    )
    assert verdict(clear_winner(), min_accuracy=0, max_dollars_per_1k=0.0).choice == LC  # 0: none


def test_constraints_out_of_range_are_refused_naming_the_one():
    """From Python as from the CLI: 60 meant as 60% would ask every variant for 6,000% and
    the verdict would blame the data; a negative or NaN limit no variant could meet."""
    df = clear_winner()
    with pytest.raises(
        ValueError,
        match=r"min_accuracy is a mean string_match_all, from 0 to 1 "
        r"here; got 60 \(for 60%: 0\.6\)",
    ):
        verdict(df, min_accuracy=60)
    for name in ("min_accuracy", "max_dollars_per_1k", "max_latency_s"):
        for bad in (-1, float("nan")):
            with pytest.raises(ValueError, match=f"^{name} must be 0 or more"):
                verdict(df, **{name: bad})
    assert verdict(df, min_accuracy=None, max_latency_s=None).choice == LC  # None: no limit
    tokens = results({LC: [3.0] * 10, RAG: [2.0] * 10}, PRICES, metric="rouge_tokens")
    assert verdict(tokens, metric="rouge_tokens", min_accuracy=2.5).choice == LC  # not a share


def test_undecided_gives_the_questions_that_would_decide():
    df = results({LC: [1, 1, 1, 1], RAG: [1, 1, 0, 0]}, PRICES)
    v = verdict(df)
    assert (v.choice, v.reason, v.compared) == (None, "undecided", (RAG, LC))
    assert v.n_pairs == 4 and v.diff == pytest.approx(-0.5) and v.comparisons == 1
    # long context better at the observed 50 points: Connor's n at psi = 0.5 is 14, 10 more
    assert v.more_questions == questions_needed(0.5, discordant=0.5) - 4 == 10
    assert "about 10 more questions would show whether long_context is more accurate" in v.text
    # no disagreement on 4 questions is no proof of none: within 5 points needs about 150
    v = verdict(results({LC: [1, 1, 1, 0], RAG: [1, 1, 1, 0]}, PRICES))
    assert (v.reason, v.choice, v.leaning) == ("undecided", None, RAG)
    sd = math.sqrt(0.05)
    assert v.more_questions == questions_needed(0.05, sd=sd) - 4
    assert "would show whether rag k=3 is within 5 points of long_context" in v.text


def test_default_metric_conditions_and_display():
    df = clear_winner().assign(contains=lambda d: d["string_match_all"])
    v = report.verdict(df)  # the first metric column: string_match_all
    assert v.metric == "string_match_all" and report.verdict is analysis.verdict
    assert v.conditions == {
        "questions": 200,
        "model": "tiny-model",
        "context_tokens": (5_000, 5_000),
        "context": "a 5,000-token context (long context read all of it)",
        "truncated": 0.0,
        "price_sheet": "example-hosted-api",
        "price_sheet_date": "2025-01-15",
    }
    assert v.conditions_text == (
        "Holds for model tiny-model, a 5,000-token context (long context read all of it), 200 "
        "questions, price sheet example-hosted-api (dated 2025-01-15)."
    )
    assert str(v) == v.text + "\n" + v.conditions_text
    assert v._repr_markdown_().startswith(f"**Verdict:** Use {LC} rather than {RAG}: ")
    assert isinstance(v, Verdict) and v.reason in REASONS
    assert "e-0" not in str(v)  # dollars in fixed notation
    assert list(v.detail["role"]) == ["verdict", "baseline", "other pair"]
    assert v.detail.attrs["notes"] and report.formatted(v.detail) is not None
    with pytest.raises(ValueError, match="metric column"):
        verdict(df, metric="f1")


def test_conditions_name_the_context_a_corpus_a_context_or_a_range_and_what_was_cut():
    """``analysis.conditions``: one shared corpus (only long context's fitted size known), one
    context size, or a range; what long context cut to fit, as a share of what it was given."""
    from ragbench.analysis.conditions import conditions

    ids = {"example_id": ["a", "a", "b", "b"]}
    corpus = pd.DataFrame(ids | {"input_context_tokens": [900, None, 900, None]})
    whole = "a 900-token corpus (long context read all of it)"
    assert conditions(corpus, corpus)["context"] == whole
    one = pd.DataFrame(
        ids
        | {
            "context_tokens": [1_000] * 4,
            "input_context_tokens": [800, None, 800, None],
            "truncated_tokens": [200, None, 200, None],
        }
    )
    got = conditions(one, one)
    assert got["context"] == "a 1,000-token context (long context cut 25% of it to fit the window)"
    assert got["context_tokens"] == (1_000, 1_000) and got["truncated"] == 0.25
    ranged = pd.DataFrame(ids | {"context_tokens": [1_000, 1_000, 3_000, 3_000]})
    assert conditions(ranged, ranged) == {
        "questions": 2,
        "context_tokens": (1_000, 3_000),
        "context": "contexts of 1,000-3,000 tokens",
    }


def test_without_dollars_the_cost_is_prompt_tokens():
    lc = [1] * 320 + [0] * 80
    df = results({LC: lc, RAG: flip(lc, 1)}, {}, tokens={LC: 5_000, RAG: 600})
    v = verdict(df)
    assert v.cost == "prompt_tokens" and v.choice == RAG
    assert (
        "cheaper: 0.12x the cost of long_context (600 prompt tokens vs 5,000 prompt tokens "
        "per query)" in v.text
    )
    with pytest.raises(ValueError, match="needs dollars"):
        verdict(df, max_dollars_per_1k=1.0)


def test_mcnemar_sample_size_matches_a_simulated_test():
    """Connor's n gives the McNemar test at least its 80% power, and not much more (the formula
    is known to be slightly conservative): simulate the test ``compare`` and the verdict run on
    0/1 scores (McNemar's, Tango's score test at 0)."""
    n = questions_needed(0.1, discordant=0.2)
    assert n == 155  # (1.96 sqrt(.2) + 0.8416 sqrt(.19))^2 / .01 = 154.6
    rng = np.random.default_rng(0)
    # p10 = 0.15, p01 = 0.05: the discordant share is 0.2 and the difference 0.1
    counts = rng.multinomial(n, [0.15, 0.05, 0.80], size=20_000)
    b, c = counts[:, 0], counts[:, 1]
    z = (b - c) / np.sqrt(np.maximum(b + c, 1))
    power = float(np.mean(np.abs(z) > 1.959964))
    assert 0.79 < power < 0.85, power
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


def test_a_lead_smaller_than_the_printed_scores_says_so():
    from ragbench.analysis.verdict_text import _standing

    assert _standing("a", "b", "f1", "66.7%", "66.7%", tied=True) == (
        "a ties with b on f1 (both 66.7%)"
    )
    assert _standing("a", "b", "f1", "66.7%", "66.7%", tied=False) == (
        "a leads b on f1 narrowly (both about 66.7%)"
    )
    assert _standing("a", "b", "f1", "70%", "60%", tied=False) == "a leads b on f1 (70% vs 60%)"


def test_one_question_is_singular_in_every_sentence():
    """A single question (or a single scored one) reads "1 question", never "1 questions"."""
    df = results({LC: [1, 1], RAG: [1, 0], SR: [1, 1]}, PRICES, routes={SR: ["rag", "rag"]})
    df.loc[df["example_id"] == "q001", "string_match_all"] = np.nan
    v = verdict(df)
    text = str(v) + " " + " ".join(analysis.summary(df).attrs["notes"])
    assert "1 scored question of 2 asked" in text, text
    assert "1 paired question" in text, text
    assert not re.search(r"\b1 (\w+ )?questions\b", text), text
    one = results({LC: [1], RAG: [0]}, PRICES)
    text = str(verdict(one)) + " " + decide(compare(one))
    assert not re.search(r"\b1 (\w+ )?questions\b", text), text
