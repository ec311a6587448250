"""A run's dollar cap (``max_dollars``): stop before the spend passes it, resume with a higher one.

One job: holding a run to its cap (what was spent, what the next round may cost, why it stopped).

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
- spent or estimate not a number (NaN dollars: the cap cannot be held): stop;
- spent + estimate > ``max_dollars``: stop before the round;
- else run the round.

The estimate is what the round's *own* records cost at most, counted as the dry run counts them
(``Budget.bound``, ``ragbench.experiment.dry_run.RoundCounter``): their prompts assembled and
counted as they will be sent, every answer at ``max_new_tokens``, priced by the sheet, plus the
preload call of each preload group of the round whose one-time cost is not paid yet. Never the
mean of the rounds so far: a NIAH grid goes from short contexts to long ones, and a round of
6,000-token prompts costs about thirty times what a round of 300-token ones did. The count is an
upper bound when the tokenizer counts as the server does; where the records finished so far cost
more than their bounds (a tokenizer that undercounts the server's), every bound is scaled up by
that ratio (never down: answers shorter than ``max_new_tokens`` on short prompts say nothing
about long ones). Prompts are priced at what the model charges for them: each finished record
whose calls the count all saw shows the prompt tokens the model reported per token the configured
tokenizer counted (a server with another tokenizer, or one that reports more than it reads), and
every bound's prompts are priced at the highest such rate so far, its answers still at
``max_new_tokens`` (a ratio of dollars mixed the two: short answers hid an undercounted prompt, so a
round of long prompts after short ones went out at the tokenizer's count). Until a record has shown
that rate (the run's first request), and whenever the last ones showed a higher rate than their
estimate used, a round goes out as one request first (``Budget._probe``): no round is sent at a
rate the model did not confirm, and a server that reports more than the estimate stops the run
before the next request when that request no longer fits at the new rate. Records still in flight
(an executor with several rounds out at once: Ray) count at their bounds too. Plus, when the config has judge metrics, the mean judge dollars per judged
record so far for each record. Records the count cannot bound (a pipeline's calls; an hourly sheet
with no calibration to model seconds from) count at the mean dollars per priced record so far, and
their preload groups at the mean one-time dollars per group paid so far; before any record is
priced, that is nothing (the dry run's check is the only one). A cap below the first round's
bound stops the run before it spends anything (``why``: "first round would pass it").

So the run never starts a round it expects to pass the cap; it can pass it only by what one
request costs beyond its bound (the run's first request, before any record shows the rate; a
request at a rate above every earlier one), or by the unbounded calls above and Self-Route's
fallback to long context (the count sees its RAG call only). A run that ends over the cap anyway says so and names what passed it (generation, the judge
pass or the noise pass) (``Budget.passed``: a warning, the
session's ``budget`` entry with ``why: passed it``, and ``BUDGET_EXIT``), never exit 0. The passes
after generation are held to the cap the same way, chunk by chunk (``Budget.allows``): the judge
pass at the mean judge dollars per judged record so far (so, until a record has judge dollars,
it judges one record at a time: ``judge_chunk``; that first record is not estimated), the
noise pass at the mean noise dollars so far, else at the chunk's own generation dollars (a noisy
answer is the same call again). A run stopped in generation skips its judge pass, writes its
records, results table and manifest (``status: stopped``, the session's ``stopped: budget`` with
the spend), prints one line (``reason``) and exits with ``BUDGET_EXIT``. The spend it reports is
what the written records cost: the rounds an executor had in flight when it stopped (Ray) finish
and are kept, so they count, and where they passed the cap the line says by how much
(``passed_by``). ``max_dollars`` is not
in the config hash, so rerunning with a higher cap lands in the same run folder and generates
only the records that are missing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypedDict

from ragbench.experiment.config.run import RunConfig
from ragbench.metrics.answer import deferred_metrics
from ragbench.strategies import preload
from ragbench.strategies.params import StrategyParams
from ragbench.types import Example, Record

BUDGET_EXIT = 3  # `ragbench run`: stopped at max_dollars (records so far written; rerun resumes)
EXIT_HELP = (
    f"{BUDGET_EXIT}: the run stopped before passing max_dollars (--max-dollars); what it "
    "finished is written, and a rerun with a higher cap resumes it. Also a run that passed "
    "the cap anyway (a round or the judge pass cost more than its estimate, or the rounds Ray "
    "had in flight when it stopped; the warning says by how much)."
)


def record_dollars(record: Record) -> tuple[float | None, float | None]:
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
    judged: int = field(default=0, compare=False)  # records with judge dollars
    judge_dollars: float = field(default=0.0, compare=False)  # of the judge's calls (in dollars)
    noise_dollars: float = field(default=0.0, compare=False)  # of the noise pass's calls
    # per preload group with answered questions, its one-time dollars (in ``dollars``, once)
    one_time: dict[tuple, float] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Counted:
    """What the count saw of one item's calls: their prompt tokens as the configured tokenizer
    counts them, the calls, and ``at(r)``: the item's dollars with ``r`` times those prompt
    tokens (its answers still at ``max_new_tokens``), priced by the run's sheet."""

    prompt_tokens: float
    calls: int
    at: Callable[[float], float]


@dataclass(frozen=True)
class RoundBound:
    """At most what a round costs, as the dry run counts it (``dry_run.RoundCounter``): each
    item's dollars (None: not counted, a pipeline's) and, per preload group of the round, its
    preload call's. NaN where the sheet gave no dollars. ``counted``: per item, its prompts as
    counted (``Counted``; None or empty: not known), so that a server that counts more prompt
    tokens than the tokenizer did prices the next items at its own rate."""

    items: tuple[float | None, ...]
    preloads: Mapping[tuple, float] = field(default_factory=dict)
    counted: tuple[Counted | None, ...] = ()


def spend_of(
    records: Iterable[Record], meta: Mapping[str, Mapping[str, object]] | None = None
) -> Spend:
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
    per_record, judge_per_record, noise_per_record = (
        t / n if n else 0.0 for t, n in zip(totals, counts, strict=True)
    )
    once = preload.one_time_dollars(records, meta or {})
    return Spend(
        sum(totals) + sum(once.values()),
        per_record,
        judge_per_record,
        noise_per_record,
        priced=counts[0],
        one_time=once,
        judged=counts[1],
        judge_dollars=totals[1],
        noise_dollars=totals[2],
    )


def preload_estimate(spend: Spend, items: Iterable[tuple[Example, StrategyParams]]) -> float:
    """Dollars of the preloads ``items`` (``(example, params)`` pairs) will send before their
    questions: each of their preload groups with no one-time cost paid yet, at the mean one-time
    dollars per group paid so far (0 before any: the first round's estimate has it)."""
    if not spend.one_time:
        return 0.0
    fresh = {preload.group(*item) for item in items} - {None} - set(spend.one_time)
    return len(fresh) * sum(spend.one_time.values()) / len(spend.one_time)


def decide(spent: float, estimate: float, cap: float) -> str | None:
    """Why to stop before a round (None: run it). A NaN spend or estimate (a record or a price
    that is not a number) passes no comparison: the cap cannot be held, so the run stops."""
    if math.isnan(spent) or math.isnan(estimate):
        return "not a number"
    if spent >= cap:
        return "reached"
    if spent + estimate > cap:
        return "next round would pass it"
    return None


# why the budget stopped a run, for the manifest's session entry (``budget``) and the line it
# prints (``Budget.reason``); empty until it stops. "pass" (a keyword): the pass it stopped in
BudgetInfo = TypedDict(
    "BudgetInfo",
    {
        "max_dollars": float | None,
        "spent_dollars": float | None,  # None: NaN
        "next_round_estimate": float | None,
        "why": str,
        "records_left": int,
        "pass": str,
        "prompt_rate": float,  # the model charged more prompt tokens than counted
        "passed_by": float | None,  # a stopped run's spend past the cap (``passed``)
    },
    total=False,
)


@dataclass
class Budget:
    """One session's cap. ``stopped``: None, or ``"budget"`` once it stopped the run;
    ``info``: what the manifest records about it."""

    max_dollars: float | None
    judged: bool = False  # the config has judge metrics: new records will be judged too
    pending_at_stop: int = 0
    stopped: str | None = None
    info: BudgetInfo = field(default_factory=lambda: BudgetInfo())
    # what a round of (example, params) items costs at most, as the dry run counts it (None: not
    # estimable): each round's estimate (see the module docstring)
    bound: Callable[[list], RoundBound | None] | None = None
    # work key -> its record's bound (None: not counted); preload group -> its preload's bound
    _bounds: dict[str, float | None] = field(default_factory=dict, repr=False)
    _preloads: dict[tuple, float] = field(default_factory=dict, repr=False)
    # work key -> its prompts as counted; the prompt-token rate the last estimate used
    _counted: dict[str, Counted] = field(default_factory=dict, repr=False)
    _rate: float = field(default=1.0, repr=False)
    # what finished records showed of the model's prompt tokens per counted one (_measured)
    _unmeasured: set[str] = field(default_factory=set, repr=False)
    _measured_records: int = field(default=0, repr=False)
    _measured_rate: float = field(default=1.0, repr=False)
    # example id -> meta: tells a shared corpus's preload groups apart (spend_of)
    meta: Mapping[str, Mapping[str, object]] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, cfg: RunConfig, examples: Iterable[Example] = ()) -> Budget:
        meta = {e.id: e.meta for e in examples}
        return cls(cfg.max_dollars, judged=bool(deferred_metrics(cfg.metrics)), meta=meta)

    def rounds(self, rounds: Iterable[list], done: Mapping[str, Record]) -> Iterator[list]:
        """``rounds`` (of ``((example, params), key)`` items) until the cap stops the run;
        ``done`` (key -> Record, updated by the caller as each round finishes) is what has been
        spent. Rounds handed out but not finished yet (an executor with several in flight: Ray)
        count at their estimate."""
        queue = list(rounds)
        handed: list = []  # the ((example, params), key) items handed out, finished or not
        while queue:
            chunk = queue.pop(0)
            if self.max_dollars is not None:
                if len(chunk) > 1 and self._probe(chunk, done):  # one request, then the rest
                    chunk, rest = chunk[:1], chunk[1:]
                    queue.insert(0, rest)
                spend = spend_of(done.values(), self.meta)
                in_flight = [(item, k) for item, k in handed if k not in done]
                estimate = self.estimate(spend, chunk, in_flight, done)
                why = decide(spend.dollars, estimate, self.max_dollars)
                if why == "next round would pass it" and not spend.priced and not handed:
                    why = "first round would pass it"
                if why is not None:
                    left = len(chunk) + sum(len(c) for c in queue)
                    self._stop(why, spend.dollars, estimate, left)
                    return
            handed.extend(chunk)
            yield chunk

    def _probe(self, chunk: list, done: Mapping[str, Record]) -> bool:
        """Whether the round ``chunk`` goes out as one request first: its items' prompts are
        counted, and no finished record has shown yet what the model charges for a counted
        prompt (the run's first request), or the last ones showed more than their estimate
        did (the rate went up since). So no round is sent at a rate the server never
        confirmed: one request is, and the next estimate prices the rest at what it charged."""
        self._count(chunk)
        if self._counted.get(chunk[0][1]) is None:
            return False
        measured, rate = self._measured(done)
        return not measured or rate > self._rate

    def estimate(
        self, spend: Spend, chunk: list, in_flight: list, done: Mapping[str, Record]
    ) -> float:
        """Dollars the round ``chunk`` and the records still ``in_flight`` (``(item, key)``
        pairs) are expected to cost: each at its own bound (``bound``), its prompts priced at
        the prompt tokens the model charged per counted one so far (``_measured``) and scaled up
        where finished records cost more than their bounds, else at the mean per priced record
        so far; plus the judge's mean per record when judged, and the preload of each of their
        groups not paid yet (at its bound, else at the mean one-time dollars so far)."""
        self._count(chunk)
        scale = self._scale(done)
        self._rate = rate = self._measured(done)[1]
        judge = spend.judge_per_record if self.judged else 0.0
        total, unbounded = 0.0, []
        for item, key in [*chunk, *in_flight]:
            own = self._bounds.get(key)
            if own is None:
                unbounded.append(item)
                total += spend.per_record + judge
                continue
            counted = self._counted.get(key)
            at_rate = own + counted.at(rate) - counted.at(1.0) if counted else own
            total += max(own * scale, at_rate) + judge
        groups = {preload.group(*item) for item, _ in [*chunk, *in_flight]} - {None}
        groups -= set(spend.one_time)  # paid: counted once, in the spend
        total += scale * sum(self._preloads[g] for g in groups if g in self._preloads)
        rest = [item for item in unbounded if preload.group(*item) not in self._preloads]
        return total + preload_estimate(spend, rest)

    def _count(self, chunk: list) -> None:
        """The bound of each record of ``chunk`` not counted yet, and of its preloads."""
        fresh = [(item, key) for item, key in chunk if key not in self._bounds]
        if not fresh:
            return
        counted = self.bound([item for item, _ in fresh]) if self.bound is not None else None
        items = counted.items if counted is not None else (None,) * len(fresh)
        prompts = (counted.counted if counted is not None else ()) or (None,) * len(fresh)
        for (_, key), own, prompt in zip(fresh, items, prompts, strict=True):
            self._bounds[key] = own
            if prompt is not None:
                self._counted[key] = prompt
                self._unmeasured.add(key)
        for group, once in (counted.preloads if counted is not None else {}).items():
            self._preloads.setdefault(group, once)

    def _measured(self, done: Mapping[str, Record]) -> tuple[int, float]:
        """(records measured, rate): the most prompt tokens the model charged per counted prompt
        token, over the finished records whose calls were all counted (a Self-Route that fell
        back to long context made a call the count did not see), at least 1. The highest, not
        the mean: a request is sent only if the budget covers its worst case."""
        for key in [k for k in self._unmeasured if k in done]:
            self._unmeasured.discard(key)
            record, counted = done[key], self._counted[key]
            cost = getattr(record, "cost", None)
            if cost is None or getattr(record, "error", None) or counted.prompt_tokens <= 0:
                continue
            if getattr(cost, "llm_calls", 0) != counted.calls or not cost.prompt_tokens:
                continue
            self._measured_records += 1
            rate = cost.prompt_tokens / counted.prompt_tokens
            self._measured_rate = max(self._measured_rate, rate)
        return self._measured_records, self._measured_rate

    def _scale(self, done: Mapping[str, Record]) -> float:
        """What the finished records cost over their bounds, when that is more than 1 (the count
        fell short of what the server charged); else 1."""
        measured = bounded = 0.0
        for key, own in self._bounds.items():
            record = done.get(key)
            if own is None or record is None or getattr(record, "error", None):
                continue
            gen = record_dollars(record)[0]
            if gen is not None and not math.isnan(gen) and not math.isnan(own):
                measured, bounded = measured + gen, bounded + own
        return max(1.0, measured / bounded) if bounded > 0 else 1.0

    def passed(self, done: Mapping[str, Record]) -> str | None:
        """After the run: the warning for a spend over the cap that no check stopped (a last
        round that cost more than its estimate), recorded in ``info``; None when within it.
        A stopped run's ``info`` gets the spend of the records written (``done``): an executor
        with rounds in flight when it stopped (Ray) drains them, and what they cost counts;
        where they passed the cap, ``passed_by`` says by how much (``reason`` says it)."""
        if self.max_dollars is None:
            return None
        spent = spend_of(done.values(), self.meta).dollars
        if self.stopped is not None:
            if math.isnan(spent):
                self.info |= {"spent_dollars": None, "why": "not a number"}
            else:
                self.info["spent_dollars"] = _rounded(spent)
                if spent > self.max_dollars:
                    self.info["passed_by"] = _rounded(spent - self.max_dollars)
            return None
        if not (spent > self.max_dollars or math.isnan(spent)):
            return None
        self.info = {
            "max_dollars": self.max_dollars,
            "spent_dollars": _rounded(spent),
            "why": "passed it",
        }
        if math.isnan(spent):
            return (
                f"over budget: the spend is not a number (NaN dollars), so max_dollars "
                f"${self.max_dollars:,.6f} could not be held; check the price sheet"
            )
        return (
            f"over budget: spent ${spent:,.6f} of max_dollars ${self.max_dollars:,.6f}, passed "
            f"it by ${spent - self.max_dollars:,.6f}: {self._culprit(done, self.max_dollars)}"
        )

    def _culprit(self, done: Mapping[str, Record], cap: float) -> str:
        """What passed the cap: generation (a round over its bound), else the judge pass, else
        the noise pass (each estimated at its mean per record so far)."""
        spend = spend_of(done.values(), self.meta)
        generation = spend.dollars - spend.judge_dollars - spend.noise_dollars
        if generation > cap:
            return (
                "a round cost more than its estimate (its prompts counted by the configured "
                "tokenizer, its answers at max_new_tokens)"
            )
        if generation + spend.judge_dollars > cap:
            return (
                f"the judge pass (${spend.judge_dollars:,.6f}) cost more than its estimate (its "
                "mean judge dollars per record so far)"
            )
        return (
            f"the noise pass (${spend.noise_dollars:,.6f}) cost more than its estimate (its "
            "mean dollars per record so far, else the records' own generation dollars)"
        )

    def judge_chunk(self, done: Mapping[str, Record], size: int, first: bool) -> int:
        """How many records the judge pass takes in its next chunk: under a cap, its ``first``
        chunk is one record when no record has judge dollars yet (a chunk is estimated at the
        judge's mean, nothing before one is known, so a run of up to ``size`` records was judged
        whole whatever the cap); else ``size``. Only the first: a judge that never prices (no
        sheet, embedding metrics, failing calls) would otherwise go one record at a time."""
        if self.max_dollars is None or not first or spend_of(done.values(), self.meta).judged:
            return size
        return 1

    def allows(
        self, done: Mapping[str, Record], chunk: Sequence[Record], left: int, step: str
    ) -> bool:
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
        self.info = BudgetInfo(
            max_dollars=self.max_dollars,
            spent_dollars=_rounded(spent),
            next_round_estimate=_rounded(estimate),
            why=why,
            records_left=left,
        )
        if step:
            self.info["pass"] = step
        if self._rate > 1 and not step:  # the model charged more prompt tokens than counted
            self.info["prompt_rate"] = round(self._rate, 3)

    @property
    def reason(self) -> str:
        """The one line a stopped run prints."""
        i = self.info
        if i["why"] == "not a number":
            return (
                f"stopped: budget: the spend or the next round's estimate is not a number (NaN "
                f"dollars), so max_dollars ${i['max_dollars']:,.6f} cannot be held; "
                f"{i['records_left']} record(s) left: check the price sheet"
            )
        spent, cap = i["spent_dollars"], i["max_dollars"]
        assert spent is not None and cap is not None  # a NaN reads "not a number", above
        over = spent - cap
        if i["why"] == "reached" and over > 0:
            why = f"passed it by ${over:,.6f}"
        elif i["why"] == "reached":
            why = "reached it"
        elif i["why"] == "first round would pass it":
            why = (
                f"the first round would pass it (estimated at most ${i['next_round_estimate']:,.6f}"
                ": its prompt tokens as the dry run counts them, every answer at max_new_tokens)"
            )
        else:
            why = f"the next round (~${i['next_round_estimate']:,.6f}) would pass it"
            if i.get("prompt_rate"):
                why += (
                    f" (its prompts at the {i['prompt_rate']:g}x tokens the model charged per "
                    "token counted so far)"
                )
        if i["why"] != "reached" and over > 0:  # rounds drained after the stop (Ray)
            why += (
                f"; passed it by ${over:,.6f} with the rounds in flight when it stopped (they "
                "finish and are kept)"
            )
        left = f"{i['records_left']} record(s) left" + (
            f" in the {i['pass']} pass" if i.get("pass") else ""
        )
        return (
            f"stopped: budget: spent ${i['spent_dollars']:,.6f} of max_dollars "
            f"${i['max_dollars']:,.6f}, {why}; {left}: rerun with a higher --max-dollars to "
            "resume"
        )


def _rounded(dollars: float) -> float | None:
    """Dollars for the manifest: 6 decimals; None for NaN (not JSON)."""
    return None if math.isnan(dollars) else round(dollars, 6)


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
