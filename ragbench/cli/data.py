"""`ragbench data ...`: generate, import and deduplicate datasets as ragbench JSONL, and ingest
folders of documents into a corpus file (``data docs``, for the ``corpus`` dataset). ``data docs``
and ``data questions`` (questions generated over a corpus) are defined in ``cli/corpus.py`` and
registered here.

Every command writes one canonical JSONL file (atomically) under ``data/generated/`` unless
``--out`` says otherwise, then prints where it wrote and the fingerprint (sha256 of the file)
that runs record. Generators and ingest show a tqdm progress bar on a terminal.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import typer

from ragbench.cli.corpus import DEFAULT_DIR, docs_cmd, questions_cmd
from ragbench.datasets import (
    beir,
    build_dataset,
    check_params,
    formats,
    multidoc,
    niah,
)
from ragbench.datasets.corpus.dedup import dedup_file
from ragbench.datasets.corpus.file import corpus_fingerprint
from ragbench.datasets.ruler import presets as ruler_presets
from ragbench.io import cli_error, user_errors
from ragbench.registry import unknown

data_app = typer.Typer(
    help="Generate, import and deduplicate datasets (ragbench JSONL).",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    """Add the `data` sub-command group to the root `ragbench` app."""
    app.add_typer(data_app, name="data")


# ------------------------------------------------------------------------------------- helpers


def _csv(text: str, kind: type = int) -> list[object]:
    try:
        return [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(
            f"expected comma-separated {kind.__name__}s, got {text!r}"
        ) from None


def _positions(text: str) -> list[int | str]:
    return [int(x) if x.strip().lstrip("-").isdigit() else x.strip() for x in text.split(",")]


def _extra(params: list[str]) -> dict[str, object]:
    """``key=value`` pairs; values are JSON when they parse (numbers, lists), else strings."""
    out: dict[str, object] = {}
    for item in params:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"expected key=value, got {item!r}", param_hint="--param")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


# the parameters a generated file is named by, with their short labels (the rest, when not the
# generator's defaults, make a hash suffix: two different files never share a name)
_NAME_PARTS = {
    "context_lengths": "L",
    "depth_percents": "D",
    "depth_intervals": "D",
    "num_docs": "docs",
    "gold_position": "pos",
    "num_examples": "n",
}
_NAMED_DEFAULTS = {
    "haystack": "essays",
    "depth_spacing": "linear",
    "tokenizer": "smollm2-135m-instruct",
    "final_context_length_buffer": 200,
    "words_per_doc": 100,
}


def _default_out(stem: str, params: dict[str, object]) -> Path:
    """``data/generated/niah-L500+900-D0+50+100.jsonl``: named by its main parameters; a short
    hash of the others is appended only when one of them is set (haystack, needle, seed...)."""

    def text(value: object) -> str:
        items = value if isinstance(value, list | tuple) else [value]
        return "+".join(f"{v:g}" if isinstance(v, float) else str(v) for v in items)

    params = dict(params)
    if params.get("depth_percents") is not None:  # the explicit depths win over the interval count
        params.pop("depth_intervals", None)
    shown = [f"{label}{text(params[k])}" for k, label in _NAME_PARTS.items() if k in params]
    rest = {
        k: v
        for k, v in params.items()
        if k not in _NAME_PARTS and v is not None and _NAMED_DEFAULTS.get(k, object()) != v
    }
    name = "-".join([stem, *shown])
    if rest:
        blob = json.dumps(rest, sort_keys=True, default=str).encode()
        name += "-" + hashlib.sha256(blob).hexdigest()[:6]
    return DEFAULT_DIR / f"{name}.jsonl"


def _refuse_folder(out: Path | None) -> None:
    """A folder as --out, refused before anything is generated or read (as `data docs` does)."""
    if out is not None and out.is_dir():
        raise cli_error(
            ValueError(f"--out {out} is a folder: name the file, e.g. {out / 'examples.jsonl'}")
        )


def _write(out: Path, examples: Iterable[Any]) -> None:
    examples = list(examples)
    _refuse_folder(out)
    with user_errors():
        path = formats.write_examples(out, examples)
    typer.echo(f"wrote {len(examples)} examples to {path}")
    typer.echo(f"dataset: {{name: file, params: {{path: {path}}}}}")  # how a config runs it
    typer.echo(f"fingerprint {formats.fingerprint(examples)}")


def _generate(desc: str, it: Iterator[object], total: int, out: Path) -> None:
    from tqdm.auto import tqdm

    _refuse_folder(out)
    with user_errors(KeyError):
        examples = list(tqdm(it, total=total, desc=desc, unit="ex", disable=None))
    _write(out, examples)


# ------------------------------------------------------------------------------------ commands


@data_app.command("niah")
def niah_cmd(
    context_lengths: str = typer.Option("1024,2048,4096", help="Comma-separated token counts."),
    depths: str = typer.Option("", help="Comma-separated depth percents (overrides intervals)."),
    depth_intervals: int = typer.Option(5, help="Number of depths when --depths is not given."),
    depth_spacing: str = typer.Option("linear", help="linear or sigmoid (as the reference)."),
    needle: str = typer.Option(None, help="Needle text (default: Kamradt's San Francisco)."),
    question: str = typer.Option(None, help="Retrieval question."),
    answer: str = typer.Option(None, help="Expected answer (default: derived from the needle)."),
    haystack: str = typer.Option("essays", help="essays, noise, or a folder of .txt/.md."),
    tokenizer: str = typer.Option("smollm2-135m-instruct", help="Tokenizer counting lengths."),
    buffer: int = typer.Option(200, help="final_context_length_buffer: tokens left free."),
    seed: int = typer.Option(None, help="Shuffle the haystack's file order (default: sorted)."),
    out: Path = typer.Option(None, help="Output JSONL (default: data/generated/niah-*.jsonl)."),
) -> None:
    """Kamradt needle-in-a-haystack grid: context lengths x depth percents."""
    params: dict[str, Any] = {
        "context_lengths": _csv(context_lengths),
        "depth_intervals": depth_intervals,
        "depth_spacing": depth_spacing,
        "haystack": haystack,
        "tokenizer": tokenizer,
        "final_context_length_buffer": buffer,
        "seed": seed,
    }
    if depths:
        params["depth_percents"] = _csv(depths, float)
    for key, value in (("needle", needle), ("question", question), ("answer", answer)):
        if value is not None:
            params[key] = value
    with user_errors(KeyError):
        total = niah.count_niah(**params)
    _generate("niah", niah.iter_niah(**params), total, out or _default_out("niah", params))


@data_app.command("ruler")
def ruler_cmd(
    task: str = typer.Argument(
        ...,
        help="A RULER task or preset, with or without ruler/: niah_single, ..., niah_single_1, "
        "..., vt, cwe, fwe, qa_1, qa_2 (`ragbench list datasets`).",
    ),
    context_lengths: str = typer.Option("4096", help="Comma-separated token counts."),
    num_examples: int = typer.Option(10, help="Examples per context length."),
    haystack: str = typer.Option(None, help="NIAH tasks: essays, noise or needles."),
    value_type: str = typer.Option(None, help="NIAH tasks: words, numbers or uuids."),
    key_type: str = typer.Option(None, help="NIAH tasks: words, numbers or uuids."),
    path: Path = typer.Option(None, help="qa tasks: the SQuAD / HotpotQA JSON to build from."),
    tokenizer: str = typer.Option("smollm2-135m-instruct", help="Tokenizer counting lengths."),
    buffer: int = typer.Option(200, help="final_context_length_buffer: tokens left free."),
    seed: int = typer.Option(42),
    param: list[str] = typer.Option([], help="Extra task parameter key=value (repeatable)."),
    out: Path = typer.Option(None, help="Output JSONL (default: data/generated/ruler-*.jsonl)."),
) -> None:
    """A RULER task or one of RULER's 13 named configurations, sized to each context length.

    Options left unset keep the task's (or the preset's) own values."""
    with user_errors(KeyError):
        name = ruler_presets.dataset_name(task)
    lengths = _csv(context_lengths)
    params: dict[str, object] = {
        "context_lengths": lengths,
        "num_examples": num_examples,
        "tokenizer": tokenizer,
        "final_context_length_buffer": buffer,
        "seed": seed,
    }
    given = {"haystack": haystack, "value_type": value_type, "key_type": key_type, "path": path}
    params |= {k: str(v) if k == "path" else v for k, v in given.items() if v is not None}
    params |= _extra(param)
    with user_errors():
        check_params(name, params)
    it = ruler_presets.iter_examples(name, **params)
    short = name.removeprefix("ruler/")
    _generate(short, it, len(lengths) * num_examples, out or _default_out(f"ruler-{short}", params))


@data_app.command("multidoc")
def multidoc_cmd(
    num_docs: int = typer.Option(10, help="Documents per example."),
    gold_positions: str = typer.Option("start,middle,end", help="Indices or start/middle/end."),
    num_examples: int = typer.Option(10, help="Questions (each asked at every gold position)."),
    words_per_doc: int = typer.Option(100, help="Approximate words per passage."),
    haystack: str = typer.Option("essays", help="essays or a folder of .txt/.md."),
    tokenizer: str = typer.Option("smollm2-135m-instruct", help="Tokenizer for context_tokens."),
    seed: int = typer.Option(0),
    out: Path = typer.Option(None, help="Output JSONL (default: data/generated/multidoc-*.jsonl)."),
) -> None:
    """Multi-document QA in the lost-in-the-middle layout."""
    params: dict[str, Any] = {
        "num_docs": num_docs,
        "gold_position": _positions(gold_positions),
        "num_examples": num_examples,
        "words_per_doc": words_per_doc,
        "haystack": haystack,
        "tokenizer": tokenizer,
        "seed": seed,
    }
    with user_errors(KeyError):
        total = multidoc.count_multidoc(**params)
    it = multidoc.iter_multidoc(**params)
    _generate("multidoc", it, total, out or _default_out("multidoc", params))


@data_app.command("import")
def import_cmd(
    fmt: str = typer.Argument(
        ...,
        metavar="FORMAT",
        help="longbench, longbench-v2, ruler, squad, beir, flashrag, hf or jsonl.",
    ),
    path: Path = typer.Argument(..., help="File (or BEIR / Hugging Face folder) to import."),
    split: str = typer.Option(
        None,
        help="BEIR qrels split (default: test, else dev, else train); hf: the DatasetDict split.",
    ),
    corpus: Path = typer.Option(
        None, help="flashrag: the corpus JSONL; hf: a shared corpus (instead of --context)."
    ),
    question: str = typer.Option(None, help="hf: the question column."),
    answers: str = typer.Option(None, help="hf: the answers column (dotted: answers.text)."),
    context: str = typer.Option(None, help="hf: each row's context column."),
    param: list[str] = typer.Option(
        [], help="hf: another mapping key=value (id_column, title_column, corpus_text, ...)."
    ),
    unanswerable: str = typer.Option(
        None, help="SQuAD 2.0 unanswerable questions: keep (declining scores 1) or drop."
    ),
    out: Path = typer.Option(
        None,
        help="Output JSONL (default: data/generated/FORMAT-NAME.jsonl; beir: the questions "
        "file, data/generated/beir-NAME.questions.jsonl, its corpus beside it).",
    ),
) -> None:
    """Convert a LongBench / RULER / SQuAD / BEIR dataset to ragbench JSONL.

    BEIR is written as a shared corpus (a corpus file and a questions file, for the `corpus`
    dataset) so the corpus is stored once; score it with the `retrieve_only` strategy. So are
    FlashRAG and a Hugging Face dataset mapped to a --corpus."""
    _refuse_folder(out)
    if fmt in _DATASET_IMPORTERS:  # the importers that are datasets too (same name in configs)
        given = {"split": split, "corpus": corpus, "question": question, "answers": answers}
        given |= {"context": context, "unanswerable": unanswerable, "param": param}
        _import_dataset(fmt, path, out, given)
        return
    if fmt not in formats.IMPORTERS:
        raise cli_error(unknown("dataset format", fmt, formats.IMPORTERS))
    options: dict[str, Any] = {}
    for name, value, owner in (("split", split, "beir"), ("unanswerable", unanswerable, "squad")):
        if value is not None:
            if fmt != owner:
                raise cli_error(ValueError(f"--{name} applies to the {owner} format only"))
            options[name] = value
    with user_errors():  # InputFileError names file:line:field; no examples is one too
        examples = formats.load(fmt, path, **options)
    if fmt == "beir":
        _write_shared(out or DEFAULT_DIR / f"beir-{path.name}.questions.jsonl", examples)
    else:
        _write(out or DEFAULT_DIR / f"{fmt}-{path.stem}.jsonl", examples)


# importers registered as datasets (``ragbench.datasets.DATASETS``), the options each takes
_DATASET_IMPORTERS = {
    "longbench-v2": (),
    "flashrag": ("corpus",),
    "hf": ("split", "corpus", "question", "answers", "context", "param"),
}


def _import_dataset(fmt: str, path: Path, out: Path | None, given: dict[str, Any]) -> None:
    """``data import`` for an importer that is a dataset: its options are the dataset's
    parameters (``--param`` adds any other), so the file written is what a config would load.
    Questions over a shared corpus are written as a corpus file plus a questions file."""
    takes = _DATASET_IMPORTERS[fmt]
    for name, value in given.items():
        if value not in (None, []) and name not in takes:
            what = ", ".join(f"--{t}" for t in takes) or "no options"
            raise cli_error(ValueError(f"--{name} does not apply to {fmt} (it takes {what})"))
    params: dict[str, Any] = {"path": str(path)}
    params |= {k: str(v) if isinstance(v, Path) else v for k, v in given.items() if v}
    params |= _extra(params.pop("param", []))
    try:
        check_params(fmt, params)
    except ValueError as exc:  # the dataset's parameter names, as this command's options
        raise cli_error(ValueError(_as_options(str(exc), takes))) from None
    with user_errors(TypeError):
        examples = build_dataset(fmt, **params)
    if examples[0].meta.get("corpus_fingerprint"):  # over one shared corpus: stored once
        _write_shared(out or DEFAULT_DIR / f"{fmt}-{path.stem}.questions.jsonl", examples, "")
    else:
        _write(out or DEFAULT_DIR / f"{fmt}-{path.stem}.jsonl", examples)


def _as_options(message: str, options: tuple[str, ...]) -> str:
    """``missing a required argument: 'corpus'`` -> ``... 'corpus' (--corpus)``."""
    for name in options:
        message = message.replace(f"'{name}'", f"'{name}' (--{name})")
    return message


def _write_shared(
    questions: Path, examples: list[Any], hint: str = "  # with strategies: [retrieve_only]"
) -> None:
    """A corpus file beside the questions file (``NAME.questions.jsonl`` -> ``NAME.corpus.jsonl``)."""
    stem = questions.name.removesuffix(".jsonl").removesuffix(".questions")
    corpus = questions.with_name(f"{stem}.corpus.jsonl")
    with user_errors():
        corpus, questions = beir.write_shared(examples, corpus, questions)
    n_docs = len(examples[0].documents)
    typer.echo(f"wrote {n_docs} documents to {corpus} and {len(examples)} questions to {questions}")
    typer.echo(f"fingerprint {corpus_fingerprint(examples[0].documents)} (corpus)")
    typer.echo(
        f"dataset: {{name: corpus, params: {{corpus: {corpus}, questions: {questions}}}}}{hint}"
    )


@data_app.command("dedup")
def dedup_cmd(
    path: Path = typer.Argument(..., help="ragbench JSONL to clean and deduplicate."),
    threshold: float = typer.Option(0.8, help="MinHash LSH Jaccard threshold for near-duplicates."),
    num_perm: int = typer.Option(128, help="MinHash permutations."),
    seed: int = typer.Option(1, help="MinHash seed."),
    out: Path = typer.Option(None, help="Output JSONL (default: data/generated/NAME.dedup.jsonl)."),
) -> None:
    """Clean text, drop exact and near-duplicate examples (MinHash LSH).

    A record repeated verbatim (same id, same content) is dropped and counted; two records with
    the same id and different content are an error naming both lines. A warning (on stderr) says
    when near-duplicates are a large share of the file: generated sweeps are near-duplicates by
    construction, so check the threshold before using the result.
    """
    target = out or DEFAULT_DIR / f"{path.stem}.dedup.jsonl"
    with user_errors():
        stats = dedup_file(path, target, threshold=threshold, num_perm=num_perm, seed=seed)
    shown = {k: v for k, v in stats.items() if not isinstance(v, list | dict)}
    for key, value in shown.items():
        typer.echo(f"{key}: {value}")
    typer.echo(
        f"kept {stats['n_kept']} of {stats['n_in']} records: dropped "
        f"{stats['repeated_records']} repeated, {stats['exact_duplicates']} exact and "
        f"{stats['near_duplicates']} near duplicates"
    )
    typer.echo(f"wrote {target}")
    typer.echo(f"fingerprint {stats.get('fingerprint_out')}")


# `data docs` and `data questions` are in cli/corpus.py; registered last, as they were listed
data_app.command("docs")(docs_cmd)
data_app.command("questions")(questions_cmd)
