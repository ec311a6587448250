"""The verdict: which variant to use, from a results table and the reader's constraints, in one
or two plain sentences with the evidence (the paired test) and the conditions it holds for.

Among the variants that meet the constraints (a minimum score, a maximum $ per 1k queries, a
maximum mean latency), take the most accurate; then, cheapest first, the first cheaper variant
that the paired test (``compare``: exact McNemar for 0/1 scores, else a paired bootstrap;
Holm-adjusted over the candidates' pairs) does not find significantly worse is chosen, provided
the comparison could have seen a loss of ``margin`` (80% power on that many questions). Where it
could not, the answer is "too few questions", with how many more would separate the two. Where
every cheaper variant is significantly worse, the most accurate one is chosen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

import numpy as np

from ragbench.analysis._common import (
    _check_metric,
    _higher_is_better,
    _scored,
    own_latency_seconds,
    paired_scores,
)
from ragbench.analysis.conditions import conditions as run_conditions
from ragbench.analysis.labels import with_labels
from ragbench.analysis.paired import compare
from ragbench.cost.planning import prefix_cache_break_even
from ragbench.strategies import FULL_CONTEXT, NO_CONTEXT, RETRIEVED, strategies_where

REASONS = ("cheapest_not_worse", "most_accurate_within_budget", "none_meets_constraints",
           "too_few_questions")  # fmt: skip
POWER = 0.8  # the chance a comparison must have of seeing a difference before "not worse" counts
# cost per query, best first: money (a preloaded corpus's one-time cost amortised), else tokens
COSTS = ("amortised_dollars", "dollars", "prompt_tokens")


def questions_needed(effect: float, *, discordant: float | None = None, sd: float | None = None,
                     alpha: float = 0.05, power: float = POWER) -> int:  # fmt: skip
    """Paired questions a two-sided test at level ``alpha`` needs to detect a mean difference
    ``effect`` with probability ``power`` (normal approximation).

    0/1 scores (McNemar), Connor (1987), "Sample size for testing differences in proportions
    for the paired-sample design", Biometrics 43:207-211:
    ``n = (z(1-alpha/2) sqrt(psi) + z(power) sqrt(psi - effect^2))^2 / effect^2`` with ``psi``
    = ``discordant``, the share of questions the two variants disagree on (at least |effect|).
    Other scores (paired z): ``n = ((z(1-alpha/2) + z(power)) sd / effect)^2`` with ``sd`` the
    standard deviation of the per-question differences. tests/test_verdict.py checks both
    against simulated tests."""
    effect = abs(effect)
    if effect == 0 or not math.isfinite(effect):
        return math.inf  # type: ignore[return-value]
    za, zb = NormalDist().inv_cdf(1 - alpha / 2), NormalDist().inv_cdf(power)
    if discordant is not None:
        psi = min(1.0, max(discordant, effect))
        n = (za * math.sqrt(psi) + zb * math.sqrt(max(psi - effect**2, 0.0))) ** 2 / effect**2
    else:
        n = ((za + zb) * float(sd or 0.0) / effect) ** 2
    return max(2, math.ceil(n - 1e-9))


@dataclass(frozen=True)
class Verdict:
    """What to use and why. ``text``: the decision with its numbers; ``choice``: the label to
    use (None: none meets the constraints, or too few questions to tell); ``reason``: one of
    ``REASONS``. The evidence is the paired comparison of ``rival`` (a cheaper variant) with
    ``best`` (the most accurate meeting the constraints): ``diff`` = rival - best on ``metric``
    with its CI, ``p_value`` Holm-adjusted, on ``n_pairs`` questions; ``more_questions`` the
    power estimate when too few. ``conditions``: model, context tokens, questions, price sheet.
    ``variants``: one row per variant (score, $ per 1k queries, latency, constraints met)."""

    text: str
    choice: str | None
    reason: str
    metric: str
    best: str | None = None
    rival: str | None = None
    test: str | None = None
    p_value: float | None = None
    diff: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    n_pairs: int | None = None
    more_questions: int | None = None
    binding: tuple[str, ...] = ()
    break_even_questions: int | None = None
    cost: str = "dollars"
    conditions: dict[str, Any] = field(default_factory=dict, compare=False)
    variants: Any = field(default=None, repr=False, compare=False)

    @property
    def conditions_text(self) -> str:
        c = self.conditions
        dated = f" (dated {c['price_sheet_date']})" if c.get("price_sheet_date") else ""
        parts = [f"model {c['model']}" if c.get("model") else "", c.get("context", ""),
                 f"{c['questions']:,} questions" if c.get("questions") else "",
                 f"price sheet {c['price_sheet']}{dated}" if c.get("price_sheet") else ""]  # fmt: skip
        parts = [p for p in parts if p]
        own = [f"{label} answered from its own index, not the run's documents."
               for label in c.get("own_index") or ()]  # fmt: skip
        return " ".join([f"Holds for {', '.join(parts)}."] * bool(parts) + own)

    def __str__(self) -> str:
        return "\n".join(filter(None, [self.text, self.conditions_text]))

    def _repr_markdown_(self) -> str:
        tail = f"\n\n<small>{self.conditions_text}</small>" if self.conditions_text else ""
        return f"**Verdict:** {self.text}{tail}"


def _money(x: float) -> str:
    """Fixed notation, two significant figures below $1 (never 1e-05)."""
    if x == 0 or not math.isfinite(x):
        return "$0" if x == 0 else "n/a"
    if x >= 1:
        return f"${x:,.2f}"
    return f"${x:.{max(2, 1 - math.floor(math.log10(x)))}f}"


def _cost_text(cost: str, value: float) -> str:
    return f"{value:,.0f} prompt tokens" if cost == "prompt_tokens" else _money(value)


@dataclass(frozen=True)
class _Fmt:
    """Scores as percentages for 0/1 metrics (differences in points), else 3 decimals."""

    binary: bool

    def score(self, x: float) -> str:
        return f"{100 * x:.3g}%" if self.binary else f"{x:.3f}"

    def num(self, x: float) -> str:  # a signed difference; never "-0"
        return f"{round(100 * x, 1) + 0.0:+g}" if self.binary else f"{round(x, 3) + 0.0:+.3f}"

    def diff(self, x: float) -> str:
        return self.num(x) + (" points" if self.binary else "")

    def ci(self, lo: float, hi: float) -> str:
        return f"95% CI {self.num(lo)} to {self.num(hi)}"


def _variants(df: Any, metric: str, cost: str) -> Any:
    """One row per variant (config order): mean score, n, cost per query (x 1000 for dollars),
    mean latency."""
    rows = _scored(df, metric)
    g = rows.groupby("label", sort=False)
    out = g[metric].agg(score="mean", n="size")
    scale = 1.0 if cost == "prompt_tokens" else 1000.0
    out["cost_per_1k"] = g[cost].mean() * scale if cost in rows else np.nan
    latency = own_latency_seconds(rows)  # its own time, the harness's queue apart
    out["latency_s"] = (
        latency.groupby(rows["label"], sort=False).mean() if latency is not None else np.nan
    )
    out["strategy"] = g["strategy"].first() if "strategy" in rows else None
    order = [lb for lb in dict.fromkeys(df["label"]) if lb in out.index]
    return out.reindex(order)


def _pick_cost(rows: Any) -> str:
    for name in COSTS:
        if name in rows.columns and len(rows) and rows[name].notna().all():
            return name
    raise ValueError(f"no cost column known for every row; looked for {', '.join(COSTS)}")


def _constraints(table: Any, metric: str, higher: bool, fmt: _Fmt, limits: dict) -> dict:
    """{name: (passes per variant, what binds in words)} for the active constraints."""
    specs = {  # name: (column, bound is a minimum?, value in words, what, the closest variant)
        "min_accuracy": ("score", higher, fmt.score, f"{'minimum' if higher else 'maximum'} "
                         f"{metric}", "the most accurate"),
        "max_dollars_per_1k": ("cost_per_1k", False, lambda x: f"{_money(x)} per 1k queries",
                               "maximum", "the cheapest"),
        "max_latency_s": ("latency_s", False, lambda x: f"{x:.2g} s", "maximum latency",
                          "the fastest"),
    }  # fmt: skip
    out = {}
    for name, bound in limits.items():
        if bound is None:
            continue
        column, minimum, show, what, closest = specs[name]
        values = table[column].astype(float)
        if values.isna().all():
            raise ValueError(f"{name} needs a {column} for each variant; the table has none")
        top = values.idxmax() if minimum else values.idxmin()
        out[name] = (values >= bound if minimum else values <= bound,
                     f"the {what} of {show(bound)} ({closest}, {top}: {show(values[top])})")  # fmt: skip
    return out


def _binding(checks: dict, labels: Any) -> tuple[str, ...]:
    """The constraints whose removal alone would let some variant through; when no single one
    does, every constraint some variant fails."""
    names = list(checks)
    alone = [n for n in names
             if any(all(checks[m][0][lb] for m in names if m != n) for lb in labels)]  # fmt: skip
    return tuple(alone or [n for n in names if not checks[n][0].all()])


def _break_even(df: Any, table: Any, choice: str, lc: str, sheet: str | None) -> int | None:
    """Questions per document from which ``lc`` (long context) with a prefix cache costs no
    more than ``choice`` (a retrieval variant), on ``sheet``; None when the table lacks what
    ``prefix_cache_break_even`` needs (a per-token sheet, the prefix length) or never."""
    if not sheet:
        return None
    no_context = strategies_where(context=NO_CONTEXT)
    sub = df[df["label"].isin([choice, lc]) | df["strategy"].isin(no_context)]
    try:
        result, _ = prefix_cache_break_even(
            sub, [sheet], long_context=table.loc[lc, "strategy"],
            rag=table.loc[choice, "strategy"], closed_book=next(iter(no_context), ""),
        )  # fmt: skip
    except (ValueError, KeyError, OSError):
        return None
    row = result[result["rag_label"] == choice] if len(result) else result
    if not len(row) or row["lc_cheaper_from"].isna().iloc[0]:
        return None
    return int(row["lc_cheaper_from"].iloc[0])


def verdict(
    df: Any,
    metric: str | None = None,
    min_accuracy: float | None = None,
    max_dollars_per_1k: float | None = None,
    max_latency_s: float | None = None,
    alpha: float = 0.05,
    margin: float = 0.05,
    seed: int = 0,
) -> Verdict:
    """Which variant to use for this table, under the constraints (None or 0: no limit):
    ``min_accuracy`` (the lowest acceptable mean ``metric``; a maximum for lower-is-better
    metrics), ``max_dollars_per_1k`` ($ per 1,000 queries, one-time costs amortised),
    ``max_latency_s`` (mean seconds a user waits). ``metric`` defaults to the table's first
    metric column; ``alpha`` is the paired tests' level; ``margin`` the loss of ``metric`` (0.05
    = 5 points of accuracy) a cheaper variant may hide and still count as "not worse": the
    comparison must have had 80% power to see it. Cost is $ per 1k queries, or prompt tokens
    per query when the run had no price sheet. See the module docstring for the decision."""
    if not 0 < alpha < 1 or not 0 < margin < 1:
        raise ValueError(f"alpha and margin must be in (0, 1), got {alpha} and {margin}")
    df = with_labels(df)
    metric = _check_metric(df, metric)
    rows = _scored(df, metric)
    if rows.empty:
        raise ValueError(f"no scored rows for {metric!r}: nothing to decide")
    cost = _pick_cost(rows)
    table = _variants(df, metric, cost)
    higher = _higher_is_better(metric)
    scores = rows[metric].to_numpy(dtype=float)
    fmt = _Fmt(bool(np.isin(scores, (0.0, 1.0)).all()))
    limits = {k: float(v) if v else None for k, v in [("min_accuracy", min_accuracy),
              ("max_dollars_per_1k", max_dollars_per_1k), ("max_latency_s", max_latency_s)]}  # fmt: skip
    if limits["max_dollars_per_1k"] and cost == "prompt_tokens":
        raise ValueError("max_dollars_per_1k needs dollars: the table has none (no price_sheet)")
    checks = _constraints(table, metric, higher, fmt, limits)
    table["meets"] = np.logical_and.reduce([c[0] for c in checks.values()] + [table["n"] > 0])
    conditions = run_conditions(df, rows)
    common = {"metric": metric, "cost": cost, "conditions": conditions, "variants": table}

    eligible = table[table["meets"]]
    if eligible.empty:
        binding = _binding(checks, table.index)
        text = "No variant meets the constraints: " + "; ".join(checks[b][1] for b in binding)
        return Verdict(text + ".", None, "none_meets_constraints", binding=binding, **common)

    # the most accurate; ties go to the cheaper, then to config order
    ranked = eligible.assign(_key=eligible["score"] * (-1 if higher else 1))
    best = ranked.sort_values(["_key", "cost_per_1k"], kind="stable").index[0]
    per = "per 1k queries" if cost != "prompt_tokens" else "per query"
    cost_of = {lb: _cost_text(cost, v) for lb, v in eligible["cost_per_1k"].items()}
    if len(eligible) == 1:
        only = "the only variant" + (" that meets the constraints" if checks else " in the table")
        text = (f"Use {best}: {only}, {metric} {fmt.score(eligible.loc[best, 'score'])} at "
                f"{cost_of[best]} {per}; nothing to compare it with.")  # fmt: skip
        return Verdict(text, best, "most_accurate_within_budget", best=best, **common)

    pairs = compare(df, metric=metric, level=alpha, seed=seed, labels=list(eligible.index))
    wide = paired_scores(df, metric, list(eligible.index))
    # power at Bonferroni's alpha / pairs, the level Holm holds the smallest p to (an upper bound)
    ev = {lb: _evidence(pairs, wide, lb, best, alpha / len(pairs)) for lb in eligible.index
          if lb != best}  # fmt: skip
    score = {lb: fmt.score(v) for lb, v in eligible["score"].items()}
    within = " within the constraints" if checks else ""

    def stats(e: dict[str, Any]) -> str:
        test = "exact McNemar" if e["test"] == "mcnemar_exact" else "paired bootstrap"
        # the p that decides is Holm's over the pairs (the paired table shows it beside the raw p)
        holm = "Holm-adjusted " if len(pairs) > 1 else ""
        p = "=n/a" if math.isnan(e["p_value"]) else f"={e['p_value']:.2g}"
        p = "<0.001" if e["p_value"] < 0.001 else p
        return (f"difference {fmt.diff(e['diff'])}, {fmt.ci(e['ci_low'], e['ci_high'])}, "
                f"{test} {holm}p{p}, {e['n_pairs']:,} paired questions")  # fmt: skip

    cheaper = eligible[eligible["cost_per_1k"] < eligible.loc[best, "cost_per_1k"]]
    order = list(cheaper.sort_values("cost_per_1k", kind="stable").index)
    runner_up = ranked.sort_values(["_key", "cost_per_1k"], kind="stable").index[1]
    # cheaper variants first: is one as good? None cheaper: is the best really better than the next?
    for other in order or [runner_up]:
        e = ev[other]
        if e["_worse"]:
            continue
        if e["n_pairs"] >= e["_need"](margin):
            if not order:
                break  # the next is not better, and dearer: the best stands
            text = (f"Use {other}: it costs {cost_of[other]} {per} against {cost_of[best]} for "
                    f"{best}, the most accurate{within}, and is not significantly worse on "
                    f"{metric} ({score[other]} vs {score[best]}; {stats(e)}).")  # fmt: skip
            q, note = _cache_note(df, eligible, other, best, ev, conditions.get("price_sheet"))
            return Verdict(text + note, other, "cheapest_not_worse", best=best,
                           break_even_questions=q, **_public(e), **common)  # fmt: skip
        at_effect = abs(e["diff"]) >= margin
        more = max(1, e["_need"](abs(e["diff"]) if at_effect else margin) - e["n_pairs"])
        what = ("would separate them at this effect size" if at_effect else
                f"would detect a difference of {fmt.diff(margin)[1:]} or more")  # fmt: skip
        text = (f"Too few questions to tell {best} ({score[best]} on {metric}, {cost_of[best]} "
                f"{per}) from {'the cheaper ' * bool(order)}{other} ({score[other]}, "
                f"{cost_of[other]}): {stats(e)}. About {more:,} more question"
                f"{'s' * (more > 1)} {what} (80% power, {100 * alpha:g}% level).")  # fmt: skip
        return Verdict(text, None, "too_few_questions", best=best, more_questions=more,
                       **_public(e), **common)  # fmt: skip
    if order:  # every cheaper variant is significantly worse: show the closest call
        e = max((ev[o] for o in order), key=lambda x: x["p_value"])
        text = (f"Use {best}: the most accurate{within} ({score[best]} on {metric}, "
                f"{cost_of[best]} {per}); every cheaper variant is significantly worse, the "
                f"closest {e['rival']} ({score[e['rival']]}, {cost_of[e['rival']]}; "
                f"{stats(e)}).")  # fmt: skip
    else:  # the most accurate is also the cheapest: show the next
        e = ev[runner_up]
        text = (f"Use {best}: the most accurate{within} ({score[best]} on {metric}) and the "
                f"cheapest ({cost_of[best]} {per}); next, {e['rival']} scores "
                f"{score[e['rival']]} ({stats(e)}).")  # fmt: skip
    return Verdict(text, best, "most_accurate_within_budget", best=best, **_public(e), **common)


def _evidence(pairs: Any, wide: Any, other: str, best: str, alpha: float) -> dict[str, Any]:
    """``compare``'s row of (other, best), oriented as other - best; ``_need(effect)``: the
    paired questions that would detect ``effect`` (``questions_needed``)."""
    row = pairs[((pairs["a"] == other) & (pairs["b"] == best))
                | ((pairs["a"] == best) & (pairs["b"] == other))].iloc[0]  # fmt: skip
    sign, n = (1.0 if row["a"] == other else -1.0), int(row["n"])
    d = (wide[other] - wide[best]).dropna().to_numpy(dtype=float)
    sd = float(d.std(ddof=1)) if d.size > 1 else 0.0
    disc = (row["a_only"] + row["b_only"]) / max(n, 1)

    def need(effect: float) -> int:
        if row["test"] == "mcnemar_exact":
            return questions_needed(effect, discordant=disc, alpha=alpha)
        # no spread observed is no proof of none: at least a 0/1 score's at this effect
        return questions_needed(effect, sd=max(sd, math.sqrt(effect - effect**2)), alpha=alpha)

    lo, hi = sorted((sign * row["ci_low"], sign * row["ci_high"]))
    return {"rival": other, "test": str(row["test"]), "p_value": float(row["p_adjusted"]),
            "diff": sign * row["diff"], "ci_low": lo, "ci_high": hi, "n_pairs": n,
            "_worse": bool(row["significant"]) and row["winner"] == best, "_need": need}  # fmt: skip


def _public(ev: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in ev.items() if not k.startswith("_")}


def _cache_note(df: Any, eligible: Any, choice: str, best: str, ev: dict, sheet: str | None):
    """Where the choice is a retrieval variant and a long-context one is as accurate (not
    significantly worse than the best) but dearer: the questions per document from which a
    prefix cache makes long context no dearer (``prefix_cache_break_even``)."""
    strategy = eligible["strategy"]
    if strategy[choice] not in strategies_where(context=RETRIEVED):
        return None, ""
    for lc in eligible[strategy.isin(strategies_where(context=FULL_CONTEXT))].index:
        if lc != best and ev[lc]["_worse"]:
            continue  # significantly less accurate: a cache would not change the answer
        q = _break_even(df, eligible, choice, lc, sheet)
        if q is not None and q > 1:
            return q, (f" With a prefix cache ({sheet} prices), {lc} costs no more than {choice} "
                       f"from {q:,} questions per document on.")  # fmt: skip
    return None, ""
