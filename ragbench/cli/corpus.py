"""`ragbench data docs` and `ragbench data questions`: a corpus from a folder of documents, and
questions generated over a corpus (for the ``corpus`` dataset).

The commands are registered on the ``data`` group by ``ragbench.cli.data``, after its own
(so ``ragbench data --help`` lists them last).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import typer

from ragbench.datasets.corpus import docs
from ragbench.experiment.question_gen import generate as question_gen
from ragbench.io import sigterm_exits, user_errors
from ragbench.secrets import collect

DEFAULT_DIR = Path("data/generated")  # where `ragbench data ...` writes unless told otherwise

# ------------------------------------------------------------------------- data docs (ingest)


def docs_cmd(
    paths: list[Path] = typer.Argument(..., help="Files and folders (read recursively)."),
    out: Path = typer.Option(
        None, help="Output corpus JSONL (default: data/generated/corpus-NAME.jsonl)."
    ),
    include: list[str] = typer.Option(
        [], help="Only files matching this glob, ignoring case, e.g. '*.pdf' (repeatable)."
    ),
    exclude: list[str] = typer.Option(
        [],
        help="Skip files and folders matching this glob, ignoring case, e.g. 'drafts' (repeatable).",
    ),
    threshold: float = typer.Option(0.8, help="MinHash Jaccard threshold for near-duplicates."),
) -> None:
    """Ingest PDF, HTML, Markdown, DOCX and text files into a corpus (one document per file).

    Each document keeps its path (its id), title, format and, for PDFs, where each page starts.
    Text is cleaned, then exact and near-duplicate documents are dropped (the first is kept).
    A file that cannot be read is reported on stderr with the reason and skipped; nothing
    readable at all is an error. Use the corpus with the `corpus` dataset and a questions file.
    Documents are written as they are read (memory: a few times the largest file; a progress
    bar by bytes on a terminal); a link loop or a folder as --out is refused before reading.
    """
    with user_errors():
        docs.refuse_loop(paths[0])  # resolve() below would fail on a link loop with a traceback
        target = out or DEFAULT_DIR / f"corpus-{paths[0].resolve().name or 'docs'}.jsonl"
        if out is not None and out.is_dir():  # before any file is read
            raise ValueError(
                f"--out {out} is a folder: name the corpus file, e.g. {out / 'corpus.jsonl'}"
            )

    def report(item: docs.Skipped) -> None:
        typer.echo(f"skipped {item.path}: {item.reason}", err=True)

    stopped = f"{target} not written (no temporary file left); run the same command again"
    with user_errors(), sigterm_exits(resume=stopped):  # SIGTERM: as `ragbench run` takes it
        # written as it is read (one document in memory at a time), in place when complete
        result = docs.ingest(
            paths,
            target,
            include=include,
            exclude=exclude,
            threshold=threshold,
            progress=None,
            on_skip=report,
        )
    unsupported = [s for s in result.skipped if s.unsupported]
    if unsupported:
        counts = Counter(Path(s.path).suffix.lower() or "(none)" for s in unsupported)
        shown = ", ".join(f"{ext} ({n})" for ext, n in sorted(counts.items()))
        typer.echo(
            f"ignored {len(unsupported)} files of unsupported types: {shown}; "
            f"supported: {', '.join(docs.readers.SUPPORTED)}",
            err=True,
        )
    for drop in result.dedup["dropped"]:
        typer.echo(
            f"dropped {drop['id']}: {drop['reason']} duplicate of {drop['duplicate_of']} "
            f"(Jaccard {drop['jaccard']})",
            err=True,
        )
    links = sum(s.symlink for s in result.skipped)  # each said as it was skipped (report)
    unreadable = len(result.skipped) - len(unsupported) - links
    linked = f"{links} symbolic links skipped, " if links else ""
    typer.echo(
        f"wrote {len(result.ids)} documents to {result.path} ({result.files} files: "
        f"{unreadable} unreadable, {len(unsupported)} unsupported, {linked}"
        f"{len(result.dedup['dropped'])} duplicates)"
    )
    typer.echo(f"fingerprint {result.fingerprint}")


# ------------------------------------------------------------------- data questions (generated)


def questions_cmd(
    corpus: Path = typer.Argument(..., help="Corpus JSONL (what `ragbench data docs` writes)."),
    n: int = typer.Option(20, "--n", help="Questions to keep."),
    out: Path = typer.Option(..., help="Output questions JSONL (for the `corpus` dataset)."),
    model: str = typer.Option("smollm2-135m-instruct", help="Preset, HF id/folder or served name."),
    backend: str = typer.Option("hf", help="hf (local transformers), openai (a server) or fake."),
    base_url: str = typer.Option("", help="OpenAI-compatible server URL (openai backend)."),
    seed: int = typer.Option(0, help="Passage order: same seed, same passages, same file."),
    drop_closed_book: bool = typer.Option(
        False, help="Drop questions the model answers correctly with no context."
    ),
    max_new_tokens: int = typer.Option(
        32, help="The runs' max_new_tokens: the closed-book check asks as they will."
    ),
    passage_tokens: int = typer.Option(128, help="Passage size in whitespace tokens."),
    max_passages: int = typer.Option(
        None, help="Try at most this many passages (default: 5 x --n)."
    ),
    dedup_threshold: float = typer.Option(0.7, help="Question token Jaccard that is a duplicate."),
    batch_size: int = typer.Option(8, help="Requests per LLM call."),
    price_sheet: str = typer.Option(None, help="Shipped sheet name or YAML: adds dollars."),
    cache: bool = typer.Option(True, help="Use the completion cache (reruns cost nothing)."),
    multi_hop: bool = typer.Option(
        False, help="Questions whose answer needs two passages of two documents (hops: 2)."
    ),
) -> None:
    """Ask an LLM for question/answer pairs over sampled passages of a corpus.

    Keeps a pair only when its answer is found in its passage (the span is recorded), drops
    near-duplicate questions and, with --drop-closed-book, questions the model answers without
    the documents. Prints why the rest were rejected and the LLM cost (tokens, seconds; dollars
    with --price-sheet). With --multi-hop each question needs two passages of two documents
    that share a rare word (its two evidence sentences are recorded).
    """
    section = {
        "backend": backend,
        "name": model,
        "params": {"base_url": base_url} if base_url else {},
        "max_new_tokens": max_new_tokens,
        "cache": cache,
    }
    collect(section)  # a key in the URL is masked in every message below
    with user_errors():
        result = question_gen.questions_file(
            corpus,
            out,
            n,
            section,
            seed=seed,
            drop_closed_book=drop_closed_book,
            passage_tokens=passage_tokens,
            max_passages=max_passages,
            dedup_threshold=dedup_threshold,
            batch_size=batch_size,
            price_sheet=price_sheet,
            progress=None,
            hops=2 if multi_hop else 1,
        )
    typer.echo(result.summary())
    typer.echo(f"wrote {len(result.rows)} questions to {out}")
