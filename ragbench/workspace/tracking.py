"""Runs in MLflow: one MLflow run per ragbench run (a sweep: a parent run and a child per run
folder of each point), from the run folder's ``manifest.json`` and ``results.parquet``.

- params: the flattened config (``model.name``, ``dataset.params.context_lengths``), its
  ``config_hash``, the model's identity (``identity.*``) and the price sheet (``price_sheet.*``,
  its name and date among them);
- metrics, per variant ``<variant slug>/<value>``: every value ``ragbench check`` reads
  (``analysis.gate.variant_values``: each score with ``.ci_low``, ``.ci_high`` and ``.n``,
  ``dollars_per_1k``, ``latency_seconds``, ``prompt_tokens``, ``completion_tokens``, ...), at the
  step of the run's session (a resume logs the next step); the tag ``variant.<slug>`` names the
  label the slug stands for;
- tags: ``ragbench.verdict`` (the verdict's sentence), ``mlflow.source.git.commit``,
  ``ragbench.version``, ``ragbench.config_hash``, ``ragbench.status``;
- artifacts: ``results.parquet``, ``manifest.json`` and ``report.html`` where one was written;
- a table (``mlflow.log_table``), ``questions.json``: one row per question x variant with
  ``example_id``, ``label``, ``question``, ``answers``, ``prediction``, the run's first metric
  (under its own name), ``dollars``, ``latency_seconds`` and ``error``, which MLflow's
  evaluation view shows row by row. ``log_table`` appends to a table the run already has, so a
  resumed run deletes the stored one first and logs the whole table again (a store that cannot
  delete gets ``questions_<step>.json``, the tag ``ragbench.questions_table`` naming it).

The default store is ``./mlruns``: a SQLite database (``mlruns/mlflow.db``) and the artifacts
beside it; ``mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db`` shows it, no server
needed. A folder path is the same layout in that folder. A ``file:`` URI (MLflow's plain-folder
store, which MLflow 3 keeps in maintenance mode and refuses when the run is logged) is refused
before the run starts (``check``), naming its SQLite form
(``experiment.config.sections.mlflow_uri_problem``). The MLflow run's id is kept in the
manifest (``tracking.mlflow``), so a resumed run logs to the same MLflow run.

Credentials never reach MLflow: params, tags and the stored URI go through ``secrets.redact``
(the manifest and the table are redacted already). ``mlflow`` is imported only here, when a run
is logged (the ``tracking`` extra).
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragbench import __version__, schema, secrets
from ragbench.analysis.gate import headline, load_run, score_columns, variant_values
from ragbench.analysis.labels import with_labels
from ragbench.analysis.verdict import verdict
from ragbench.experiment.config.run import RunConfig, load_config
from ragbench.experiment.config.sections import mlflow_uri_problem
from ragbench.experiment.runner import run as run_experiment
from ragbench.io import atomic_write_text
from ragbench.locks import FolderLock
from ragbench.workspace.export import questions, sample_rows, slug

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_STORE = "mlruns"  # ./mlruns: mlflow.db + artifacts/
DEFAULT_EXPERIMENT = "ragbench"
ARTIFACTS = ("results.parquet", "manifest.json", "report.html")
MAX_PARAM_VALUE = 6000  # MLflow's limit on a param value (longer ones are cut, with a marker)
MAX_TAG_VALUE = 5000
QUESTIONS_TABLE = "questions.json"  # the per-question table (mlflow.log_table)


class TrackingError(RuntimeError):
    """MLflow is not installed, or the store refused the run (the message is redacted)."""


@dataclass(frozen=True)
class Tracking:
    """Where runs are logged: an MLflow URI (see ``store_uri``) and an experiment name."""

    tracking_uri: str | None = None
    experiment: str = DEFAULT_EXPERIMENT

    @property
    def uri(self) -> str:
        return store_uri(self.tracking_uri)


def settings(
    cfg: RunConfig | None = None,
    mlflow: bool = False,
    uri: str | None = None,
    experiment: str | None = None,
) -> Tracking | None:
    """The tracking a run gets: the config's ``tracking.mlflow`` section, overridden by the
    command line (``--mlflow``, ``--mlflow-uri``, ``--mlflow-experiment``: any of them turns it
    on). None: not tracked."""
    section = cfg.tracking.mlflow if cfg is not None and cfg.tracking else None
    if section is None and not (mlflow or uri or experiment):
        return None
    base = Tracking(section.tracking_uri, section.experiment) if section else Tracking()
    return Tracking(uri or base.tracking_uri, experiment or base.experiment)


def store_uri(uri: str | None) -> str:
    """An MLflow tracking URI: None is ``./mlruns``; a plain folder path is a SQLite store in
    it (``<folder>/mlflow.db``); a URI (``sqlite:///``, ``http://``, ``databricks``) as given;
    a ``file:`` URI a TrackingError naming its SQLite form (never a folder named ``file:``)."""
    problem = mlflow_uri_problem(uri)
    if problem:
        raise TrackingError(problem)
    if uri and "://" in uri or uri == "databricks":
        return uri
    folder = Path(uri or DEFAULT_STORE).resolve()
    return f"sqlite:///{folder / 'mlflow.db'}"


def _artifact_root(uri: str) -> str | None:
    """Artifacts of a local SQLite store go beside its database (MLflow's default, ./mlruns
    of the working directory, would scatter them)."""
    if uri.startswith("sqlite:///"):
        return (Path(uri.removeprefix("sqlite:///")).parent / "artifacts").as_uri()
    return None


def check_available() -> None:
    """Fail before a run starts, not after it, when MLflow is missing."""
    if importlib.util.find_spec("mlflow") is None:
        raise TrackingError(
            "MLflow tracking needs the mlflow package: pip install 'ragbench[tracking]' "
            "(or pip install mlflow)"
        )


def check(tracking: Tracking) -> None:
    """Everything that would make logging fail, checked before a run starts, not after it:
    MLflow missing, or a store URI MLflow refuses (a TrackingError saying which)."""
    check_available()
    store_uri(tracking.tracking_uri)


def _client(tracking: Tracking):
    check_available()
    from mlflow.tracking import MlflowClient  # lazy: an optional extra that imports in seconds

    return MlflowClient(tracking_uri=tracking.uri)


def _experiment_id(client, name: str, uri: str) -> str:
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    return client.create_experiment(name, artifact_location=_artifact_root(uri))


def flatten(obj: object, prefix: str = "") -> dict[str, str]:
    """``{"model": {"name": "x"}}`` -> ``{"model.name": "x"}``; lists as JSON text."""
    out: dict[str, str] = {}
    if isinstance(obj, dict):
        for key, value in obj.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    if obj is None:
        return out
    text = obj if isinstance(obj, str) else json.dumps(obj, sort_keys=True, default=str)
    out[_key(prefix.rstrip("."))] = _cut(text, MAX_PARAM_VALUE)
    return out


def _key(name: str) -> str:
    """A valid MLflow param/metric/tag key: letters, digits, ``_ - . / :`` and spaces."""
    return re.sub(r"[^\w\-./: ]", "_", name)[:250]


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 12] + "...(cut)"


def run_params(manifest: dict[str, Any]) -> dict[str, str]:
    """The params of a run: its flattened config, hash, model identity and price sheet."""
    schema.check(manifest, "manifest.json")  # another schema's run: SchemaError
    params = flatten(manifest.get("config") or {})
    params["config_hash"] = str(manifest.get("config_hash"))
    params.update(flatten(manifest.get("model") or {}, "identity."))
    params.update(flatten(manifest.get("price_sheet") or {}, "price_sheet."))
    if (manifest.get("config") or {}).get("price_sheet") is not None:
        params["price_sheet"] = str(manifest["config"]["price_sheet"])
    return secrets.redact(params)


def run_metrics(df: pd.DataFrame, seed: int) -> tuple[dict[str, float], dict[str, str]]:
    """(metrics ``<slug>/<value>``, tags ``variant.<slug>`` -> label) of a results table; NaN
    values (no price sheet: no dollars) are left out."""
    metrics: dict[str, float] = {}
    names: dict[str, str] = {}
    for label, values in variant_values(df, seed=seed).items():
        name = slug(label)
        while name in names and names[name] != label:  # two labels, one slug
            name += "_"
        names[name] = label
        for value, number in values.items():
            if number == number and math.isfinite(number):
                metrics[_key(f"{name}/{value}")] = float(number)
    return metrics, {f"variant.{name}": label for name, label in names.items()}


def _verdict_text(df: pd.DataFrame, seed: int) -> str:
    try:
        return headline(verdict(df, seed=seed).text)
    except ValueError as exc:  # nothing scored (every record failed), one variant, ...
        return f"no verdict: {exc}"


def _find_run(client, stored: dict[str, object] | None, uri: str):
    """The MLflow run a resumed ragbench run logged to before, if it is in this store."""
    if not stored or stored.get("tracking_uri") != secrets.redact_text(uri):
        return None
    try:
        found = client.get_run(stored["run_id"])
    except Exception:  # deleted, or another store under the same name
        return None
    return found if found.info.lifecycle_stage == "active" else None


def log_run(
    run_dir: str | Path,
    tracking: Tracking,
    parent_run_id: str | None = None,
    extra_params: dict[str, object] | None = None,
    run_name: str | None = None,
) -> str:
    """Log the run folder ``run_dir`` to MLflow (the module docstring says what); returns the
    MLflow run id, also kept in the manifest so a resumed run logs to the same MLflow run."""
    run_dir = Path(run_dir)
    df, seed = load_run(run_dir)
    uri = tracking.uri
    client = _client(tracking)
    try:
        return _log(
            client,
            uri,
            tracking,
            run_dir,
            df,
            seed,
            parent_run_id=parent_run_id,
            extra_params=extra_params,
            run_name=run_name,
        )
    except TrackingError:
        raise
    except Exception as exc:  # MlflowException, a store that cannot be reached
        raise TrackingError(secrets.redact_text(f"MLflow ({uri}): {exc}")) from None


def question_table(run_dir: Path, df: pd.DataFrame) -> pd.DataFrame:
    """The per-question table MLflow's evaluation view shows: one row per question x variant
    (the export's rows, ``export.sample_rows``) with the question, the gold answers, the
    prediction, the variant's label, the run's first metric (under its own name), the dollars,
    the latency and the error."""
    import pandas as pd

    manifest = json.loads((run_dir / "manifest.json").read_text(encoding="utf-8"))
    scores = score_columns(with_labels(df))
    rows = sample_rows(df, questions(run_dir, manifest))
    columns = (
        "example_id",
        "label",
        "question",
        "answers",
        "prediction",
        *scores[:1],
        "dollars",
        "latency_seconds",
        "error",
    )
    renamed = [{**r, "label": r["variant"]} for r in rows]
    return pd.DataFrame([{c: r.get(c) for c in columns} for r in renamed], columns=columns)


def _log_questions(client, run_id: str, table: object, step: int) -> None:
    """``table`` as the run's ``questions.json`` (``mlflow.log_table``, which MLflow's
    evaluation view reads). ``log_table`` appends to a table the run has (a resume): the stored
    one is deleted first, so the table is the run's whole table once; a store that cannot
    delete (the artifact is still there) gets the table under a name of this session's."""
    name = QUESTIONS_TABLE
    if any(a.path == name for a in client.list_artifacts(run_id)):
        from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

        uri = client.get_run(run_id).info.artifact_uri  # lazy: the optional extra (_client)
        get_artifact_repository(uri).delete_artifacts(name)
        if any(a.path == name for a in client.list_artifacts(run_id)):
            name = f"questions_{step}.json"
    client.log_table(run_id, table, name)
    client.set_tag(run_id, "ragbench.questions_table", name)


def _log(
    client,
    uri: str,
    tracking: Tracking,
    run_dir: Path,
    df: pd.DataFrame,
    seed: int,
    *,
    parent_run_id: str | None,
    extra_params: dict[str, object] | None,
    run_name: str | None,
) -> str:
    """``log_run``'s work: the MLflow run found (a resume) or created, then params, metrics,
    tags, artifacts and the question table."""
    from mlflow.entities import Metric, Param, RunTag  # lazy: the optional extra (see _client)

    found, manifest = _mlflow_run(client, uri, tracking, run_dir, run_name)
    run_id = found.info.run_id
    params = run_params(manifest)
    params.update(secrets.redact(flatten(extra_params or {})))
    logged = found.data.params  # params cannot change: a resume adds only new ones
    changed = sorted(k for k, v in params.items() if k in logged and logged[k] != v)
    new = [Param(k, v) for k, v in params.items() if k not in logged]
    metrics, variant_tags = run_metrics(df, seed) if len(df) else ({}, {})
    step = max(0, len(manifest.get("sessions") or [1]) - 1)
    now = int(time.time() * 1000)
    tags = _run_tags(run_dir, df, seed, manifest, variant_tags)
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id
    if changed:  # a resume with another max_dollars or threads: the first values stay
        tags["ragbench.params_changed_on_resume"] = ", ".join(changed)
    tag_list = [
        RunTag(_key(k), _cut(str(v), MAX_TAG_VALUE)) for k, v in secrets.redact(tags).items()
    ]
    metric_list = [Metric(k, v, now, step) for k, v in metrics.items()]
    for i in range(0, max(len(new), len(metric_list), len(tag_list)), 100):  # MLflow's batch cap
        part = slice(i, i + 100)
        client.log_batch(run_id, metrics=metric_list[part], params=new[part], tags=tag_list[part])
    for name in ARTIFACTS:
        if (run_dir / name).is_file():
            client.log_artifact(run_id, str(run_dir / name))
    if len(df):
        _log_questions(client, run_id, question_table(run_dir, df), step)
    status = {"finished": "FINISHED", "failed": "FAILED"}.get(manifest.get("status"), "KILLED")
    client.set_terminated(run_id, status=status)
    return run_id


def _mlflow_run(client, uri: str, tracking: Tracking, run_dir: Path, run_name: str | None):
    """(the MLflow run of ``run_dir``: the one its manifest names when it is in this store,
    else a new one; the manifest, which now names it)."""
    with FolderLock(run_dir, what="run", wait=True):  # the manifest's one writer
        manifest = json.loads((run_dir / "manifest.json").read_text(encoding="utf-8"))
        stored = (manifest.get("tracking") or {}).get("mlflow")
        found = _find_run(client, stored, uri)
        if found is None:
            experiment_id = _experiment_id(client, tracking.experiment, uri)
            found = client.create_run(experiment_id, run_name=run_name or run_dir.name)
        manifest["tracking"] = {
            "mlflow": {
                "tracking_uri": secrets.redact_text(uri),
                "experiment": tracking.experiment,
                "experiment_id": found.info.experiment_id,
                "run_id": found.info.run_id,
            }
        }
        text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
        atomic_write_text(run_dir / "manifest.json", text)
    return found, manifest


def _run_tags(
    run_dir: Path,
    df: pd.DataFrame,
    seed: int,
    manifest: dict[str, Any],
    variant_tags: dict[str, str],
) -> dict[str, str]:
    """A run's tags (the module docstring lists them)."""
    tags = {
        "ragbench.verdict": _verdict_text(df, seed),
        "ragbench.version": __version__,
        "ragbench.config_hash": str(manifest.get("config_hash")),
        "ragbench.status": str(manifest.get("status")),
        "ragbench.run_dir": str(run_dir.resolve()),
        **variant_tags,
    }
    if manifest.get("git_commit"):
        tags["mlflow.source.git.commit"] = manifest["git_commit"]
    return tags


def log_sweep(outcome: Any, spec_path: str | Path, tracking: Tracking, results: str) -> str:
    """A sweep (``workspace.sweep.execute_sweep``'s outcome) as a parent MLflow run and, under
    it, one child per run folder of each done point (its params include the point's, as
    ``point.<name>``). The parent's id is kept in ``<sweep_dir>/mlflow.json``, each child's in
    its run's manifest: a resumed sweep logs to the same runs."""
    from mlflow.entities import Metric, Param, RunTag  # lazy: the optional extra (see _client)

    client = _client(tracking)
    uri = tracking.uri
    sweep_dir = Path(outcome.sweep_dir)
    marker = sweep_dir / "mlflow.json"
    try:
        stored = json.loads(marker.read_text(encoding="utf-8")) if marker.exists() else None
        parent = _find_run(client, stored, uri)
        if parent is None:
            experiment_id = _experiment_id(client, tracking.experiment, uri)
            parent = client.create_run(experiment_id, run_name=f"sweep {Path(spec_path).stem}")
        parent_id = parent.info.run_id
        atomic_write_text(
            marker,
            json.dumps(
                {
                    "tracking_uri": secrets.redact_text(uri),
                    "experiment": tracking.experiment,
                    "experiment_id": parent.info.experiment_id,
                    "run_id": parent_id,
                },
                indent=2,
            )
            + "\n",
        )
        children = 0
        for point in outcome.points:
            if point.status != "done":
                continue
            folder = sweep_dir / point.point_id
            for results_file in sorted(folder.glob(results)):
                if not (results_file.parent / "manifest.json").is_file():
                    continue  # not a ragbench run folder
                log_run(
                    results_file.parent,
                    tracking,
                    parent_run_id=parent_id,
                    extra_params={"point": {**point.params, "id": point.point_id}},
                    run_name=point.point_id,
                )
                children += 1
        logged = parent.data.params
        params = {k: v for k, v in secrets.redact(flatten({"spec": str(spec_path)})).items()}
        new = [Param(k, v) for k, v in params.items() if k not in logged]
        counts = {
            "points_done": outcome.count("done"),
            "points_failed": outcome.count("failed"),
            "runs_logged": children,
        }
        now = int(time.time() * 1000)
        client.log_batch(
            parent_id,
            params=new,
            metrics=[Metric(k, float(v), now, 0) for k, v in counts.items()],
            tags=[
                RunTag("ragbench.version", __version__),
                RunTag("ragbench.sweep_dir", str(sweep_dir.resolve())),
            ],
        )
        if (sweep_dir / "summary.json").is_file():
            client.log_artifact(parent_id, str(sweep_dir / "summary.json"))
        client.set_terminated(parent_id, status="FINISHED" if not outcome.failed else "FAILED")
    except TrackingError:
        raise
    except Exception as exc:
        raise TrackingError(secrets.redact_text(f"MLflow ({uri}): {exc}")) from None
    return parent_id


def run(config: Any, *args: Any, mlflow: Tracking | None = None, **kwargs: Any) -> Any:
    """``ragbench.run``: run ``config`` (``experiment.runner.run``, same arguments) and log it
    to MLflow when the config has a ``tracking:`` section or ``mlflow`` says where. Returns
    the results table; ``df.attrs["mlflow_run_id"]`` names the MLflow run."""
    cfg = load_config(config)
    tracking = mlflow or settings(cfg)
    if tracking is not None:
        check(tracking)  # before the run, not after it
    df = run_experiment(cfg, *args, **kwargs)
    if tracking is not None:
        df.attrs["mlflow_run_id"] = log_run(df.attrs["run_dir"], tracking)
    return df
