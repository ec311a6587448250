"""Whether a timed piece of CPU work ran on its threads' whole share of the cores
(``CpuShare``): the calibration's probes (``calibration.py``) are timed again only where it did
not."""

from __future__ import annotations

STEADY_SHARE = 0.85  # a prefill whose process had this share of its threads' cores ran steady


class CpuShare:
    """Which CPU prefill probes ran on their threads' whole share of the cores.

    On a CPU, what makes a probe slow by chance is other work on its cores: another process, a
    virtual machine's stolen time. That shows as the probe's process CPU time falling short of
    its wall time x its threads (at most the cores). Measured on this project's 2-core machine
    (AMD EPYC, 2 threads), SmolLM2's 1k-8k prefills ran at 0.96-0.99 of that alone, 0.59-0.66
    beside one busy process (and took 1.7-2.7x as long), 0.27-0.43 beside a 4-worker test run.
    A probe that ran steady cannot get faster by timing it again, so where the fit misses it, the
    miss is the fit's shape and the calibration (``calibration.py``) does not time that long
    prefill again: on that machine, quiet, SmolLM2's held-out 8k prefill (~31 s) missed by 25%
    and 15% on two first compares, and was timed again for nothing. Hand-written: no library
    times work against its CPU share. Other threads of the same process would count as its own;
    the calibration runs while the command only prints (``compare``) or before the run starts."""

    def __init__(self, threads: int) -> None:
        self.threads = max(1, threads)
        self.shares: dict[tuple[int, int, int, bool], list[float]] = {}

    def record(self, probe: tuple[int, int, int, bool], wall: float, cpu: float) -> None:
        """A timed probe's wall and process CPU seconds."""
        self.shares.setdefault(probe, []).append(cpu / wall / self.threads if wall > 0 else 0.0)

    def steady(self, probe: tuple[int, int, int, bool], samples: list[float]) -> bool:
        """Whether the fastest of ``samples`` (the probe's estimate) ran steady."""
        shares = self.shares.get(probe, [])
        if len(shares) != len(samples) or not samples:  # samples lent by an earlier calibration
            return False
        return shares[samples.index(min(samples))] >= STEADY_SHARE

    def report(self, probes: dict[str, tuple[int, int, int, bool]]) -> dict[str, list[float]]:
        """Each timed probe's shares (for the calibration's meta), by probe name."""
        return {
            name: [round(s, 3) for s in self.shares[args]]
            for name, args in probes.items()
            if args in self.shares
        }
