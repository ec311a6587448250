"""A run's dollar cap (``max_dollars``): stop before the spend passes it, resume with a higher one.

What counts as spent: every record in the run folder (earlier sessions included) priced by the
run's price sheet: its ``cost.dollars`` plus the ``judge_dollars`` its judge calls cost (the
judge's own sheet) and the ``noise_dollars`` of its noise-pass call, and each one-time cost
once (a ``long_context preload`` corpus: ``one_time_dollars``, carried by every question of its
group, counted once per group, ``strategies.preload.one_time_dollars``: what the records'
amortised dollars add up to). A cached completion is priced like a sent one: the cap bounds what
the run is *worth* at its sheet, which is what the dry run estimates too; so a resumed session
that preloads a corpus again does not count it twice (its manifest entry lists that preload).

When the runner stops (``Budget.rounds`` wraps its rounds of ``model.batch_size`` records):
before each round, from the records finished so far,

- spent >= ``max_dollars``: stop;
- spent + estimate > ``max_dollars``: stop before the round. The estimate is the round's size
  (plus the records of rounds still in flight, on an executor that runs several at once) times
  the mean dollars per priced record so far (generation, plus the mean judge dollars per judged
  record when the config has judge metrics), plus, for each preload group of the round with no
  one-time cost paid yet, the mean one-time dollars per group paid so far;
- else run the round.

Before any record is priced (a new run) there is no mean: the first round is estimated as the
dry run estimates it (``Budget.first_round``, ``ragbench.experiment.dry_run.round_dollars``): its
prompts assembled and counted as they will be sent (its preload calls included), every answer at
``max_new_tokens``, priced by the sheet. That is an upper bound, so a cap below it stops the run
before it spends anything (``why``: "first round would pass it"); rounds handed out before the
first one finishes (Ray) count at the same per-record bound. A pipeline's calls and the judge's
are not in it (the dry run cannot estimate them), and an hourly sheet with no calibration to
model seconds from gives no estimate: then the first round runs unestimated (its preload too),
and the dry run's check is the only one.

So the run never starts a round it expects to pass the cap; it can pass it only by what one
round costs beyond its estimate. The passes after generation are
held to the cap the same way, chunk by chunk (``Budget.allows``): the judge pass at the mean
judge dollars per judged record so far (its first chunk has no estimate), the noise pass at the
mean noise dollars so far, else at the chunk's own generation dollars (a noisy answer is the
same call again). A run stopped in generation skips its judge pass, writes its records, results table and manifest (``status: stopped``, the session's
``stopped: budget`` with the spend), prints one line (``reason``) and exits with
``BUDGET_EXIT``. ``max_dollars`` is not in the config hash, so rerunning with a higher cap
lands in the same run folder and generates only the records that are missing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ragbench.metrics.answer import deferred_metrics
from ragbench.strategies import preload

BUDGET_EXIT = 3  # `ragbench run`: stopped at max_dollars (records so far written; rerun resumes)
EXIT_HELP = (
    f"{BUDGET_EXIT}: the run stopped before passing max_dollars (--max-dollars); what it "
    "finished is written, and a rerun with a higher cap resumes it."
)


def record_dollars(record: Any) -> tuple[float | None, float | None]:
    """(generation dollars, judge dollars) of one record; None where it has none."""
    cost = getattr(record, "cost", None)
    gen = getattr(cost, "dollars", None) if cost is not None else None
    judge = (getattr(record, "meta", None) or {}).get("judge_dollars")
    return gen, judge


@dataclass(frozen=True)
class Spend:
    """What the records so far cost, and the means a round's estimate is made of."""

    dollars: float = 0.0
    per_record: float = 0.0  # mean generation dollars per priced record
    judge_per_record: float = 0.0  # mean judge dollars per judged record
    noise_per_record: float = 0.0  # mean noise-pass dollars per record it answered again
    priced: int = field(default=0, compare=False)  # records with generation dollars
    # per preload group with answered questions, its one-time dollars (in ``dollars``, once)
    one_time: dict[tuple, float] = field(default_factory=dict, compare=False)


def spend_of(records: Iterable[Any], meta: Mapping[str, Mapping[str, Any]] | None = None) -> Spend:
    """Total dollars of ``records`` (generation, judge, noise pass, and each preload group's
    one-time cost once) and the mean of each per record that has it (a record's own: the
    one-time cost is not in the means). ``meta``: example id -> meta, which tells the preload
    groups apart (``strategies.preload.group_of``)."""
    records = list(records)
    totals, counts = [0.0, 0.0, 0.0], [0, 0, 0]
    for record in records:
        noise = (getattr(record, "meta", None) or {}).get("noise_dollars")
        for i, value in enumerate((*record_dollars(record), noise)):
            if value is not None:
                totals[i], counts[i] = totals[i] + value, counts[i] + 1
    means = [t / n if n else 0.0 for t, n in zip(totals, counts, strict=True)]
    once = preload.one_time_dollars(records, meta or {})
    return Spend(sum(totals) + sum(once.values()), *means, priced=counts[0], one_time=once)


def preload_estimate(spend: Spend, items: Iterable[Any]) -> float:
    """Dollars of the preloads ``items`` (``(example, params)`` pairs) will send before their
    questions: each of their preload groups with no one-time cost paid yet, at the mean one-time
    dollars per group paid so far (0 before any: the first round's estimate has it)."""
    if not spend.one_time:
        return 0.0
    fresh = {preload.group(*item) for item in items} - {None} - set(spend.one_time)
    return len(fresh) * sum(spend.one_time.values()) / len(spend.one_time)


def round_estimate(spend: Spend, size: int, judged: bool) -> float:
    """Dollars a round of ``size`` new records is expected to cost (``judged``: they will be
    judged too)."""
    return size * (spend.per_record + (spend.judge_per_record if judged else 0.0))


def decide(spent: float, estimate: float, cap: float) -> str | None:
    """Why to stop before a round (None: run it)."""
    if spent >= cap:
        return "reached"
    if spent + estimate > cap:
        return "next round would pass it"
    return None


@dataclass
class Budget:
    """One session's cap. ``stopped``: None, or ``"budget"`` once it stopped the run;
    ``info``: what the manifest records about it."""

    max_dollars: float | None
    judged: bool = False  # the config has judge metrics: new records will be judged too
    pending_at_stop: int = 0
    stopped: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    # the dollars a round of (example, params) items costs at most, as the dry run counts them
    # (None: not estimable); used until a record is priced (see the module docstring)
    first_round: Callable[[list], float | None] | None = None
    _bound_per_record: float | None = None  # first_round's bound over the first round's size
    # example id -> meta: tells a shared corpus's preload groups apart (spend_of)
    meta: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, cfg: Any, examples: Iterable[Any] = ()) -> Budget:
        meta = {e.id: e.meta for e in examples}
        return cls(cfg.max_dollars, judged=bool(deferred_metrics(cfg.metrics)), meta=meta)

    def rounds(self, rounds: Iterable[list], done: Mapping[str, Any]) -> Iterator[list]:
        """``rounds`` (of ``((example, params), key)`` items) until the cap stops the run;
        ``done`` (key -> Record, updated by the caller as each round finishes) is what has been
        spent. Rounds handed out but not finished yet (an executor with several in flight: Ray)
        count at their estimate."""
        rounds = list(rounds)
        handed: list = []  # the ((example, params), key) items handed out, finished or not
        for i, chunk in enumerate(rounds):
            if self.max_dollars is not None:
                spend = spend_of(done.values(), self.meta)
                in_flight = [item for item, k in handed if k not in done]
                estimate = round_estimate(spend, len(chunk) + len(in_flight), self.judged)
                estimate += preload_estimate(spend, [item for item, _ in chunk] + in_flight)
                if not spend.priced and (bound := self._bound(chunk)) is not None:
                    estimate = (len(chunk) + len(in_flight)) * bound  # no mean yet: the dry run's
                why = decide(spend.dollars, estimate, self.max_dollars)
                if why is not None and not spend.priced and not handed and why != "reached":
                    why = "first round would pass it"
                if why is not None:
                    self._stop(why, spend.dollars, estimate, sum(len(c) for c in rounds[i:]))
                    return
            handed.extend(chunk)
            yield chunk

    def _bound(self, chunk: list) -> float | None:
        """Dollars per record at most, from the dry-run estimate of the first round (made once,
        on the first round asked about); None when there is no estimate."""
        if self._bound_per_record is None and self.first_round is not None and chunk:
            total = self.first_round([item for item, _ in chunk])
            self.first_round = None  # once: a None answer is not asked again
            if total is not None and total == total:  # NaN: no estimate
                self._bound_per_record = total / len(chunk)
        return self._bound_per_record

    def allows(self, done: Mapping[str, Any], chunk: Sequence[Any], left: int, step: str) -> bool:
        """Whether a pass after generation (``step``: ``"judge"`` or ``"noise"``) may run its
        next ``chunk`` (the records it will answer or judge again); ``left``: its records not
        done yet, this chunk's included. False once the cap stopped the run (the pass stops; a
        rerun resumes it). The noise pass, before it has a mean of its own, is estimated at the
        chunk's own generation dollars: the same calls again, on a noisier corpus."""
        if self.stopped is not None:
            return False
        if self.max_dollars is None:
            return True
        spend = spend_of(done.values(), self.meta)
        if step == "judge":
            estimate = len(chunk) * spend.judge_per_record
        elif spend.noise_per_record:
            estimate = len(chunk) * spend.noise_per_record
        else:
            estimate = spend_of(chunk).per_record * len(chunk)
        why = decide(spend.dollars, estimate, self.max_dollars)
        if why is not None:
            self._stop(why, spend.dollars, estimate, left, step)
        return why is None

    def _stop(self, why: str, spent: float, estimate: float, left: int, step: str = "") -> None:
        self.stopped = "budget"
        self.pending_at_stop = 0 if step else left  # generation's records not generated
        self.info = {
            "max_dollars": self.max_dollars,
            "spent_dollars": round(spent, 6),
            "next_round_estimate": round(estimate, 6),
            "why": why,
            "records_left": left,
        } | ({"pass": step} if step else {})

    @property
    def reason(self) -> str:
        """The one line a stopped run prints."""
        i = self.info
        if i["why"] == "reached":
            why = "reached it"
        elif i["why"] == "first round would pass it":
            why = (
                f"the first round would pass it (estimated at most ${i['next_round_estimate']:,.6f}"
                ": its prompt tokens as the dry run counts them, every answer at max_new_tokens)"
            )
        else:
            why = f"the next round (~${i['next_round_estimate']:,.6f}) would pass it"
        left = f"{i['records_left']} record(s) left" + (
            f" in the {i['pass']} pass" if i.get("pass") else ""
        )
        return (
            f"stopped: budget: spent ${i['spent_dollars']:,.6f} of max_dollars "
            f"${i['max_dollars']:,.6f}, {why}; {left}: rerun with a higher --max-dollars to "
            "resume"
        )


def over_budget(estimate: float | None, cap: float | None) -> str | None:
    """The dry run's refusal: why a config estimated at ``estimate`` dollars (an upper bound:
    every completion at max_new_tokens) exceeds ``cap``; None when it fits or nothing is
    known."""
    if cap is None or estimate is None or estimate != estimate or estimate <= cap:
        return None
    return (
        f"estimated at most ${estimate:,.6f}, over max_dollars ${cap:,.6f}: raise "
        "--max-dollars, or shrink the run (dataset.limit, fewer strategies or points)"
    )
