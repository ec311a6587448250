"""Paired comparison: every pair of variants on the same questions, each difference's interval
and p-value from one procedure (the verdict's: Tango's score interval for 0/1 scores, a paired
bootstrap otherwise), Bonferroni over the pairs, and a plain-language decision."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypedDict, cast

import numpy as np
from numpy.typing import ArrayLike

from ragbench.analysis._common import _check_metric, _higher_is_better, counted, paired_scores
from ragbench.registry import unknown

if TYPE_CHECKING:
    import pandas as pd

ADJUSTMENTS = ("bonferroni", "none")

# ``np.random.default_rng``'s seed: an int, or several (an independent stream per pair)
Seed = int | Sequence[int]


class PairedDifference(TypedDict):
    """``paired_difference``'s result (a dict, read by key)."""

    n: int
    diff: float
    ci_low: float
    ci_high: float
    p_value: float  # Bonferroni-adjusted over ``comparisons``
    p_raw: float
    significant: bool
    a_only: int
    b_only: int
    sd: float
    test: str  # "tango" or "paired_bootstrap" ("paired_z": a sequential look's)
    comparisons: int
    level: float


@dataclass(frozen=True)
class SequentialLook:
    """A sequential run's look behind a comparison: the critical value (``boundary``), the
    statistic ``z`` at no difference, the look's number and information fraction, the spending
    function and the level one look's interval holds (``ci_level``)."""

    boundary: float
    z: float
    look: int
    fraction: float
    spending: str
    ci_level: float


@dataclass(frozen=True)
class Comparison:
    """``a - b`` on paired scores, as the verdict quotes it: ``paired_difference``'s numbers
    (or a sequential look's repeated interval, ``look``) with the two labels."""

    a: str
    b: str
    n: int
    diff: float
    ci_low: float
    ci_high: float
    p_value: float
    p_raw: float
    significant: bool
    a_only: int
    b_only: int
    sd: float
    test: str
    comparisons: int
    level: float
    look: SequentialLook | None = None

    @classmethod
    def of(cls, a: str, b: str, r: PairedDifference) -> Comparison:
        return cls(a=a, b=b, **r)

    def flipped(self) -> Comparison:
        """``b - a``: the same evidence read the other way."""
        look = self.look and replace(self.look, z=-self.look.z)
        return replace(
            self,
            a=self.b,
            b=self.a,
            diff=-self.diff,
            ci_low=-self.ci_high,
            ci_high=-self.ci_low,
            a_only=self.b_only,
            b_only=self.a_only,
            look=look,
        )


def compare(
    df: pd.DataFrame,
    metric: str | None = None,
    level: float = 0.05,
    n_boot: int = 2000,
    seed: int = 0,
    labels: Iterable[str] | None = None,
    adjust: str = "bonferroni",
) -> pd.DataFrame:
    """Every pair of variants on the questions both answered (inner join on ``example_id``),
    on ``metric`` (default: the table's first metric column, the config's first metric).

    One row per pair (a, b), in config order: ``n`` paired questions, ``mean_a``, ``mean_b``,
    ``diff`` (= mean_a - mean_b) with its interval (``ci_low``, ``ci_high``), ``a_only``/
    ``b_only`` (questions where a scored higher / b scored higher), ``test`` and ``p_value``
    (the raw p), ``p_adjusted`` and ``significant``; ``winner`` names the better variant only
    where the difference is significant (lower is better for metrics that say so). ``decide``
    turns the table into sentences.

    Interval and p come from one procedure, the verdict's (``paired_difference``): Tango's score
    interval and its test at 0 (McNemar's) when every score is 0 or 1, else a paired bootstrap
    read both ways from the same resamples. With ``adjust="bonferroni"`` (the default) each
    interval is at ``1 - level / pairs`` and ``p_adjusted`` is ``pairs`` times the raw p, so the
    intervals hold together at ``1 - level``; ``"none"``: each at ``1 - level``. Either way
    "significant", "the interval excludes 0" and "p_adjusted < level" are one statement: the
    table can never show an interval that excludes 0 beside a p over ``level``.
    """
    import pandas as pd

    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if adjust not in ADJUSTMENTS:
        raise unknown("p-value adjustment", adjust, ADJUSTMENTS)
    metric = _check_metric(df, metric)
    wide = paired_scores(df, metric, labels)
    values = wide.to_numpy()
    binary = bool(np.isin(values[~np.isnan(values)], (0.0, 1.0)).all())
    higher = _higher_is_better(metric)
    cols = list(wide.columns)
    pairs = len(cols) * (len(cols) - 1) // 2
    comparisons = pairs if adjust == "bonferroni" else 1
    rows = []
    for i, a in enumerate(cols):
        for b in cols[i + 1 :]:
            both = wide[[a, b]].dropna()
            x, y = both[a].to_numpy(), both[b].to_numpy()
            # an independent stream per pair, still fixed by ``seed``: adding a variant to the
            # run does not change the other pairs' resamples
            r = paired_difference(
                x, y, level, comparisons, binary, n_boot, [seed, i, cols.index(b)]
            )
            rows.append(
                {
                    "a": a,
                    "b": b,
                    "n": r["n"],
                    "mean_a": float(x.mean()) if x.size else float("nan"),
                    "mean_b": float(y.mean()) if y.size else float("nan"),
                    "diff": r["diff"],
                    "ci_low": r["ci_low"],
                    "ci_high": r["ci_high"],
                    "a_only": r["a_only"],
                    "b_only": r["b_only"],
                    "test": r["test"],
                    "p_value": r["p_raw"],
                    "p_adjusted": r["p_value"],
                    "significant": r["significant"],
                }
            )
    table = pd.DataFrame(
        rows,
        columns=[
            "a",
            "b",
            "n",
            "mean_a",
            "mean_b",
            "diff",
            "ci_low",
            "ci_high",
            "a_only",
            "b_only",
            "test",
            "p_value",
            "p_adjusted",
            "significant",
        ],
    )
    table["significant"] = table["significant"].astype(bool)
    better_a = (table["diff"] > 0) == higher
    table["winner"] = [
        (a if up else b) if sig else None
        for a, b, up, sig in zip(
            table["a"], table["b"], better_a, table["significant"], strict=True
        )
    ]
    table.attrs.update(
        metric=metric,
        level=level,
        adjust=adjust,
        binary=binary,
        n_boot=n_boot,
        comparisons=comparisons,
    )
    return table


def _signed(cell: object) -> str:
    x = float(cast("float", cell))
    return "nan" if math.isnan(x) else f"{x:+.3f}"


def decide(table: pd.DataFrame) -> str:
    """Sentences from a ``compare`` table: one per pair, naming a winner only where the
    difference is significant, then an overall verdict (a variant that significantly beats every
    other one, or none)."""
    if not len(table):
        return "nothing to compare: fewer than two variants"
    metric = table.attrs.get("metric", "metric")
    level = table.attrs.get("level", 0.05)
    comparisons = table.attrs.get("comparisons", 1)
    adjusted = comparisons > 1
    conf = f"{100 * (1 - level / comparisons):.4g}% CI"
    lines = []
    for row in table.itertuples(index=False):
        test = "Tango score test" if row.test == "tango" else "paired bootstrap"
        p = f"{test} p={row.p_value:.3g}" + (
            f", Bonferroni x{comparisons} {row.p_adjusted:.3g}" if adjusted else ""
        )
        stats = (
            f"{metric} {row.a} - {row.b} = {_signed(row.diff)} "
            f"({conf} {_signed(row.ci_low)} to {_signed(row.ci_high)}; {p}; "
            f"{counted(int(cast('int', row.n)), 'paired question')})"
        )
        if isinstance(row.winner, str):  # None: no winner (pandas may store it as NaN)
            loser = str(row.b if row.winner == row.a else row.a)
            lines.append(f"{row.winner} beats {loser}: {stats}")
        else:
            lines.append(f"{row.a} vs {row.b}: no significant difference at {level:g}: {stats}")
    variants = list(dict.fromkeys([*table["a"], *table["b"]]))
    wins = table["winner"].dropna().value_counts()
    best = [v for v in variants if wins.get(v, 0) == len(variants) - 1]
    if best:
        lines.append(f"=> {best[0]} is significantly better than every other variant on {metric}")
    else:
        lines.append(
            f"=> no variant is significantly better than all others on {metric} at {level:g}"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------ one procedure per difference
#
# The verdict quotes a difference's interval and its p-value side by side, so both come from one
# procedure: the interval is the set of differences the test does not reject, and the p-value is
# the test of "no difference" (0/1 scores: Tango's score interval, whose test at 0 is McNemar's
# score test; other scores: a paired bootstrap whose interval and p read the same resampled
# means). Hence "the interval excludes 0" and "p < level" are the same statement, at any level.


def _tango_z(a_only: int, b_only: int, n: int, delta: float) -> float:
    """Tango's (1998) score statistic for ``H0: p_a - p_b = delta`` on paired 0/1 outcomes:
    ``(a_only - b_only - n delta) / sqrt(n (2 q + delta (1 - delta)))`` with ``q`` the
    maximum-likelihood estimate of P(a wrong, b right) under H0 (a closed form; tests check it
    against a numerical maximum). At ``delta = 0`` it is McNemar's ``(b - c) / sqrt(b + c)``."""
    big_a = 2.0 * n
    big_b = -a_only - b_only + (2.0 * n - a_only + b_only) * delta
    big_c = -b_only * delta * (1.0 - delta)
    q = (math.sqrt(max(big_b * big_b - 4.0 * big_a * big_c, 0.0)) - big_b) / (2.0 * big_a)
    var = n * (2.0 * q + delta * (1.0 - delta))
    top = a_only - b_only - n * delta
    if var <= 0:
        return 0.0 if top == 0 else math.copysign(math.inf, top)
    return top / math.sqrt(var)


def tango(a_only: int, b_only: int, n: int, level: float = 0.05) -> tuple[float, float, float]:
    """(ci_low, ci_high, p) for the difference of two paired proportions, ``p_a - p_b``, from
    ``n`` pairs of which ``a_only`` had only a right and ``b_only`` only b right: Tango's score
    interval (Stat Med 1998;17:891-908) at ``1 - level``, found by inverting the score test
    (``scipy.optimize.brentq``), and the score test's two-sided p at 0 (McNemar's asymptotic
    test; 1 when no pair is discordant). The interval is right at small n (it never collapses to
    a point, even with no discordant pair) and contains 0 exactly when ``p >= level``."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    if n < 1:
        return float("nan"), float("nan"), float("nan")
    crit = float(norm.ppf(1 - level / 2))
    z0 = _tango_z(a_only, b_only, n, 0.0) if a_only + b_only else 0.0
    p = float(min(1.0, 2 * norm.sf(abs(z0))))
    est = (a_only - b_only) / n
    eps = 1e-12

    def bound(target: float, lo: float, hi: float, edge: float) -> float:
        f = lambda d: _tango_z(a_only, b_only, n, d) - target  # noqa: E731
        if f(edge) * (1 if edge == lo else -1) <= 0:  # the test never rejects out to the edge
            return -1.0 if edge < 0 else 1.0
        return float(brentq(f, lo, hi, xtol=1e-12))

    low = bound(crit, -1 + eps, est, -1 + eps) if est > -1 + eps else -1.0
    high = bound(-crit, est, 1 - eps, 1 - eps) if est < 1 - eps else 1.0
    return low, high, p


def bootstrap_difference(
    diffs: ArrayLike, n_boot: int = 2000, seed: Seed = 0, level: float = 0.05
) -> tuple[float, float, float]:
    """(ci_low, ci_high, p) for the mean of per-question differences from one set of paired
    resamples (``paired_bootstrap``'s draws): the interval's ends are order statistics of the
    resampled means, the ``ceil(n_boot * level / 2)``-th from each end, and ``p`` is twice the
    smaller share of resampled means at or beyond 0 on either side. With ends taken this way (no
    interpolation), ``ci_low > 0`` exactly when the share at or below 0 is under ``level / 2``,
    so the interval excludes 0 exactly when ``p < level``."""
    d = np.asarray(diffs, dtype=float)
    if d.size < 2 or n_boot < 1:
        value = float(d[0]) if d.size == 1 else float("nan")
        return value, value, float("nan")
    rng = np.random.default_rng(seed)
    means = np.sort(d[rng.integers(0, d.size, size=(n_boot, d.size))].mean(axis=1))
    k = max(1, math.ceil(n_boot * level / 2 - 1e-9))
    lo, hi = float(means[k - 1]), float(means[n_boot - k])
    p = min(1.0, 2 * min(float(np.mean(means <= 0)), float(np.mean(means >= 0))))
    return lo, hi, p


def paired_difference(
    x: ArrayLike,
    y: ArrayLike,
    level: float = 0.05,
    comparisons: int = 1,
    binary: bool | None = None,
    n_boot: int = 2000,
    seed: Seed = 0,
) -> PairedDifference:
    """``mean(x) - mean(y)`` over paired scores (NaN pairs dropped) with its interval and p from
    one procedure (``tango`` for 0/1 scores, else ``bootstrap_difference``), Bonferroni-adjusted
    for ``comparisons``: the interval is at ``1 - level / comparisons`` (together the intervals
    of that many comparisons cover at ``1 - level``) and ``p_value`` is ``comparisons`` times
    the raw p (capped at 1). So ``significant`` (``p_value < level``) is "the interval excludes
    0". Also: ``n``, ``a_only``/``b_only`` (pairs where x / y scored higher), ``sd`` of the
    per-question differences, ``test`` (``tango`` or ``paired_bootstrap``)."""
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = ~(np.isnan(a) | np.isnan(b))
    a, b = a[keep], b[keep]
    d = a - b
    if binary is None:
        binary = bool(np.isin(np.concatenate([a, b]), (0.0, 1.0)).all())
    each = level / max(1, comparisons)
    a_only, b_only = int((d > 0).sum()), int((d < 0).sum())
    if binary:
        lo, hi, p = tango(a_only, b_only, int(d.size), each)
    else:
        lo, hi, p = bootstrap_difference(d, n_boot, seed, each)
    p_adj = min(1.0, p * max(1, comparisons)) if p == p else p
    return {
        "n": int(d.size),
        "diff": float(d.mean()) if d.size else float("nan"),
        "ci_low": lo,
        "ci_high": hi,
        "p_value": p_adj,
        "p_raw": p,
        "significant": bool(lo > 0 or hi < 0),
        "a_only": a_only,
        "b_only": b_only,
        "sd": float(d.std(ddof=1)) if d.size > 1 else 0.0,
        "test": "tango" if binary else "paired_bootstrap",
        "comparisons": max(1, comparisons),
        "level": level,
    }
