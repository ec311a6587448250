"""Experiment config: one YAML file -> a validated, hashable ``RunConfig``.

Unknown keys are errors (pydantic ``extra="forbid"``) reported as ``file:line: field: message``
with the closest valid key; unknown model, strategy, dataset and metric names get a did-you-mean.
``config_hash`` is the sha256 of the canonical JSON of the validated config (defaults filled in,
``output_dir`` left out), so the same experiment always lands in the same run folder.

Validated once: the typed objects a run reads (``cfg.points``, ``cfg.sheet``) are built by
validation and kept as private attributes (not in the dump or the hash), never rebuilt.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from ragbench.cost.prices import PriceSheet, price_sheet
from ragbench.experiment.config.sections import (
    DatasetConfig,
    JudgeConfig,
    ModelConfig,
    RetrievalConfig,
    SequentialConfig,
    StrategyConfig,
    TrackingConfig,
    _Strict,
)
from ragbench.experiment.config.text import (
    ConfigError,
    _line_of,
    apply_overrides,
    explain_validation_error,
    located,
)
from ragbench.io import InputFileError, dumps_canonical, load_yaml, read_text, yaml_problem
from ragbench.llm import backend_capabilities
from ragbench.llm.kv.variants import refuse_variants, variants_run
from ragbench.metrics.answer import METRICS
from ragbench.schema import KEY as SCHEMA_KEY
from ragbench.schema import SCHEMA_VERSION
from ragbench.secrets import collect, redact
from ragbench.strategies import get_strategy
from ragbench.strategies.params import StrategyParams
from ragbench.strategies.pipeline.target import imports_from

PATH_PARAMS = ("path", "corpus", "questions")  # dataset parameters that name files


NOISE_DISTRACTORS = 5  # noise_sensitivity's default distractors per example


class RunConfig(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")  # run folder: <name>-<hash[:8]>
    seed: int = 0  # every generator and bootstrap takes it: same config, same table
    dataset: DatasetConfig
    model: ModelConfig = Field(default_factory=ModelConfig)
    retrieval: RetrievalConfig = Field(default_factory=RetrievalConfig)
    strategies: list[StrategyConfig] = Field(min_length=1)  # compared on the same examples
    metrics: list[str] = Field(default_factory=lambda: ["string_match_all"])  # answer metrics
    prompt_budget: int | None = Field(None, ge=1)  # matched budgets: one prompt-token cap for all
    price_sheet: str | None = None  # shipped sheet name or YAML path; None: no $ column
    # what an hourly sheet charges: calibrated = the seconds the model's measured rates give the
    # query's own tokens (same tokens, same dollars, whatever the load); measured = its measured
    # share of device time (varies with the load). Token sheets price tokens either way.
    cost_basis: Literal["calibrated", "measured"] = "calibrated"
    judge: JudgeConfig | None = None  # judge metrics' model and settings (ragbench.judge)
    # noise_sensitivity: distractor documents put before each example's own (noise_pass.py)
    noise_distractors: int = Field(NOISE_DISTRACTORS, ge=1)
    # stop the run before its spend (price sheets; judge included) passes this many dollars
    # (ragbench.experiment.budget); the dry run refuses a config estimated over it. Not part of
    # the hash: a rerun with a higher cap resumes in the same run folder
    max_dollars: float | None = Field(None, gt=0)
    # stop when decided (`ragbench run --until-decided`): rounds, alpha spending, margin; not
    # part of the hash either (where a run stops)
    sequential: SequentialConfig | None = None
    output_dir: str = "data/results"  # where run folders go (not part of the hash)
    # where the run is logged besides its folder (MLflow: ragbench.workspace.tracking); not part
    # of the hash: where a run is reported changes nothing it computes
    tracking: TrackingConfig | None = None

    # the folder of the YAML file the config came from: relative dataset paths resolve there
    _source_dir: str | None = PrivateAttr(default=None)
    _source_file: str | None = PrivateAttr(default=None)  # that YAML file (error locations)
    # the folder a relative output_dir resolves against: the config file's when the file (or a
    # --set) names output_dir; None: the working directory (the default data/results, dicts)
    _output_base: str | None = PrivateAttr(default=None)
    # `--set dotted.path=value` overrides applied on top of the file (recorded in the manifest)
    _overrides: list[str] = PrivateAttr(default_factory=list)
    # built by validation (`_typed`), read by the run: not part of the dump or the hash
    _points: tuple[StrategyParams, ...] = PrivateAttr(default=())
    _sheet: PriceSheet | None = PrivateAttr(default=None)
    # set once loaded (``load_config``): from then on nothing is written, private attributes
    # included (the fields are frozen); ``with_origin`` makes a changed copy
    _sealed: bool = PrivateAttr(default=False)

    def __setattr__(self, name: str, value: Any) -> None:
        # the fields are frozen (pydantic refuses them); the private attributes once loaded
        if name.startswith("_") and (self.__pydantic_private__ or {}).get("_sealed"):
            raise TypeError(
                f"RunConfig is immutable once loaded: cannot set {name!r} (a changed copy: "
                "model_copy(update=...) for a field, with_origin(...) for where it came from)"
            )
        super().__setattr__(name, value)

    @property
    def points(self) -> tuple[StrategyParams, ...]:
        """Every (strategy, parameter point) of the config, in config order: each strategy's
        ``params`` grid, crossed with the ``retrieval`` grid for the strategies that retrieve."""
        return self._points

    @property
    def sheet(self) -> PriceSheet | None:
        """The loaded ``price_sheet`` (None: no dollar column)."""
        return self._sheet

    def output_path(self) -> Path:
        """Where run folders go: ``output_dir``, a relative one against the config file's
        folder when the file names it (as dataset paths), else against the working directory
        (the default ``data/results``, configs given as dicts, ``--output-dir``)."""
        out = Path(self.output_dir).expanduser()
        if out.is_absolute() or self._output_base is None:
            return out
        return Path(os.path.normpath(Path(self._output_base) / out))

    def dataset_params(self) -> dict[str, Any]:
        """The dataset builder's kwargs, with relative file parameters (``PATH_PARAMS``) resolved
        against the config file's folder when the file is there (else as given: the working
        directory). Resolved here, not stored, so the config hash stays machine-independent."""
        params = dict(self.dataset.params)
        if self._source_dir is None:
            return params
        for key in PATH_PARAMS:
            value = params.get(key)
            if isinstance(value, str) and value and not Path(value).is_absolute():
                candidate = Path(self._source_dir) / value
                if candidate.exists():
                    params[key] = str(candidate)
        return params

    @field_validator("strategies", mode="before")
    @classmethod
    def _shorthand(cls, v: Any) -> Any:  # `- rag` is short for `- {name: rag}`
        return [{"name": s} if isinstance(s, str) else s for s in v] if isinstance(v, list) else v

    @field_validator("metrics")
    @classmethod
    def _metrics(cls, v: list[str]) -> list[str]:
        names = [METRICS.check(name) for name in v]
        twice = next((name for i, name in enumerate(names) if name in names[:i]), None)
        if twice is not None:  # the table would show its column twice
            raise ValueError(f"{twice!r} is listed twice; name each metric once")
        return names

    @model_validator(mode="after")
    def _typed(self) -> RunConfig:
        """The typed objects the run reads, built once: each strategy's grid crossed with the
        retrieval grid (a strategy's chunk_size with the section's chunk_overlap, say; every
        point must be valid before anything loads) and the price sheet. Errors name the place
        in the file they come from (``strategies.1``, ``price_sheet``)."""
        retrieval_grid = self.retrieval.grid_values()
        # a KV-cache variant the model's backend cannot keep would fail every record of it
        kv = variants_run(backend_capabilities(self.model.backend), self.model.params)
        points: list[StrategyParams] = []
        for i, s in enumerate(self.strategies):
            grid = located(("strategies", i), get_strategy(s.name).grid, s.params, retrieval_grid)
            keeps = [p for p in grid if hasattr(p, "kv")]
            located(
                ("strategies", i, "params", "kv"), refuse_variants, keeps, self.model.backend, kv
            )
            points.extend(grid)
        self._points = tuple(points)
        if not self.metrics and any(get_strategy(p.strategy).generates for p in points):
            located(("metrics",), _no_metrics)
        if self.price_sheet is not None:
            self._sheet = located(("price_sheet",), price_sheet, self.price_sheet)
        return self

    @model_validator(mode="after")
    def _budget(self) -> RunConfig:
        """A dollar cap needs dollars: a price sheet for the model (or the judge)."""
        judge_sheet = self.judge is not None and self.judge.price_sheet is not None
        if self.max_dollars is not None and self.price_sheet is None and not judge_sheet:
            raise ValueError(
                "max_dollars needs dollars to count: set price_sheet (e.g. example-hosted-api, "
                "or a YAML path; `ragbench prices list` shows the shipped ones)"
            )
        return self

    @model_validator(mode="after")
    def _judge(self) -> RunConfig:
        """Judge metrics need a judge model, and not the model under test unless allowed."""
        judged = [m for m in self.metrics if METRICS.get(m).kind == "judge"]
        judge = self.judge
        if judged and (judge is None or judge.model is None):
            raise ValueError(
                f"metrics {judged} need a judge model: add a `judge:` section with `model:` "
                "(backend, name, params), e.g. judge: {model: {backend: openai, name: ...}}"
            )
        same = lambda m: (m.backend, m.name, m.params)  # noqa: E731 (what makes it that model)
        if (
            judge is not None
            and judge.model is not None
            and same(judge.model) == same(self.model)
            and not judge.allow_model_under_test
        ):
            raise ValueError(
                "judge.model is the model under test; a model grading its own answers is "
                "biased. Name another model, or set judge.allow_model_under_test: true"
            )
        return self


# ---------------------------------------------------------------------------- loading and hashing
# (the text side: --set overrides and file:line validation messages live in config/text.py)


SPEED_PARAMS = ("decode", "cuda_graphs")  # model.params that change speed, not answers
# model.params that say how long a request may wait and how often it is tried (the HTTP
# backend's retry policy): when a request gives up, never what an answer means. Left out of the
# hash by name, so a config that does not set them hashes as it always did (its run folder keeps
# its name), and one that does lands in the same folder as without them (a rerun with a longer
# timeout resumes the run instead of starting another)
TRANSPORT_PARAMS = (
    "timeout",
    "connect_timeout",
    "deadline",
    "max_retries",
    "backoff_base",
    "backoff_max",
)


def _no_metrics() -> None:
    raise ValueError("[] scores no answer; name one (e.g. string_match_all)")


def config_hash(config: RunConfig) -> str:
    """Identity of a config's results, and of the schema they are stored in (a new schema is a
    new run folder). Credentials are masked first: a new password or key
    gives the same run folder, and the hash is never a function of a secret."""
    # threads and rate limits change speed, not answers: the same run folder whatever the
    # machine's load; max_dollars and sequential where a run stops, not what it computes (a
    # higher cap resumes; a run without sequential answers the rest); tracking where it is
    # reported; and so does the transformers backend's decode path (model.params decode /
    # cuda_graphs), and the HTTP backend's timeouts and retries (TRANSPORT_PARAMS)
    params = dict.fromkeys((*SPEED_PARAMS, *TRANSPORT_PARAMS), True)
    speed = {"threads": True, "rate_limit": True, "params": params}
    exclude: dict[str, Any] = {
        "output_dir": True,
        "max_dollars": True,
        "sequential": True,
        "tracking": True,
        "model": speed,
        "judge": {"model": speed},
    }
    data = redact(config.model_dump(mode="json", exclude=exclude))
    if not any(m in METRICS and METRICS.get(m).kind == "noise" for m in config.metrics):
        data.pop("noise_distractors", None)  # changes nothing without a noise metric
    # what a run stores has one version (ragbench.schema): a new schema is a new run folder
    data[SCHEMA_KEY] = SCHEMA_VERSION
    return hashlib.sha256(dumps_canonical(data).encode("utf-8")).hexdigest()


def parse_config(data: Any, source: str = "<config>", text: str | None = None) -> RunConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a config must be a YAML mapping, got {type(data).__name__}")
    collect(data)  # credentials in it are masked in every later error, log and file
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(explain_validation_error(exc, source, text, RunConfig)) from None


def check_output_dir(cfg: RunConfig, text: str | None = None) -> None:
    """A relative ``output_dir`` named in a config file must stay inside the config's folder
    tree or the working directory (``output_dir: ../../..`` would put run folders at /); an
    absolute path is the user's own choice. A ConfigError naming the key, the resolved path
    and the fix otherwise."""
    if cfg._output_base is None or Path(cfg.output_dir).expanduser().is_absolute():
        return
    resolved, base, cwd = cfg.output_path().resolve(), Path(cfg._output_base).resolve(), Path.cwd()
    if resolved.is_relative_to(base) or resolved.is_relative_to(cwd.resolve()):
        return
    source = cfg._source_file or "<config>"
    line = _line_of(text, ("output_dir",)) if text else None
    raise ConfigError(
        f"{source}{f':{line}' if line else ''}: output_dir: {cfg.output_dir!r} resolves to "
        f"{resolved}, outside the config's folder ({base}) and the working directory ({cwd}); "
        "write a path inside either (relative paths resolve against the config's folder), or "
        "an absolute path to write there"
    )


ORIGIN = ("source_dir", "source_file", "output_base", "overrides")  # where a config came from


def with_origin(cfg: RunConfig, **origin: Any) -> RunConfig:
    """A loaded (sealed) copy of ``cfg`` with ``origin`` changed: ``source_dir`` (relative
    dataset paths resolve there), ``source_file``, ``output_base``, ``overrides`` (the private
    attributes of the same names). ``cfg`` itself is not written."""
    if unknown := set(origin) - set(ORIGIN):
        raise TypeError(f"with_origin: unknown {sorted(unknown)}; valid: {list(ORIGIN)}")
    new = cfg.model_copy()
    private = {**(cfg.__pydantic_private__ or {}), **{f"_{k}": v for k, v in origin.items()}}
    object.__setattr__(new, "__pydantic_private__", private | {"_sealed": True})
    return new


def _sealed(cfg: RunConfig) -> RunConfig:
    """``cfg``, never written again (``RunConfig.__setattr__``)."""
    (cfg.__pydantic_private__ or {})["_sealed"] = True
    return cfg


def load_config(
    path: str | os.PathLike | RunConfig | dict, overrides: Sequence[str] = ()
) -> RunConfig:
    """A RunConfig from a YAML path (or a dict, or an existing RunConfig), with ``overrides``
    (``dotted.path=value``, see :func:`apply_overrides`) applied before validation and kept in
    ``cfg._overrides`` for the manifest. The config returned is sealed: immutable, its private
    attributes included."""
    if isinstance(path, RunConfig):
        if not overrides:
            return _sealed(path)
        cfg = parse_config(apply_overrides(path.model_dump(mode="json"), overrides))
        output_base = path._output_base
        if path._source_dir and any(o.strip().startswith("output_dir=") for o in overrides):
            output_base = path._source_dir  # a --set output_dir is the file's key
        cfg = with_origin(
            cfg,
            source_dir=path._source_dir,
            source_file=path._source_file,
            overrides=[*path._overrides, *overrides],
            output_base=output_base,
        )
        check_output_dir(cfg)
        return cfg
    if isinstance(path, dict):
        cfg = parse_config(apply_overrides(path, overrides))
        return with_origin(cfg, overrides=list(overrides))
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: no such config file")
    if path.is_dir():  # a run folder keeps its config as config.yaml
        hint = f"; its config is {path / 'config.yaml'}" if (path / "config.yaml").is_file() else ""
        raise ConfigError(f"{path}: a folder, not a config file{hint}")
    try:
        text = read_text(path)  # bytes that are not UTF-8: the file, line and column
        data = load_yaml(text)  # a repeated key, or aliases that expand too far: refused
    except InputFileError as exc:
        raise ConfigError(str(exc)) from None
    except yaml.YAMLError as exc:
        line, problem = yaml_problem(exc)
        where = f"{path}:{line}" if line else str(path)
        raise ConfigError(f"{where}: invalid YAML: {problem}") from None
    if overrides:
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: a config must be a YAML mapping")
        data = apply_overrides(data, overrides)
    with imports_from(path.resolve().parent):  # a pipeline target may sit beside the config
        cfg = parse_config(data, str(path), None if overrides else text)
    source_dir = str(path.resolve().parent)
    named = isinstance(data, dict) and "output_dir" in data  # named in the file (or a --set)
    cfg = with_origin(
        cfg,
        source_dir=source_dir,
        source_file=str(path),
        overrides=list(overrides),
        output_base=source_dir if named else None,
    )
    check_output_dir(cfg, None if overrides else text)
    return cfg
