"""The verdict's words: money in fixed notation, ratios, p-values that never round across the
level, scores as percentages or decimals, a difference's evidence, and how one cost compares
with another (``verdict`` decides; this module only writes)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ragbench.analysis._common import counted
from ragbench.analysis.paired import Comparison, SequentialLook
from ragbench.judge.agreement import LOW_KAPPA, RepeatAgreement


def _money(x: float) -> str:
    """Fixed notation, two significant figures below $1 (never 1e-05)."""
    if x == 0 or not math.isfinite(x):
        return "$0" if x == 0 else "n/a"
    if x >= 1:
        return f"${x:,.2f}"
    return f"${x:.{max(2, 1 - math.floor(math.log10(x)))}f}"


def _cost_text(cost: str, value: float) -> str:
    return f"{value:,.0f} prompt tokens" if cost == "prompt_tokens" else _money(value)


def _ratio(x: float) -> str:
    if not math.isfinite(x):
        return "n/a"
    return f"{x:.2g}x" if x < 10 else f"{x:,.0f}x"


def _p(p: float, alpha: float) -> str:
    """Two significant figures, more where rounding would land on the other side of
    ``alpha`` (never "p=0.05" beside an interval that excludes 0)."""
    if p != p:
        return "p=n/a"
    if p < 0.001:
        return "p<0.001"
    for digits in (2, 3, 4, 6):
        text = f"{p:.{digits}g}"
        if (float(text) < alpha) == (p < alpha):
            return f"p={text}"
    return f"p={p:.6g}"


@dataclass(frozen=True)
class _Fmt:
    """Scores as percentages for 0/1 metrics (differences in points), else 3 decimals."""

    binary: bool

    def score(self, x: float) -> str:
        return f"{100 * x:.3g}%" if self.binary else f"{x:.3f}"

    def num(self, x: float) -> str:  # a signed difference; never "-0", never 0 for a non-zero
        scale, places = (100, 1) if self.binary else (1, 3)
        while places < 6 and x != 0 and round(scale * x, places) == 0:
            places += 1
        value = round(scale * x, places) + 0.0
        if value == 0:
            return "0"
        return f"{value:+g}" if self.binary else f"{value:+.{places}f}"

    def diff(self, x: float) -> str:
        return self.num(x) + (" points" if self.binary else "")

    def size(self, x: float) -> str:  # an unsigned amount: the margin
        return self.diff(x)[1:]


def _evidence(r: Comparison, fmt: _Fmt, alpha: float, x: str, y: str) -> str:
    if r.look is not None:
        return _repeated_evidence(r, r.look, fmt, alpha, x, y)
    test = "Tango score test" if r.test == "tango" else "paired bootstrap"
    m = r.comparisons
    ci = f"{100 * (1 - alpha):g}% CI" if m == 1 else f"{100 * (1 - alpha):g}% simultaneous CI"
    adj = f" (Bonferroni over {m} comparisons)" if m > 1 else ""
    return (
        f"{x} - {y} = {fmt.diff(r.diff)}, {ci} {fmt.num(r.ci_low)} to "
        f"{fmt.num(r.ci_high)}, {test} {_p(r.p_value, alpha)}{adj}, "
        f"{counted(r.n, 'paired question')}"
    )


def _repeated_evidence(
    r: Comparison, look: SequentialLook, fmt: _Fmt, alpha: float, x: str, y: str
) -> str:
    """A sequential run's difference: its repeated interval, and the statistic against the
    look's boundary (the interval excludes 0 exactly when |z| reaches it)."""
    m = r.comparisons
    adj = f", Bonferroni over {m} comparisons" if m > 1 else ""
    test = "Tango score z" if r.test == "tango" else "paired z"
    return (
        f"{x} - {y} = {fmt.diff(r.diff)}, repeated {100 * (1 - alpha):g}% CI "
        f"{fmt.num(r.ci_low)} to {fmt.num(r.ci_high)} (group-sequential, look "
        f"{look.look}{adj}), {test} {abs(look.z):.2f} against the boundary "
        f"{look.boundary:.2f}, {counted(r.n, 'paired question')}"
    )


def _standing(x: str, y: str, metric: str, score_x: str, score_y: str, tied: bool) -> str:
    """Where x stands against y on ``metric``: it leads, or (equal scores) ties with it; a lead
    too small to show in the printed scores says so rather than "66.7% vs 66.7%"."""
    if tied:
        return f"{x} ties with {y} on {metric} (both {score_x})"
    if score_x == score_y:
        return f"{x} leads {y} on {metric} narrowly (both about {score_x})"
    return f"{x} leads {y} on {metric} ({score_x} vs {score_y})"


def _same_cost(lo: float, hi: float) -> bool:
    return not (hi < 1 or lo > 1)  # the interval holds 1 (NaN: cannot tell, so no "cheaper")


def _cost_phrase(x: str, y: str, cr: tuple, cost_of: dict, per: str) -> str:
    """How x's cost compares with y's: a ratio of mean cost per query, with its interval."""
    r, lo, hi = cr
    both = f"{cost_of[x]} vs {cost_of[y]} {per}"
    spread = f", 95% CI {_ratio(lo)} to {_ratio(hi)}" if hi - lo > 1e-9 * max(hi, 1) else ""
    if r == 1 and not spread:
        return f"at the same cost ({cost_of[x]} {per})"
    if _same_cost(lo, hi):
        return f"at about the same cost ({_ratio(r)} the cost of {y}{spread}; {both})"
    word = "cheaper" if r < 1 else "dearer"
    return f"{word}: {_ratio(r)} the cost of {y} ({both}{spread})"


def judge_text(j: RepeatAgreement) -> str:
    """How far a judged metric's repeats agree (``conditions``' ``judge``,
    ``judge.repeat_agreement``), and a warning when they agree poorly."""
    who = f" by {j['judge_model']}" if j.get("judge_model") else ""
    kappa, n = j["kappa"], j["n_kappa"]
    if not n:
        agree = "agreement across the repeats not measured (no answer had every repeat read)"
    elif kappa != kappa:  # one verdict throughout: chance agreement is 1, kappa undefined
        agree = "the repeats gave one verdict throughout (kappa undefined)"
    else:
        agree = f"agreement across the repeats Fleiss' kappa {kappa:.2f} (n={n:,})"
    differed = j.get("differed")
    spread = (
        f"; they differed on {differed:.0%} of answers (mean spread {j['mean_spread']:.2f})"
        if differed is not None and differed == differed and differed > 0
        else ""
    )
    text = f"{j['metric']} judged {j['repeats']} times per answer{who}; {agree}{spread}."
    if j.get("low"):
        text += (
            f" Low agreement (kappa below {LOW_KAPPA:g}): the judge's score of one answer changes "
            "from repeat to repeat, so it measures the judge as much as the answers; read this "
            "verdict with care (more repeats average that noise out of each score; a stronger "
            "judge has less of it)."
        )
    return text
