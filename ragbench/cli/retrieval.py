"""`ragbench index build` and `ragbench retrieve`: build a chunk index from a dataset, query it.

An index folder holds ``chunks.jsonl`` (one ``Chunk`` per line), the FAISS files written by
``FaissIndex.save`` (``index.faiss``, ``ids.npy``, ``index.json``: row i is chunk i) and
``build.json`` (the dataset's sha256 and the chunking and embedder parameters), so
``retrieve`` rebuilds the same embedder and BM25 over the same chunks. Heavy libraries (torch,
faiss) load only when a command embeds or searches. User errors (a missing or malformed file, an unknown name, a folder that is
not an index) print one ``error: ...`` line and exit 2; anything else keeps its traceback.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import typer

from ragbench.datasets.corpus.file import read_documents
from ragbench.datasets.formats import read_examples
from ragbench.experiment.config.sections import ModelConfig, RetrievalConfig
from ragbench.io import (
    InputFileError,
    atomic_write_text,
    iter_jsonl,
    read_text,
    require_file,
    sha256_file,
    user_errors,
    write_jsonl,
)
from ragbench.registry import unknown
from ragbench.retrieval import SPLITTERS, build_index, build_retriever
from ragbench.retrieval.embedders.base import get_embedder
from ragbench.retrieval.faiss_index import FaissIndex
from ragbench.retrieval.retrievers import DenseRetriever
from ragbench.types import Chunk

CHUNKS_FILE, BUILD_FILE = "chunks.jsonl", "build.json"
CLI_RETRIEVERS = ("dense", "bm25", "hybrid")  # the RETRIEVERS that need no cross-encoder


def corpus_documents(examples) -> list:
    """The documents of all examples, each id once. A document id that reappears with another
    text (NIAH examples share a haystack id but differ by the needle) is renamed
    ``"{example_id}/{doc_id}"`` so every text is indexed."""
    from dataclasses import replace

    seen: dict[str, str] = {}
    out = []
    for ex in examples:
        for doc in ex.documents:
            if doc.id in seen and seen[doc.id] == doc.text:
                continue
            if doc.id in seen:
                doc = replace(doc, id=f"{ex.id}/{doc.id}")
            seen[doc.id] = doc.text
            out.append(doc)
    return out


def is_corpus(path: Path) -> bool:
    """Whether ``path`` is a corpus file (a document a line, as ``ragbench data docs`` and the
    importers' ``--corpus`` write) rather than a dataset (an example a line): its first
    non-blank line has a ``text`` and no ``question``. A malformed file is left to the dataset
    reader, which names its line."""
    require_file(Path(path))  # a folder or a missing file: the readers' one-line errors
    with open(path, encoding="utf-8-sig", errors="replace") as f:
        for line in f:
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    return False
                return isinstance(row, dict) and "text" in row and "question" not in row
    return False


@dataclass(frozen=True)
class IndexSettings:
    """How ``index build`` chunks and embeds, as ``build.json`` records it."""

    chunker: str  # a SPLITTERS name
    chunk_size: int  # tokens of ``tokenizer``
    chunk_overlap: int
    tokenizer: str
    embedder: str  # an EMBEDDERS name or a model folder
    factory: str  # the FAISS factory string


def write_index(dataset: Path, out: Path, settings: IndexSettings) -> dict:
    """Chunk, embed and index the documents of a ragbench JSONL dataset, or of a corpus file,
    into ``out`` (``build_index`` with a dense retriever, saved)."""
    if settings.chunker not in SPLITTERS:  # checked before the (slow) chunking and embedding
        raise unknown("chunker", settings.chunker, SPLITTERS)
    emb = get_embedder(settings.embedder)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"{out}: is a file, not an index folder")
    documents = (
        read_documents(dataset) if is_corpus(dataset) else corpus_documents(read_examples(dataset))
    )
    if not documents:
        raise ValueError(f"{dataset}: no documents to index")
    chunks, dense = build_index(
        documents,
        retriever="dense",
        embedder=emb,
        splitter=settings.chunker,
        chunk_size=settings.chunk_size,
        chunk_overlap=settings.chunk_overlap,
        tokenizer=settings.tokenizer,
        retriever_params={"factory": settings.factory},
    )
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / CHUNKS_FILE, chunks)
    assert isinstance(dense, DenseRetriever)  # retriever="dense" above
    dense.index.save(out)
    build = {
        "dataset": str(dataset),
        "dataset_sha256": sha256_file(dataset),
        "documents": len(documents),
        "chunks": len(chunks),
        **asdict(settings),
        "embedder_identity": emb.identity(),
    }
    atomic_write_text(out / BUILD_FILE, json.dumps(build, indent=2, sort_keys=True) + "\n")
    return build


def load_retriever(index_dir: Path, retriever: str):
    """A retriever over a saved index folder (dense and hybrid reuse the saved FAISS index)."""
    if retriever not in CLI_RETRIEVERS:
        raise unknown("retriever", retriever, CLI_RETRIEVERS)
    build_path = index_dir / BUILD_FILE
    if not build_path.is_file():
        raise FileNotFoundError(
            f"{index_dir}: not an index folder, no {BUILD_FILE} (run `ragbench index build`)"
        )
    try:
        build = json.loads(read_text(build_path))
    except json.JSONDecodeError as exc:
        raise InputFileError(build_path, exc.lineno, f"invalid JSON ({exc.msg})") from None
    if not isinstance(build, dict) or not isinstance(build.get("embedder"), str):
        raise InputFileError(build_path, None, "missing (expected a string)", field="embedder")
    chunks = []
    for line, row in iter_jsonl(index_dir / CHUNKS_FILE):
        try:
            chunks.append(Chunk.from_dict(row))
        except (TypeError, ValueError) as exc:
            raise InputFileError(index_dir / CHUNKS_FILE, line, f"not a chunk: {exc}") from None
    if retriever == "bm25":
        return build_retriever("bm25", chunks)
    emb = get_embedder(build["embedder"])
    index = FaissIndex.load(index_dir, expect_dim=emb.dim, expect_embedder=emb.identity())
    return build_retriever(retriever, chunks, embedder=emb, index=index)


def register(app: typer.Typer) -> None:
    # one source per default: a default run config's retrieval settings
    default = {name: field.default for name, field in RetrievalConfig.model_fields.items()}
    # the tokenizer a default run config chunks with: the default model's
    default_tokenizer = default["tokenizer"] or ModelConfig.model_fields["name"].default
    index_app = typer.Typer(help="Build retrieval indexes.", no_args_is_help=True)
    app.add_typer(index_app, name="index")

    @index_app.command("build")
    def index_build(
        dataset: Path = typer.Argument(
            ...,
            help="ragbench JSONL dataset whose documents to index, or a corpus file (`ragbench data docs`, an "
            "importer's --corpus)",
        ),
        out: Path = typer.Option(..., "--out", help="index folder to write"),
        chunker: str = typer.Option(default["splitter"], help=" | ".join(SPLITTERS)),
        chunk_size: int = typer.Option(
            default["chunk_size"], help="chunk size in tokens of --tokenizer"
        ),
        chunk_overlap: int = typer.Option(default["chunk_overlap"], help="overlap in tokens"),
        tokenizer: str = typer.Option(default_tokenizer, help="tokenizer for sizes"),
        embedder: str = typer.Option(default["embedder"], help="minilm | hash | model folder"),
        factory: str = typer.Option("Flat", help="FAISS factory string, e.g. Flat, HNSW32"),
    ) -> None:
        """Chunk, embed and index a dataset's documents, or a corpus file's."""
        with user_errors():
            settings = IndexSettings(
                chunker, chunk_size, chunk_overlap, tokenizer, embedder, factory
            )
            build = write_index(dataset, out, settings)
        typer.echo(
            f"indexed {build['documents']} documents as {build['chunks']} chunks "
            f"({build['embedder']}, {build['factory']}) -> {out}"
        )

    @app.command("retrieve")
    def retrieve(
        index_dir: Path = typer.Argument(..., help="folder written by `ragbench index build`"),
        query: str = typer.Argument(..., help="the query"),
        k: int = typer.Option(5, "-k", "--k", help="number of chunks"),
        retriever: str = typer.Option(default["retriever"], help=" | ".join(CLI_RETRIEVERS)),
        width: int = typer.Option(160, help="characters of chunk text to show"),
    ) -> None:
        """Print the top-k chunks of an index for a query."""
        with user_errors():
            hits = load_retriever(index_dir, retriever).retrieve([query], k)[0]
        for rank, hit in enumerate(hits, start=1):
            text = " ".join(hit.chunk.text.split())
            text = text if len(text) <= width else text[: width - 3] + "..."
            typer.echo(f"{rank:>3}  {hit.score:9.4f}  {hit.chunk.id}  {text}")
