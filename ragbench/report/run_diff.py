"""Two runs, question by question: ``compare_runs(run_a, run_b)`` (``ragbench diff``).

``ragbench.load([a, b])`` sets two runs one below the other (each label names its run), so a
summary counts every question once per run. This pairs them instead, to answer "what did the
change do": the settings that differ between the two runs' configs come first (flattened to
dotted keys: ``retrieval.chunk_size: 64 -> 32``), then the questions both asked (by
``example_id``; the others are counted and left out), each variant of A matched with its
counterpart in B, and per matched pair the paired difference of the score with the verdict's
procedure (``analysis.paired.paired_difference``: Tango's interval and McNemar's test for 0/1
scores, else a paired bootstrap; Bonferroni over the pairs), the cost and latency ratios with
the verdict's bootstrap interval (``analysis.verdict_table.cost_ratio``), and the questions that
flipped: right in A only, right in B only.

Variants are matched by ``report.run_match`` (the pairs given, then the same label, then
the same strategy whose parameters differ only in what differs between the runs: ``rag k=1 ...
chunk=64`` with ``rag k=1 ... chunk=32``); the matching is part of the result, each pair with
the rule that made it, and what stayed unmatched with why.

One job: the diff of two runs (its numbers and their text); the matching is ``run_match``'s.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragbench.analysis._common import (
    _higher_is_better,
    _scored,
    check_metric_version,
    check_one_row_each,
    counted,
    metric_columns,
    own_latency_seconds,
    resolve_metric,
)
from ragbench.analysis.labels import with_labels
from ragbench.analysis.paired import paired_difference
from ragbench.analysis.routing import pick_cost
from ragbench.analysis.verdict_table import cost_ratio
from ragbench.registry import unknown
from ragbench.report.run_match import (
    Match,
    Unmatched,
    given_pairs,
    match_variants,
    show_value,
    value_key,
    variants,
)
from ragbench.report.runs import load, manifest_of, run_folder, run_names
from ragbench.schema import check
from ragbench.secrets import redact

if TYPE_CHECKING:
    import pandas as pd

SIDES = ("A", "B")
NOT_SET = "(not set)"  # a setting one config has and the other does not
# a pair's numbers, in the order its JSON and table show them
PAIR_NUMBERS = (
    "a_score",
    "b_score",
    "difference",
    "ci_low",
    "ci_high",
    "p_value",
    "cost_ratio",
    "cost_ratio_low",
    "cost_ratio_high",
    "latency_ratio",
    "latency_ratio_low",
    "latency_ratio_high",
)


class RunDiffError(ValueError):
    """Two runs that cannot be paired (no question in common, a bad ``pairs`` entry)."""


# ------------------------------------------------------------------------------ the results


@dataclass(frozen=True)
class Setting:
    """A config setting (dotted key) whose value differs between run A and run B (``None``
    where one config does not set it)."""

    key: str
    a: object
    b: object

    def __str__(self) -> str:
        a = NOT_SET if self.a is None else show_value(self.a)
        b = NOT_SET if self.b is None else show_value(self.b)
        return f"{self.key}: {a} -> {b}"


def _number(x: float | None) -> float | None:
    """A float for JSON: NaN (nothing to compute) as null."""
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


@dataclass(frozen=True)
class PairDiff:
    """One matched pair on the questions both answered with a score (``n``): each run's mean
    ``metric`` over them, ``difference`` = a_score - b_score with its interval and ``p_value``
    (``test``: ``tango`` or ``paired_bootstrap``; Bonferroni over the diff's pairs),
    ``cost_ratio`` (mean cost per query of A over B, the diff's ``cost`` column) and
    ``latency_ratio`` (mean own latency, A over B), each with a 95% bootstrap interval; and the
    questions that flipped (``a_only``: right in A only, better in A for scores other than 0/1;
    ``b_only``: the other way), by ``example_id`` in A's order."""

    match: Match
    n: int
    a_score: float
    b_score: float
    difference: float
    ci_low: float
    ci_high: float
    p_value: float
    test: str
    cost_ratio: float
    cost_ratio_low: float
    cost_ratio_high: float
    latency_ratio: float
    latency_ratio_low: float
    latency_ratio_high: float
    a_only: tuple[str, ...]
    b_only: tuple[str, ...]

    @property
    def a_label(self) -> str:
        return self.match.a_label

    @property
    def b_label(self) -> str:
        return self.match.b_label

    def to_json(self) -> dict[str, Any]:
        """Plain JSON values (NaN as null; flipped ids as lists)."""
        return {
            "a_label": self.a_label,
            "b_label": self.b_label,
            "match": self.match.rule,
            "differs": list(self.match.differs),
            "n": self.n,
            **{name: _number(getattr(self, name)) for name in PAIR_NUMBERS},
            "test": self.test,
            "a_only": list(self.a_only),
            "b_only": list(self.b_only),
        }


@dataclass(frozen=True)
class RunDiff:
    """Run A against run B (module docstring): ``settings`` that differ between their configs,
    the questions both asked (``shared``) and those left out (``left_out_a``: asked by A only,
    ``left_out_b``: by B only), one ``PairDiff`` per matched pair (its ``match`` says how it was
    matched), the variants left ``unmatched``, on ``metric``; ``cost``: the column the cost
    ratios divide (dollars, else resource seconds; None: neither is known for every row).
    Each difference's interval holds at ``1 - level / len(pairs)`` (together at ``1 - level``).
    ``table()``: one row per pair; ``to_json()``: what ``ragbench diff --json`` prints;
    ``text()``: what ``ragbench diff`` prints."""

    a: str
    b: str
    metric: str
    settings: tuple[Setting, ...]
    shared: int
    left_out_a: int
    left_out_b: int
    pairs: tuple[PairDiff, ...]
    unmatched: tuple[Unmatched, ...] = ()
    cost: str | None = None
    level: float = 0.05
    notes: tuple[str, ...] = ()

    @property
    def ci_level(self) -> float:
        """The level each pair's interval holds at (Bonferroni over the pairs)."""
        return 1 - self.level / max(1, len(self.pairs))

    def to_json(self) -> dict[str, Any]:
        """What ``ragbench diff --json`` prints: plain JSON values, NaN as null."""
        return {
            "runs": {"a": self.a, "b": self.b},
            "metric": self.metric,
            "settings": [{"key": s.key, "a": s.a, "b": s.b} for s in self.settings],
            "shared": self.shared,
            "left_out": {"a": self.left_out_a, "b": self.left_out_b},
            "cost": self.cost,
            "ci_level": self.ci_level,
            "pairs": [p.to_json() for p in self.pairs],
            "unmatched": [{"side": u.side, "label": u.label, "why": u.why} for u in self.unmatched],
            "notes": list(self.notes),
        }

    def table(self) -> Any:
        """One row per pair: labels, rule, ``n``, the numbers, and the flipped counts
        (``n_a_only``, ``n_b_only``) beside their ids."""
        import pandas as pd

        rows = []
        for p in self.pairs:
            row = p.to_json()
            row["differs"] = ", ".join(row["differs"])
            row["n_a_only"], row["n_b_only"] = len(p.a_only), len(p.b_only)
            rows.append(row)
        heads = ["a_label", "b_label", "match", "differs", "n"]
        tails = ["test", "n_a_only", "n_b_only", "a_only", "b_only"]
        table = pd.DataFrame(rows, columns=[*heads, *PAIR_NUMBERS, *tails])
        table.attrs.update(metric=self.metric, cost=self.cost, ci_level=self.ci_level)
        return table

    def text(self, limit: int = 10) -> str:
        """The diff for people: settings first, then the questions, the matching, and one block
        per pair; flipped ids beyond ``limit`` are counted, not listed."""
        lines = _head_lines(self)
        for pair in self.pairs:
            lines += _pair_lines(self, pair, limit)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()


def _percent(level: float) -> str:
    return f"{100 * level:.4g}%"


def _ratio(value: float, low: float, high: float) -> str:
    if math.isnan(value):
        return "n/a"
    return f"{value:#.3g}x (95% CI {low:#.3g} to {high:#.3g})"


def _ids(ids: tuple[str, ...], limit: int) -> str:
    if not ids:
        return "none"
    shown = ", ".join(ids[:limit])
    more = f" and {len(ids) - limit} more" if len(ids) > limit else ""
    return f"{len(ids)}: {shown}{more}"


def _head_lines(d: RunDiff) -> list[str]:
    """Settings, questions, matching."""
    lines = [f"A = {d.a}, B = {d.b}"]
    if d.settings:
        lines += ["settings that differ (A -> B):", *(f"  {s}" for s in d.settings)]
    else:
        lines.append("settings that differ: none found in the two configs")
    left = ""
    if d.left_out_a or d.left_out_b:
        left = f"; left out: {d.left_out_a:,} asked only by A, {d.left_out_b:,} only by B"
    lines.append(f"questions: {d.shared:,} asked by both{left}")
    lines.append(f"matching ({counted(len(d.pairs), 'pair')}):")
    lines += [f"  {p.match}" for p in d.pairs]
    lines += [f"  unmatched in {u.side}: {u.label} ({u.why})" for u in d.unmatched]
    lines += [f"note: {n}" for n in d.notes]
    if d.pairs:
        lines.append(
            f"{d.metric}: A - B with {_percent(d.ci_level)} intervals (Bonferroni over "
            f"{counted(len(d.pairs), 'pair')}); cost: {d.cost or 'unknown'} per query"
        )
    return lines


def _pair_lines(d: RunDiff, p: PairDiff, limit: int) -> list[str]:
    """One pair's block."""
    binary = p.test == "tango"
    test = "Tango score test" if binary else "paired bootstrap"
    right = "right" if binary else "better"
    return [
        "",
        f"{p.a_label} -> {p.b_label}  ({counted(p.n, 'paired question')})",
        f"  {d.metric}: A {p.a_score:.3f}, B {p.b_score:.3f}; A - B = {p.difference:+.3f} "
        f"({_percent(d.ci_level)} CI {p.ci_low:+.3f} to {p.ci_high:+.3f}; {test} p={p.p_value:.3g})",
        f"  cost A/B: {_ratio(p.cost_ratio, p.cost_ratio_low, p.cost_ratio_high)}; latency A/B: "
        f"{_ratio(p.latency_ratio, p.latency_ratio_low, p.latency_ratio_high)}",
        f"  {right} in A only: {_ids(p.a_only, limit)}",
        f"  {right} in B only: {_ids(p.b_only, limit)}",
    ]


# ------------------------------------------------------------------------------ the two runs


@dataclass(frozen=True)
class _Run:
    """One side: its name, results table (labels as the run wrote them), config (None: no
    manifest to read) and folder (None: a table given without one)."""

    name: str
    table: pd.DataFrame
    config: dict[str, object] | None
    folder: Path | None


def _config(folder: Path | None) -> dict[str, object] | None:
    """The run's config from its manifest (another schema's: SchemaError), credentials masked."""
    if folder is None:
        return None
    manifest = manifest_of(folder)
    config = manifest.get("config")
    if not isinstance(config, dict):
        return None
    check(manifest, folder)
    return redact(config)


def _side(run: object, side: str) -> _Run:
    """A run folder (or its ``results.parquet``), or the table ``ragbench.load`` returns for one
    run; anything else is an error saying what is accepted."""
    import pandas as pd

    folder: Path | None  # a table's own folder, where it names one
    if isinstance(run, str | PathLike):
        folder = run_folder(run)
        table = load(folder)
    elif isinstance(run, pd.DataFrame):
        table = run
        runs = list(dict.fromkeys(table["run"])) if "run" in table else []
        if len(runs) > 1:
            raise RunDiffError(
                f"run {side} holds {len(runs)} runs ({', '.join(map(str, runs))}): give one run "
                "folder, or ragbench.load(one_run_dir)"
            )
        dirs = table.attrs.get("run_dirs") or {}
        folder = Path(next(iter(dirs.values()))) if len(dirs) == 1 else None
    else:
        raise RunDiffError(
            f"run {side}: a run folder or the table ragbench.load(run_dir) returns; got "
            f"{type(run).__name__}"
        )
    table = with_labels(table)
    check_one_row_each(table)
    if "run" in table and len(table):
        name = str(table["run"].iloc[0])
    else:
        name = folder.name if folder else f"run {side}"
    return _Run(name, table, _config(folder), folder)


def _named(a: _Run, b: _Run) -> tuple[_Run, _Run]:
    """The two sides under distinct names (two folders of one name: with their parents)."""
    if a.name != b.name:
        return a, b
    if a.folder is not None and b.folder is not None and a.folder.resolve() != b.folder.resolve():
        na, nb = run_names([a.folder, b.folder])
    else:
        na, nb = f"{a.name} (A)", f"{b.name} (B)"
    return _Run(na, a.table, a.config, a.folder), _Run(nb, b.table, b.config, b.folder)


def flat_settings(config: object, prefix: str = "") -> dict[str, object]:
    """A config as ``{dotted key: value}``: mappings by key, lists of mappings by position
    (``strategies.2.params.top_k``); any other list is one value (``metrics``, a grid axis)."""
    out: dict[str, object] = {}
    if isinstance(config, Mapping):
        items: Iterable[tuple[object, object]] = config.items()
    elif isinstance(config, list) and any(isinstance(v, Mapping) for v in config):
        items = enumerate(config)
    else:
        return {prefix.rstrip("."): config}
    for key, value in items:
        out.update(flat_settings(value, f"{prefix}{key}."))
    return out


def _settings(a: _Run, b: _Run) -> tuple[tuple[Setting, ...], list[str]]:
    """The settings that differ, in A's key order then B's own; notes where a config is
    missing (a folder without a manifest, a table without its folder)."""
    missing = [r.name for r in (a, b) if r.config is None]
    if missing:
        note = (
            f"no config for {' and '.join(missing)} (no manifest.json to read): the settings "
            "that differ are not known"
        )
        return (), [note]
    fa, fb = flat_settings(a.config or {}), flat_settings(b.config or {})
    keys = list(dict.fromkeys([*fa, *fb]))
    differ = [
        Setting(k, fa.get(k), fb.get(k))
        for k in keys
        if value_key(fa.get(k)) != value_key(fb.get(k))
    ]
    return tuple(differ), []


# ------------------------------------------------------------------------------ the numbers


@dataclass(frozen=True)
class _Setup:
    """What every pair's numbers share."""

    metric: str
    higher: bool
    shared: tuple[str, ...]
    cost: str | None
    level: float
    comparisons: int
    seed: int
    n_boot: int


NAN3 = (math.nan, math.nan, math.nan)


def _rows(run: _Run, label: str, shared: tuple[str, ...]) -> Any:
    t = run.table
    return t[(t["label"] == label) & t["example_id"].isin(shared)]


def _ratios(
    ra: pd.DataFrame, rb: pd.DataFrame, s: _Setup
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(cost ratio, latency ratio), each with its interval, by the verdict's method
    (``cost_ratio``) over the questions both answered: A's rows labelled "A", B's "B"."""
    import pandas as pd

    frame = pd.concat([ra.assign(label=SIDES[0]), rb.assign(label=SIDES[1])], ignore_index=True)
    cost = cost_ratio(frame, s.cost, *SIDES, s.n_boot, s.seed) if s.cost else NAN3
    latency = own_latency_seconds(frame)  # the request's own time, the harness's queue apart
    if latency is None:
        return cost, NAN3
    frame["latency_seconds"] = latency
    return cost, cost_ratio(frame, "latency_seconds", *SIDES, s.n_boot, s.seed)


def _pair(a: _Run, b: _Run, match: Match, s: _Setup) -> PairDiff:
    """One matched pair's numbers (``PairDiff``)."""
    ra, rb = _rows(a, match.a_label, s.shared), _rows(b, match.b_label, s.shared)
    xa = _scored(ra, s.metric).set_index("example_id")[s.metric].astype(float)
    xb = _scored(rb, s.metric).set_index("example_id")[s.metric].astype(float)
    in_b = set(xb.index)
    ids = [i for i in xa.index if i in in_b]  # scored in both, in A's order
    x, y = xa.loc[ids].to_numpy(), xb.loc[ids].to_numpy()
    # an independent stream per pair, fixed by ``seed`` and the two labels (as the verdict's)
    stream = [s.seed, zlib.crc32(match.a_label.encode()), zlib.crc32(match.b_label.encode())]
    r = paired_difference(x, y, s.level, s.comparisons, None, s.n_boot, stream)
    better_a = x > y if s.higher else x < y
    better_b = x < y if s.higher else x > y
    cost, latency = _ratios(ra, rb, s)
    return PairDiff(
        match=match,
        n=r["n"],
        a_score=float(x.mean()) if x.size else math.nan,
        b_score=float(y.mean()) if y.size else math.nan,
        difference=r["diff"],
        ci_low=r["ci_low"],
        ci_high=r["ci_high"],
        p_value=r["p_value"],
        test=r["test"],
        cost_ratio=cost[0],
        cost_ratio_low=cost[1],
        cost_ratio_high=cost[2],
        latency_ratio=latency[0],
        latency_ratio_low=latency[1],
        latency_ratio_high=latency[2],
        a_only=tuple(str(i) for i, flag in zip(ids, better_a, strict=True) if flag),
        b_only=tuple(str(i) for i, flag in zip(ids, better_b, strict=True) if flag),
    )


def _labels(run: _Run) -> list[str]:
    return [str(label) for label in dict.fromkeys(run.table["label"])]


def _cost_column(a: _Run, b: _Run, matches: list[Match], shared: tuple[str, ...]) -> str | None:
    """The cost the ratios divide: dollars where every answered row of the matched variants in
    both runs has them (both had a price sheet), else resource seconds (``pick_cost``); None
    when neither is known for every row."""
    import pandas as pd

    rows = pd.concat(
        [_rows(a, m.a_label, shared) for m in matches]
        + [_rows(b, m.b_label, shared) for m in matches],
        ignore_index=True,
    )
    try:
        return pick_cost(rows)
    except ValueError:
        return None


def _metric(a: _Run, b: _Run, metric: str | None) -> str:
    """``metric``, by default A's first; both runs must have it, scored by one version."""
    import pandas as pd

    metric = resolve_metric(a.table, metric)
    if metric not in b.table:
        raise unknown(f"metric column of run B ({b.name})", metric, metric_columns(b.table))
    resolve_metric(b.table, metric)
    if "metric_versions" in a.table and "metric_versions" in b.table:
        both = pd.concat([a.table[["metric_versions"]], b.table[["metric_versions"]]])
        check_metric_version(both, metric)
    return metric


def _question_notes(a: _Run, b: _Run, shared: tuple[str, ...]) -> list[str]:
    """A note when shared ids hold different question texts (``question``, from each folder's
    ``questions.parquet``): pairing by id assumes they are the same questions."""
    if "question" not in a.table or "question" not in b.table:
        return []
    qa = a.table.drop_duplicates("example_id").set_index("example_id")["question"]
    qb = b.table.drop_duplicates("example_id").set_index("example_id")["question"]
    texts = [(i, qa.get(i), qb.get(i)) for i in shared]
    differ = [i for i, x, y in texts if isinstance(x, str) and isinstance(y, str) and x != y]
    if not differ:
        return []
    return [
        f"{counted(len(differ), 'shared example_id')} hold different question texts in the two "
        f"runs (e.g. {differ[0]!r}): pairing by id assumes the same questions"
    ]


def _shared(a: _Run, b: _Run) -> tuple[tuple[str, ...], int, int]:
    """(the example ids both runs asked, in A's order; how many only A asked; only B), or an
    error when they share none."""
    ids_a = list(dict.fromkeys(a.table["example_id"]))
    ids_b = list(dict.fromkeys(b.table["example_id"]))
    in_b = set(ids_b)
    shared = tuple(i for i in ids_a if i in in_b)
    if not shared:
        e_a = f" (e.g. {ids_a[0]!r})" if ids_a else ""
        e_b = f" (e.g. {ids_b[0]!r})" if ids_b else ""
        raise RunDiffError(
            f"no question in common: {a.name} asked {counted(len(ids_a), 'question')}{e_a} and "
            f"{b.name} {counted(len(ids_b), 'question')}{e_b}, none with the same example_id; "
            "runs are paired question by question, so they must ask some of the same questions"
        )
    return shared, len(ids_a) - len(shared), len(ids_b) - len(shared)


def compare_runs(
    a: object,
    b: object,
    pairs: Mapping[str, str] | Iterable[str] | None = None,
    metric: str | None = None,
    seed: int = 0,
    *,
    level: float = 0.05,
    n_boot: int = 2000,
) -> RunDiff:
    """Run ``a`` against run ``b`` question by question (module docstring; ``ragbench diff``).

    ``a``, ``b``: run folders (or a ``results.parquet`` in one), or the table
    ``ragbench.load(run_dir)`` returns for one run. ``pairs``: ``{label in a: label in b}``
    (or ``"LABEL_A=LABEL_B"`` texts, as ``--pair`` gives them) paired first, whatever their
    strategies; the rest are matched by label, then by strategy and parameters. ``metric``:
    default A's first metric (the run's primary); B must have it. ``seed`` fixes the bootstrap
    resamples; ``level``: the intervals hold together at ``1 - level`` (Bonferroni over the
    pairs). Errors (RunDiffError, a ValueError; RunFolderError for a path that is no run
    folder): no question in common, an unknown label in ``pairs`` (naming the valid ones), a
    metric one run lacks, a table holding two rows for one question and variant."""
    if not 0 < level < 1:
        raise RunDiffError(f"level must be in (0, 1), got {level}")
    ra, rb = _named(_side(a, SIDES[0]), _side(b, SIDES[1]))
    metric = _metric(ra, rb, metric)
    shared, only_a, only_b = _shared(ra, rb)
    labels_a, labels_b = _labels(ra), _labels(rb)
    given = given_pairs(pairs, labels_a, labels_b, (ra.name, rb.name))
    matches, unmatched = match_variants(variants(ra.table), variants(rb.table), given)
    settings, notes = _settings(ra, rb)
    setup = _Setup(
        metric=metric,
        higher=_higher_is_better(metric),
        shared=shared,
        cost=_cost_column(ra, rb, matches, shared) if matches else None,
        level=level,
        comparisons=max(1, len(matches)),
        seed=seed,
        n_boot=n_boot,
    )
    if matches and setup.cost is None:
        notes.append(
            "no cost known for every answered row of both runs (dollars, resource seconds): "
            "no cost ratio"
        )
    return RunDiff(
        a=ra.name,
        b=rb.name,
        metric=metric,
        settings=settings,
        shared=len(shared),
        left_out_a=only_a,
        left_out_b=only_b,
        pairs=tuple(_pair(ra, rb, m, setup) for m in matches),
        unmatched=tuple(unmatched),
        cost=setup.cost,
        level=level,
        notes=tuple(notes + _question_notes(ra, rb, shared)),
    )
