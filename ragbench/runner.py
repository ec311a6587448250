"""Run a config: examples x strategies x parameter points -> results table + manifest.

Run folder: ``<output_dir>/<name>-<config hash[:8]>/`` holding

- ``records.jsonl``: one line per finished Record, appended, flushed and fsynced as each
  chunk of ``model.batch_size`` records completes (``strategies.run_batch``: each round of
  requests goes to the LLM in one call), so a run killed at any moment (SIGKILL included) loses
  at most the chunk in flight; a restart skips the (example, strategy, params) keys already
  there and drops a torn last line. Nothing is ever duplicated: a key is written only if it
  was not loaded.
- ``results.parquet``: the flattened table, rows in work order (independent of resumes).
- ``manifest.json``: config, hash, dataset fingerprint, model identity, versions, git commit,
  hardware, start and end times.

Example failures become error rows (``error`` column) and the run continues. Bad input that
makes the whole run meaningless (unknown names, config typos, examples with no gold answers)
fails before any model is loaded, with one clear message.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import sys
from collections import OrderedDict
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from ragbench.config import RunConfig, config_hash, load_config
from ragbench.io import atomic_write_bytes, atomic_write_text, dumps_canonical
from ragbench.strategies import Resources, expand, get_strategy, run_batch
from ragbench.types import Example, Record

log = logging.getLogger(__name__)
RECORDS = "records.jsonl"
PACKAGES = (
    "ragbench", "numpy", "pandas", "pydantic", "torch", "transformers", "sentence-transformers",
    "faiss-cpu", "llama-index-core", "bm25s", "gguf",
)  # fmt: skip


class DatasetError(ValueError):
    """The dataset cannot be scored (no examples, missing gold answers, duplicate ids)."""


# ---------------------------------------------------------------------------- pure helpers


def work_key(example_id: str, strategy: str, params: dict[str, Any]) -> str:
    return dumps_canonical([example_id, strategy, params])


def check_examples(examples: list[Example], dataset: str) -> None:
    if not examples:
        raise DatasetError(f"dataset {dataset!r} produced no examples")
    no_answers = [e.id for e in examples if not any(a.strip() for a in e.answers)]
    if no_answers:
        raise DatasetError(
            f"dataset {dataset!r}: {len(no_answers)} of {len(examples)} examples have no gold "
            f"answers (first: {no_answers[0]!r}); answer metrics need at least one per example"
        )
    seen: set[str] = set()
    for e in examples:
        if e.id in seen:
            raise DatasetError(f"dataset {dataset!r}: duplicate example id {e.id!r}")
        seen.add(e.id)


def read_records(path: Path) -> dict[str, Record]:
    """Records already written, by work key. A torn last line (killed mid-write) is cut off."""
    done: dict[str, Record] = {}
    if not path.exists():
        return done
    data = path.read_bytes()
    good_end = 0
    for lineno, line in enumerate(data.splitlines(keepends=True), start=1):
        if not line.endswith(b"\n"):
            break  # torn write: the line never got its newline; only this is cut off
        good_end += len(line)
        try:
            row = json.loads(line)
            done[row["key"]] = Record.from_dict(row["record"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            # a complete but unreadable line (another version's fields, a bad edit): skip it,
            # keep every record after it; its work item is simply run again
            log.warning("%s:%d: skipping unreadable record (%s)", path, lineno, exc)
    if good_end < len(data):
        log.warning("%s: dropping %d bytes of a torn last record", path, len(data) - good_end)
        with path.open("r+b") as f:
            f.truncate(good_end)
            f.flush()
            os.fsync(f.fileno())
    return done


def append_record(f, key: str, record: Record) -> None:
    f.write((dumps_canonical({"key": key, "record": record.to_dict()}) + "\n").encode("utf-8"))
    f.flush()
    os.fsync(f.fileno())


def error_record(example: Example, strategy: str, params: dict, exc: BaseException) -> Record:
    return Record(
        example_id=example.id,
        strategy=strategy,
        params=params,
        prediction="",
        answers=example.answers,
        error=f"{type(exc).__name__}: {exc}",
    )


def flatten(record: Record, example_meta: dict[str, Any]) -> dict[str, Any]:
    """One table row: ids, params, scores, cost, record meta, scalar example facts."""
    row: dict[str, Any] = {
        "example_id": record.example_id,
        "strategy": record.strategy,
        "params": dumps_canonical(record.params),
        "prediction": record.prediction,
        "answers": list(record.answers),
        "error": record.error,
    }
    sections = (record.params, record.scores, record.cost, record.meta)
    facts = {k: v for k, v in example_meta.items() if not isinstance(v, list | dict)}
    for prefix, section in zip(("", "", "", "meta_", "ex_"), (*sections, facts), strict=True):
        for key, value in section.items():
            row[key if key not in row else prefix + key] = value
    return row


# ---------------------------------------------------------------------------- resources


def _load_examples(cfg: RunConfig) -> list[Example]:
    from ragbench.datasets import build_dataset

    params = dict(cfg.dataset.params)
    examples = list(build_dataset(cfg.dataset.name, **params))
    return examples[: cfg.dataset.limit] if cfg.dataset.limit else examples


def _load_llm(cfg: RunConfig):
    from ragbench.llm import load_llm

    m = cfg.model
    name_kw = "name" if m.backend == "fake" else "model"  # the backends' own argument names
    cache = None
    if m.cache:
        from ragbench.assets import cache_dir

        cache = cache_dir() / "completions.sqlite"
    return load_llm(m.backend, cache=cache, **{name_kw: m.name, **m.params})


def _chunk_tokenizer(cfg: RunConfig) -> str:
    if cfg.retrieval.tokenizer:
        return cfg.retrieval.tokenizer
    from ragbench.llm.presets import PRESETS

    name = cfg.model.name
    embedded = name in PRESETS and PRESETS[name].embedded
    return name if cfg.model.backend == "hf" and embedded else "whitespace"


def make_index(cfg: RunConfig, cache_size: int = 8):
    """example -> (chunks, retriever), memoised by the documents (many questions, one corpus)."""
    from ragbench.retrieval.chunking import chunk_documents
    from ragbench.retrieval.embedders import get_embedder
    from ragbench.retrieval.retrievers import build_retriever

    r = cfg.retrieval
    embedder = get_embedder(r.embedder)
    tokenizer = _chunk_tokenizer(cfg)
    memo: OrderedDict[str, tuple] = OrderedDict()

    def index(example: Example):
        key = dumps_canonical([d.to_dict() for d in example.documents])
        if key not in memo:
            chunks = chunk_documents(
                example.documents, r.splitter, r.chunk_size, r.chunk_overlap, tokenizer=tokenizer
            )
            kw = dict(r.retriever_params)
            if r.retriever in ("dense", "hybrid", "rerank"):
                kw.setdefault("embedder", embedder)
            memo[key] = (chunks, build_retriever(r.retriever, chunks, **kw))
            if len(memo) > cache_size:
                memo.popitem(last=False)
        memo.move_to_end(key)
        return memo[key]

    return index


# ---------------------------------------------------------------------------- provenance


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _git_commit() -> str | None:
    try:
        res = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
            cwd=Path(__file__).resolve().parent,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout.strip() if res.returncode == 0 else None


def _hardware() -> dict[str, Any]:
    hw: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
    }
    try:
        import psutil

        hw["memory_bytes"] = psutil.virtual_memory().total
    except ImportError:
        pass
    torch = sys.modules.get("torch")  # only if a backend already loaded it
    if torch is not None and torch.cuda.is_available():
        hw["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return hw


def _identity(llm) -> dict[str, Any]:
    try:
        return dict(llm.identity())
    except Exception as exc:  # provenance must not kill a finished run
        return {"error": f"{type(exc).__name__}: {exc}"}


def record_in_notebook(run_dir: Path, manifest: dict[str, Any]) -> None:
    """Inside a Jupyter kernel, add this run to the cell's outputs: a ``run folder: ...`` line
    plus the run folder and manifest under ragbench's own mime type, which ``ragbench render``
    reads for the provenance header. The executed notebook thereby names the runs it made, however
    many other runs share its output folder. Outside a kernel (scripts, CLI, tests): nothing."""
    ipython = sys.modules.get("IPython")  # a kernel has imported it; never import it here
    shell = ipython.get_ipython() if ipython is not None else None
    if getattr(shell, "kernel", None) is None:  # terminal IPython has no kernel: no notebook
        return
    from IPython.display import display

    from ragbench.render import RUN_MIME

    payload = {"run_dir": str(run_dir.resolve()), "manifest": manifest}
    display({"text/plain": f"run folder: {run_dir}", RUN_MIME: payload}, raw=True)


# ---------------------------------------------------------------------------- run


def run_dir_for(cfg: RunConfig) -> Path:
    return Path(cfg.output_dir) / f"{cfg.name}-{config_hash(cfg)[:8]}"


def run(config: Any, progress: bool = True, llm: Any = None) -> Any:
    """Run ``config`` (path, dict or RunConfig); returns the results DataFrame.

    ``llm`` overrides the configured model (tests, notebooks holding a loaded model).
    """
    import pandas as pd
    from tqdm import tqdm  # text bar: works in terminals and notebooks without ipywidgets

    cfg = load_config(config)
    started = datetime.now(UTC).isoformat()
    for s in cfg.strategies:
        get_strategy(s.name)
    examples = _load_examples(cfg)
    check_examples(examples, cfg.dataset.name)
    from ragbench.datasets.formats import fingerprint

    work = [
        (e, s.name, point)
        for e in examples
        for s in cfg.strategies
        for point in expand(s.name, dict(s.params))
    ]
    keys = [work_key(e.id, name, p) for e, name, p in work]
    if len(set(keys)) != len(keys):
        raise ValueError("config lists the same strategy and parameters twice")
    out = run_dir_for(cfg)
    out.mkdir(parents=True, exist_ok=True)
    done = read_records(out / RECORDS)
    # error rows are retried on resume (timeouts, out-of-memory); the new record is appended and
    # read_records keeps the last line of a key
    pending = [(w, k) for w, k in zip(work, keys, strict=True) if k not in done or done[k].error]

    llm = llm or _load_llm(cfg)
    identity = _identity(llm)
    res = _resources(cfg, llm, kv_dtype=identity.get("dtype"))
    errors = 0
    with (out / RECORDS).open("ab") as f:
        bar = tqdm(total=len(work), initial=len(work) - len(pending), desc=cfg.name,
                   disable=not progress, unit="rec")  # fmt: skip
        # chunks of batch_size records run together (strategies.run_batch: one LLM call per
        # round); records are appended per chunk, so a killed run loses at most one chunk
        size = cfg.model.batch_size
        for start in range(0, len(pending), size):
            chunk = pending[start : start + size]
            outcomes = run_batch([(name, e, p) for (e, name, p), _ in chunk], res)
            for ((example, name, params), key), outcome in zip(chunk, outcomes, strict=True):
                record = (  # one bad example must not stop the run
                    error_record(example, name, params, outcome)
                    if isinstance(outcome, Exception)
                    else outcome
                )
                errors += record.error is not None
                append_record(f, key, record)
                done[key] = record
                bar.update(1)
        bar.close()

    meta = {e.id: e.meta for e in examples}
    df = pd.DataFrame([flatten(done[k], meta[w[0].id]) for w, k in zip(work, keys, strict=True)])
    atomic_write_bytes(out / "results.parquet", _parquet_bytes(df))
    manifest = {
        "name": cfg.name,
        "config": cfg.model_dump(mode="json"),
        "config_hash": config_hash(cfg),
        "dataset": {
            "name": cfg.dataset.name,
            "fingerprint": fingerprint(examples),
            "n": len(examples),
        },
        "model": identity,
        "records": len(df),
        "errors": int(df["error"].notna().sum()),
        "resumed_records": len(work) - len(pending),
        "versions": _versions(),
        "git_commit": _git_commit(),
        "hardware": _hardware(),
        "started_at": started,
        "finished_at": datetime.now(UTC).isoformat(),
    }
    atomic_write_text(out / "manifest.json", json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    record_in_notebook(out, manifest)
    if errors:
        first = next(r.error for r in done.values() if r.error)
        log.warning("%d of %d records failed; first error: %s", errors, len(pending), first)
    df.attrs["run_dir"] = str(out)
    return df


def _resources(cfg: RunConfig, llm, kv_dtype: str | None = None) -> Resources:
    from ragbench.cost import price_sheet
    from ragbench.llm.presets import get_preset

    needs_index = any(get_strategy(s.name).needs_retrieval for s in cfg.strategies)
    return Resources(
        llm=llm,
        metrics=tuple(cfg.metrics),
        max_new_tokens=cfg.model.max_new_tokens,
        prompt_budget=cfg.prompt_budget,
        preset=get_preset(cfg.model.arch) if cfg.model.arch else None,
        kv_dtype=kv_dtype,  # transformers backend: the model's dtype (identity()["dtype"])
        sheet=price_sheet(cfg.price_sheet) if cfg.price_sheet else None,
        index=make_index(cfg) if needs_index else None,
    )


def _parquet_bytes(df) -> bytes:
    """Parquet of ``df``; object columns pyarrow cannot type (mixed kinds) become JSON text."""
    import io

    import pandas as pd
    import pyarrow as pa

    df = df.copy()
    for col in [c for c in df.columns if pd.api.types.is_object_dtype(df[c])]:
        try:
            pa.array(df[col])
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
            df[col] = [None if v is None else json.dumps(v, default=str) for v in df[col]]
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return buf.getvalue()


# ---------------------------------------------------------------------------- CLI


def register(app) -> None:
    """Adds ``ragbench run CONFIG`` to the root typer app."""
    import typer

    @app.command("run")
    def run_command(
        config: Path = typer.Argument(..., help="experiment YAML, e.g. configs/quick-cpu.yaml"),
        output_dir: str | None = typer.Option(None, help="override the config's output_dir"),
        quiet: bool = typer.Option(False, help="no progress bar"),
    ) -> None:
        """Run an experiment config (resumable): results.parquet + manifest.json."""
        from ragbench.io import user_errors
        from ragbench.report import summary

        with user_errors():  # ConfigError, DatasetError: ValueErrors naming file, line, field
            cfg = load_config(config)
            if output_dir:
                cfg = cfg.model_copy(update={"output_dir": output_dir})
            df = run(cfg, progress=not quiet)
        typer.echo(f"run folder: {df.attrs['run_dir']}")
        for metric in cfg.metrics:  # accuracy with its 95% CI and mean cost per query
            table = summary(df, metric=metric, seed=cfg.seed)
            typer.echo(table.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
