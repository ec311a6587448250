"""``ragbench compare DOCS... --questions FILE``: from a folder of documents to the answer, with no
YAML to write (the command is ``ragbench.cli.compare``; this is its logic).

One job: the command's steps in order, each checked before the next spends anything (its
options, price sheet and pipelines, then the documents, the questions, the config, the estimate,
the run, the verdict and the report); a user's options and files go through this module only.

The steps, each a function here so the CLI stays thin and tests can call them:

1. :func:`ingest`: the folder(s) -> one corpus file, fingerprinted, under
   ``<output_dir>/your-documents/`` (where notebook 05 writes it);
2. :func:`questions_path`: the questions file given, or questions generated over the corpus
   (``experiment.question_gen``, as ``ragbench data questions`` and notebook 05 generate them);
3. :func:`build_config` + :func:`write_config`: the run config notebook 05 builds from the same
   parameters (closed book, long context, RAG and Self-Route on one shared corpus, and the user's
   own pipeline beside them: :func:`strategy_list`), written as a real YAML file in the run
   folder, so ``ragbench run <that file>`` resumes the same run;
4. :func:`estimate` (the dry run: tokens and dollars per strategy) and :func:`is_paid` (a backend
   without local weights priced per token: the CLI asks before spending);
5. ``experiment.runner.run`` on that YAML, then :func:`decide` (``analysis.verdict`` with the share
   of the corpus long context had to cut added to its conditions);
6. :func:`write_report`: notebook 05 executed with the run's parameters (its run is this run: same
   config, same folder, nothing pending), its verdict moved to the top, rendered to HTML beside
   the run.

A pipeline (``pipeline``: ``"module:attr"``, a function, a llama-index query engine or retriever,
or a factory of one; ``pipeline_url``: an HTTP service) is checked first, by
:func:`check_pipelines`, before the documents are read or any model loads: a target whose module
does not import or lacks the attribute, or an endpoint that does not answer, is one error line.
Once the options check out, :func:`build_pipelines` calls a target's factory (the run reuses what
it built): one that raises is one error line too, before the ingest.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from ragbench import secrets
from ragbench.analysis import verdict as analysis_verdict
from ragbench.analysis.verdict import Verdict
from ragbench.analysis.verdict_table import bad_limit
from ragbench.cost.prices import available_price_sheets, price_sheet
from ragbench.datasets.corpus import docs as ingest_docs
from ragbench.datasets.corpus.file import write_documents
from ragbench.datasets.questions import read_questions
from ragbench.experiment.config.run import RunConfig, load_config, with_origin
from ragbench.experiment.dry_run import dry_run
from ragbench.experiment.question_gen import generate as question_gen
from ragbench.experiment.resources import Warmup, generates_answers, no_gold_answer
from ragbench.experiment.runner import run_dir_for
from ragbench.io import InputFileError, atomic_write_text
from ragbench.llm import backend_params
from ragbench.strategies import get_strategy
from ragbench.strategies.pipeline import http as pipeline_http
from ragbench.strategies.pipeline.params import URL_ENV, PipelineParams
from ragbench.strategies.pipeline.strategy import open_pipeline
from ragbench.workspace.kernels import execute_notebook
from ragbench.workspace.notebook import ModelSection, model_block
from ragbench.workspace.render import executed_runs, render_notebook
from ragbench.workspace.scrub import repo_root

if TYPE_CHECKING:
    import pandas as pd
    from nbformat import NotebookNode

# what notebook 05 compares, and how its long context fits a corpus larger than the window
# (LongBench's middle truncation: keep the start and the end)
DEFAULT_STRATEGIES = ("closed_book", "long_context", "rag", "self_route")
DEFAULT_OVERFLOW = "truncate_middle"
RUN_NAME = "your-documents"  # notebook 05's run name: its report resumes this very run
WORK_FOLDER = "your-documents"  # under output_dir: the corpus and generated questions
CHUNK_OVERLAP = 16  # tokens neighbouring RAG chunks share, for chunks of 64 tokens or more
METRICS = ("contains", "f1")  # notebook 05's; the verdict decides on the first
CONFIG_FILE = "compare.yaml"  # in the run folder: the config the run used
NOTEBOOK = "notebooks/05_your_documents.ipynb"
VERDICT_HEADING = "## Verdict"
DEFAULT_PRICE_SHEET = "example-hosted-api"  # notebook 05's; local and fake backends spend nothing


@dataclass(frozen=True)
class CompareSpec:
    """What ``ragbench compare`` was asked (its options); the defaults are notebook 05's."""

    docs: tuple[str, ...]  # files and folders, read recursively
    questions: str = ""  # CSV or JSONL questions file; empty: generate n_questions
    n_questions: int = 10
    backend: str = "hf"  # hf (the embedded model) | openai (a server) | fake (tests, offline)
    model: str = "smollm2-135m-instruct"
    base_url: str = ""
    embedder: str = "minilm"
    tokenizer: str = ""  # chunk and length counting; empty: the model's (or the backend's)
    max_new_tokens: int = 32
    chunk_size: int = 128
    chunk_overlap: int = -1  # tokens neighbouring chunks share; -1: chunk_overlap_for's default
    top_k: int = 3
    # a paid API (a backend that sends to a server) with none given: the shipped sheet of its
    # model (``price_sheet_for``); else this example sheet
    price_sheet: str = DEFAULT_PRICE_SHEET
    max_dollars: float | None = None  # the run's cap (max_dollars; not in the config hash)
    strategies: tuple[str, ...] = DEFAULT_STRATEGIES
    overflow: str = DEFAULT_OVERFLOW
    min_accuracy: float = 0.0  # the verdict's constraints (0: none)
    max_dollars_per_1k: float = 0.0
    max_latency_s: float = 0.0
    output_dir: str = "data/results"
    seed: int = 0
    threads: int | None = None  # torch CPU threads (model.threads; speed only, not in the hash)
    pipeline: str = ""  # your system: "module:attr" (function, llama-index engine, or a factory)
    pipeline_url: str = ""  # your system as an HTTP service (POST JSON, see docs/pipeline.md)
    until_decided: bool = False  # questions in rounds until a group-sequential test decides

    @property
    def out(self) -> Path:
        """``output_dir``, absolute: the YAML and the notebook name it from anywhere."""
        return Path(self.output_dir).resolve()


# --------------------------------------------------------------------------- corpus and questions


def ingest(spec: CompareSpec, on_skip: Callable[[Any], None] | None = None) -> tuple[Any, Path]:
    """(ingest result, corpus file): the documents of ``spec.docs`` in one corpus file named by
    its fingerprint, where notebook 05 writes it. A path that does not exist, or nothing
    readable, raises (FileNotFoundError, ValueError: one line each)."""
    result = ingest_docs.ingest(list(spec.docs), progress=False, on_skip=on_skip)
    work = spec.out / WORK_FOLDER
    return result, write_documents(
        work / f"corpus-{result.fingerprint[:12]}.jsonl", result.documents
    )


def model_section(spec: CompareSpec) -> tuple[ModelSection, str]:
    """(the config's ``model`` section, the chunking tokenizer), as notebook 05 makes them (plus
    ``threads``, which changes speed, not the config hash)."""
    section, counter = model_block(
        spec.backend, spec.model, spec.base_url, spec.max_new_tokens, spec.tokenizer
    )
    return ({**section, "threads": spec.threads} if spec.threads else section), counter


def questions_path(
    spec: CompareSpec, corpus: Path, fingerprint: str, warmup: Warmup | None = None
) -> tuple[Path, Any]:
    """(questions file, the generation result or None): the file given, or ``n_questions``
    generated from sampled passages of the corpus (answers checked against their passage,
    near-duplicates and questions the model answers closed book dropped), where notebook 05
    puts them; by ``warmup``'s model when there is one (not loaded twice)."""
    if spec.questions:
        path = Path(spec.questions)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such questions file")
        return path.resolve(), None
    path = spec.out / WORK_FOLDER / f"questions-{fingerprint[:12]}.jsonl"
    section, _ = model_section(spec)
    model = warmup.llm() if warmup is not None else section
    generated = question_gen.questions_file(
        corpus,
        path,
        spec.n_questions,
        model,
        seed=spec.seed,
        drop_closed_book=True,
        price_sheet=spec.price_sheet,
        progress=False,
        closed_book_max_new_tokens=section["max_new_tokens"],
    )
    return path, generated


# --------------------------------------------------------------------------- the config


def strategy_list(
    strategies: Sequence[str], top_k: int, overflow: str, pipeline: str = "", pipeline_url: str = ""
) -> list[object]:
    """Each strategy with the options it declares among ``top_k`` and ``overflow`` (a bare name
    when it takes none), then the pipeline(s): what notebook 05 and ``ragbench compare`` run."""
    options = {"top_k": top_k, "overflow": overflow}
    entries: list[object] = []
    for name in strategies:
        fields = get_strategy(name).params.field_names()  # unknown name: did-you-mean
        params = {k: v for k, v in options.items() if k in fields}
        entries.append({"name": name, "params": params} if params else name)
    return entries + [
        {"name": PipelineParams.strategy, "params": p}
        for p in pipeline_params(pipeline, pipeline_url)
    ]


def strategy_entries(spec: CompareSpec) -> list[object]:
    """``strategy_list`` of the spec's strategies, options and pipeline(s)."""
    return strategy_list(
        spec.strategies, spec.top_k, spec.overflow, spec.pipeline, spec.pipeline_url
    )


def pipeline_params(pipeline: str = "", pipeline_url: str = "") -> list[dict[str, Any]]:
    """The ``pipeline`` strategy's params for a target and/or an endpoint (none when both are
    empty)."""
    points: list[dict[str, object]] = []
    if pipeline:
        points.append({"target": pipeline})
    if pipeline_url:
        points.append({"url": pipeline_url})
    return points


def check_pipelines(spec: CompareSpec) -> list[PipelineParams]:
    """The spec's pipelines, checked before anything else is done: a target's module imports and
    has the attribute (``ValueError`` naming which failed; its factory is called by
    ``build_pipelines``, once the options check out), an endpoint answers
    (``ServerUnreachable``, a ``ValueError``)."""
    points = [PipelineParams(**p) for p in pipeline_params(spec.pipeline, spec.pipeline_url)]
    for point in points:
        if point.url is not None:
            pipeline_http.check(point)
    return points


def build_pipelines(points: Sequence[PipelineParams]) -> None:
    """Each target opened as the run will open it (``pipeline.strategy.open_pipeline``: a
    factory builds its engine now, once; the run reuses it), after the options are checked and
    before a document is read: a factory that raises is one error line (ValueError), not a
    traceback after the ingest."""
    for point in points:
        if point.target is not None:
            open_pipeline(point)


def chunk_overlap_for(chunk_size: int, chunk_overlap: int = -1) -> int:
    """The tokens neighbouring RAG chunks share: ``chunk_overlap`` when set (0 or more; the
    config check says when it is not below ``chunk_size``); -1: ``CHUNK_OVERLAP`` (16), at most
    a quarter of ``chunk_size``, so that any chunk size runs (16 is a whole 16-token chunk)."""
    return min(CHUNK_OVERLAP, chunk_size // 4) if chunk_overlap == -1 else chunk_overlap


def build_config(spec: CompareSpec, corpus: Path, questions: Path) -> dict[str, object]:
    """The run config, key for key the one notebook 05 builds from the same parameters (so the
    notebook's run is this run: same hash, same folder)."""
    section, counter = model_section(spec)
    return (
        {
            "name": RUN_NAME,
            "seed": spec.seed,
            "dataset": {
                "name": "corpus",
                "params": {"corpus": str(corpus), "questions": str(questions)},
            },
            "model": section,
            "retrieval": {
                "embedder": spec.embedder,
                "retriever": "dense",
                "chunk_size": spec.chunk_size,
                "chunk_overlap": chunk_overlap_for(spec.chunk_size, spec.chunk_overlap),
                "tokenizer": counter,
            },
            "strategies": strategy_entries(spec),
            "metrics": list(METRICS),
            "price_sheet": spec.price_sheet,
            "output_dir": str(spec.out),
        }
        | ({"sequential": {}} if spec.until_decided else {})
        | ({"max_dollars": spec.max_dollars} if spec.max_dollars is not None else {})
    )


def sends(backend: str) -> bool:
    """A backend that sends its requests to a server (it takes a ``base_url``): a paid API when
    its sheet prices tokens."""
    return "base_url" in backend_params(backend)


def price_sheet_for(backend: str, model: str, given: str | None) -> tuple[str, str | None]:
    """(the price sheet to use, the line that says why, or None): ``given`` when there is one;
    for a backend that sends to a server, the shipped sheet whose ``model`` is ``model`` when
    exactly one is (pricing gpt-4.1 at the example sheet's rates showed it ~13x cheaper than its
    own sheet, in the estimate a paid run asks to spend on), else ValueError: a model with no
    sheet of its own is not guessed at; for local and fake backends, ``DEFAULT_PRICE_SHEET``."""
    if given:
        return given, None
    if not sends(backend):
        return DEFAULT_PRICE_SHEET, None
    names = [n for n in available_price_sheets() if price_sheet(n).model == model]
    if len(names) == 1:
        return (
            names[0],
            f"price sheet: {names[0]} (the shipped sheet of model {model}; --price-sheet to choose another)",
        )
    which = (
        f"{len(names)} shipped sheets price model {model!r} ({', '.join(names)})"
        if names
        else (f"no shipped price sheet is for model {model!r}")
    )
    raise ValueError(
        f"--backend {backend} sends paid requests, and {which}: name one with --price-sheet "
        "(a shipped name from `ragbench prices list`, or a YAML path)"
    )


def precheck(spec: CompareSpec) -> RunConfig:
    """Every option, and the questions file, checked before a document is read: a typo in a
    backend or model name fails in a second, not after the ingest. (The config is built on the
    corpus path the ingest will write; nothing is read from it here.)"""
    check_constraints(spec)
    if spec.questions and not Path(spec.questions).is_file():
        raise FileNotFoundError(f"{spec.questions}: no such questions file")
    questions = read_questions(spec.questions) if spec.questions else None  # a bad line: now
    cfg = validate(spec, spec.out / WORK_FOLDER / "corpus.jsonl")
    if questions is not None and generates_answers(cfg) and not any(q.answers for q in questions):
        raise InputFileError(spec.questions, None, no_answers(len(questions)), "answers")
    return cfg


def no_answers(n: int) -> str:
    """Why a questions file without a single gold answer is refused, and what to do."""
    return (
        f"{no_gold_answer(n, 'question')}, so no answer could be scored; give at least one "
        'question answers (an `answers` column: CSV cells separated by `|`, a JSONL "answers" '
        "list; questions without them are run and reported unscored), or leave out --questions "
        "to generate questions with answers (--n-questions)"
    )


def check_constraints(spec: CompareSpec) -> None:
    """The verdict's constraints in range, or ValueError naming the option: ``min_accuracy`` a
    share of questions, 0-1 (60 meant as 60% would ask for 6,000%); a maximum $ or latency
    0 or more (0: no limit; a negative one no variant could meet). A chunk overlap set to the
    chunk size or more is named by its options too (the config check would say ``<config>:
    retrieval: chunk_overlap``, a file the user never wrote)."""
    if chunk_overlap_for(spec.chunk_size, spec.chunk_overlap) >= spec.chunk_size:
        raise ValueError(
            f"--chunk-overlap must be less than --chunk-size ({spec.chunk_size}); "
            f"got {spec.chunk_overlap}"
        )
    if bad_limit(spec.min_accuracy) or spec.min_accuracy > 1:  # (contains: a share)
        raise ValueError(f"--min-accuracy must be from 0 to 1 (0: any); got {spec.min_accuracy:g}")
    for option, value in (
        ("--max-dollars-per-1k", spec.max_dollars_per_1k),
        ("--max-latency-s", spec.max_latency_s),
    ):
        if bad_limit(value):  # the verdict's rule: infinity too, not found after a paid run
            raise ValueError(f"{option} must be 0 or more (0: no limit); got {value:g}")


def validate(spec: CompareSpec, corpus: Path) -> RunConfig:
    """The config validated before anything is spent (question generation included): unknown
    strategies, overflow policies, price sheets, models raise ValueError naming the choices."""
    return load_config(build_config(spec, corpus, corpus))


def write_config(config: dict[str, Any]) -> tuple[RunConfig, Path]:
    """(the validated config, its YAML file in the run folder). The file is what the run reads,
    so ``ragbench run`` on it lands in the same folder; edit it and rerun for a variation.

    The file holds no credential (``secrets.redact``: a ``--base-url`` or ``--pipeline-url`` with
    ``user:password@`` or a ``?token=`` is written with them masked, which gives the same run
    folder: the hash is taken redacted). The config returned is the one given, credentials and
    all, for this command's run; a resume takes them from the environment (``OPENAI_BASE_URL``,
    ``RAGBENCH_PIPELINE_URL``) or ``--set``, as the file's header says."""
    cfg = load_config(config)  # validated first: a bad option fails before anything is written
    path = run_dir_for(cfg) / CONFIG_FILE
    stored = secrets.redact(config)
    header = (
        "# written by `ragbench compare` (its options are the keys below)\n"
        f"# rerun or resume: ragbench run {path}\n"
        "# edit anything (strategies, top_k, model, price_sheet...) and run it again: a changed\n"
        "# config is a new run folder beside this one. Keys: see docs/your-documents.md (3. The config)\n"
    )
    if stored != config:
        header += (
            "# credentials are never stored: the URLs below read *** where they had them. To\n"
            "# resume, give the full URLs in the environment (model: OPENAI_BASE_URL, pipeline:\n"
            f"# {URL_ENV}) or on the command line, e.g.\n"
            f"# ragbench run {path} --set 'model.params.base_url=http://user:password@host/v1'\n"
        )
    if any(isinstance(s, dict) and s["params"].get("target") for s in config["strategies"]):
        header += (
            "# the pipeline's module is imported from sys.path, the working directory or this\n"
            f"# folder; `ragbench compare` ran in {Path.cwd()}\n"
        )
    body = yaml.safe_dump(stored, sort_keys=False, allow_unicode=True, width=100)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, header + body)
    written = load_config(path)  # the file reads back into the same run folder
    if run_dir_for(written) != path.parent:
        raise RuntimeError(f"{path}: the written config names another run folder")  # a bug
    cfg = with_origin(cfg, source_dir=written._source_dir, source_file=written._source_file)
    return cfg, path


def warm_up(spec: CompareSpec) -> Warmup | None:
    """The run's model loading in the background from the start of the command (a backend with
    local weights; None for the others): the documents are read, the questions taken, the
    config written and the estimate made meanwhile. Tell it the config once the estimate is
    done (``Warmup.calibrate``): it then calibrates to the run's longest request, as the run
    would, while the command prints the estimate and the run opens its folder."""
    model = validate(spec, spec.out / WORK_FOLDER / "corpus.jsonl").model  # reads no corpus
    return Warmup(model) if Warmup.needed(model) else None


# --------------------------------------------------------------------------- before spending


def estimate(cfg: RunConfig) -> pd.DataFrame:
    """The dry run: records, prompt tokens and dollars (bounds) per strategy variant."""
    return dry_run(cfg, progress=False)


def is_paid(cfg: RunConfig) -> bool:
    """A paid API: a backend that sends its requests to a server (it takes a ``base_url``),
    priced per token. Its calls cost money, so the CLI shows the estimate and asks before
    spending (``--yes`` skips the question). The fake backend sends nothing: its dollars are
    what the sheet would charge, never spent."""
    return sends(cfg.model.backend) and cfg.sheet is not None and cfg.sheet.kind == "api"


# --------------------------------------------------------------------------- the answer


def decide(df: pd.DataFrame, spec: CompareSpec) -> Verdict:
    """``analysis.verdict`` on the run (the first metric, ``spec``'s constraints); its
    conditions say what share of the corpus long context cut (``analysis.conditions``)."""
    seq = df.attrs.get("sequential")  # --until-decided: read at its last look
    design = {"alpha": seq["alpha"], "margin": seq["margin"]} if seq else {}
    return analysis_verdict(
        df,
        metric=METRICS[0],
        min_accuracy=spec.min_accuracy,
        max_dollars_per_1k=spec.max_dollars_per_1k,
        max_latency_s=spec.max_latency_s,
        seed=spec.seed,
        sequential=seq,
        **design,
    )


SUMMARY_COLUMNS = (
    "label",
    METRICS[0],
    "ci_low",
    "ci_high",
    "n",
    "prompt_tokens",
    "dollars",
    "amortised_dollars",
    "latency_seconds",
)


def summary_view(table: pd.DataFrame) -> pd.DataFrame:
    """The summary's columns a terminal has room for (the report and the parquet have all);
    amortised dollars only where a one-time cost makes them differ."""
    columns = [c for c in SUMMARY_COLUMNS if c in table.columns]
    if "amortised_dollars" in columns and table["amortised_dollars"].equals(table["dollars"]):
        columns.remove("amortised_dollars")
    view = table[columns].copy()
    view.attrs = dict(table.attrs)
    return view


# --------------------------------------------------------------------------- the report


def notebook_path() -> Path | None:
    root = repo_root()
    path = root / NOTEBOOK if root is not None else None
    return path if path is not None and path.is_file() else None


def report_blocker(spec: CompareSpec) -> str | None:
    """Why notebook 05 cannot show this run (it would run another one), or None. Its parameters
    carry the strategies, overflow policy and pipelines; it reads one folder."""
    if notebook_path() is None:
        return f"{NOTEBOOK} not found (ragbench is not running from its checkout)"
    if len(spec.docs) != 1:
        return "notebook 05 reads one folder; this run read several"
    if spec.until_decided:
        return "notebook 05 answers every question; --until-decided stops when decided"
    return None


def notebook_parameters(spec: CompareSpec, questions: Path) -> dict[str, object]:
    """Notebook 05's parameters for this run: the notebook builds the same config from them."""
    return {
        "docs": str(Path(spec.docs[0]).resolve()),
        "questions": str(questions),
        "backend": spec.backend,
        "model": spec.model,
        "base_url": spec.base_url,
        "embedder": spec.embedder,
        "tokenizer": spec.tokenizer,
        "max_new_tokens": spec.max_new_tokens,
        "chunk_size": spec.chunk_size,
        "chunk_overlap": spec.chunk_overlap,
        "top_k": spec.top_k,
        "price_sheet": spec.price_sheet,
        "output_dir": str(spec.out),
        "seed": spec.seed,
        "min_accuracy": spec.min_accuracy,
        "max_dollars_per_1k": spec.max_dollars_per_1k,
        "max_latency_s": spec.max_latency_s,
        "strategies": list(spec.strategies),
        "overflow": spec.overflow,
        "pipeline": spec.pipeline,
        "pipeline_url": spec.pipeline_url,
    }


def verdict_first(nb: NotebookNode, weak_model: str | None = None) -> NotebookNode:
    """The notebook with its verdict section (the ``## Verdict`` markdown cell and every cell
    after it up to the next ``## `` heading: the sentence, then its detail) moved up to follow
    the title: a comparison page opens with its verdict. ``weak_model`` (``Verdict.weak_model``)
    is the page's first line, above the title: nothing on it holds for a stronger model."""
    import nbformat  # as write_report: only a report needs it

    lead = [nbformat.v4.new_markdown_cell(f"**{weak_model}**")] if weak_model else []
    cells = list(nb.cells)

    def heading(cell: NotebookNode, text: str = "## ") -> bool:
        return cell.get("cell_type") == "markdown" and "".join(cell.get("source", "")).startswith(
            text
        )

    at = next((i for i, c in enumerate(cells) if heading(c, VERDICT_HEADING)), None)
    if at is None or at + 1 >= len(cells):
        nb.cells = lead + cells
        return nb
    end = next((i for i in range(at + 1, len(cells)) if heading(cells[i])), len(cells))
    section = cells[at:end]
    rest = cells[:at] + cells[end:]
    title = 1 if rest and rest[0].get("cell_type") == "markdown" else 0
    nb.cells = lead + rest[:title] + section + rest[title:]
    return nb


def write_report(
    spec: CompareSpec,
    questions: Path,
    run_dir: Path,
    progress: bool = False,
    weak_model: str | None = None,
) -> Path:
    """Notebook 05 executed with the run's parameters into ``run_dir/report.ipynb`` (its run is
    this run, resumed with nothing pending) and rendered, verdict first and without code, to
    ``run_dir/report.html`` (``weak_model``, the verdict's line, first of all). Raises ValueError
    when the notebook ran another run.

    Its kernel starts in this process's working directory (every path it is given is
    absolute), so a pipeline module found there by the command is found by the notebook too."""
    import nbformat

    notebook = notebook_path()
    if notebook is None:  # report_blocker says so first
        raise ValueError(f"{NOTEBOOK} not found (ragbench is not running from its checkout)")
    executed = run_dir / "report.ipynb"
    nb = execute_notebook(
        notebook,
        executed,
        parameters=notebook_parameters(spec, questions),
        cwd=str(Path.cwd()),
        progress_bar=progress,
    )
    runs = [name for name, _ in executed_runs(nb)]
    if runs != [run_dir.name]:
        raise ValueError(f"notebook 05 ran {', '.join(runs) or 'nothing'}, not {run_dir.name}")
    with tempfile.TemporaryDirectory(prefix="ragbench-report-") as tmp:
        shown = Path(tmp) / Path(NOTEBOOK).name  # the header names notebook 05
        nbformat.write(verdict_first(nb, weak_model), str(shown))
        return render_notebook(
            shown, run_dir / "report.html", include_code=False, run_dir=run_dir.resolve()
        )  # the page names the run folder as ``ragbench render`` does: $RUN_DIR


def report_failure(exc: BaseException, run_dir: Path) -> str:
    """Why ``write_report`` failed, in one line: for an error in a cell (papermill's
    ``PapermillExecutionError``, whose own text starts with a blank line) the cell of
    ``run_dir/report.ipynb`` it stopped in and the error's last line; else the exception's
    type and the last line of its message. Credentials are masked."""
    if hasattr(exc, "ename") and hasattr(exc, "evalue"):
        exec_count = getattr(exc, "exec_count", None)
        count = f" (In [{exec_count}])" if exec_count else ""
        where = f"{run_dir / 'report.ipynb'}: cell {getattr(exc, 'cell_index', '?')}{count}"
        text = f"{where}: {exc.ename}: {_last_line(str(exc.evalue))}"
    else:
        text = f"{type(exc).__name__}: {_last_line(str(exc))}"
    return secrets.redact_text(text.rstrip(": "))


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""
