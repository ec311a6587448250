"""Group-sequential stopping (``analysis.sequential``): boundaries against published values and
simulation, the repeated interval against Tango's, and the operating characteristics the issue
asks for (2,000 simulated runs)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from ragbench.analysis.paired import tango
from ragbench.analysis.sequential import (
    NEVER,
    _decide_z,
    boundaries,
    decide,
    repeated_interval,
    simulate,
    spent,
)


def test_boundaries_match_published_lan_demets_values():
    # Jennison & Turnbull (2000) table 2.x / R ldbounds, gsDesign sfLDOF and sfLDPocock:
    # two-sided alpha 0.05, equally spaced looks
    five = np.arange(1, 6) / 5
    assert boundaries(five, 0.05, "obrien_fleming") == pytest.approx(
        [4.8769, 3.3570, 2.6803, 2.2898, 2.0310], abs=2e-4
    )
    assert boundaries(five, 0.05, "pocock") == pytest.approx(
        [2.4380, 2.4268, 2.4102, 2.3966, 2.3860], abs=2e-4
    )
    assert boundaries([0.25, 0.5, 0.75, 1.0]) == pytest.approx(
        [4.3326, 2.9631, 2.3590, 2.0141], abs=2e-4
    )
    assert boundaries([1.0]) == pytest.approx([norm.isf(0.025)])  # one look: the fixed design


def test_spending_functions_end_at_alpha():
    for kind in ("obrien_fleming", "pocock"):
        assert spent(0, 0.05, kind) == 0 and spent(1, 0.05, kind) == pytest.approx(0.05)
        assert spent(0.5, 0.05, kind) < 0.05
    assert spent(0.2, 0.05, "obrien_fleming") < spent(0.2, 0.05, "pocock")
    with pytest.raises(ValueError, match="pocock"):
        spent(0.5, 0.05, "pocok")


def test_boundaries_spend_alpha_on_simulated_brownian_paths():
    """Unequal looks (a run stopped at its budget takes an unplanned one): the first crossing of
    each look happens as often as the spending function allows, by simulation."""
    t = np.array([0.15, 0.4, 0.55, 0.9, 1.0])
    for kind in ("obrien_fleming", "pocock"):
        c = np.array(boundaries(t, 0.05, kind))
        rng = np.random.default_rng(1)
        steps = rng.standard_normal((200_000, len(t))) * np.sqrt(np.diff(t, prepend=0))
        z = np.cumsum(steps, axis=1) / np.sqrt(t)
        crossed = np.abs(z) >= c
        first = np.where(crossed.any(axis=1), crossed.argmax(axis=1), -1)
        total = np.mean(first >= 0)
        assert total == pytest.approx(0.05, abs=0.003)
        increments = np.diff([0] + [spent(x, 0.05, kind) for x in t])
        for k, inc in enumerate(increments):
            assert np.mean(first == k) == pytest.approx(inc, abs=0.0025)


def test_a_repeated_fraction_spends_nothing():
    assert boundaries([0.5, 0.5, 1.0])[1] == NEVER
    with pytest.raises(ValueError, match="increase"):
        boundaries([0.5, 0.4])


def test_repeated_interval_is_tangos_at_the_looks_critical_value():
    rng = np.random.default_rng(3)
    for _ in range(20):
        n = int(rng.integers(10, 200))
        x, y = rng.random(n) < 0.6, rng.random(n) < 0.5
        c = float(rng.uniform(1.5, 4.5))
        r = repeated_interval(x, y, c, binary=True)
        lo, hi, _ = tango(r["a_only"], r["b_only"], n, level=2 * norm.sf(c))
        assert (r["ci_low"], r["ci_high"]) == pytest.approx((lo, hi), abs=1e-7)
        excludes = r["ci_low"] > 0 or r["ci_high"] < 0
        assert excludes == (abs(r["z"]) >= c)


def test_no_discordant_pair_still_has_tangos_interval():
    """Two variants that agree on every question: Tango's interval is well defined (it does not
    collapse to a point), and the repeated interval is it, at any count and critical value."""
    for n in (1, 11, 33, 100):
        for c in (1.96, 2.5, 3.7):
            r = repeated_interval(np.ones(n), np.ones(n), c, binary=True)
            lo, hi, _ = tango(0, 0, n, level=2 * norm.sf(c))
            assert (r["ci_low"], r["ci_high"]) == pytest.approx((lo, hi), abs=1e-9)
            assert r["z"] == 0 and r["ci_low"] < 0 < r["ci_high"]
    r = repeated_interval(np.ones(100), np.ones(100), 1.99, binary=True)  # enough to decide
    assert decide(r["ci_low"], r["ci_high"], 0.05) == "equivalent"
    assert _decide_z(np.array([0]), np.array([0]), 100, 1.99, 0.05)[0] == "equivalent"


def test_continuous_interval_has_a_spread_floor():
    r = repeated_interval([0.5] * 10, [0.5] * 10, 2.0, binary=False, margin=0.05)
    half = 2.0 * math.sqrt(0.05 * 0.95) / math.sqrt(10)
    assert (r["ci_low"], r["ci_high"]) == pytest.approx((-half, half))
    assert decide(r["ci_low"], r["ci_high"], 0.05) == "continue"  # ten equal scores decide nothing


def test_vectorised_decision_matches_the_interval():
    rng = np.random.default_rng(4)
    n = 120
    a = rng.integers(0, 40, 300)
    b = rng.integers(0, 40, 300)
    c = 2.4
    fast = _decide_z(a, b, n, c, 0.05)
    for ai, bi, f in zip(a, b, fast, strict=True):
        x = np.r_[np.ones(ai), np.zeros(bi), np.ones(n - ai - bi)]
        y = np.r_[np.zeros(ai), np.ones(bi), np.ones(n - ai - bi)]
        r = repeated_interval(x, y, c, binary=True)
        assert decide(r["ci_low"], r["ci_high"], 0.05) == f


@pytest.mark.parametrize("spending", ["obrien_fleming", "pocock"])
def test_operating_characteristics(spending):
    """The issue's check: 2,000 simulated runs. No true difference: "one is better" at most 5%
    of the time. A true 10-point difference either way: it decides, on fewer questions than
    the fixed design's 400 on average."""
    null = simulate(400, 5, 0.15, 0.15, spending=spending, runs=2000, seed=0)["sequential"]
    assert null["x_better"] + null["y_better"] <= 0.05
    for x_only, y_only, right in (
        (0.20, 0.10, ("x_better", "x_not_worse")),
        (0.10, 0.20, ("y_better",)),
    ):
        s = simulate(400, 5, x_only, y_only, spending=spending, runs=2000, seed=0)["sequential"]
        assert sum(s[k] for k in right) >= 0.9
        assert s["mean_questions"] < 300
