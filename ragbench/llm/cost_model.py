"""The cost model of one model on one device, pure: ``Rates`` (seconds per unit of work: what a
request costs alone, one forward pass or decode step at a time), the fair split of a measured
total among its rows (``split_seconds``), and the fit of ``Rates`` to probe timings
(``fit_forward``, ``fit``). No torch, no files: ``llm.calibration`` measures the probes on the
device and caches the fitted rates; its docstring gives the model's shape and why.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# ------------------------------------------------------------------------ the cost model (pure)


@dataclass(frozen=True)
class Rates:
    """Seconds per unit of work on one model and device (see the module docstring)."""

    a: float  # fixed seconds of one forward pass (in the compute-bound regime)
    b: float  # seconds per new token
    c: float  # seconds per (new token x position it attends to), plain attention
    d0: float  # fixed seconds of one decode step
    d1: float  # seconds per KV position read by one row in a decode step, plain attention
    d_row: float = 0.0  # seconds per extra row of a batched decode step
    c_shared: float | None = None  # c when the positions are a shared prefix (None: as c)
    d1_shared: float | None = None  # d1 when the positions are a shared prefix (None: as d1)
    floor: float = 0.0  # the least one forward pass takes (launch-bound: a GPU's short passes)
    meta: dict[str, Any] = field(default_factory=dict)  # key, probes, when: provenance only

    def forward(self, new: int, past: int = 0, shared_past: int = 0) -> float:
        """One forward pass of ``new`` tokens after ``past`` plain and ``shared_past`` shared-prefix
        positions (batch of one)."""
        if new <= 0:
            return 0.0
        c_shared = self.c if self.c_shared is None else self.c_shared
        seen = past + (new + 1) / 2  # mean positions attended per new token, causal
        work = self.a + self.b * new + self.c * new * seen + c_shared * new * shared_past
        return max(self.floor, work)

    def decode(self, steps: int, first_kv: int, shared_past: int = 0) -> float:
        """``steps`` decode steps of one row, the first over ``first_kv`` positions (its own,
        plain), each next one over one more; plus ``shared_past`` shared-prefix positions."""
        if steps <= 0:
            return 0.0
        d1_shared = self.d1 if self.d1_shared is None else self.d1_shared
        kv_sum = steps * first_kv + steps * (steps - 1) / 2  # arithmetic series
        return steps * (self.d0 + d1_shared * shared_past) + self.d1 * kv_sum

    def alone(
        self,
        prompt_tokens: int,
        completion_tokens: int,
        prefix_tokens: int = 0,
        prefix_computed: bool = True,
        shared: bool = False,
    ) -> float:
        """Seconds one request would take on its own: its prefix prefill (if it computed the
        prefix rather than reusing a cached one), its suffix prefill after the prefix, and a
        decode step for every completion token after the first (the prefill emits the first)."""
        suffix = prompt_tokens - prefix_tokens
        seconds = self.forward(prefix_tokens) if prefix_tokens and prefix_computed else 0.0
        plain, via_shared = (0, prefix_tokens) if shared else (prefix_tokens, 0)
        seconds += self.forward(suffix, plain, via_shared)
        # decode step j (1-based) feeds completion token j: the suffix and j own positions
        first_kv = (suffix if shared else prompt_tokens) + 1
        return seconds + self.decode(completion_tokens - 1, first_kv, via_shared)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Rates:
        return cls(**data)


def split_seconds(total: float, estimates: list[float]) -> list[float]:
    """``total`` split in proportion to ``estimates`` (each row's stand-alone seconds); the shares
    add up to ``total``. All estimates zero (nothing known): an even split."""
    if not estimates:
        return []
    weight = sum(max(e, 0.0) for e in estimates)
    if weight <= 0:
        return [total / len(estimates)] * len(estimates)
    shares = [total * max(e, 0.0) / weight for e in estimates]
    shares[-1] = total - sum(shares[:-1])  # exact sum despite float rounding
    return shares


# ------------------------------------------------------------------------ fitting (pure)


def _nnls_relative(rows: list[list[float]], seconds: list[float]) -> list[float]:
    """Non-negative least squares on relative errors, so the short probes weigh as much as the
    long ones."""
    import numpy as np
    from scipy.optimize import nnls

    x, y = np.asarray(rows, float), np.asarray(seconds, float)
    w = 1.0 / np.maximum(y, 1e-9)
    coef, _ = nnls(x * w[:, None], y * w)
    return [float(v) for v in coef]


def _forward_terms(n: int, p: int) -> list[float]:
    return [1.0, n, n * (p + (n + 1) / 2)]


def fit_forward(prefill: list[tuple[int, int, float]]) -> tuple[float, float, float, float]:
    """``(a, b, c, floor)`` of ``max(floor, a + b*n + c*n*seen)`` from ``[(new, past, seconds)]``.

    The max is not linear, so its break is searched: the k fastest probes are taken as the flat
    (launch-bound) part, whose best constant on relative errors is the floor, and the others fit
    the compute terms by non-negative least squares; the k whose model has the least relative
    error over *every* probe wins (k = 0: no floor, the plain sum; a tie keeps the smaller k).
    Hand-written: the search is over at most a dozen probes, and no fitting library offers a
    max-of-two-regimes model with non-negative coefficients."""
    rows = sorted(prefill, key=lambda r: r[2])
    best: tuple[float, tuple[float, float, float, float]] | None = None
    for k in range(max(1, len(rows) - 2)):  # the compute terms need 3 probes
        low, high = rows[:k], rows[k:]
        inv = [1.0 / max(t, 1e-12) for *_, t in low]
        floor = sum(inv) / sum(v * v for v in inv) if low else 0.0  # argmin sum (f/t - 1)^2
        a, b, c = _nnls_relative([_forward_terms(n, p) for n, p, _ in high], [t for *_, t in high])
        error = 0.0
        for n, p, t in rows:
            modelled = max(floor, a + b * n + c * n * (p + (n + 1) / 2))
            error += (modelled / max(t, 1e-12) - 1.0) ** 2
        if best is None or error < best[0] * (1 - 1e-9):
            best = (error, (a, b, c, floor))
    assert best is not None
    return best[1]


def fit(prefill: list[tuple[int, int, float]], decode: list[tuple[int, int, float]]) -> Rates:
    """Rates from probe timings: ``prefill`` = [(new, past, seconds)] (plain, batch of one),
    ``decode`` = [(kv, rows, seconds)] (one step). Relative errors throughout, so the short
    probes weigh as much as the long ones (see :func:`fit_forward` for the forward pass)."""
    a, b, c, floor = fit_forward(prefill)
    single = [(k, t) for k, r, t in decode if r == 1]
    d0, d1 = _nnls_relative([[1.0, k] for k, _ in single], [t for _, t in single])
    extra = [(t - d0 - d1 * r * k) / (r - 1) for k, r, t in decode if r > 1]
    d_row = max(0.0, sum(extra) / len(extra)) if extra else 0.0
    return Rates(a=a, b=b, c=c, d0=d0, d1=d1, d_row=d_row, floor=floor)


def relative_error(rates: Rates, probe: tuple[int, int, float]) -> float:
    """|modelled - measured| / measured of one prefill probe ``(new, past, seconds)``."""
    n, p, t = probe
    return abs(rates.forward(n, p) - t) / t if t > 0 else 0.0
