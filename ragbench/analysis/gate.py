"""A CI gate over a run: requirements such as ``"rag k=4: contains >= 0.6"`` or
``"long_context: dollars_per_1k <= 0.5"`` checked against the run's summary, and optionally the
verdict's choice (``ragbench check``; ``assert_run`` inside pytest).

A requirement is ``VARIANT: VALUE OP NUMBER``:

- ``VARIANT`` names one variant of the run: its label (``rag k=4 embedder=hash chunk=64
  overlap=8``) or words of it that only it has (``rag k=4``, ``long_context``);
- ``VALUE`` is a score (``contains``: the variant's mean), its interval's bounds
  (``contains.ci_low``, ``contains.ci_high``: the summary's 95% interval, Wilson for 0/1 scores,
  so a gate on ``ci_low`` is not passed by the noise of a few lucky questions) and its number of
  scored questions (``contains.n``), or a cost per query: ``dollars_per_1k``,
  ``amortised_dollars_per_1k``, ``latency_seconds``, ``prompt_tokens``, ``completion_tokens``,
  ``resource_seconds``;
- ``OP`` is one of ``>= <= > < ==``; ``NUMBER`` may end in ``%`` (``60%`` is 0.6).

The values are the summary's (``analysis.summary.summary``: the table ``ragbench run`` prints),
so a gate reads the numbers people read. A requirement that names no variant or value of the
run is malformed (``GateError``, naming the valid ones), never a silent pass.

The summary's means leave failed records out, so a gate also fails when records of the variants
it reads failed (more than ``max_errors``: 0 unless allowed), and when the run folder's manifest
says the run did not finish (``unfinished``: stopped at its budget, interrupted, or killed while
running, whose table is an earlier session's): a mean over the questions that happened to
succeed is not the run's.
"""

from __future__ import annotations

import json
import math
import operator
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

from ragbench.analysis._common import check_one_row_each, error_summary, metric_columns
from ragbench.analysis.labels import with_labels
from ragbench.analysis.summary import summary
from ragbench.analysis.verdict import verdict as decide_verdict
from ragbench.registry import did_you_mean
from ragbench.schema import read_folder_table

if TYPE_CHECKING:
    import pandas as pd

OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt, "==": operator.eq}
# a score's companions in the summary table (``contains.ci_low``)
SCORE_PARTS = ("ci_low", "ci_high", "n")
# per-query costs: name -> (summary or results column, scale); the means of successful rows
COSTS = {
    "dollars_per_1k": ("dollars", 1000.0),
    "amortised_dollars_per_1k": ("amortised_dollars", 1000.0),
    "latency_seconds": ("latency_seconds", 1.0),
    "prompt_tokens": ("prompt_tokens", 1.0),
    "completion_tokens": ("completion_tokens", 1.0),
    "resource_seconds": ("resource_seconds", 1.0),
}
_REQUIREMENT = re.compile(
    r"^(?P<variant>.+):\s*(?P<value>[A-Za-z_][\w@.\-]*)\s*(?P<op>>=|<=|==|>|<)\s*"
    r"(?P<number>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*(?P<percent>%?)\s*$"
)


class GateError(ValueError):
    """A malformed requirement, or one naming a variant or value the run does not have."""


@dataclass(frozen=True)
class Requirement:
    text: str  # as written
    variant: str
    value: str  # contains, contains.ci_low, dollars_per_1k, ...
    op: str
    number: float

    def holds(self, got: float) -> bool:
        return not math.isnan(got) and OPS[self.op](got, self.number)


def parse_requirement(text: str) -> Requirement:
    """``"rag k=4: contains.ci_low >= 0.5"`` -> a Requirement; a malformed one is a GateError
    saying what the shape is."""
    m = _REQUIREMENT.match(text.strip())
    if not m:
        raise GateError(
            f"malformed requirement {text!r}: expected 'VARIANT: VALUE OP NUMBER', e.g. "
            f"'rag k=4: contains >= 0.6' or 'long_context: dollars_per_1k <= 0.5' "
            f"(OP one of {' '.join(OPS)})"
        )
    number = float(m["number"]) / (100.0 if m["percent"] else 1.0)
    return Requirement(text.strip(), m["variant"].strip(), m["value"], m["op"], number)


def score_columns(df: pd.DataFrame) -> list[str]:
    """The run's score columns: answer metrics (``contains``) and retrieval metrics
    (``recall@5``) that scored something."""
    answer = metric_columns(df)
    ranked = [str(c) for c in df.columns if re.search(r"@\d+$", str(c)) and c not in answer]
    return [c for c in [*answer, *ranked] if df[c].notna().any()]


def unscored_columns(df: pd.DataFrame) -> list[str]:
    """The run's answer metrics that scored nothing (its config names them, every record's
    score is missing: a judge that never answered): a requirement on one fails, saying so."""
    return [c for c in metric_columns(df) if df[c].isna().all()]


def variant_values(df: pd.DataFrame, seed: int = 0) -> dict[str, dict[str, float]]:
    """Every value a requirement may name, per variant label (config order): each score with its
    ``.ci_low``, ``.ci_high`` and ``.n`` (the summary's; NaN and 0 for an unscored metric,
    ``unscored_columns``), and the ``COSTS`` (means over the variant's successful rows; NaN
    when the run has none, e.g. no price sheet: no dollars)."""
    import pandas as pd

    def _numeric_mean(s: pd.Series) -> float:
        return float(pd.to_numeric(s, errors="coerce").mean())

    df = with_labels(df)
    labels = list(dict.fromkeys(df["label"]))
    values: dict[str, dict[str, float]] = {label: {} for label in labels}
    for metric in score_columns(df):
        table = summary(df, metric=metric, seed=seed).set_index("label")
        for label in labels:
            row = table.loc[label]
            values[label][metric] = float(row[metric])
            for part in SCORE_PARTS:
                values[label][f"{metric}.{part}"] = float(row[part])
    for metric in unscored_columns(df):  # no mean, no interval, n = 0: never a pass
        none = {
            metric: math.nan,
            f"{metric}.ci_low": math.nan,
            f"{metric}.ci_high": math.nan,
            f"{metric}.n": 0.0,
        }
        for label in labels:
            values[label].update(none)
    ok = df[df["error"].isna()] if "error" in df else df
    for name, (column, scale) in COSTS.items():
        means = (
            ok.groupby("label")[column].apply(_numeric_mean)
            if column in ok and len(ok)
            else pd.Series(dtype=float)
        )
        for label in labels:
            mean = means.get(label, float("nan"))
            values[label][name] = float(mean) * scale if mean == mean else float("nan")
    return values


def match_variant(name: str, labels: list[str]) -> str:
    """The one label ``name`` names: itself, or the only label holding all its words. None or
    several: a GateError naming the labels."""
    if name in labels:
        return name
    words = name.split()
    found = [label for label in labels if set(words) <= set(label.split())]
    if len(found) == 1:
        return found[0]
    if found:
        raise GateError(
            f"variant {name!r} names {len(found)} variants ({'; '.join(found)}): "
            "add the words that tell them apart"
        )
    raise GateError(f"unknown variant {name!r}; {did_you_mean(name, labels)}")


def check_verdict_words(verdict: str, labels: list[str]) -> None:
    """``verdict`` (words of a label: ``rag``, ``long_context``; several variants may share them)
    names at least one of ``labels``, or a GateError naming them: a typo is never a FAILED
    verdict."""
    words = set(verdict.split())
    if not words or not any(words <= set(label.split()) for label in labels):
        raise GateError(
            f"verdict {verdict!r} names no variant of the run; {did_you_mean(verdict, labels)}"
        )


def _fmt(value: float) -> str:
    return "nan" if value != value else f"{value:.4g}"


def failed_records(df: pd.DataFrame, labels: list[str], max_errors: int = 0) -> list[str]:
    """A FAILED line when more than ``max_errors`` records of ``labels`` failed (their count per
    variant and the most frequent error), else none."""
    if "error" not in df.columns:
        return []
    rows = with_labels(df)
    bad = rows[rows["label"].isin(labels) & rows["error"].notna()]
    if len(bad) <= max_errors:
        return []
    counts = bad.groupby("label", sort=False).size()
    asked = rows[rows["label"].isin(counts.index)].groupby("label").size()
    each = "; ".join(f"{label}: {n} of {asked[cast('str', label)]}" for label, n in counts.items())
    message, n = error_summary(bad["error"], limit=1)[0]
    allow = f"--max-errors {len(bad)} (max_errors=) to allow them"
    return [
        f"FAILED records: {len(bad)} failed ({each}); the means leave them out; most "
        f"frequent ({n} x): {message[:200]}; {allow}"
    ]


def check(
    df: pd.DataFrame,
    requirements: list[str],
    verdict: str | None = None,
    seed: int = 0,
    metric: str | None = None,
    max_errors: int = 0,
) -> list[str]:
    """One line per failed requirement (empty: all hold). ``verdict``: the verdict's choice
    (``analysis.verdict.verdict`` on ``metric``, default the run's first) must be the variant it
    names (words of its label, as for requirements: ``rag``, ``long_context``). Every
    requirement (and ``verdict``) is parsed and matched before any is checked: a malformed one
    raises GateError. A requirement on a metric the run did not score fails, saying so. More
    than ``max_errors`` failed records of the variants it reads (those the requirements name;
    every variant with ``verdict``) fail it too (``failed_records``). So does a verdict that
    chose the variant for a model too weak to tell (``Verdict.weak_model``: its line): a
    stronger model might choose the other."""
    check_one_row_each(with_labels(df))  # the gate reads one run's table
    parsed = [parse_requirement(text) for text in requirements]
    values = variant_values(df, seed=seed)
    labels = list(values)
    valid = sorted({name for row in values.values() for name in row})
    resolved = []
    for req in parsed:
        label = match_variant(req.variant, labels)
        if req.value not in values[label]:
            raise GateError(
                f"requirement {req.text!r}: unknown value {req.value!r}; "
                f"{did_you_mean(req.value, valid)}"
            )
        resolved.append((req, label))
    if verdict is not None:
        check_verdict_words(verdict, labels)
    unscored = unscored_columns(df)
    read = labels if verdict is not None else list(dict.fromkeys(lb for _, lb in resolved))
    failed = failed_records(df, read, max_errors)
    for req, label in resolved:
        got = values[label][req.value]
        base = req.value.split(".")[0]
        if base in unscored and not req.holds(got):
            failed.append(
                f"FAILED {req.text}: {label}: {base} is configured but unscored in "
                f"this run (every record's {base} is missing)"
            )
        elif not req.holds(got):
            interval = ""
            if f"{base}.ci_low" in values[label]:
                row = values[label]
                interval = (
                    f" ({base} {_fmt(row[base])}, 95% CI {_fmt(row[base + '.ci_low'])}"
                    f"-{_fmt(row[base + '.ci_high'])}, n={int(row[base + '.n'])})"
                )
            failed.append(f"FAILED {req.text}: {label}: {req.value} is {_fmt(got)}{interval}")
    if verdict is not None:
        v = decide_verdict(df, metric=metric, seed=seed)
        if v.choice is None or not set(verdict.split()) <= set(v.choice.split()):
            failed.append(
                f"FAILED verdict {verdict}: the verdict chose "
                f"{v.choice or 'nothing'}: {headline(v.text)}"
            )
        elif v.weak_model:  # its choice, for a model that cannot tell: no evidence to gate on
            failed.append(f"FAILED verdict {verdict}: {v.weak_model} (it chose {v.choice})")
    return failed


def headline(text: str) -> str:
    """A verdict's sentence without its evidence (what a CI log line or a tracker tag shows)."""
    return text.split(" Evidence: ")[0].strip()


def load_run(run: str | Path | pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """(results table, seed) of a run folder (``results.parquet``, another schema's refused:
    ``ragbench.schema.read_folder_table``; the manifest's seed), or of a results DataFrame as
    given (seed 0)."""
    import pandas as pd

    if isinstance(run, pd.DataFrame):
        return run, 0
    folder = Path(run)
    results = folder / "results.parquet"
    if not results.exists():
        raise FileNotFoundError(f"{folder}: no results.parquet (is it a ragbench run folder?)")
    try:
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
        seed = int(manifest.get("config", {}).get("seed", 0))
    except (OSError, ValueError):
        seed = 0
    return read_folder_table(folder), seed


# what to do about a run that did not finish, by its manifest's status
_SAME_COMMAND = "(`ragbench run` on its config, or the same `ragbench compare`)"
NEXT = {
    "interrupted": f"run the command that started it again to resume {_SAME_COMMAND}: the "
    "records written are kept",
    "stopped": f"run the command that started it again, with a higher budget, to finish it "
    f"{_SAME_COMMAND}",
    "failed": "every record failed: fix the cause its most frequent error names, then run the "
    f"command that started it again {_SAME_COMMAND}",
    "running": "it is still running, or was killed before it could say so: wait for it, or run "
    f"the command that started it again to resume {_SAME_COMMAND}",
}


def unfinished(run: str | Path | pd.DataFrame) -> list[str]:
    """A FAILED line when the run folder's manifest says the run did not finish: ``stopped``
    (its budget), ``interrupted`` (SIGTERM, Ctrl-C), ``failed`` (every record failed), or still
    ``running`` (live, or killed: its table, if any, is an earlier session's), with what to do
    next. None for a finished run, a DataFrame, or a folder without a manifest (``load_run``
    says what is missing)."""
    import pandas as pd

    if isinstance(run, pd.DataFrame):
        return []
    try:
        manifest = json.loads((Path(run) / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    status = manifest.get("status")
    if status in (None, "finished"):
        return []
    last = (manifest.get("sessions") or [{}])[-1]
    why = f" ({last['stopped']})" if last.get("stopped") else ""
    left = last.get("budget", {}).get("records_left")
    more = f", {left} records left" if left else ""
    if status == "interrupted":
        kept = last.get("records_written")
        more = f" at {last.get('interrupted_at', '?')}" + (
            f" ({kept} records written this session)" if kept is not None else ""
        )
    then = NEXT.get(status, NEXT["running"])
    return [
        f"FAILED run: its manifest says {status}{why}{more}: the gate reads finished runs; {then}"
    ]


def assert_run(
    run: str | Path | pd.DataFrame,
    *requirements: str,
    verdict: str | None = None,
    metric: str | None = None,
    max_errors: int = 0,
) -> None:
    """``ragbench check`` inside pytest: ``run`` is a run folder (or its results DataFrame);
    raises AssertionError with one line per failed requirement (and for failed records or an
    unfinished run, as ``check`` and ``unfinished`` say), GateError (a ValueError) for a
    malformed one::

        assert_run("data/results/nightly-1a2b3c4d", "rag k=4: contains.ci_low >= 0.5",
                   "long_context: dollars_per_1k <= 0.5", verdict="rag")
    """
    failed = check_run(run, list(requirements), verdict, metric, max_errors)
    if failed:
        raise AssertionError("\n".join(failed))


def check_run(
    run: str | Path | pd.DataFrame,
    requirements: list[str],
    verdict: str | None = None,
    metric: str | None = None,
    max_errors: int = 0,
) -> list[str]:
    """What ``ragbench check`` and ``assert_run`` report for a run folder (or its DataFrame):
    ``unfinished``, then ``check``'s lines. A run that stopped before writing its table, or any
    record, has no variant to match: its ``unfinished`` line alone."""
    stopped = unfinished(run)
    folder = cast("str | Path", run) if stopped else None  # a DataFrame is never stopped
    if folder is not None and not (Path(folder) / "results.parquet").exists():  # ended early
        return stopped
    df, seed = load_run(run)
    if stopped and not len(df):
        return stopped
    return stopped + check(
        df, requirements, verdict=verdict, seed=seed, metric=metric, max_errors=max_errors
    )
