"""How many questions would decide: the sample size of a paired test at a given power (Connor
1987 for 0/1 scores, a paired z otherwise), and the verdict's "about N more questions" for an
undecided comparison. Pure arithmetic on counts and spreads; it never reads a results table
(``verdict`` and ``sequential`` call it).
"""

from __future__ import annotations

import math
from statistics import NormalDist

from ragbench.analysis.paired import Comparison

POWER = 0.8  # the chance "more questions" gives of deciding, at the observed difference


def spread_floor(margin: float) -> float:
    """The smallest per-question standard deviation assumed for non-0/1 scores: no spread seen
    is no proof of none, so at least that of a share ``margin`` (``sqrt(m (1 - m))``)."""
    return math.sqrt(margin * (1 - margin))


def questions_needed(
    effect: float,
    *,
    discordant: float | None = None,
    sd: float | None = None,
    alpha: float = 0.05,
    power: float = POWER,
) -> int:
    """Paired questions a two-sided test at level ``alpha`` needs to detect a mean difference
    ``effect`` with probability ``power`` (normal approximation).

    0/1 scores (McNemar), Connor (1987), "Sample size for testing differences in proportions
    for the paired-sample design", Biometrics 43:207-211:
    ``n = (z(1-alpha/2) sqrt(psi) + z(power) sqrt(psi - effect^2))^2 / effect^2`` with ``psi``
    = ``discordant``, the share of questions the two variants disagree on (at least |effect|).
    Other scores (paired z): ``n = ((z(1-alpha/2) + z(power)) sd / effect)^2`` with ``sd`` the
    standard deviation of the per-question differences. A non-inferiority margin ``m`` is the
    same question with ``effect`` = difference + m. tests/test_verdict.py checks both against
    simulated tests."""
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


def questions_to_decide(r: Comparison, margin: float, binary: bool) -> tuple[int | None, str]:
    """(more questions, what they would show) for an undecided x - y: the fewer of those that
    give 80% power at the observed difference to show x within ``margin`` (non-inferiority)
    or y better; no spread observed is no proof of none (at least the margin's share)."""
    d, n = r.diff, r.n
    alpha = r.level / r.comparisons
    psi = (r.a_only + r.b_only) / max(n, 1)
    floor = spread_floor(margin)
    sd = math.sqrt(max(max(psi, margin) - d * d, 1e-12)) if binary else max(r.sd, floor)
    options = []
    if d + margin > 0:
        options.append((questions_needed(d + margin, sd=sd, alpha=alpha), "within"))
    if d < 0:
        need = (
            questions_needed(d, discordant=psi, alpha=alpha)
            if binary
            else questions_needed(d, sd=max(r.sd, floor), alpha=alpha)
        )
        options.append((need, "better"))
    need, what = min(options)
    return (max(1, need - n) if math.isfinite(need) else None), what
