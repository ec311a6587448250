"""A run folder exported for other tools: per-sample rows as JSONL or CSV, or the files
lm-evaluation-harness writes with ``--output_path --log_samples``, so what reads those reads
ragbench's (``ragbench export``).

Per-sample rows: one per record (example x variant): ``example_id``, ``variant`` (the label),
``strategy``, ``params``, ``question``, ``prediction``, ``answers``, ``error``, each score, and
the tokens, seconds and dollars of the answer. The question is not in the results table: it is
read from the dataset the run's config builds (``experiment.resources.load_examples``); when
that cannot be rebuilt here (a file that moved), it is left empty and a warning says why.

lm-eval layout (``lm_eval/loggers/evaluation_tracker.py``, v0.4): under
``<out>/<model_name_sanitized>/`` one ``results_<date_id>.json`` (``date_id`` = the ISO time
with ``:`` as ``-``) holding ``results`` (per task: ``alias``, ``<metric>,none`` and
``<metric>_stderr,none``, the standard error of the mean as lm-eval computes it),
``group_subtasks``, ``configs``, ``versions``, ``n-shot``, ``higher_is_better``,
``n-samples`` (``original``, ``effective``), ``config`` (model, model_args, ...), ``git_hash``,
``date`` and the tracker's ``model_name``/``model_name_sanitized``/``start_time``/``end_time``;
and per task one ``samples_<task>_<date_id>.jsonl`` whose lines hold ``doc_id``, ``doc``,
``target``, ``arguments`` (``gen_args_0``: ``arg_0`` the prompt, here the question, ``arg_1``
the generation kwargs), ``resps``, ``filtered_resps``, ``filter`` (``none``), ``metrics``,
``doc_hash``, ``prompt_hash``, ``target_hash`` (sha256 hex, as lm-eval's ``hash_string``) and
each metric's value. Each ragbench variant is one task, named ``<run name>_<variant slug>``.

Credentials never reach an export: every text field goes through ``secrets.redact``. Files are
written atomically (``ragbench.io``).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import math
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from ragbench import __version__, secrets
from ragbench.analysis.gate import load_run, score_columns
from ragbench.analysis.labels import with_labels
from ragbench.experiment.config.run import parse_config
from ragbench.experiment.resources import load_examples
from ragbench.io import atomic_write_text, dumps_canonical, read_json
from ragbench.schema import migrate_config, version_of

log = logging.getLogger(__name__)

FORMATS = ("jsonl", "csv", "lm-eval")
# the answer's cost columns an export carries (the results table's names)
COST_COLUMNS = ("prompt_tokens", "cached_prompt_tokens", "completion_tokens", "latency_seconds",
                "resource_seconds", "dollars", "amortised_dollars")  # fmt: skip


def slug(label: str) -> str:
    """A variant label as a name tools accept (MLflow metric keys, lm-eval task names): ``=``
    as ``-``, other characters outside ``[A-Za-z0-9_.-]`` as ``_``."""
    text = re.sub(r"[^A-Za-z0-9_.\-]+", "_", label.replace("=", "-"))
    return text.strip("_") or "variant"


def _clean(value: Any) -> Any:
    """JSON-ready: numpy scalars and arrays as Python values, NaN as None."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def questions(manifest: dict[str, Any]) -> dict[str, str]:
    """example id -> question, from the dataset the run's config builds; {} (with a warning)
    when it cannot be built here."""
    try:
        config = migrate_config(manifest["config"], version_of(manifest))
        cfg = parse_config(config, "manifest.json")
        return {e.id: e.question for e in load_examples(cfg)}
    except Exception as exc:  # a moved file, a dataset needing what is not installed here
        log.warning("questions left empty: the run's dataset could not be rebuilt here (%s: %s)",
                    type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")  # fmt: skip
        return {}


def sample_rows(df: Any, asked: dict[str, str]) -> list[dict[str, Any]]:
    """One row per record, credentials masked (the module docstring lists the fields)."""
    df = with_labels(df)
    scores = score_columns(df)
    rows = []
    for rec in df.to_dict("records"):
        row = {
            "example_id": rec["example_id"], "variant": rec["label"],
            "strategy": rec["strategy"], "params": rec["params"],
            "question": asked.get(rec["example_id"]), "prediction": rec["prediction"],
            "answers": _clean(rec["answers"]), "error": rec.get("error"),
        }  # fmt: skip
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
    rows = sample_rows(df, questions(manifest) if manifest.get("config") else {})
    if fmt == "lm-eval":
        return write_lm_eval(rows, df, manifest, Path(out or run_dir / "export" / "lm-eval"))
    path = Path(out or run_dir / "export" / f"samples.{fmt}")
    if fmt == "jsonl":
        return [atomic_write_text(path, "".join(dumps_canonical(r) + "\n" for r in rows))]
    buf = io.StringIO()
    fields = list(dict.fromkeys(k for r in rows for k in r))
    writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for r in rows:  # lists (answers) as JSON text in their cell
        writer.writerow({k: json.dumps(v) if isinstance(v, list) else v for k, v in r.items()})
    return [atomic_write_text(path, buf.getvalue())]


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


def write_lm_eval(rows: list[dict[str, Any]], df: Any, manifest: dict[str, Any], out: Path):
    """The lm-eval files for ``rows`` (one task per variant) under ``out``."""
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
            "task": task, "output_type": "generate_until", "num_fewshot": 0,
            "generation_kwargs": {"max_gen_toks": model.get("max_new_tokens"), "do_sample": False},
            "metric_list": [{"metric": m, "aggregation": "mean", "higher_is_better": True}
                            for m in scores],
            "metadata": {"ragbench_variant": labels[task], "strategy": task_rows[0]["strategy"],
                         "params": task_rows[0]["params"], "dataset": config.get("dataset")},
        }  # fmt: skip
        higher[task] = {m: True for m in scores}
        n_samples[task] = {"original": len(task_rows), "effective": len(ok)}
        lines = [_lm_eval_sample(i, r, scores, model) for i, r in enumerate(task_rows)]
        path = folder / f"samples_{task}_{date_id}.jsonl"
        written.append(atomic_write_text(path, "".join(json.dumps(s) + "\n" for s in lines)))
    started = manifest.get("started_at")
    aggregate = {
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
        },  # fmt: skip
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


def _lm_eval_sample(i: int, row: dict[str, Any], scores: list[str], model: dict) -> dict:
    question = row.get("question") or ""
    answers = row.get("answers") or []
    target = str(answers[0]) if len(answers) == 1 else json.dumps(answers, ensure_ascii=False)
    doc = {"id": row["example_id"], "question": question, "answers": answers}
    prediction = row.get("prediction") or ""
    metrics = [m for m in scores if row.get(m) is not None]
    return {
        "doc_id": i,
        "doc": doc,
        "target": target,
        "arguments": {"gen_args_0": {"arg_0": question,
                                     "arg_1": {"max_gen_toks": model.get("max_new_tokens")}}},
        "resps": [[prediction]],
        "filtered_resps": [prediction],
        "filter": "none",
        "metrics": metrics,
        "doc_hash": _hash(json.dumps(doc, indent=2, ensure_ascii=False)),
        "prompt_hash": _hash(question),
        "target_hash": _hash(target),
        **{m: row[m] for m in metrics},
        "ragbench": {k: row.get(k) for k in ("variant", "error", *COST_COLUMNS) if k in row},
    }  # fmt: skip
