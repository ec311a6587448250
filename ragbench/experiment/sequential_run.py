"""Stop when decided (``ragbench run --until-decided``; the config's ``sequential`` section):
the run's questions in a seeded random order, in rounds; after each round a look decides,
by the verdict itself (``analysis.verdict.sequential_look`` with the looks so far, handed to
the runner by its caller: the best retrieval variant against the best long-context one, their
repeated confidence interval at the look's group-sequential boundary, ``analysis.sequential``),
between "recommend X" (more accurate, or the cheaper one not worse by more than the margin),
"equivalent within the margin" and "continue". The run stops when decided, at the budget
(``max_dollars``: the budget stops a round; a last look is taken on what was answered) or when
the questions run out.

The runner generates each round's work items as it always does (``runner._generate``: rounds of
``batch_size``, the budget, the executor); this module only says which questions come next and
whether to go on. Every look goes to the session's manifest entry (``sequential.looks``: n,
statistic, boundary, decision). Looks are decided from the records alone, so a resumed run
replays the same looks over the records it has and stops where the first run stopped (or goes
on where that one was stopped by the budget).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from ragbench.analysis._common import _scored
from ragbench.experiment.results import table
from ragbench.experiment.session import RunSession
from ragbench.types import Example, Record

if TYPE_CHECKING:
    import pandas as pd

# a verdict's reason -> the look's decision (the verdict's choice completes it)
STOPS = {"more_accurate": "recommend", "not_worse": "recommend"}


def question_order(examples: list[Example], seed: int) -> list[str]:
    """The run's question ids in a seeded random order (each once; same seed, same order)."""
    ids = list(dict.fromkeys(e.id for e in examples))
    perm = np.random.default_rng([seed, 0x5E9]).permutation(len(ids))
    return [ids[i] for i in perm]


class Sequential:
    """One run's looks. ``rounds(pending)`` hands out each round's pending work items (some
    rounds may have none left: a resumed run); after each, the runner calls ``look(done)``,
    True once decided. ``summary()`` is the session's manifest entry."""

    def __init__(self, session: RunSession) -> None:
        cfg = session.cfg
        if cfg.sequential is None or session.until_decided is None:
            raise ValueError("a sequential run needs the config's sequential section and its look")
        self.cfg, self.sc, self.decide = cfg, cfg.sequential, session.until_decided
        seed = self.sc.seed if self.sc.seed is not None else cfg.seed
        self.order = question_order(session.examples, seed)
        self.rank = {qid: i for i, qid in enumerate(self.order)}
        self.at = self.sc.looks(len(self.order))  # questions asked by each look
        self.keys = session.keys
        self.meta = {e.id: e.meta for e in session.examples}
        self.looks: list[dict[str, Any]] = []
        self.fractions: list[float] = []
        self.asked = 0  # questions handed out so far
        self.stopped: str | None = None
        self.verdict: Any = None

    def rounds(self, pending: list) -> Iterator[list]:
        """Each round's pending ``((example, params), key)`` items, in plan order."""
        start = 0
        for end in self.at:
            ids = set(self.order[start:end])
            self.asked, start = end, end
            yield [item for item in pending if item[0][0].id in ids]
            if self.stopped:
                return

    def look(self, done: dict[str, Record], budget_stopped: bool = False) -> bool:
        """A look at the records of the questions asked so far; True when the run stops here
        (decided, or ``budget_stopped``, or the last round)."""
        asked = set(self.order[: self.asked])
        records = [done[k] for k in self.keys if k in done and done[k].example_id in asked]
        answered = len({r.example_id for r in records})
        if budget_stopped and answered == 0:
            self.stopped = "budget"
            return True
        fraction = answered / len(self.order)
        if self.fractions and fraction <= self.fractions[-1]:  # nothing new since the last look
            self.stopped = "budget" if budget_stopped else self.stopped
            return budget_stopped
        self.fractions.append(fraction)
        last = self.asked >= len(self.order)
        df = table(records, self.meta, list(self.cfg.metrics))
        # nothing scored yet (every record an error): nothing to decide; any other failure of
        # the verdict is an error, never read as "nothing scored"
        scored = not _scored(df, self.cfg.metrics[0]).empty
        v = self._verdict(df, answered, None) if scored else None
        decided = v is not None and v.reason in STOPS
        why = "decided" if decided else "budget" if budget_stopped else "questions ran out" * last
        if why:
            self.stopped = why
            if v is not None:  # the same numbers, with the stop in words
                v = self._verdict(df, answered, why)
        self.verdict = v
        self.looks.append(self._record(v, answered))
        return bool(why)

    def _verdict(self, df: pd.DataFrame, answered: int, stopped: str | None) -> Any:
        return self.decide(df, self.state(answered, stopped))

    def state(self, answered: int | None = None, stopped: str | None = None) -> dict[str, Any]:
        """What ``analysis.verdict`` reads of the looks (the last one last)."""
        return {
            "fractions": list(self.fractions),
            "spending": self.sc.spending,
            "questions": len(self.order),
            "answered": answered
            if answered is not None
            else round((self.fractions[-1] if self.fractions else 0) * len(self.order)),
            "stopped": stopped if stopped is not None else self.stopped,
            "alpha": self.sc.alpha,
            "margin": self.sc.margin,
            "seed": self.cfg.seed,
        }

    def _record(self, v: Any, answered: int) -> dict[str, Any]:
        if v is None:
            return {
                "look": len(self.looks) + 1,
                "n": 0,
                "of": len(self.order),
                "fraction": round(self.fractions[-1], 6),
                "asked": answered,
                "decision": "continue",
                "reason": "nothing scored",
            }
        s = v.sequential or {}
        if v.reason in STOPS:
            equivalent = (
                v.ci_high is not None
                and v.ci_high < self.sc.margin
                and v.ci_low > (-self.sc.margin)
            )
            decision = (
                "equivalent within the margin: recommend "
                if equivalent and v.reason == "not_worse"
                else "recommend "
            ) + str(v.choice)
        else:
            decision = "continue"
        x, y = v.compared or (None, None)
        look = {
            "look": len(self.looks) + 1,
            "n": int(v.n_pairs or 0),
            "of": len(self.order),
            "asked": answered,
            "fraction": self.fractions[-1],
            "statistic": abs(s.get("z", math.nan)),
            "boundary": s.get("boundary", math.nan),
            "comparisons": s.get("comparisons"),
            "x": x,
            "y": y,
            "diff": v.diff,
            "ci_low": v.ci_low,
            "ci_high": v.ci_high,
            "decision": decision,
            "reason": v.reason,
        }
        return {k: _json(v) for k, v in look.items()}

    def summary(self) -> dict[str, Any]:
        """The session's manifest entry: the design, every look, why it stopped."""
        return {
            "spending": self.sc.spending,
            "alpha": self.sc.alpha,
            "margin": self.sc.margin,
            "seed": self.sc.seed if self.sc.seed is not None else self.cfg.seed,
            "questions": len(self.order),
            "planned_looks": self.at,
            "answered": self.looks[-1]["asked"] if self.looks else 0,
            "stopped": self.stopped,
            "looks": self.looks,
            "fractions": list(self.fractions),
            "decision": self.looks[-1]["decision"] if self.looks else None,
            "line": self.line(),
            "verdict": self.verdict.text if self.verdict is not None else None,
        }

    def line(self) -> str:
        """One line for the terminal: where it stopped and what it decided."""
        last = self.looks[-1] if self.looks else {}
        n, of = last.get("asked", 0), len(self.order)
        head = {
            "decided": f"decided after {n:,} of {of:,} questions",
            "budget": f"stopped at the budget after {n:,} of {of:,} questions",
        }.get(self.stopped or "", f"not decided after all {of:,} questions")
        return f"sequential: {head} ({len(self.looks)} looks): {last.get('decision', 'continue')}"


def _json(value: object) -> object:
    """Floats rounded for the manifest; NaN as None (not JSON)."""
    if isinstance(value, float | np.floating):
        return round(float(value), 6) if math.isfinite(value) else None
    return value


def generate_until_decided(
    session: RunSession,
    seq: Sequential,
    pending: list,
    generate: Callable[[list], int],
    score: Callable[[], object] | None = None,
) -> tuple[int, int]:
    """Each round's pending items through ``generate`` (the runner's ``_generate`` on them;
    returns its errors), ``score`` (the judge pass, when the decision metric is judged), then a
    look at the session's records; stops when decided, at the session's budget or when the
    questions run out. Returns (errors, work items handed out)."""
    errors = handed = 0
    budget = session.budget
    for items in seq.rounds(pending):
        if items:
            handed += len(items)
            errors += generate(items)
        if score is not None and not budget.stopped:
            score()
        if seq.look(session.done, budget_stopped=bool(budget.stopped)):
            break
    if budget.stopped and not budget.info.get("pass"):  # stopped in generation: every question
        # not answered is left, the later looks' too, not only the stopped round's
        budget.info["records_left"] = len(pending) - (handed - budget.pending_at_stop)
    return errors, handed
