"""A run folder exported for other tools: per-sample rows as JSONL or CSV, or the files
lm-evaluation-harness writes with ``--output_path --log_samples``, so what reads those reads
ragbench's (``ragbench export``).

Per-sample rows: one per record (example x variant): ``example_id``, ``variant`` (the label),
``strategy``, ``params``, ``question``, ``prediction``, ``answers``, ``error``; what the answer
read: ``retrieved`` (the chunk ids a RAG call placed in its prompt), ``retrieved_scores``,
``gold_chunks`` (the chunks holding the evidence), ``gold_hit``, and of a long-context call
``kept_tokens``, ``truncated_tokens``, ``evidence_truncated``, ``dropped_documents``,
``cut_documents`` (Self-Route's: those of its long-context call when it was routed there) and
``route``; each score; the tokens, seconds and dollars of the answer. A value a record does not
have is empty (null); in CSV, lists are JSON text in their cell. The question is read from the
folder's ``questions.parquet``; a folder written before it was kept rebuilds it from the dataset
the run's config builds (``experiment.resources.load_examples``); when that cannot be rebuilt
here (a file that moved), it is left empty and a warning says why.

lm-eval layout (``lm_eval/loggers/evaluation_tracker.py``, v0.4): under
``<out>/<model_name_sanitized>/`` one ``results_<date_id>.json`` (``date_id`` = the ISO time
with ``:`` as ``-``) holding ``results`` (per task: ``alias``, ``<metric>,none`` and
``<metric>_stderr,none``, the standard error of the mean as lm-eval computes it),
``group_subtasks``, ``configs``, ``versions``, ``n-shot``, ``higher_is_better``,
``n-samples`` (``original``, ``effective``), ``config`` (model, model_args, ...), ``git_hash``,
``date`` and the tracker's ``model_name``/``model_name_sanitized``/``start_time``/``end_time``;
and per task one ``samples_<task>_<date_id>.jsonl`` whose lines hold ``doc_id``, ``doc``,
``target``, ``arguments`` (``gen_args_0``: ``arg_0`` the prompt, ``arg_1`` the generation
kwargs), ``resps``, ``filtered_resps``, ``filter`` (``none``), ``metrics``, ``doc_hash``,
``prompt_hash``, ``target_hash`` (sha256 hex, as lm-eval's ``hash_string``) and each metric's
value. Each ragbench variant is one task, named ``<run name>_<variant slug>``.

``arg_0`` is the prompt the answering call was sent (the text the strategy handed the backend,
before its chat template), rebuilt by the strategy's own prompt builder (``SentPrompts``:
``Contexts.prompts``), as the judge rebuilds contexts: records do not store prompts (a
long-context prompt is the whole document, in every record). The rebuild needs the run's
examples, its records and, for long context and RAG, the model's tokenizer and the index, never
the model's weights. An answer of several calls (chain of thought; Self-Route routed to long
context) keeps the earlier calls' prompts in ``ragbench.earlier_prompts``. Where the prompt
cannot be rebuilt faithfully (a pipeline, which builds its own; a failed record; a dataset or
index this machine cannot rebuild; retrieval that now returns other chunks) ``arg_0`` is the
question and the sample says why: ``ragbench.arg_0`` is ``"prompt"`` or ``"question"``, and
``ragbench.prompt_unavailable`` the reason.

Credentials never reach an export: every text field goes through ``secrets.redact``. Files are
written atomically (``ragbench.io``).
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import logging
import math
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragbench import __version__, secrets
from ragbench.analysis.gate import load_run, score_columns
from ragbench.analysis.labels import with_labels
from ragbench.experiment.config.run import RunConfig, parse_config
from ragbench.experiment.dry_run import prompt_counter
from ragbench.experiment.evidence import read_questions
from ragbench.experiment.resources import build_resources, load_examples
from ragbench.experiment.results import RECORDS, record_from_dict
from ragbench.io import atomic_write_text, dumps_canonical, read_json
from ragbench.schema import check
from ragbench.strategies import Resources, contexts_of, params_from_dict
from ragbench.strategies.contexts import ContextUnavailable
from ragbench.types import Example, Record

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)

FORMATS = ("jsonl", "csv", "lm-eval")
# the answer's cost columns an export carries (the results table's names)
COST_COLUMNS = (
    "prompt_tokens",
    "cached_prompt_tokens",
    "completion_tokens",
    "latency_seconds",
    "resource_seconds",
    "dollars",
    "amortised_dollars",
)
# what a RAG call read: the chunk ids in its prompt, their scores, the evidence's chunks, a hit
RETRIEVAL_COLUMNS = ("retrieved", "retrieved_scores", "gold_chunks", "gold_hit")
# what a long-context cut kept, read from the call that answered (``Contexts.meta_prefix``)
CUT_COLUMNS = (
    "kept_tokens",
    "truncated_tokens",
    "evidence_truncated",
    "dropped_documents",
    "cut_documents",
)
ROUTE = "route"  # the branch a router's answer came from


def slug(label: str) -> str:
    """A variant label as a name tools accept (MLflow metric keys, lm-eval task names): ``=``
    as ``-``, other characters outside ``[A-Za-z0-9_.-]`` as ``_``."""
    text = re.sub(r"[^A-Za-z0-9_.\-]+", "_", label.replace("=", "-"))
    return text.strip("_") or "variant"


def _clean(value: object) -> object:
    """JSON-ready: numpy scalars and arrays as Python values, NaN as None."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def run_config(manifest: dict[str, Any]) -> RunConfig:
    """The config a run folder's manifest holds (another schema's: SchemaError); without its
    ``tracking`` section, where the run was reported, which changes nothing an export rebuilds
    (and an older run's ``file:`` MLflow URI, refused now, must not stop its export)."""
    check(manifest, "manifest.json")
    config = {k: v for k, v in manifest["config"].items() if k != "tracking"}
    return parse_config(config, "manifest.json")


def _why(exc: BaseException) -> str:
    """``Type: first line`` of an error, for a one-line reason."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def questions(run_dir: Path, manifest: dict[str, object]) -> dict[str, str]:
    """example id -> question: the folder's ``questions.parquet``, else the dataset the run's
    config builds; {} (with a warning) when neither is at hand."""
    table = read_questions(run_dir)
    if table is not None:
        return dict(zip(table["example_id"], table["question"], strict=True))
    if not manifest.get("config"):
        return {}
    try:
        return {e.id: e.question for e in load_examples(run_config(manifest))}
    except Exception as exc:  # a moved file, a dataset needing what is not installed here
        log.warning(
            "questions left empty: the run's dataset could not be rebuilt here (%s)", _why(exc)
        )
        return {}


def _fact(rec: dict[str, object], name: str) -> object:
    """A record's meta fact from its table row (``meta_<name>`` where a parameter or score
    shares the name), JSON-ready; a token count as an int (the column is float for its NaN)."""
    value = _clean(rec.get(name, rec.get(f"meta_{name}")))
    if isinstance(value, float) and name.endswith("_tokens") and value.is_integer():
        return int(value)
    return value


def record_facts(rec: dict[str, object]) -> dict[str, object]:
    """What the answer read (``RETRIEVAL_COLUMNS``, ``CUT_COLUMNS``, ``ROUTE``); the cut of the
    call that answered: a router's long-context call keeps its facts under a prefix."""
    prefix = contexts_of(rec).meta_prefix
    facts = {c: _fact(rec, c) for c in RETRIEVAL_COLUMNS}
    facts.update({c: _fact(rec, prefix + c) for c in CUT_COLUMNS})
    facts[ROUTE] = _fact(rec, ROUTE)
    return facts


def sample_rows(df: Any, asked: dict[str, str]) -> list[dict[str, Any]]:
    """One row per record, credentials masked (the module docstring lists the fields)."""
    df = with_labels(df)
    scores = score_columns(df)
    rows = []
    for rec in df.to_dict("records"):
        row = {
            "example_id": rec["example_id"],
            "variant": rec["label"],
            "strategy": rec["strategy"],
            "params": rec["params"],
            "question": asked.get(rec["example_id"]),
            "prediction": rec["prediction"],
            "answers": _clean(rec["answers"]),
            "error": rec.get("error"),
        }
        row.update(record_facts(rec))
        row.update({m: _clean(rec.get(m)) for m in scores})
        row.update({c: _clean(rec.get(c)) for c in COST_COLUMNS if c in df.columns})
        rows.append(secrets.redact(row))
    return rows


def export_run(run_dir: str | Path, fmt: str, out: str | Path | None = None) -> list[Path]:
    """Write ``run_dir``'s export in ``fmt`` (``FORMATS``) and return the files written:
    ``out`` is a file for jsonl/csv (default ``<run_dir>/export/samples.<fmt>``), a folder for
    lm-eval (default ``<run_dir>/export/lm-eval``)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; valid: {', '.join(FORMATS)}")
    run_dir = Path(run_dir)
    df, _seed = load_run(run_dir)
    manifest = read_json(run_dir / "manifest.json") or {}
    rows = sample_rows(df, questions(run_dir, manifest))
    if fmt == "lm-eval":
        prompts = SentPrompts(run_dir, manifest)
        out_dir = Path(out or run_dir / "export" / "lm-eval")
        return write_lm_eval(rows, df, manifest, out_dir, prompts)
    path = Path(out or run_dir / "export" / f"samples.{fmt}")
    if fmt == "jsonl":
        return [atomic_write_text(path, "".join(dumps_canonical(r) + "\n" for r in rows))]
    buf = io.StringIO()
    fields = list(dict.fromkeys(k for r in rows for k in r))
    writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for r in rows:  # lists (answers, retrieved, ...) as JSON text in their cell
        writer.writerow({k: json.dumps(v) if isinstance(v, list) else v for k, v in r.items()})
    return [atomic_write_text(path, buf.getvalue())]


@dataclass(frozen=True)
class SentPrompt:
    """The prompt of each call a record's answer took, in order (the last one's reply is the
    answer), or None and why it cannot be rebuilt."""

    calls: list[str] | None
    unavailable: str | None = None


def _row_key(example_id: object, strategy: object, params: Any) -> tuple[str, str, str]:
    """A record's identity as both its ``records.jsonl`` line and its table row give it: the
    parameters as their typed class writes them (an older table's row lacks the defaults a
    newer parameter brought, ``cot: false``, which the typed record has)."""
    data = json.loads(params) if isinstance(params, str) else params
    with contextlib.suppress(KeyError, TypeError, ValueError):  # a strategy or parameter
        data = params_from_dict(str(strategy), data).to_dict()  # this version lacks: kept as is
    return str(example_id), str(strategy), dumps_canonical(data)


def read_records_only(path: Path) -> dict[tuple[str, str, str], Record]:
    """A run folder's records by ``_row_key``, read without touching the file: the run's own
    reader (``experiment.results.read_records``) cuts a torn last line off, which a reader
    must not do to a folder a run may still be writing. The last line of a key wins."""
    found: dict[tuple[str, str, str], Record] = {}
    if not path.exists():
        return found
    for line in path.read_bytes().splitlines(keepends=True):
        if not line.endswith(b"\n"):
            break  # torn (or being written): the run rewrites it
        try:
            row = json.loads(line)
            check(row, path)
            record = record_from_dict(row["record"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            continue  # an unreadable line (another schema's too): its row says no record
        found[_row_key(record.example_id, record.strategy, record.params.to_dict())] = record
    return found


class SentPrompts:
    """The prompts a run folder's records were sent, rebuilt by their strategies' prompt
    builders (``Contexts.prompts``) from the run's examples (its dataset, built again from the
    manifest's config), its records and, on first need, its ``Resources`` with a token counter
    in place of the model (``experiment.dry_run.prompt_counter``: the tokenizer and chat
    template, never the weights; the fake and server backends are built, which sends nothing)."""

    def __init__(self, run_dir: Path, manifest: dict[str, object]) -> None:
        self.problem: str | None = None
        self.examples: dict[str, Example] = {}
        self.records: dict[tuple[str, str, str], Record] = {}
        self._res: Resources | None = None
        self._res_problem: str | None = None
        if not manifest.get("config"):
            self.problem = "the run folder has no manifest with its config to rebuild it from"
            return
        try:
            self.cfg = run_config(manifest)
            self.examples = {e.id: e for e in load_examples(self.cfg)}
        except Exception as exc:  # a moved file, a dataset needing what is not installed here
            self.problem = f"the run's dataset cannot be rebuilt here ({_why(exc)})"
            return
        self.records = read_records_only(run_dir / RECORDS)

    def resources(self) -> Resources:
        """The run's resources with the token counter (built once; a failure is kept)."""
        if self._res is None and self._res_problem is None:
            try:
                self._res = build_resources(self.cfg, prompt_counter(self.cfg))
            except Exception as exc:  # a tokenizer this machine does not have
                self._res_problem = f"the model's tokenizer cannot be loaded here ({_why(exc)})"
        if self._res is None:
            raise ContextUnavailable(self._res_problem)
        return self._res

    def of(self, row: dict[str, object]) -> SentPrompt:
        """The prompts of the record behind an export row (``sample_rows``)."""
        if self.problem:
            return SentPrompt(None, self.problem)
        if row.get("error"):
            return SentPrompt(None, "the record failed: no prompt is known to have been answered")
        record = self.records.get(_row_key(row["example_id"], row["strategy"], row["params"]))
        example = self.examples.get(str(row["example_id"]))
        if record is None or example is None:
            missing = f"{RECORDS} holds no record" if record is None else "the dataset no example"
            return SentPrompt(None, f"{missing} for this row")
        try:
            calls = contexts_of(record, example, self.resources).prompts()
        except Exception as exc:  # ContextUnavailable; an index or tokenizer not at hand here
            return SentPrompt(None, _why(exc))
        return SentPrompt([secrets.redact_text(c) for c in calls])


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _stderr(values: list[float]) -> float | str:
    """lm-eval's ``mean_stderr``: the sample standard deviation (n - 1) over sqrt(n)."""
    n = len(values)
    if n < 2:
        return "N/A"
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def sanitize_model_name(name: str) -> str:
    """lm-eval's folder name for a model (``utils.sanitize_model_name``)."""
    return re.sub(r"[\"<>:/|\\?*\[\]]+", "__", name)


def write_lm_eval(
    rows: list[dict[str, Any]],
    df: pd.DataFrame,
    manifest: dict[str, Any],
    out: Path,
    prompts: SentPrompts | None = None,
) -> list[Path]:
    """The lm-eval files for ``rows`` (one task per variant) under ``out``; ``prompts``: what
    fills ``arg_0`` (None: the question, each sample saying so)."""
    config = manifest.get("config") or {}
    model = config.get("model") or {}
    model_name = str(model.get("name") or "unknown")
    folder = out / sanitize_model_name(model_name)
    now = datetime.now()
    date_id = now.isoformat().replace(":", "-")
    run_name = str(manifest.get("name") or config.get("name") or "ragbench")
    scores = score_columns(with_labels(df))
    versions = manifest.get("metric_versions") or {}
    tasks: dict[str, list[dict[str, Any]]] = {}
    labels: dict[str, str] = {}
    for row in rows:
        task = f"{slug(run_name)}_{slug(row['variant'])}"
        tasks.setdefault(task, []).append(row)
        labels[task] = row["variant"]
    written = []
    results, configs, higher, n_samples = {}, {}, {}, {}
    for task, task_rows in tasks.items():
        ok = [r for r in task_rows if not r.get("error")]
        entry: dict[str, Any] = {"alias": task}
        for m in scores:
            values = [float(r[m]) for r in ok if r.get(m) is not None]
            entry[f"{m},none"] = sum(values) / len(values) if values else None
            entry[f"{m}_stderr,none"] = _stderr(values)
        results[task] = entry
        configs[task] = {
            "task": task,
            "output_type": "generate_until",
            "num_fewshot": 0,
            "generation_kwargs": {"max_gen_toks": model.get("max_new_tokens"), "do_sample": False},
            "metric_list": [
                {"metric": m, "aggregation": "mean", "higher_is_better": True} for m in scores
            ],
            "metadata": {
                "ragbench_variant": labels[task],
                "strategy": task_rows[0]["strategy"],
                "params": task_rows[0]["params"],
                "dataset": config.get("dataset"),
            },
        }
        higher[task] = {m: True for m in scores}
        n_samples[task] = {"original": len(task_rows), "effective": len(ok)}
        sent = [prompts.of(r) if prompts else SentPrompt(None, "not rebuilt") for r in task_rows]
        lines = [
            _lm_eval_sample(i, r, scores, model, p)
            for i, (r, p) in enumerate(zip(task_rows, sent, strict=True))
        ]
        path = folder / f"samples_{task}_{date_id}.jsonl"
        written.append(atomic_write_text(path, "".join(json.dumps(s) + "\n" for s in lines)))
    started = manifest.get("started_at")
    aggregate: dict[str, Any] = {
        "results": results,
        "group_subtasks": {task: [] for task in tasks},
        "configs": configs,
        "versions": {task: versions.get(scores[0]) if scores else None for task in tasks},
        "n-shot": {task: 0 for task in tasks},
        "higher_is_better": higher,
        "n-samples": n_samples,
        "config": {
            "model": f"ragbench-{model.get('backend', 'unknown')}",
            "model_args": f"pretrained={model_name}",
            "batch_size": model.get("batch_size"),
            "batch_sizes": [],
            "device": None,
            "use_cache": None,
            "limit": (config.get("dataset") or {}).get("limit"),
            "bootstrap_iters": 0,
            "gen_kwargs": None,
            "random_seed": config.get("seed"),
        },
        "git_hash": (manifest.get("git_commit") or "")[:7] or None,
        "date": now.timestamp(),
        "model_source": "ragbench",
        "model_name": model_name,
        "model_name_sanitized": sanitize_model_name(model_name),
        "start_time": started,
        "end_time": manifest.get("finished_at"),
        "ragbench_version": __version__,
        "ragbench_config_hash": manifest.get("config_hash"),
    }
    path = folder / f"results_{date_id}.json"
    text = json.dumps(secrets.redact(aggregate), indent=2, ensure_ascii=False, default=str)
    return [atomic_write_text(path, text + "\n"), *written]


def _lm_eval_sample(
    i: int, row: dict[str, Any], scores: list[str], model: dict, sent: SentPrompt
) -> dict:
    question = row.get("question") or ""
    answers = row.get("answers") or []
    target = str(answers[0]) if len(answers) == 1 else json.dumps(answers, ensure_ascii=False)
    doc = {"id": row["example_id"], "question": question, "answers": answers}
    prediction = row.get("prediction") or ""
    metrics = [m for m in scores if row.get(m) is not None]
    prompt = sent.calls[-1] if sent.calls else question
    facts = (*RETRIEVAL_COLUMNS, *CUT_COLUMNS, ROUTE)
    extra = {k: row.get(k) for k in ("variant", "error", *facts, *COST_COLUMNS) if k in row}
    if sent.calls:
        extra["arg_0"] = "prompt"
        if len(sent.calls) > 1:  # chain of thought's reasoning call; Self-Route's RAG call
            extra["earlier_prompts"] = sent.calls[:-1]
    else:
        extra.update(arg_0="question", prompt_unavailable=sent.unavailable)
    return {
        "doc_id": i,
        "doc": doc,
        "target": target,
        "arguments": {
            "gen_args_0": {"arg_0": prompt, "arg_1": {"max_gen_toks": model.get("max_new_tokens")}}
        },
        "resps": [[prediction]],
        "filtered_resps": [prediction],
        "filter": "none",
        "metrics": metrics,
        "doc_hash": _hash(json.dumps(doc, indent=2, ensure_ascii=False)),
        "prompt_hash": _hash(prompt),
        "target_hash": _hash(target),
        **{m: row[m] for m in metrics},
        "ragbench": extra,
    }
