"""``ragbench compare DOCS... [--questions FILE]``: a folder of documents to the verdict in one
command, no YAML to write (it writes the one it used). The steps are ``ragbench.workspace.compare``'s."""

from __future__ import annotations

import warnings
from pathlib import Path

import typer

from ragbench.analysis.verdict import sequential_look
from ragbench.cli.run import RESUME, echo_estimate, failed_line, log_to_mlflow
from ragbench.experiment.budget import BUDGET_EXIT
from ragbench.experiment.preflight import OverWindowError
from ragbench.experiment.runner import run
from ragbench.io import ALL_FAILED_EXIT, cli_error, sigterm_exits, user_errors
from ragbench.locks import LockHeldError
from ragbench.report import summary
from ragbench.report.readable import readable_text
from ragbench.report.tables import table_remarks
from ragbench.secrets import collect
from ragbench.workspace import compare as steps
from ragbench.workspace import tracking
from ragbench.workspace.kernels import reap_children_on_signals

_D = steps.CompareSpec  # the defaults: notebook 05's


def register(app: typer.Typer) -> None:
    """Adds ``ragbench compare`` to the root typer app."""

    @app.command("compare")
    def compare_command(
        docs: list[Path] = typer.Argument(
            ..., help="Folders and files: PDF, HTML, Markdown, DOCX, text."
        ),
        questions: Path = typer.Option(
            None, help="Questions CSV or JSONL (docs/your-documents.md); none: generate them."
        ),
        n_questions: int = typer.Option(
            _D.n_questions, min=1, help="Questions to generate (no --questions)."
        ),
        backend: str = typer.Option(
            _D.backend,
            help="hf (local, the embedded model) | openai (a server) | fake (offline tests).",
        ),
        model: str = typer.Option(
            _D.model, help="Preset, HF id/folder/.gguf, or the served model's name."
        ),
        base_url: str = typer.Option(
            _D.base_url,
            help="OpenAI-compatible server URL (openai backend); key from OPENAI_API_KEY.",
        ),
        price_sheet: str = typer.Option(
            None,
            help=f"Shipped sheet name (`ragbench prices list`) or YAML path; default: with --backend openai, the shipped sheet of --model (none: an error), else {_D.price_sheet}.",
        ),
        max_dollars: float = typer.Option(
            None,
            help=f"Stop before the run's spend passes this many dollars (max_dollars; exit {BUDGET_EXIT}; rerun with a higher one to resume).",
        ),
        strategy: list[str] = typer.Option(
            list(_D.strategies), help="Strategies to compare (repeatable)."
        ),
        pipeline: str = typer.Option(
            _D.pipeline,
            help="Your system beside them, 'module:attr': a function, a llama-index query engine or retriever, or a factory of one.",
        ),
        pipeline_url: str = typer.Option(
            _D.pipeline_url,
            help="Your system as an HTTP service: POST {question, id, corpus} -> answer JSON (docs/pipeline.md).",
        ),
        overflow: str = typer.Option(
            _D.overflow,
            help="Long context over the window: truncate_middle | truncate_head | truncate_tail | error.",
        ),
        min_accuracy: float = typer.Option(
            _D.min_accuracy, help="Verdict: lowest acceptable mean `contains`, 0-1 (0: any)."
        ),
        max_dollars_per_1k: float = typer.Option(
            _D.max_dollars_per_1k, help="Verdict: most $ per 1,000 queries (0: no limit)."
        ),
        max_latency_s: float = typer.Option(
            _D.max_latency_s, help="Verdict: longest mean wait per query, s (0: no limit)."
        ),
        embedder: str = typer.Option(
            _D.embedder, help="RAG embedder: minilm (embedded) | hash (no model, tests)."
        ),
        top_k: int = typer.Option(_D.top_k, min=1, help="Chunks RAG and Self-Route read."),
        chunk_size: int = typer.Option(_D.chunk_size, min=1, help="RAG chunk size in tokens."),
        chunk_overlap: int = typer.Option(
            _D.chunk_overlap,
            min=-1,
            help="Tokens neighbouring chunks share (< chunk size); -1: 16, at most a quarter of the chunk size.",
        ),
        max_new_tokens: int = typer.Option(
            _D.max_new_tokens, min=1, help="Answer length cap (SmolLM2: keep >= 32)."
        ),
        tokenizer: str = typer.Option(
            _D.tokenizer, help="Chunk token counter; empty: the model's."
        ),
        output_dir: str = typer.Option(
            _D.output_dir, help="Where the corpus and the run folder go."
        ),
        seed: int = typer.Option(_D.seed, help="Question sampling and bootstraps."),
        threads: int = typer.Option(None, min=1, help="Torch CPU threads (1-2 on a busy machine)."),
        yes: bool = typer.Option(False, "--yes", "-y", help="Spend without asking (paid APIs)."),
        report: bool = typer.Option(True, help="Write report.html (notebook 05) beside the run."),
        quiet: bool = typer.Option(False, help="No progress bars."),
        mlflow: bool = typer.Option(
            False,
            "--mlflow",
            help="Log the run (and report.html) to MLflow; default store ./mlruns.",
        ),
        mlflow_uri: str = typer.Option(
            None, metavar="URI", help="MLflow tracking URI or folder (implies --mlflow)."
        ),
        mlflow_experiment: str = typer.Option(
            None, help="MLflow experiment (implies --mlflow; default: ragbench)."
        ),
        until_decided: bool = typer.Option(
            False,
            "--until-decided",
            help="Questions in a seeded order, in rounds, until a group-sequential test decides (no report: notebook 05 answers every question).",
        ),
    ) -> None:
        """Closed book, long context, RAG and Self-Route on your documents (and your own pipeline
        beside them): the verdict.

        Checks --pipeline / --pipeline-url first (its module imports and its factory builds, the
        endpoint answers), ingests DOCS into one corpus, takes --questions (or generates them),
        writes the run config (compare.yaml in the run folder: edit it and `ragbench run` it),
        prints the dry-run estimate (tokens, dollars) before spending (a paid API asks unless
        --yes), runs, prints the verdict and the summary table, and writes report.html beside
        the run."""
        with user_errors():  # a paid API without a sheet of its own: one line, exit 2
            sheet, why = steps.price_sheet_for(backend, model, price_sheet)
        spec = steps.CompareSpec(
            docs=tuple(str(d) for d in docs),
            questions=str(questions or ""),
            n_questions=n_questions,
            backend=backend,
            model=model,
            base_url=base_url,
            embedder=embedder,
            tokenizer=tokenizer,
            max_new_tokens=max_new_tokens,
            chunk_size=chunk_size,
            chunk_overlap=chunk_overlap,
            top_k=top_k,
            price_sheet=sheet,
            max_dollars=max_dollars,
            strategies=tuple(strategy),
            overflow=overflow,
            min_accuracy=min_accuracy,
            max_dollars_per_1k=max_dollars_per_1k,
            max_latency_s=max_latency_s,
            output_dir=output_dir,
            seed=seed,
            threads=threads,
            pipeline=pipeline,
            pipeline_url=pipeline_url,
            until_decided=until_decided,
        )
        collect({"base_url": base_url, "pipeline_url": pipeline_url})  # masked in every line below
        tracked = tracking.settings(None, mlflow, mlflow_uri, mlflow_experiment)
        with user_errors(tracking.TrackingError):  # a bad option, target or endpoint, no MLflow:
            if tracked is not None:  # before any document is read
                tracking.check(tracked)
            pipelines = steps.check_pipelines(spec)
            for point in pipelines:
                typer.echo(f"pipeline: {point.label()}")
            steps.precheck(spec)
            steps.build_pipelines(pipelines)  # a factory builds its engine: before the ingest
        if why:
            typer.echo(why)
        # SIGTERM unwinds as in `ragbench run`: the run's manifest says interrupted, no lock
        # owner or temporary file is left, exit 143; the same command resumes
        with sigterm_exits(resume=RESUME):
            _compare(spec, tracked, yes=yes, progress=not quiet, report=report)


def _compare(spec: steps.CompareSpec, tracked, yes: bool, progress: bool, report: bool) -> None:
    """The run, its verdict, the report and MLflow, once the options have checked out."""
    with user_errors(LockHeldError, OverWindowError):
        df, spec_run = _run(spec, yes=yes, progress=progress)
    weak = _answer(spec, df, spec_run)
    stopped = df.attrs.get("stopped")  # at --max-dollars (the runner logged its line)
    if report and stopped:  # notebook 05 would answer the rest, past the cap
        typer.echo(
            "report: not written: the run stopped at --max-dollars; rerun with a higher one, "
            "or `ragbench run` its config, then compare again"
        )
    elif report:
        _report(spec, spec_run, progress=progress, weak_model=weak)
    if tracked is not None:  # after the report: report.html is one of its artifacts
        log_to_mlflow(df.attrs["run_dir"], tracked)
    if stopped or df.attrs.get("over_budget"):  # stopped at, or passed, max_dollars
        raise typer.Exit(code=BUDGET_EXIT)


def _run(spec: steps.CompareSpec, yes: bool, progress: bool):
    """Ingest, questions, config, estimate, confirmation, run: (results, (yaml, questions)). The
    model loads meanwhile, and calibrates once the estimate is done (``steps.warm_up``)."""
    warmup = steps.warm_up(spec)
    ingested, corpus = steps.ingest(
        spec, on_skip=lambda s: typer.echo(f"skipped {s.path}: {s.reason}", err=True)
    )
    typer.echo(
        f"corpus: {len(ingested.documents)} documents from {ingested.files} files -> {corpus}"
    )
    for drop in ingested.dedup["dropped"]:
        typer.echo(
            f"dropped {drop['id']}: {drop['reason']} duplicate of {drop['duplicate_of']}", err=True
        )
    cfg = steps.validate(spec, corpus)  # every option checked before anything is spent
    if not spec.questions and steps.is_paid(cfg) and not yes:
        typer.confirm(
            f"Generate {spec.n_questions} questions with {spec.model} (a paid API)?", abort=True
        )
    questions, generated = steps.questions_path(spec, corpus, ingested.fingerprint, warmup)
    if generated is not None:
        typer.echo(generated.summary())
    typer.echo(f"questions: {questions}")
    cfg, yaml_path = steps.write_config(steps.build_config(spec, corpus, questions))
    typer.echo(f"config: {yaml_path} (edit it, then `ragbench run {yaml_path}`)")
    table = steps.estimate(cfg)
    if warmup is not None:  # the estimate embedded and retrieved: the device is the model's now
        warmup.calibrate(cfg)
    typer.echo("estimate (dry run: nothing generated yet):")
    echo_estimate(table)
    if table.attrs.get("over_budget"):  # the bound is over the cap: the run stops at it
        typer.echo(f"warning: {table.attrs['over_budget']}; the run stops before passing it")
    if steps.is_paid(cfg) and not yes:
        typer.confirm(f"{cfg.model.name} is a paid API ({cfg.price_sheet}): run it?", abort=True)
    # the config itself, not the file: the file's URLs have their credentials masked
    llm = warmup.llm() if warmup is not None else None  # loaded (and calibrated) by now
    df = run(cfg, progress=progress, until_decided=sequential_look, llm=llm)
    if df.attrs.get("sequential"):
        typer.echo(df.attrs["sequential"]["line"])
    return df, (yaml_path, questions)


def _answer(spec: steps.CompareSpec, df, spec_run) -> str | None:
    """The verdict, then the summary table (accuracy with its 95% CI, $ per 1k queries); returns
    the verdict's weak-model line (the report's first line), if any."""
    typer.echo(f"run folder: {df.attrs['run_dir']}")
    if df.attrs.get("stopped") and not len(df):  # at --max-dollars before any record
        return None
    if df.attrs.get("failed"):  # every record failed: one line, the most common error
        raise cli_error(ValueError(failed_line(df)), code=ALL_FAILED_EXIT)
    failed = int(df["error"].notna().sum())
    with user_errors():
        v = steps.decide(df, spec)
    typer.echo(f"verdict: {v.text}")
    if v.conditions_text:
        typer.echo(v.conditions_text)
    with warnings.catch_warnings():  # printed below, as lines
        warnings.simplefilter("ignore", UserWarning)
        table = summary(df, metric=steps.METRICS[0], seed=spec.seed)
    typer.echo(readable_text(steps.summary_view(table)))
    for remark in table_remarks(table):
        typer.echo(remark)
    if failed:
        typer.echo(f"{failed} of {len(df)} records failed (rerun to retry them)")
    typer.echo(f"rerun or edit: ragbench run {spec_run[0]}")
    return v.weak_model


def _report(
    spec: steps.CompareSpec, spec_run, progress: bool, weak_model: str | None = None
) -> None:
    yaml_path, questions = spec_run
    blocker = steps.report_blocker(spec)
    if blocker:
        typer.echo(f"report: not written: {blocker}")
        return
    try:
        with reap_children_on_signals():  # stopped: notebook 05's kernel ends with the command
            html = steps.write_report(spec, questions, yaml_path.parent, progress, weak_model)
    except Exception as exc:  # the run is done and printed: say why the page is missing
        why = steps.report_failure(exc, yaml_path.parent)
        raise cli_error(ValueError(f"report not written: {why}"), code=1) from None
    typer.echo(f"report: {html}")
