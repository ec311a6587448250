"""The verdict: RAG or long context, from a results table and the reader's constraints, in one
sentence a manager can act on, then the evidence and the conditions it holds for.

One job: the decision. Its wording is ``verdict_text``; its table of variants, the constraints
and the cost ratio are ``verdict_table``; the families' best and the paired comparisons are its
steps and read the same frame, so they stay here.

1. The variants that meet the constraints (a minimum score, a maximum $ per 1k queries, a
   maximum mean latency) are sorted into families (``families``): retrieval (RAG, Self-Route, a
   pipeline), long context (with its KV-cache variants) and the closed-book baseline. Each
   family's best is its most accurate variant; equal scores go to the one with less machinery
   (RAG before Self-Route, a plain KV cache before a technique), and a Self-Route that never
   routed yields to the RAG variant that retrieved as it did.
2. The best retrieval variant is compared with the best long-context one on the same questions
   (with one family only, the best with the next best). Of the two, the cheaper (mean cost per
   query; at the same cost, the simpler) is used when it is significantly more accurate, or
   *not worse*: non-inferiority, the lower end of the paired difference's interval above
   ``-margin``. The dearer one is used when it is significantly more accurate. Otherwise it is
   not decided yet, with the questions that would decide it (80% power at the observed
   difference).
3. Closed book is the baseline line: the documents matter (the choice is significantly better),
   do not matter (closed book within the margin) or hurt.

Each difference's interval and p-value come from one procedure (``paired.paired_difference``:
Tango's score interval for 0/1 scores, whose test at 0 is McNemar's; a paired bootstrap
otherwise), Bonferroni-adjusted over the comparisons the sentence makes (the intervals are
simultaneous, the p-values multiplied by their number), so an interval that excludes 0 always
stands beside p < alpha. Cost is the ratio of mean cost per query, with a paired bootstrap
interval; a variant is called cheaper only when that interval lies below 1.

A run that stopped when decided (``sequential``: ``ragbench run --until-decided``) is read at
its last look: the two variants' interval is the repeated confidence interval at that look's
group-sequential critical value (``analysis.sequential``; Bonferroni over every retrieval x
long-context pair, since the best of each family may change from look to look, and the
baseline), and the sentence says after how many of the questions it was decided. The runner
decides each look with this very function, so the sentence and the stop agree.
"""

from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from ragbench.analysis._common import (
    _check_metric,
    _higher_is_better,
    _scored,
    check_one_row_each,
    counted,
    paired_scores,
)
from ragbench.analysis.answers import WEAK_FLOOR, count_empty_answers, weak_model_line
from ragbench.analysis.conditions import Conditions
from ragbench.analysis.conditions import conditions as run_conditions
from ragbench.analysis.families import BASELINE, LONG_CONTEXT, RETRIEVAL, annotate
from ragbench.analysis.labels import with_labels
from ragbench.analysis.paired import Comparison, SequentialLook, paired_difference
from ragbench.analysis.planning import prefix_cache_break_even
from ragbench.analysis.power import questions_to_decide
from ragbench.analysis.sequential import (
    SPENDING_NAMES,
    LookSummary,
    SequentialState,
    boundaries,
    repeated_interval,
)
from ragbench.analysis.verdict_table import (
    _machinery_at,
    _score_at,
    answered_rows,
    binding_constraints,
    constraint_checks,
    cost_ratio,
    parse_limits,
    pick_cost,
    variant_table,
)
from ragbench.analysis.verdict_text import (
    _cost_phrase,
    _cost_text,
    _evidence,
    _Fmt,
    _same_cost,
    _standing,
    judge_text,
)
from ragbench.strategies import NO_CONTEXT, strategies_where

if TYPE_CHECKING:
    import pandas as pd

REASONS = ("more_accurate", "not_worse", "undecided", "only_variant", "none_meets_constraints")
MOST = 0.5  # long context cut more than this share of the corpus: the sentence says so


def _questions_text(c: Conditions) -> str:
    """The question count a verdict holds for; where some answered questions had no score (no
    gold answer), what the accuracy and the cost per query are each over."""
    n, asked = c.get("questions"), c.get("asked")
    if not n:
        return ""
    if not asked:
        return counted(n, "question")
    return f"{counted(n, 'scored question')} of {asked:,} asked (cost per query over all {asked:,})"


class _Common(TypedDict):
    """What every ``Verdict`` of one table shares."""

    metric: str
    cost: str
    conditions: Conditions
    variants: pd.DataFrame
    margin: float


@dataclass(frozen=True)
class Verdict:
    """What to use and why. ``text``: the sentence, then its evidence; ``choice``: the label to
    use (None: none meets the constraints, or not decided yet); ``reason``: one of ``REASONS``;
    ``opponent``: the best of the other family (or the next best); ``leaning``: when undecided,
    the variant ahead on cost (or as dear and simpler) and at least level on score, if one is. ``compared`` = (x, y): ``diff`` = x - y
    on ``metric`` with its interval (``ci_low``, ``ci_high``) and ``p_value`` from one procedure
    (``test``), Bonferroni-adjusted over ``comparisons``, on ``n_pairs`` questions;
    ``cost_ratio`` = mean cost of x / of y with its bootstrap 95% interval. ``baseline``: the
    closed-book line's variant. ``more_questions``: how many more would decide. ``detail``:
    every comparison (these first), ``conditions``: model, context, questions, price sheet;
    ``variants``: one row per variant (score and ``n`` over the scored questions; $ per 1k
    queries and latency over all ``asked``; family, constraints met). ``weak_model``: why the
    model is too weak for the comparison to say how a stronger one would compare (the text leads
    with it; ``analysis.answers.weak_model_line``), None when it is not; ``empty_answers``: a
    line per variant with too many empty answers (``analysis.answers.count_empty_answers``)."""

    text: str
    choice: str | None
    reason: str
    metric: str
    opponent: str | None = None
    leaning: str | None = None
    compared: tuple[str, str] | None = None
    test: str | None = None
    p_value: float | None = None
    diff: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    n_pairs: int | None = None
    comparisons: int = 1
    margin: float = 0.05
    cost_ratio: float | None = None
    cost_ratio_low: float | None = None
    cost_ratio_high: float | None = None
    baseline: str | None = None
    more_questions: int | None = None
    binding: tuple[str, ...] = ()
    break_even_questions: int | None = None
    cost: str = "dollars"
    weak_model: str | None = None
    empty_answers: tuple[str, ...] = ()
    # a sequential run's look: boundary (critical value), statistic, comparisons, fraction
    sequential: LookSummary | None = field(default=None, compare=False)
    conditions: Conditions = field(default_factory=lambda: Conditions(), compare=False)
    variants: pd.DataFrame | None = field(default=None, repr=False, compare=False)
    detail: pd.DataFrame | None = field(default=None, repr=False, compare=False)

    @property
    def conditions_text(self) -> str:
        c = self.conditions
        dated = f" (dated {c['price_sheet_date']})" if c.get("price_sheet_date") else ""
        parts = [
            f"model {c['model']}" if c.get("model") else "",
            c.get("context", ""),
            _questions_text(c),
            f"price sheet {c['price_sheet']}{dated}" if c.get("price_sheet") else "",
        ]
        parts = [p for p in parts if p]
        own = [
            f"{label} answered from its own index, not the run's documents."
            for label in c.get("own_index") or ()
        ]
        judged = [judge_text(c["judge"])] if c.get("judge") else []
        return " ".join([f"Holds for {', '.join(parts)}."] * bool(parts) + own + judged)

    def __str__(self) -> str:
        return "\n".join(filter(None, [self.text, self.conditions_text]))

    def _repr_markdown_(self) -> str:
        tail = f"\n\n<small>{self.conditions_text}</small>" if self.conditions_text else ""
        return f"**Verdict:** {self.text}{tail}"


# ------------------------------------------------------------------------------ the sides


def _rank(sub: pd.DataFrame, higher: bool) -> list[str]:
    """Labels best first: score, then less machinery, then cheaper, then config order."""
    order = {lb: i for i, lb in enumerate(sub.index)}
    return sorted(
        sub.index,
        key=lambda lb: (
            -_score_at(sub, lb) if higher else _score_at(sub, lb),
            len(_machinery_at(sub, lb)),
            sub.loc[lb, "cost_per_1k"],
            order[lb],
        ),
    )


def _champion(sub: pd.DataFrame, higher: bool, fmt: _Fmt) -> tuple[str, list[str]]:
    """A family's best variant, with why where a simpler one stood in for another: equal
    scores, or a Self-Route that never routed (its twin RAG did the same)."""
    ranked = _rank(sub, higher)
    top, notes = ranked[0], []
    for other in ranked[1:]:
        score, machinery = _score_at(sub, other), _machinery_at(sub, other)
        if abs(score - _score_at(sub, top)) > 1e-12 or not machinery:
            continue
        if sub.loc[other, "never_routed"]:
            notes.append(
                f"{other} also scored {fmt.score(score)} but never routed "
                f"(every answer came from its RAG step): {top} does the same without "
                "the routing step"
            )
        elif len(machinery) > len(_machinery_at(sub, top)):
            notes.append(
                f"{other} also scored {fmt.score(score)} but adds "
                f"{' and '.join(machinery)}: {top} is the simpler"
            )
    if sub.loc[top, "never_routed"]:
        twin = sub.loc[top, "twin"]
        seen = (
            f", against {fmt.score(_score_at(sub, twin))} for {twin}"
            if (isinstance(twin, str) and twin in sub.index)
            else ""
        )
        notes.append(
            f"{top} never routed: every answer came from its RAG step, whose prompt "
            f"(with its 'unanswerable' option) scored {fmt.score(_score_at(sub, top))}"
            f"{seen}"
        )
    return top, notes


def _break_even(
    df: pd.DataFrame, table: pd.DataFrame, choice: str, lc: str, sheet: str | None
) -> int | None:
    """Questions per document from which ``lc`` (long context) with a prefix cache costs no
    more than ``choice`` (a retrieval variant), on ``sheet``; None when the table lacks what
    ``prefix_cache_break_even`` needs (a per-token sheet, the prefix length) or never."""
    if not sheet:
        return None
    no_context = strategies_where(context=NO_CONTEXT)
    sub = df[df["label"].isin([choice, lc]) | df["strategy"].isin(no_context)]
    try:
        result, _ = prefix_cache_break_even(
            sub,
            [sheet],
            long_context=str(table.loc[lc, "strategy"]),
            rag=str(table.loc[choice, "strategy"]),
            closed_book=next(iter(no_context), ""),
        )
    except (ValueError, KeyError, OSError):
        return None
    row = result[result["rag_label"] == choice] if len(result) else result
    if not len(row) or row["lc_cheaper_from"].isna().iloc[0]:
        return None
    return int(row["lc_cheaper_from"].iloc[0])


# ------------------------------------------------------------------------------ the verdict


def verdict(
    df: pd.DataFrame,
    metric: str | None = None,
    min_accuracy: float | None = None,
    max_dollars_per_1k: float | None = None,
    max_latency_s: float | None = None,
    alpha: float = 0.05,
    margin: float = 0.05,
    seed: int = 0,
    n_boot: int = 2000,
    sequential: SequentialState | None = None,
    *,
    weak_floor: float = WEAK_FLOOR,
) -> Verdict:
    """RAG or long context for this table, under the constraints (None or 0: no limit):
    ``min_accuracy`` (the lowest acceptable mean ``metric``; a maximum for lower-is-better
    metrics), ``max_dollars_per_1k`` ($ per 1,000 queries, one-time costs amortised),
    ``max_latency_s`` (mean seconds a user waits, from ``latency_seconds``). ``metric``
    defaults to the table's first metric column; ``alpha``: the level the intervals hold
    together; ``margin``: the loss of ``metric`` (0.05 = 5 points of accuracy) within which a
    cheaper or simpler variant is "not worse" (non-inferiority). Cost is $ per 1k queries, or
    prompt tokens per query when the run had no price sheet. The module docstring has the
    decision; ``Verdict.detail`` every comparison. ``sequential``: the run's group-sequential
    looks (``fractions``: information fraction of each look so far, this one last; ``spending``;
    ``questions``: all the run could ask; ``answered``: asked by this look; ``stopped``: why the
    run stopped, None while it runs), as ``experiment.sequential_run`` records them.
    ``weak_floor``: a model whose every variant's upper 95% bound is below it (or whose closed
    book beats every variant) is too weak to tell: the text leads with that, and with any
    variant more than a tenth of whose answers are empty (``Verdict.weak_model``,
    ``Verdict.empty_answers``)."""
    if not 0 < alpha < 1 or not 0 < margin < 1:
        raise ValueError(f"alpha and margin must be in (0, 1), got {alpha} and {margin}")
    if not 0 <= weak_floor <= 1:
        raise ValueError(
            f"error: weak_floor must be from 0 to 1 (a share of the questions; 0: none), got "
            f"{weak_floor:g}"
        )
    df = with_labels(df)
    check_one_row_each(df)  # two runs concatenated: every pair twice
    metric = _check_metric(df, metric)
    rows = _scored(df, metric)
    if rows.empty:
        raise ValueError(f"no scored rows for {metric!r}: nothing to decide")
    cost = pick_cost(answered_rows(df[df["label"].isin(rows["label"])]))
    higher = _higher_is_better(metric)
    scores = rows[metric].to_numpy(dtype=float)
    fmt = _Fmt(bool(np.isin(scores, (0.0, 1.0)).all()))
    table = annotate(df, variant_table(df, metric, cost))
    limits = parse_limits(min_accuracy, max_dollars_per_1k, max_latency_s, metric, scores)
    if limits["max_dollars_per_1k"] and cost == "prompt_tokens":
        raise ValueError("max_dollars_per_1k needs dollars: the table has none (no price_sheet)")
    checks = constraint_checks(table, metric, higher, fmt, limits)
    table["meets"] = np.logical_and.reduce([c[0] for c in checks.values()] + [table["n"] > 0])
    conditions = run_conditions(df, rows, metric)
    common: _Common = {
        "metric": metric,
        "cost": cost,
        "conditions": conditions,
        "variants": table,
        "margin": margin,
    }

    weak = weak_model_line(df, table, metric, weak_floor, seed)
    empty = [e.text for e in count_empty_answers(df)]
    eligible = table[table["meets"]]
    if eligible.empty:
        binding = binding_constraints(checks, table.index)
        text = "No variant meets the constraints: " + "; ".join(checks[b][1] for b in binding)
        none = Verdict(text + ".", None, "none_meets_constraints", binding=binding, **common)
        return _caveats(none, weak, empty)

    ctx = _Context(
        df,
        table,
        eligible,
        checks,
        fmt,
        higher,
        metric,
        cost,
        alpha,
        margin,
        seed,
        n_boot,
        conditions,
        sequential,
    )
    return _caveats(ctx.decide(common), weak, empty)


def _caveats(v: Verdict, weak: str | None, empty: list[str]) -> Verdict:
    """``v`` led by what the answers say about the model: too weak to tell (its recommendation
    then stands only for this model: ``weak_model`` marks it), too many empty answers."""
    weak, empty = _sentence(weak) if weak else None, [_sentence(line) for line in empty]
    if not weak and not empty:
        return v
    text = " ".join([*([weak] if weak else []), *empty, v.text])
    return dataclasses.replace(v, text=text, weak_model=weak, empty_answers=tuple(empty))


def _sentence(line: str) -> str:
    return line[:1].upper() + line[1:] + "."


@dataclass
class _Context:
    """One verdict's inputs, so each step is a short method."""

    df: pd.DataFrame
    table: pd.DataFrame
    eligible: pd.DataFrame
    checks: dict
    fmt: _Fmt
    higher: bool
    metric: str
    cost: str
    alpha: float
    margin: float
    seed: int
    n_boot: int
    conditions: Conditions
    sequential: SequentialState | None = None

    @property
    def per(self) -> str:
        return "per 1k queries" if self.cost != "prompt_tokens" else "per query"

    def cost_of(self) -> dict[str, str]:
        costs = self.table["cost_per_1k"]
        return {str(lb): _cost_text(self.cost, v) for lb, v in costs.items()}

    def score(self, label: str) -> str:
        return self.fmt.score(_score_at(self.table, label))

    def good(self, labels: list[str]) -> pd.DataFrame:
        """Paired scores, oriented so that higher is better."""
        wide = paired_scores(self.df, self.metric, labels)
        return wide if self.higher else -wide

    def difference(self, x: str, y: str, comparisons: int) -> Comparison:
        wide = self.good([x, y])
        # an independent stream per pair, fixed by ``seed`` and the two labels
        stream = [self.seed, zlib.crc32(x.encode()), zlib.crc32(y.encode())]
        r = paired_difference(
            wide[x], wide[y], self.alpha, comparisons, self.fmt.binary, self.n_boot, stream
        )
        return Comparison.of(x, y, r)

    def seq_comparisons(self) -> int:
        """A sequential run's Bonferroni count: every retrieval x long-context pair (with one
        family, every pair of contenders), since the best of a family may change between looks,
        plus the baseline line."""
        fam = self.table["family"]
        r, lc = int((fam == RETRIEVAL).sum()), int((fam == LONG_CONTEXT).sum())
        pairs = r * lc if r and lc else (r + lc) * (r + lc - 1) // 2
        return max(1, pairs) + int((fam == BASELINE).any())

    def repeated(self, x: str, y: str, comparisons: int) -> Comparison:
        """``x - y`` with its repeated confidence interval at the last look's critical value
        (``analysis.sequential``), in ``paired_difference``'s shape, plus the look
        (``boundary``, ``z``, its number and fraction)."""
        seq: SequentialState = self.sequential or {}
        fractions = list(seq["fractions"])
        spending = seq.get("spending", "obrien_fleming")
        crit = boundaries(fractions, self.alpha / comparisons, spending)[-1]
        wide = self.good([x, y])
        r = repeated_interval(wide[x], wide[y], crit, self.fmt.binary, self.margin)
        nominal = float(2 * NormalDist().cdf(-crit))  # the level one look's interval holds
        p = float(2 * NormalDist().cdf(-abs(r["z"])))
        # boundary, z, the look's number and fraction, spending, the level one look holds
        look = SequentialLook(
            r["boundary"], r["z"], len(fractions), fractions[-1], spending, 1 - nominal
        )
        return Comparison(
            a=x,
            b=y,
            n=r["n"],
            diff=r["diff"],
            ci_low=r["ci_low"],
            ci_high=r["ci_high"],
            p_value=min(1.0, p * comparisons),
            p_raw=p,
            significant=bool(r["ci_low"] > 0 or r["ci_high"] < 0),
            a_only=r["a_only"],
            b_only=r["b_only"],
            sd=r["sd"],
            test="tango" if self.fmt.binary else "paired_z",
            comparisons=comparisons,
            level=nominal * comparisons,
            look=look,
        )

    def stop_note(self, n_pairs: int) -> str:
        """When a sequential run stopped: decided early, at the budget, or out of questions."""
        seq = self.sequential or {}
        why, of = seq.get("stopped"), seq.get("questions")
        if not why or not of:
            return ""
        asked = seq.get("answered", n_pairs)
        looks = len(seq.get("fractions", ()))
        test = (
            f"a group-sequential test, {SPENDING_NAMES.get(str(seq.get('spending')), '')} alpha "
            f"spending, {counted(looks, 'look')}"
        )
        if why == "decided":
            return f"Decided after {asked:,} of {counted(of, 'question')} ({test})."
        if why == "budget":
            return f"Stopped at the budget after {asked:,} of {counted(of, 'question')} ({test})."
        return f"Not decided after all {counted(of, 'question')} ({test})."

    def out_note(self, fam: str, present: set) -> str:
        """Why a family is missing from the comparison."""
        members = self.table[self.table["family"] == fam]
        if members.empty:
            return f"No {fam} variant in the table."
        best = _rank(members, self.higher)[0]
        failed = [self.checks[n][2] for n in self.checks if not self.checks[n][0][best]]
        return f"{best}, the best {fam} variant, does not meet {' and '.join(failed)}."

    def baseline_line(self, x: str, comparisons: int) -> tuple[str, Comparison | None, str | None]:
        base = self.table[self.table["family"] == BASELINE]
        if base.empty or x in base.index:
            return "", None, None
        b = _rank(base, self.higher)[0]
        r = self.difference(x, b, comparisons)
        ev = _evidence(r, self.fmt, self.alpha, x, b)
        head = f"Without the documents, {b} scores {self.score(b)}"
        if r.ci_low > 0:
            text = f"{head}: the documents matter ({ev})."
        elif r.ci_high < 0:
            text = f"{head}, more than {x}: the documents hurt these answers ({ev})."
        elif r.ci_high < self.margin:
            text = (
                f"{head}, within {self.fmt.size(self.margin)} of {x}: the documents do not "
                f"matter for these questions ({ev})."
            )
        else:
            text = f"{head}; whether the documents matter is not yet shown ({ev})."
        return text, r, b

    def truncation_note(self, labels: tuple[str, ...]) -> str:
        cut = self.conditions.get("truncated") or 0.0
        lc = [lb for lb in labels if self.table.loc[lb, "family"] == LONG_CONTEXT]
        if cut <= MOST or not lc:
            return ""
        return (
            f"{lc[0]} cut {cut:.0%} of the corpus to fit the window: it answered from "
            f"{1 - cut:.0%} of the documents."
        )

    def decide(self, common: _Common) -> Verdict:
        el, fmt = self.eligible, self.fmt
        contenders = el[el["family"] != BASELINE]
        sides, notes = {}, []
        for fam in (RETRIEVAL, LONG_CONTEXT):
            sub = contenders[contenders["family"] == fam]
            if len(sub):
                sides[fam], why = _champion(sub, self.higher, fmt)
                notes += why
        missing = [f for f in (RETRIEVAL, LONG_CONTEXT) if f not in sides]
        if len(sides) == 2:
            x, y = sides[RETRIEVAL], sides[LONG_CONTEXT]
        else:
            ranked = _rank(contenders, self.higher) if len(contenders) else []
            if len(ranked) < 2:
                return self.only(
                    ranked[0] if ranked else _rank(el, self.higher)[0], common, notes, missing
                )
            x = next(iter(sides.values()), ranked[0])
            y = next(lb for lb in ranked if lb != x)
        if len(sides) < 2:
            notes += [self.out_note(f, set(sides)) for f in missing]
        return self.headline(x, y, common, notes)

    def only(self, x: str, common: _Common, notes: list[str], missing: list[str]) -> Verdict:
        kind = (
            "variant"
            if x in self.table.index[self.table["family"] == BASELINE]
            or not ((self.table["family"] == BASELINE).any())
            else "retrieval or long-context variant"
        )
        only = f"the only {kind}" + (
            " that meets the constraints" if self.checks else " in the table"
        )
        base, r, b = self.baseline_line(x, 1)
        text = (
            f"Use {x}: {only}, {self.metric} {self.score(x)} at {self.cost_of()[x]} "
            f"{self.per}; nothing to compare it with."
        )
        extra = (
            [self.out_note(f, set()) for f in missing if self.table.loc[x, "family"] != f]
            if self.checks
            else []
        )
        text = " ".join([text, *[n.rstrip(".") + "." for n in notes], *extra, base]).strip()
        detail = self.detail([r] if r else [], [x])
        return Verdict(text, x, "only_variant", baseline=b, detail=detail, **common)

    def headline(self, x: str, y: str, common: _Common, notes: list[str]) -> Verdict:
        fmt, t = self.fmt, self.table
        cost_of = self.cost_of()
        has_base = (t["family"] == BASELINE).any()
        m = 2 if has_base else 1
        if self.sequential:
            m = self.seq_comparisons()
        cr = cost_ratio(self.df, self.cost, x, y, self.n_boot, self.seed)
        if _same_cost(cr[1], cr[2]):  # the simpler first; at equal machinery the more accurate
            sign = 1 if self.higher else -1
            keys = {lb: (len(_machinery_at(t, lb)), -sign * _score_at(t, lb)) for lb in (x, y)}
            c, d = (y, x) if keys[y] < keys[x] else (x, y)
        else:
            c, d = (x, y) if cr[0] < 1 else (y, x)
        if (c, d) != (x, y):
            cr = cost_ratio(self.df, self.cost, c, d, self.n_boot, self.seed)
        r = self.repeated(c, d, m) if self.sequential else self.difference(c, d, m)
        leaning, more, choice = None, None, None
        simpler = _same_cost(cr[1], cr[2]) and len(_machinery_at(t, c)) < len(_machinery_at(t, d))
        if r.ci_low > 0:
            choice, reason, other = c, "more_accurate", d
        elif r.ci_high < 0:
            choice, reason, other = d, "more_accurate", c
        elif r.ci_low > -self.margin:
            choice, reason, other = c, "not_worse", d
        else:
            reason, other = "undecided", d
            sign = 1 if self.higher else -1
            leaning = c if sign * _score_at(t, c) >= sign * _score_at(t, d) else None
            more, what = questions_to_decide(r, self.margin, fmt.binary)
        sign = 1 if self.higher else -1
        ahead_of_pair = c if sign * _score_at(t, c) >= sign * _score_at(t, d) else d
        base, rb, b = self.baseline_line(choice or ahead_of_pair, m)
        if choice == d:  # the dearer (or more elaborate) one wins: flip the evidence to it
            r = r.flipped()
            cr = cost_ratio(self.df, self.cost, d, c, self.n_boot, self.seed)
        x_, y_ = r.a, r.b
        ev = _evidence(r, fmt, self.alpha, x_, y_)
        cost = _cost_phrase(x_, y_, cr, cost_of, self.per)
        on = f"on {self.metric} ({self.score(x_)} vs {self.score(y_)})"
        if reason == "more_accurate":
            text = f"Use {x_} rather than {y_}: more accurate {on}, {cost}."
        elif reason == "not_worse":
            also = f", and simpler ({y_} adds {' and '.join(_machinery_at(t, y_))})" * simpler
            text = (
                f"Use {x_} rather than {y_}: not worse by more than "
                f"{fmt.size(self.margin)} {on}, {cost}{also}."
            )
        else:
            shows = (
                f"whether {x_} is within {fmt.size(self.margin)} of {y_}"
                if what == "within"
                else f"whether {y_} is more accurate"
            )
            decide = (
                (
                    f"about {counted(more, 'more question')} would show {shows} (80% power at the "
                    f"observed difference)"
                )
                if more
                else "more questions would decide"
            )
            if leaning:
                tied = abs(_score_at(t, x_) - _score_at(t, y_)) <= 1e-12
                stands = _standing(x_, y_, self.metric, self.score(x_), self.score(y_), tied)
                text = (
                    f"Not decided yet: {stands}, {cost}, but "
                    f"{counted(r.n, 'question')} cannot yet show it is not worse by more than "
                    f"{fmt.size(self.margin)}; {decide}."
                )
            else:
                on = f"on {self.metric} ({self.score(y_)} vs {self.score(x_)})"
                text = (
                    f"Not decided yet between {x_} and {y_}: {y_} scores higher {on} and "
                    f"{x_} is {cost}; {decide}."
                )
        text += f" Evidence: {ev}."
        q, cache = self.cache_note(choice, other, reason)
        parts = [
            text,
            self.stop_note(r.n),
            *[n.rstrip(".") + "." for n in notes],
            self.truncation_note((x_, y_)),
            base,
            cache,
        ]
        detail = self.detail([r, *([rb] if rb else [])], [x_, y_])
        return Verdict(
            " ".join(p for p in parts if p),
            choice,
            reason,
            opponent=other,
            leaning=leaning,
            compared=(x_, y_),
            test=r.test,
            p_value=r.p_value,
            diff=r.diff,
            ci_low=r.ci_low,
            ci_high=r.ci_high,
            n_pairs=r.n,
            comparisons=m,
            cost_ratio=cr[0],
            cost_ratio_low=cr[1],
            cost_ratio_high=cr[2],
            baseline=b,
            more_questions=more,
            break_even_questions=q,
            detail=detail,
            **common,
            sequential=LookSummary(
                boundary=r.look.boundary,
                z=r.look.z,
                comparisons=r.comparisons,
                look=r.look.look,
                fraction=r.look.fraction,
                spending=r.look.spending,
            )
            if r.look
            else None,
        )

    def cache_note(self, choice: str | None, other: str, reason: str) -> tuple[int | None, str]:
        """Where retrieval is used and long context is as accurate but dearer: the questions
        per document from which a prefix cache makes long context no dearer."""
        t = self.table
        if (
            reason != "not_worse"
            or choice is None
            or t.loc[choice, "family"] != RETRIEVAL
            or t.loc[other, "family"] != LONG_CONTEXT
        ):
            return None, ""
        sheet = self.conditions.get("price_sheet")
        q = _break_even(self.df, t, choice, other, sheet)
        if q is None or q <= 1:
            return None, ""
        return q, (
            f"With a prefix cache ({sheet} prices), {other} costs no more than {choice} "
            f"from {q:,} questions per document on."
        )

    def detail(self, used: list[Comparison], shown: list[str]) -> pd.DataFrame:
        """Every comparison: the verdict's own first (the numbers its sentence quotes), then
        every other pair of variants, Bonferroni-adjusted over those pairs; each row's interval
        and p from one procedure, its cost ratio, and the questions that would decide it."""
        import pandas as pd

        labels = list(self.table.index)
        done = {frozenset((r.a, r.b)) for r in used}
        others = [
            (a, b)
            for i, a in enumerate(labels)
            for b in labels[i + 1 :]
            if frozenset((a, b)) not in done
        ]
        rows = [("verdict" if i == 0 else "baseline", r) for i, r in enumerate(used)]
        rows += [("other pair", self.difference(a, b, len(others))) for a, b in others]
        out = []
        for role, r in rows:
            a, b = r.a, r.b
            cr = cost_ratio(self.df, self.cost, a, b, self.n_boot, self.seed)
            if r.ci_low > 0 or r.ci_high < 0:
                decision = f"{a if r.ci_low > 0 else b} more accurate"
            elif r.ci_low > -self.margin and r.ci_high < self.margin:
                decision = f"equivalent within {self.fmt.size(self.margin)}"
            elif r.ci_low > -self.margin:
                decision = f"{a} not worse by more than {self.fmt.size(self.margin)}"
            elif r.ci_high < self.margin:
                decision = f"{b} not worse by more than {self.fmt.size(self.margin)}"
            else:
                decision = "undecided"
            more = (
                questions_to_decide(r, self.margin, self.fmt.binary)[0]
                if decision == "undecided"
                else None
            )
            out.append(
                {
                    "role": role,
                    "a": a,
                    "b": b,
                    "n": r.n,
                    "mean_a": _score_at(self.table, a),
                    "mean_b": _score_at(self.table, b),
                    "diff": r.diff if self.higher else -r.diff,
                    "ci_low": r.ci_low if self.higher else -r.ci_high,
                    "ci_high": r.ci_high if self.higher else -r.ci_low,
                    "ci_level": r.look.ci_level if r.look else 1 - self.alpha / r.comparisons,
                    "comparisons": r.comparisons,
                    "p_value": r.p_value,
                    "significant": r.significant,
                    "decision": decision,
                    "more_questions": more,
                    "cost_ratio": cr[0],
                    "cost_ratio_low": cr[1],
                    "cost_ratio_high": cr[2],
                    "test": r.test,
                    "a_only": r.a_only,
                    "b_only": r.b_only,
                }
            )
        table = pd.DataFrame(out)
        method = (
            "Tango's score interval and test (0/1 scores; its test at 0 is McNemar's)"
            if self.fmt.binary
            else f"a paired bootstrap (interval and p from the same {self.n_boot:,} resamples)"
        )
        table.attrs["metric"] = self.metric
        table.attrs["notes"] = [
            f"diff = a - b on {self.metric}; interval and p from {method}, Bonferroni-adjusted "
            "over the row's comparisons (the verdict's: its sentence; the other pairs: each "
            f"other), so an interval excludes 0 exactly when p < {self.alpha:g}",
            f"not worse: the interval's lower end above -{self.fmt.size(self.margin)}; "
            "more_questions: 80% power at the observed difference; cost_ratio: mean cost per "
            "query of a over b, 95% bootstrap interval",
        ]
        return table


def sequential_look(df: pd.DataFrame, state: SequentialState) -> Verdict:
    """A sequential run's look (``experiment.sequential_run``): the verdict on the records so
    far at the look's boundary, with the design's ``alpha``, ``margin`` and ``seed`` from
    ``state`` (no constraints: the reader's, applied when the verdict is read)."""
    return verdict(
        df, alpha=state["alpha"], margin=state["margin"], seed=state["seed"], sequential=state
    )
