"""Stop when decided: a group-sequential test of a paired difference, with Lan-DeMets alpha
spending, read as repeated confidence intervals (pure math; the run's loop is
``experiment.sequential_run``, the sentence ``analysis.verdict``).

The procedure (Jennison & Turnbull, *Group Sequential Methods*, 2000, ch. 2, 7 and 9):

- Questions come in rounds; after round k, ``n_k`` paired questions have been answered, an
  information fraction ``t_k = n_k / N`` of the ``N`` available.
- The spending function says how much of the two-sided level ``alpha`` may be used by ``t``:
  O'Brien-Fleming type ``2 (2 - 2 Phi(z(1 - alpha/4) / sqrt(t)))`` (each side ``alpha / 2``
  spent as gsDesign's ``sfLDOF`` and ldbounds spend it; almost nothing early, nearly
  the fixed design's critical value at the end) or Pocock type ``alpha ln(1 + (e - 1) t)``
  (evenly spread: stops earlier on large differences, pays at the end). Lan & DeMets (1983),
  Biometrika 70:659-663.
- The critical value ``c_k`` of look k solves "the probability that the standardised statistic
  first leaves (-c_j, c_j) at look k is the level spent between ``t_{k-1}`` and ``t_k``" under
  no difference. The statistics of successive looks are correlated (``corr(Z_j, Z_k) =
  sqrt(t_j / t_k)``: the later look contains the earlier questions), so this is the
  Armitage-McPherson-Rowe (1969) recursion: the density of the score process ``S(t) = Z
  sqrt(t)`` (a Brownian motion under no difference) on the paths still inside the boundaries is
  carried from look to look by numerical integration (Simpson's rule on a grid; ``boundaries``).
  The looks need not be planned: each is computed from the fractions actually seen (a run that
  stops at its budget takes a last look where it stopped).
- At each look the repeated confidence interval is the difference's interval at critical value
  ``c_k`` instead of ``z(1 - alpha/2)``: Tango's score interval for 0/1 scores (``paired.tango``
  at that level), ``mean +- c_k sd / sqrt(n)`` for other scores. Together, the intervals of all
  looks cover the true difference with probability at least ``1 - alpha`` (Jennison & Turnbull
  1989, JRSS B 51:301-361), whatever rule decides when to stop; so any claim read from the
  interval at the look where the run stops holds at level ``alpha``:
  more accurate (the interval excludes 0), equivalent within the margin (it lies inside
  ``(-margin, margin)``), or the cheaper variant not worse (its lower end above ``-margin``).
  Otherwise: continue.

Why it is written here: no maintained Python library computes group-sequential boundaries.
PyPI's ``gsdesign`` (0.1.5, "experimental", development status alpha) ships only the
integration primitives (grid points, first density, density update: the same Jennison-Turnbull
recursion as below), no spending function or boundary search; ``spotify-confidence`` has
sequential tests inside an A/B-testing framework with a large dependency tree. The recursion is
40 lines on scipy; tests check it against published boundaries and against simulation.

``simulate`` runs the whole procedure on simulated paired 0/1 answers (its operating
characteristics: ``benchmarks/sequential.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypedDict

import numpy as np
from numpy.typing import ArrayLike

from ragbench.analysis.power import spread_floor
from ragbench.registry import unknown

SPENDING = ("obrien_fleming", "pocock")
SPENDING_NAMES = {"obrien_fleming": "O'Brien-Fleming", "pocock": "Pocock"}
NEVER = 12.0  # a critical value that no statistic reaches: nothing spent at that look
DECISIONS = ("x_better", "y_better", "equivalent", "x_not_worse", "continue")


def spent(t: float, alpha: float = 0.05, spending: str = "obrien_fleming") -> float:
    """The two-sided level the Lan-DeMets spending function allows by information fraction
    ``t`` (0 at 0, ``alpha`` at 1 and beyond)."""
    from scipy.stats import norm

    if spending not in SPENDING:
        raise unknown("alpha spending", spending, SPENDING)
    t = min(max(float(t), 0.0), 1.0)
    if t == 0:
        return 0.0
    if spending == "pocock":
        return alpha * math.log(1 + (math.e - 1) * t)
    # each side spends the one-sided form at alpha / 2, as gsDesign's sfLDOF and ldbounds do
    return float(min(alpha, 4 * norm.sf(norm.isf(alpha / 4) / math.sqrt(t))))


def _simpson(lo: float, hi: float, step: float) -> tuple[np.ndarray, np.ndarray]:
    """Points and Simpson weights on [lo, hi], spacing at most ``step`` (odd count)."""
    n = max(101, 2 * math.ceil((hi - lo) / step / 2) + 1)
    x = np.linspace(lo, hi, n)
    w = np.ones(n)
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    return x, w * (x[1] - x[0]) / 3.0


def boundaries(
    fractions: Sequence[float] | np.ndarray,
    alpha: float = 0.05,
    spending: str = "obrien_fleming",
) -> list[float]:
    """Two-sided critical values ``c_k`` (on the standardised z scale) of looks at information
    fractions ``fractions`` (increasing, in (0, 1]): the first time ``|Z_k| >= c_k`` has
    probability ``spent(t_k) - spent(t_{k-1})`` under no difference. ``NEVER`` where a look
    may spend nothing (a repeated fraction). Armitage-McPherson-Rowe recursion on the score
    process, Simpson's rule with at most 1/8 of a look's increment SD between grid points."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    t = [min(float(f), 1.0) for f in fractions]
    if not t or t[0] <= 0 or any(b < a for a, b in zip(t, t[1:], strict=False)):
        raise ValueError(f"information fractions must increase within (0, 1], got {fractions}")
    cum = [spent(f, alpha, spending) for f in t]
    out: list[float] = []
    # grid, weights and density of the paths still inside, at the last look
    state: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    prev_t, prev_cum = 0.0, 0.0
    for tk, ck in zip(t, cum, strict=True):
        inc, dt = ck - prev_cum, tk - prev_t
        if inc <= 1e-15 or dt <= 0:
            c = NEVER
        elif state is None:  # the first look: Z_1 is standard normal
            c = min(NEVER, float(norm.isf(inc / 2)))
        else:
            x, w, g = state
            sd = math.sqrt(dt)

            def excess(
                b: float,
                x: np.ndarray = x,
                w: np.ndarray = w,
                g: np.ndarray = g,
                sd: float = sd,
                inc: float = inc,
            ) -> float:
                # the paths still inside that first leave (-b, b) now, less what may be spent
                out = norm.sf((b - x) / sd) + norm.cdf((-b - x) / sd)
                return float(np.sum(w * g * out)) - inc

            top = NEVER * math.sqrt(tk)
            c = NEVER if excess(top) >= 0 else brentq(excess, 1e-9, top, xtol=1e-10) / math.sqrt(tk)
        out.append(float(c))
        b = c * math.sqrt(tk)
        sd = math.sqrt(dt) if dt > 0 else math.sqrt(tk)
        new_x, new_w = _simpson(-b, b, sd / 8)
        if state is None:
            g = norm.pdf(new_x / math.sqrt(tk)) / math.sqrt(tk)
        elif dt > 0:
            x, w, g = state
            kernel = norm.pdf((new_x[:, None] - x[None, :]) / sd) / sd
            g = kernel @ (w * g)
        else:  # no new information: the same paths, cut at the new boundary
            x, _, g = state
            g = np.interp(new_x, x, g)
        state = (new_x, new_w, g)
        prev_t, prev_cum = tk, max(prev_cum, ck)
    return out


# --------------------------------------------------------------------------------- one look


def score_z(a_only: ArrayLike, b_only: ArrayLike, n: ArrayLike, delta: float) -> np.ndarray:
    """Tango's score statistic for ``p_a - p_b = delta`` on paired 0/1 answers
    (``paired._tango_z``, vectorised over arrays of counts): decreasing in ``delta``."""
    a, b, n = (np.asarray(v, dtype=float) for v in (a_only, b_only, n))
    big_a = 2.0 * n
    big_b = -a - b + (2.0 * n - a + b) * delta
    big_c = -b * delta * (1.0 - delta)
    with np.errstate(invalid="ignore", divide="ignore"):
        q = (np.sqrt(np.maximum(big_b**2 - 4.0 * big_a * big_c, 0.0)) - big_b) / (2.0 * big_a)
        var = n * (2.0 * q + delta * (1.0 - delta))
        top = a - b - n * delta
        # no variance under H0 (no discordant pair, delta 0): 0 where the count matches it,
        # else infinitely far, as ``paired._tango_z`` (sign(0) * inf would be NaN)
        edge = np.where(top == 0, 0.0, np.sign(top) * np.inf)
        z = np.where(var > 0, top / np.sqrt(np.where(var > 0, var, 1.0)), edge)
    return np.where(n > 0, z, 0.0)


def decide(ci_low: float, ci_high: float, margin: float) -> str:
    """What the interval of ``x - y`` (``x`` the cheaper or, at the same cost, the simpler
    variant; higher is better) allows, in ``DECISIONS``: ``x_better`` / ``y_better`` (it
    excludes 0), ``equivalent`` (inside ``(-margin, margin)``: x is used), ``x_not_worse``
    (its lower end above ``-margin``), else ``continue``. The verdict decides the same way."""
    if ci_low > 0:
        return "x_better"
    if ci_high < 0:
        return "y_better"
    if ci_low > -margin and ci_high < margin:
        return "equivalent"
    if ci_low > -margin:
        return "x_not_worse"
    return "continue"


def _score_bound(a_only: int, b_only: int, n: int, c: float, lower: bool) -> float:
    from scipy.optimize import brentq

    def f(d: float) -> float:
        return float(score_z(a_only, b_only, n, d)) - (c if lower else -c)

    est, eps = (a_only - b_only) / n, 1e-12
    lo_end, hi_end = (-1 + eps, est) if lower else (est, 1 - eps)
    edge = lo_end if lower else hi_end
    if (f(edge) <= 0) if lower else (f(edge) >= 0):  # never rejected out to the edge
        return -1.0 if lower else 1.0
    if (f(est) > 0) if lower else (f(est) < 0):  # the estimate itself is rejected: c < 0
        return est
    return float(brentq(f, lo_end, hi_end, xtol=1e-12))


class RepeatedInterval(TypedDict):
    """``repeated_interval``'s result (a dict, read by key)."""

    n: int
    a_only: int
    b_only: int
    boundary: float  # the critical value ``c``
    sd: float
    diff: float
    ci_low: float
    ci_high: float
    z: float


class SequentialState(TypedDict, total=False):
    """A sequential run's looks as ``analysis.verdict`` reads them
    (``experiment.sequential_run.Sequential.state``)."""

    fractions: list[float]  # information fraction of each look so far, this one last
    spending: str
    questions: int  # all the run could ask
    answered: int  # asked by this look
    stopped: str | None  # why the run stopped; None while it runs
    alpha: float
    margin: float
    seed: int


class LookSummary(TypedDict):
    """``Verdict.sequential``: a sequential run's look behind the verdict's comparison."""

    boundary: float  # the look's critical value
    z: float  # the statistic at no difference
    comparisons: int
    look: int
    fraction: float  # the look's information fraction
    spending: str


def repeated_interval(
    x: ArrayLike, y: ArrayLike, c: float, binary: bool, margin: float = 0.05
) -> RepeatedInterval:
    """``mean(x) - mean(y)`` (NaN pairs dropped) with its interval at critical value ``c``:
    Tango's score interval for 0/1 scores (``paired.tango`` with ``crit = c``), else ``mean +-
    c sd / sqrt(n)`` with the standard deviation at least ``sqrt(margin (1 - margin))`` (no
    spread seen is no proof of none: ``power.spread_floor``). ``z``: the statistic at
    no difference, so the interval excludes 0 exactly when ``|z| >= c``."""
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = ~(np.isnan(a) | np.isnan(b))
    d = a[keep] - b[keep]
    n = int(d.size)
    a_only, b_only = int((d > 0).sum()), int((d < 0).sum())
    spread = float(d.std(ddof=1)) if n > 1 else 0.0

    def out(diff: float, lo: float, hi: float, z: float) -> RepeatedInterval:
        return RepeatedInterval(
            n=n,
            a_only=a_only,
            b_only=b_only,
            boundary=float(c),
            sd=spread,
            diff=diff,
            ci_low=lo,
            ci_high=hi,
            z=z,
        )

    if n == 0:
        return out(math.nan, -1.0, 1.0, 0.0)
    diff = float(d.mean())
    if binary:
        z = float(score_z(a_only, b_only, n, 0.0)) if a_only + b_only else 0.0
        lo = _score_bound(a_only, b_only, n, c, lower=True)
        hi = _score_bound(a_only, b_only, n, c, lower=False)
    else:
        sd = max(spread, spread_floor(margin))
        se = sd / math.sqrt(n)
        z, lo, hi = diff / se, diff - c * se, diff + c * se
    return out(diff, lo, hi, z)


# --------------------------------------------------------------------------------- simulation


def _counts(rng: np.random.Generator, runs: int, n: int, q10: float, q01: float) -> np.ndarray:
    """Per run, cumulative (x only right, y only right) counts after each question."""
    u = rng.random((runs, n))
    return np.stack([np.cumsum(u < q10, axis=1), np.cumsum((u >= q10) & (u < q10 + q01), axis=1)])


def simulate(
    questions: int = 400,
    rounds: int = 5,
    x_only: float = 0.15,
    y_only: float = 0.15,
    alpha: float = 0.05,
    margin: float = 0.05,
    spending: str = "obrien_fleming",
    runs: int = 2000,
    seed: int = 0,
) -> dict[str, object]:
    """``runs`` simulated sequential comparisons of two variants on ``questions`` paired 0/1
    answers in ``rounds`` equal rounds: each question is answered right by x only with
    probability ``x_only``, by y only with ``y_only`` (true difference ``x_only - y_only``), x
    the cheaper. Each run stops at the first look whose decision is not ``continue``. Returns
    the share of runs ending in each decision, the mean questions used, and the fixed design
    (every question, one test at ``alpha``) on the same answers for comparison."""
    from scipy.stats import norm

    rng = np.random.default_rng(seed)
    cum = _counts(rng, runs, questions, x_only, y_only)
    sizes = np.linspace(0, questions, rounds + 1).round().astype(int)[1:]
    bounds = boundaries(sizes / questions, alpha, spending)
    decision = np.full(runs, "continue", dtype=object)
    used = np.full(runs, questions)
    open_ = np.ones(runs, dtype=bool)
    for n, c in zip(sizes, bounds, strict=True):
        a, b = cum[0][:, n - 1], cum[1][:, n - 1]
        now = _decide_z(a, b, n, c, margin)
        stop = open_ & (now != "continue")
        decision[stop], used[stop] = now[stop], n
        open_ &= ~stop
    fixed = _decide_z(cum[0][:, -1], cum[1][:, -1], questions, float(norm.isf(alpha / 2)), margin)

    def shares(d: np.ndarray) -> dict[str, float]:
        return {k: float(np.mean(d == k)) for k in DECISIONS}

    return {
        "questions": questions,
        "rounds": rounds,
        "looks_at": sizes.tolist(),
        "boundaries": [round(c, 4) for c in bounds],
        "x_only": x_only,
        "y_only": y_only,
        "true_difference": round(x_only - y_only, 6),
        "alpha": alpha,
        "margin": margin,
        "spending": spending,
        "runs": runs,
        "seed": seed,
        "sequential": {
            **shares(decision),
            "decided": float(np.mean(decision != "continue")),
            "mean_questions": float(used.mean()),
            "median_questions": float(np.median(used)),
        },
        "fixed": {
            **shares(fixed),
            "decided": float(np.mean(fixed != "continue")),
            "mean_questions": float(questions),
        },
    }


def _decide_z(a: np.ndarray, b: np.ndarray, n: int, c: float, margin: float) -> np.ndarray:
    """``decide`` on Tango intervals at critical value ``c`` without finding their ends: the
    statistic decreases in the tested difference, so "lower end above d" is ``z(d) > c``."""
    low_gt = lambda d: score_z(a, b, n, d) > c  # noqa: E731
    high_lt = lambda d: score_z(a, b, n, d) < -c  # noqa: E731
    discordant = (a + b) > 0
    out = np.full(a.shape, "continue", dtype=object)
    not_worse, inside = low_gt(-margin), high_lt(margin)
    out[not_worse] = "x_not_worse"
    out[not_worse & inside] = "equivalent"
    out[discordant & high_lt(0.0)] = "y_better"
    out[discordant & low_gt(0.0)] = "x_better"
    return out
