"""`ragbench index build` / `ragbench retrieve`: user errors are one `error:` line, exit 2."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from ragbench.cli import retrieval as cli
from ragbench.datasets.formats import write_examples
from ragbench.io import USER_ERROR_EXIT
from ragbench.types import Document, Example

FAST = [
    "--tokenizer",
    "whitespace",
    "--embedder",
    "hash",
    "--chunk-size",
    "64",
    "--chunk-overlap",
    "4",
]
TEXTS = {
    "lisbon": "The magic number for Lisbon is 7463343. Lisbon lies on the Tagus river.",
    "oslo": "The magic number for Oslo is 1200450. Oslo lies at the head of a fjord.",
}


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    app = typer.Typer()
    cli.register(app)
    return app


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    docs = tuple(Document(name, text) for name, text in TEXTS.items())
    examples = [Example(f"q-{name}", f"Magic number for {name}?", ("x",), docs) for name in TEXTS]
    return write_examples(tmp_path_factory.mktemp("data") / "data.jsonl", examples)


@pytest.fixture(scope="module")
def built(app, dataset, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("built") / "index"
    result = CliRunner().invoke(app, ["index", "build", str(dataset), "--out", str(out), *FAST])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture()
def index(built, tmp_path) -> Path:
    """A private copy of the built index, free to damage."""
    return Path(shutil.copytree(built, tmp_path / "index"))


def invoke(app, *args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


def one_line_error(result, *names: str) -> str:
    """The result is a handled user error: exit 2, one stderr line `error: ...` naming `names`."""
    assert isinstance(result.exception, SystemExit), result.exception  # not an uncaught error
    assert result.exit_code == USER_ERROR_EXIT == 2, result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


def test_build_and_retrieve_still_work(app, built):
    result = invoke(
        app, "retrieve", built, "magic number for Lisbon", "-k", "1", "--retriever", "bm25"
    )
    assert result.exit_code == 0, result.output
    assert "7463343" in result.output and result.stderr == ""


# ------------------------------------------------------------------------------- index build


def test_build_takes_a_corpus_file_as_data_docs_writes_it(app, built, tmp_path):
    """A user's corpus (a document a line) indexes as the dataset with the same documents does,
    chunk for chunk; a malformed corpus line is named like a dataset's."""
    import json

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": k, "text": v}) + "\n" for k, v in TEXTS.items()))
    out = tmp_path / "index"
    result = invoke(app, "index", "build", corpus, "--out", out, *FAST)
    assert result.exit_code == 0, result.output
    assert "indexed 2 documents" in result.stdout
    assert (out / cli.CHUNKS_FILE).read_text() == (built / cli.CHUNKS_FILE).read_text()
    hits = invoke(app, "retrieve", out, "fjord", "-k", "1")
    assert hits.exit_code == 0 and "oslo#0" in hits.stdout
    corpus.write_text('{"id": "a", "text": "x"}\n{"id": "b"}\n')
    one_line_error(invoke(app, "index", "build", corpus, "--out", out, *FAST), "corpus.jsonl:2")


def test_build_missing_dataset(app, tmp_path):
    missing = tmp_path / "nope.jsonl"
    one_line_error(
        invoke(app, "index", "build", missing, "--out", tmp_path / "i", *FAST), str(missing)
    )
    assert not (tmp_path / "i").exists()


def test_build_dataset_is_a_folder(app, tmp_path):
    result = invoke(app, "index", "build", tmp_path, "--out", tmp_path / "i", *FAST)
    one_line_error(result, f"{tmp_path}: is a folder; expected a file")


def test_build_malformed_jsonl(app, dataset, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(dataset.read_text().splitlines()[0] + "\n{not json\n")
    line = one_line_error(invoke(app, "index", "build", bad, "--out", tmp_path / "i", *FAST))
    assert f"{bad}:2: invalid JSON" in line


def test_build_bad_field_names_file_line_and_field(app, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "question": "q", "answers": "x", "documents": []}\n')
    line = one_line_error(invoke(app, "index", "build", bad, "--out", tmp_path / "i", *FAST))
    assert f"{bad}:1: field 'answers':" in line


@pytest.mark.parametrize(
    ("option", "value", "expect"),
    [
        ("--embedder", "hsh", ["unknown embedder 'hsh'", "did you mean 'hash'"]),
        ("--chunker", "sentense", ["unknown chunker 'sentense'", "did you mean 'sentence'"]),
        ("--tokenizer", "whitespac", ["unknown tokenizer 'whitespac'", "whitespace"]),
        ("--factory", "Flatt", ["invalid FAISS factory string 'Flatt'"]),
        ("--chunk-overlap", "64", ["chunk_overlap must be in [0, chunk_size=64)"]),
    ],
)
def test_build_bad_choice_names_it(app, dataset, tmp_path, option, value, expect):
    args = ["index", "build", dataset, "--out", tmp_path / "i", *FAST, option, value]
    one_line_error(invoke(app, *args), *expect)


def test_build_out_is_a_file(app, dataset, tmp_path):
    target = tmp_path / "taken"
    target.write_text("not a folder")
    one_line_error(invoke(app, "index", "build", dataset, "--out", target, *FAST), str(target))


def test_build_dataset_without_documents(app, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"id": "a", "question": "q", "answers": ["x"], "documents": []}\n')
    line = one_line_error(invoke(app, "index", "build", empty, "--out", tmp_path / "i", *FAST))
    assert line == f"error: {empty}: no documents to index"


# ---------------------------------------------------------------------------------- retrieve


def test_retrieve_unknown_retriever(app, built):
    result = invoke(app, "retrieve", built, "q", "--retriever", "bm26")
    one_line_error(result, "unknown retriever 'bm26'", "did you mean 'bm25'", "dense, hybrid")


@pytest.mark.parametrize("where", ["missing", "empty", "file"])
def test_retrieve_not_an_index(app, tmp_path, where):
    path = tmp_path / where
    if where == "empty":
        path.mkdir()
    elif where == "file":
        path.write_text("{}")
    one_line_error(invoke(app, "retrieve", path, "q"), f"{path}: not an index folder")


def test_retrieve_corrupted_faiss_file(app, index):
    (index / "index.faiss").write_bytes(b"garbage")
    one_line_error(invoke(app, "retrieve", index, "q"), str(index / "index.faiss"), "corrupted")


def test_retrieve_malformed_build_json(app, index):
    (index / "build.json").write_text("{oops")
    one_line_error(invoke(app, "retrieve", index, "q"), f"{index / 'build.json'}:1: invalid JSON")
    (index / "build.json").write_text("{}")
    one_line_error(invoke(app, "retrieve", index, "q"), f"{index / 'build.json'}:", "'embedder'")


def test_retrieve_malformed_chunks(app, index):
    chunks = index / "chunks.jsonl"
    chunks.write_text(chunks.read_text() + '{"id": 3}\n')
    n = len(chunks.read_text().splitlines())
    result = invoke(app, "retrieve", index, "q", "--retriever", "bm25")
    one_line_error(result, f"{chunks}:{n}: not a chunk")
    chunks.unlink()
    one_line_error(invoke(app, "retrieve", index, "q"), f"{chunks}: no such file")


def test_retrieve_bad_query_and_k(app, built):
    one_line_error(
        invoke(app, "retrieve", built, "q", "-k", "0"), "k must be an integer >= 1, got 0"
    )


# ------------------------------------------------------------------------------- real bugs


def test_unexpected_errors_keep_their_traceback(app, built, monkeypatch):
    """Only user-error types become one line: anything else propagates (exit 1, traceback)."""

    def broken(*args, **kwargs):
        raise RuntimeError("a genuine bug")

    monkeypatch.setattr(cli, "load_retriever", broken)
    result = invoke(app, "retrieve", built, "q")
    assert result.exit_code == 1 and isinstance(result.exception, RuntimeError)
    assert "error:" not in result.output
    monkeypatch.setattr(cli, "write_index", broken)
    result = invoke(app, "index", "build", "x.jsonl", "--out", "i")
    assert result.exit_code == 1 and isinstance(result.exception, RuntimeError)


def test_real_process_prints_one_line(tmp_path):
    """Through the installed entry point (no CliRunner): stderr is exactly one line."""
    missing = tmp_path / "nope.jsonl"
    for args in (
        ["index", "build", str(missing), "--out", str(tmp_path / "i")],
        ["retrieve", str(tmp_path), "q"],
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "ragbench.cli", *args], capture_output=True, text=True
        )
        assert proc.returncode == 2, proc.stderr
        assert proc.stdout == "" and "Traceback" not in proc.stderr
        [line] = proc.stderr.splitlines()
        assert line.startswith("error: ") and str(tmp_path) in line


# ------------------------------------------------------------------------ one index builder


def test_index_build_is_build_index_with_the_config_defaults(app, dataset, tmp_path, monkeypatch):
    """`index build` builds through `ragbench.retrieval.build_index`, with the run config's
    defaults for whatever it is not told: the saved index answers as build_index's does."""
    from ragbench.datasets.formats import read_examples
    from ragbench.experiment.config.sections import RetrievalConfig
    from ragbench.retrieval import build_index

    calls = []

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return build_index(*args, **kwargs)

    monkeypatch.setattr(cli, "build_index", spy)
    out = tmp_path / "index"
    result = invoke(app, "index", "build", dataset, "--out", out, *FAST[:4])  # tokenizer, embedder
    assert result.exit_code == 0, result.output
    [settings] = calls
    default = {n: f.default for n, f in RetrievalConfig.model_fields.items()}
    for name in ("splitter", "chunk_size", "chunk_overlap"):
        assert settings[name] == default[name]
    assert settings["retriever"] == "dense" and settings["tokenizer"] == "whitespace"

    documents = cli.corpus_documents(read_examples(dataset))
    chunks, _ = build_index(documents, **settings)
    assert (out / cli.CHUNKS_FILE).read_text().splitlines() == [c.to_json() for c in chunks]
    queries = [f"magic number for {name}" for name in TEXTS]
    for retriever in ("dense", "hybrid"):
        _, expected = build_index(documents, **{**settings, "retriever": retriever})
        got = cli.load_retriever(out, retriever).retrieve(queries, 2)
        assert got == expected.retrieve(queries, 2)
