"""The `pipeline` strategy: your own system beside closed book, long context and RAG.

A plain Python function, a llama-index query engine (ragbench's embedder and FAISS inside, a
llama-index reader), a llama-index retriever read by the run's model and a loopback HTTP service,
each run through ``ragbench.run`` beside ``long_context`` with the fake backend over one shared
corpus; error rows for a pipeline that raises, times out or answers out of contract; a dead
endpoint stops the CLI (exit 2) before any work; resume reruns only a changed pipeline.
"""

from __future__ import annotations

import base64
import json
import math
import socket
import sys
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ragbench.cost import prices
from ragbench.datasets.corpus.file import write_documents
from ragbench.experiment.runner import run
from ragbench.llm.fake import FakeLLM
from ragbench.strategies import get_strategy
from ragbench.strategies.pipeline import http as pipeline_http
from ragbench.strategies.pipeline.answer import MalformedAnswer, PipelineAnswer
from ragbench.strategies.pipeline.params import PipelineParams
from ragbench.strategies.pipeline.strategy import retrieval_scores
from ragbench.types import Document, Example

KEYS = {"quiet-lake": "4817263", "red-fox": "5920114", "old-mill": "6031875", "blue-sky": "7142986"}
SHEET = prices.price_sheet("example-hosted-api").prices

# A plain pipeline: rank documents by the question's key, read the best two with the fake reader.
PIPE = """
from ragbench.datasets.corpus.file import read_documents
from ragbench.llm.fake import answer_from_prompt

CORPUS = {corpus!r}
CALLS = {calls!r}


def rank(question):
    key = question.rstrip("?").rsplit(" ", 1)[-1]
    return sorted(read_documents(CORPUS), key=lambda d: key not in d.text)


def answer(question, example_id, corpus):
    with open(CALLS, "a") as f:
        f.write(example_id + "\\n")
    docs = rank(question)[:2]
    text = answer_from_prompt("\\n\\n".join(d.text for d in docs) + "\\nQuestion: " + question)
    return {{"answer": text, "contexts": [{{"text": d.text, "doc_id": d.id}} for d in docs],
            "usage": {{"prompt_tokens": 100, "completion_tokens": 3, "model": "my-model"}}}}


def bare(question):  # a plain string: no contexts reported, so its retrieval is unknown
    return answer_from_prompt(rank(question)[0].text + "\\nQuestion: " + question)


def empty(question):  # contexts reported, and there were none: it retrieved nothing
    return {{"answer": bare(question), "contexts": []}}


def plain(question):  # a string answer, text contexts: tokens counted, documents found by text
    class Out:
        pass

    out = Out()
    out.answer = answer_from_prompt(rank(question)[0].text + "\\nQuestion: " + question)
    out.contexts = [d.text for d in rank(question)[:3]]
    return out


def boom(question):
    raise RuntimeError("index is down")


def slow(question):
    import time
    time.sleep(3)
    return "late"


def no_answer(question):
    return {{"answr": "x"}}


def bad_usage(question):
    return {{"answer": "x", "usage": {{"prompt_tokens": "many"}}}}


def bad_span(question):
    return {{"answer": "x", "contexts": [{{"text": "t", "span": [1]}}]}}


def broken():  # a factory that cannot build its engine
    raise RuntimeError("connection refused\\nthe vector store at localhost:6333 is down")


def wordy(question):  # a multi-line answer, the value on its second line; contexts read by
    # another reader: CRLF line ends and runs of spaces, the pipeline's own ids
    doc = rank(question)[0]
    key = question.rstrip("?").rsplit(" ", 1)[-1]
    value = doc.text.split(f"for {{key}} is ", 1)[1].split(".")[0]
    text = doc.text.replace(" The special", "\\r\\n  The special")
    return {{"answer": f"From the documents:\\n  The number is {{value}}.\\n", "contexts": [
        {{"text": text, "doc_id": "3f2a-uuid"}},
        {{"text": "text from a page ragbench never read", "doc_id": "9c1b-uuid"}}]}}
"""

ENGINE = """
from llama_index.core import get_response_synthesizer
from llama_index.core.callbacks import CallbackManager, TokenCountingHandler
from llama_index.core.llms import CompletionResponse, CustomLLM, LLMMetadata
from llama_index.core.llms.callbacks import llm_completion_callback
from llama_index.core.query_engine import RetrieverQueryEngine

from ragbench.datasets.corpus.file import read_documents
from ragbench.llm.fake import answer_from_prompt
from ragbench.retrieval import build_index
from ragbench.retrieval.embedders.base import get_embedder
from ragbench.retrieval.llamaindex import RagbenchLlamaRetriever

CORPUS = {corpus!r}
EMBEDDER = {embedder!r}


class Reader(CustomLLM):
    @property
    def metadata(self):
        return LLMMetadata()

    @llm_completion_callback()
    def complete(self, prompt, formatted=False, **kwargs):
        context, _, query = prompt.rpartition("Query:")
        question = query.split("\\n")[0].strip()
        return CompletionResponse(text=answer_from_prompt(context + "\\nQuestion: " + question))

    @llm_completion_callback()
    def stream_complete(self, prompt, formatted=False, **kwargs):
        raise NotImplementedError


def retriever():
    _, dense = build_index(read_documents(CORPUS), retriever="dense",
                           embedder=get_embedder(EMBEDDER), splitter="sentence", chunk_size=48,
                           chunk_overlap=8, tokenizer="whitespace")
    return RagbenchLlamaRetriever(dense, k=3)


def engine():
    counter = TokenCountingHandler(tokenizer=str.split)
    manager = CallbackManager([counter])
    reader = Reader(callback_manager=manager)
    synthesizer = get_response_synthesizer(llm=reader, callback_manager=manager)
    return RetrieverQueryEngine(retriever(), response_synthesizer=synthesizer,
                                callback_manager=manager)
"""


def corpus(tmp_path: Path) -> tuple[Path, Path]:
    docs, rows = [], []
    for i, (key, value) in enumerate(KEYS.items()):
        filler = " ".join(f"d{i}w{j}" for j in range(120))
        fact = f"The special magic number for {key} is {value}."
        docs.append(Document(f"doc-{i}", f"{filler} {fact} {filler}"))
        rows.append(
            {
                "id": key,
                "question": f"What is the special magic number for {key}?",
                "answers": [value],
                "evidence": fact,
                "task_type": "needle",
            }
        )
    path = write_documents(tmp_path / "corpus.jsonl", docs)
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path, questions


def setup(tmp_path, monkeypatch, name="mypipe", source=PIPE, **fmt) -> Path:
    """The corpus, and the pipeline module ``name`` in a folder on sys.path."""
    path, _ = corpus(tmp_path)
    folder = tmp_path / "code"
    folder.mkdir(exist_ok=True)
    module = folder / f"{name}.py"
    module.write_text(source.format(corpus=str(path), calls=str(tmp_path / "calls.txt"), **fmt))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, name, raising=False)  # another test's module of that name
    return module


def config(tmp_path, *pipelines, **over):
    cfg = {
        "name": "t-pipe",
        "dataset": {
            "name": "corpus",
            "params": {
                "corpus": str(tmp_path / "corpus.jsonl"),
                "questions": str(tmp_path / "questions.jsonl"),
            },
        },
        "model": {
            "backend": "fake",
            "name": "fake",
            "preset": "smollm2-135m-instruct",
            "cache": False,
        },
        "strategies": ["long_context", *({"name": "pipeline", "params": p} for p in pipelines)],
        "metrics": ["string_match_all"],
        "price_sheet": "example-hosted-api",
        "output_dir": str(tmp_path / "results"),
    }
    return cfg | over


def dollars(prompt, completion, cached=0):
    return (
        (prompt - cached) * SHEET["input_per_million"]
        + cached * SHEET["cached_input_per_million"]
        + completion * SHEET["output_per_million"]
    ) / 1e6


def check_reported(pipe):
    """Rows of the `answer` pipeline (reported usage, document ids): tokens, dollars, contexts,
    retrieval metrics."""
    assert pipe["error"].isna().all() and (pipe["string_match_all"] == 1.0).all()
    assert (pipe["prompt_tokens"] == 100).all() and (pipe["completion_tokens"] == 3).all()
    assert not pipe["usage_estimated"].any()
    assert (pipe["dollars"] - dollars(100, 3)).abs().max() < 1e-15
    assert pipe["flops"].isna().all()  # another model than the run's: no architecture facts
    assert (pipe["latency_seconds"] > 0).all() and pipe["gold_hit"].all()
    for key, row in pipe.set_index("example_id").iterrows():
        assert [c["doc_id"] for c in row["contexts"]][0] == f"doc-{list(KEYS).index(key)}"
        assert KEYS[key] in row["contexts"][0]["text"] and len(row["contexts"]) == 2
    for name in ("hit@1", "recall@1", "mrr@10", "ndcg@10", "recall@5"):
        assert (pipe[name] == 1.0).all(), name


def test_a_python_function_beside_long_context(tmp_path, monkeypatch):
    setup(tmp_path, monkeypatch)
    df = run(
        config(tmp_path, {"target": "mypipe:answer"}, {"target": "mypipe:plain"}), progress=False
    )
    assert len(df) == 4 * 3 and df["error"].isna().all()
    lc = df[df.strategy == "long_context"]
    assert (lc["string_match_all"] == 1.0).all()
    labels = df[df.strategy == "pipeline"]["label"].unique()
    assert {label.split(" v=")[0] for label in labels} == {
        "pipeline mypipe:answer",
        "pipeline mypipe:plain",
    }
    assert all(" v=" in label for label in labels)  # the module's identity
    check_reported(df[df.label.str.startswith("pipeline mypipe:answer")])
    plain = df[df.label.str.startswith("pipeline mypipe:plain")].set_index("example_id")
    assert plain["usage_estimated"].all() and (plain["string_match_all"] == 1.0).all()
    fake = FakeLLM("fake")
    for key, row in plain.iterrows():  # counted with the run's tokenizer
        texts = [c["text"] for c in row["contexts"]]
        question = f"What is the special magic number for {key}?"
        assert row["prompt_tokens"] == fake.count_tokens("\n\n".join([*texts, question]))
        assert row["completion_tokens"] == fake.count_tokens(row["prediction"])
        assert row["dollars"] == pytest.approx(
            dollars(row["prompt_tokens"], row["completion_tokens"])
        )
        assert row["flops"] > 0  # no model reported: the run's own (counted with its tokenizer)
        # text-only contexts were found in the corpus: document ids and spans, so ranks are known
        assert row["contexts"][0]["doc_id"] == f"doc-{list(KEYS).index(key)}"
        assert row["hit@1"] == 1.0 and row["recall@10"] == 1.0 and row["gold_hit"]


def _engine_run(tmp_path, monkeypatch, embedder):
    setup(tmp_path, monkeypatch, "myengine", ENGINE, embedder=embedder)
    cfg = config(tmp_path, {"target": "myengine:engine"}, {"target": "myengine:retriever"})
    return run(cfg, progress=False)


def check_engine(df):
    assert df["error"].isna().all(), df["error"].dropna().tolist()
    engine = df[df.label.str.startswith("pipeline myengine:engine")]
    reader = df[df.label.str.startswith("pipeline myengine:retriever")]
    for rows in (engine, reader):
        assert len(rows) == 4 and (rows["contexts"].map(len) == 3).all()
        assert rows["contexts"].map(lambda cs: all("#" in c["id"] for c in cs)).all()  # chunk ids
        # the reader answers iff the evidence was retrieved; the ranking metrics agree
        assert (rows["string_match_all"] == rows["gold_hit"].astype(float)).all()
        assert (rows["hit@5"] >= rows["gold_hit"].astype(float)).all()
        assert rows["gold_hit"].any()
    # the query engine's tokens come from its TokenCountingHandler (whitespace tokens)
    assert not engine["usage_estimated"].any() and (engine["prompt_tokens"] > 50).all()
    assert (engine["dollars"] > 0).all()
    # a retriever's contexts are read by the run's model with the RAG prompt: its real usage
    assert not reader["usage_estimated"].any() and (reader["llm_calls"] == 1).all()
    assert (reader["retrieval_seconds"] > 0).all() and (reader["flops"] > 0).all()


def test_a_llamaindex_query_engine_and_retriever_with_faiss(tmp_path, monkeypatch):
    check_engine(_engine_run(tmp_path, monkeypatch, "hash"))


@pytest.mark.slow
def test_a_llamaindex_query_engine_with_the_embedded_embedder(tmp_path, monkeypatch):
    df = _engine_run(tmp_path, monkeypatch, "minilm")
    check_engine(df)
    assert df[df.strategy == "pipeline"]["gold_hit"].all()  # MiniLM finds every key


class Service(BaseHTTPRequestHandler):
    """POST: the `answer` pipeline over HTTP (its JSON), with the service's version."""

    answer = None
    seen: list = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Service.seen.append((body, self.headers.get("X-Token")))
        out = Service.answer(body["question"], body["id"], body["corpus"]) | {"version": "7"}
        data = json.dumps(out).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def service():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Service)
    server.handle_error = lambda *a: None  # a client that timed out closed its socket
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_an_http_service(tmp_path, monkeypatch, service):
    setup(tmp_path, monkeypatch)
    import mypipe

    Service.answer, Service.seen = staticmethod(mypipe.answer), []
    monkeypatch.setenv("PIPE_TOKEN", "tok-abcdef-123456")
    url = service.replace("http://", "http://me:hunter2-secret@") + "/answer"
    params = {"url": url, "version": "2", "headers_env": {"X-Token": "PIPE_TOKEN"}, "retries": 0}
    df = run(config(tmp_path, params), progress=False)
    pipe = df[df.strategy == "pipeline"]
    check_reported(pipe)
    assert (pipe["pipeline_version"] == "7").all()  # what the service says it runs
    assert (
        pipe["label"].iloc[0] == f"pipeline {service.replace('http://', 'http://***@')}/answer v=2"
    )
    body, token = Service.seen[0]
    assert token == "tok-abcdef-123456" and set(body) == {"question", "id", "corpus"}
    assert body["corpus"]  # the shared corpus' fingerprint
    stored = (Path(df.attrs["run_dir"]) / "records.jsonl").read_text()
    assert "hunter2" not in stored and "tok-abcdef" not in stored and "***@127.0.0.1" in stored


def test_error_rows(tmp_path, monkeypatch, service):
    setup(tmp_path, monkeypatch)
    points = [{"target": f"mypipe:{n}"} for n in ("boom", "no_answer", "bad_usage", "bad_span")]
    points.append({"target": "mypipe:slow", "timeout": 0.2})
    points.append({"url": service + "/answer", "timeout": 0.5, "retries": 0})
    Service.answer = staticmethod(lambda *a: __import__("time").sleep(2) or {"answer": "late"})
    df = run(
        config(tmp_path, *points, dataset=config(tmp_path)["dataset"] | {"limit": 1}),
        progress=False,
    )
    pipe = df[df.strategy == "pipeline"].set_index("label")

    def error(name):
        return next(e for label, e in pipe["error"].items() if name in label)

    assert "RuntimeError: index is down" in error("mypipe:boom")
    assert "malformed" in error("no_answer") and "unknown field(s) ['answr']" in error("no_answer")
    assert "usage.prompt_tokens must be an integer" in error("bad_usage")
    assert "contexts[0].span" in error("bad_span")
    assert "PipelineTimeout" in error("mypipe:slow") and "0.2 s" in error("mypipe:slow")
    assert "POST" in error("/answer") and "timed out after 0.5 s" in error("/answer")
    assert (pipe["prediction"] == "").all() and pipe["prompt_tokens"].isna().all()  # no partial
    assert "contexts" not in pipe.columns or pipe["contexts"].isna().all()


def test_a_dead_endpoint_stops_the_cli_before_any_work(tmp_path, monkeypatch):
    import typer
    import yaml
    from typer.testing import CliRunner

    from ragbench.cli.run import register

    corpus(tmp_path)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = typer.Typer()
    register(app)
    app.command("other")(lambda: None)  # a second command keeps typer in multi-command mode
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config(tmp_path, {"url": f"http://127.0.0.1:{port}/answer"})))
    result = CliRunner().invoke(app, ["run", str(path), "--quiet"])
    assert result.exit_code == 2, result.output
    assert "pipeline endpoint check failed" in result.output and str(port) in result.output
    assert not list((tmp_path / "results").glob("*/records.jsonl"))  # nothing was run


def test_a_factory_that_raises_stops_the_cli_in_one_line(tmp_path, monkeypatch):
    import typer
    import yaml
    from typer.testing import CliRunner

    from ragbench.cli.run import register

    setup(tmp_path, monkeypatch)
    app = typer.Typer()
    register(app)
    app.command("other")(lambda: None)  # a second command keeps typer in multi-command mode
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config(tmp_path, {"target": "mypipe:broken"})))
    result = CliRunner().invoke(app, ["run", str(path), "--quiet"])
    assert result.exit_code == 2, result.output
    assert result.output.strip() == (
        "error: pipeline: target 'mypipe:broken': its factory broken() raised RuntimeError: "
        "the vector store at localhost:6333 is down"
    )
    assert not list((tmp_path / "results").glob("*/records.jsonl"))  # nothing was run


def test_a_pipelines_answer_is_scored_whole_and_its_contexts_found_whitespace_aside(
    tmp_path, monkeypatch
):
    setup(tmp_path, monkeypatch)
    df = run(
        config(tmp_path, {"target": "mypipe:wordy"}, metrics=["exact_match", "contains"]),
        progress=False,
    )
    pipe = df[df.strategy == "pipeline"].set_index("example_id")
    assert pipe["error"].isna().all(), pipe["error"].dropna().tolist()
    for key, row in pipe.iterrows():
        # the whole answer, trimmed (not ragbench's first line, "From the documents:")
        assert row["prediction"] == f"From the documents:\n  The number is {KEYS[key]}."
        assert row["raw"] == row["prediction"] + "\n"  # the answer as it came
        assert row["contains"] == 1.0 and row["exact_match"] == 0.0
        # the CRLF context is the run's document (whitespace aside), span and all
        first = row["contexts"][0]
        assert first["doc_id"] == f"doc-{list(KEYS).index(key)}" and row["gold_hit"]
        # the other one is in no document of the run: its rank is unknown, so no 0s
        assert row["contexts"][1]["doc_id"] == "9c1b-uuid"
        assert all(
            math.isnan(row[f"{m}@{k}"])
            for m in ("hit", "recall", "mrr", "ndcg")
            for k in (1, 5, 10)
        )
        assert row["retrieval_note"].startswith("1 of 2 contexts are in none of the run's")
    lc = df[df.strategy == "long_context"]
    assert "retrieval_note" not in lc.columns or lc["retrieval_note"].isna().all()


def test_resume_reruns_only_a_changed_pipeline(tmp_path, monkeypatch):
    module = setup(tmp_path, monkeypatch)
    calls = tmp_path / "calls.txt"
    cfg = config(tmp_path, {"target": "mypipe:answer"})
    first = run(cfg, progress=False)
    assert len(calls.read_text().split()) == 4
    again = run(cfg, progress=False)  # unchanged: nothing reruns
    assert len(calls.read_text().split()) == 4
    assert again["label"].tolist() == first["label"].tolist()
    manifest = json.loads((Path(again.attrs["run_dir"]) / "manifest.json").read_text())
    assert manifest["sessions"][-1]["pending"] == 0
    module.write_text(module.read_text() + "\n# retuned: a new prompt\n")
    changed = run(cfg, progress=False)  # the module changed: its rows rerun, long context not
    assert len(calls.read_text().split()) == 8
    manifest = json.loads((Path(changed.attrs["run_dir"]) / "manifest.json").read_text())
    assert manifest["sessions"][-1]["pending"] == 4
    assert changed.attrs["run_dir"] == first.attrs["run_dir"]
    old, new = (d[d.strategy == "pipeline"]["label"].iloc[0] for d in (first, changed))
    assert old != new and old.split(" v=")[0] == new.split(" v=")[0]
    check_reported(changed[changed.strategy == "pipeline"])


def test_params_and_contract():
    with pytest.raises(ValueError, match="exactly one of target"):
        PipelineParams()
    with pytest.raises(ValueError, match="exactly one of target"):
        PipelineParams(target="json:dumps", url="http://x/a")
    with pytest.raises(ValueError, match="module:attribute"):
        PipelineParams(target="json.dumps")
    with pytest.raises(ValueError, match="cannot import 'nope_mod'"):
        PipelineParams(target="nope_mod:f")
    with pytest.raises(ValueError, match="has no attribute 'dumpz'"):
        PipelineParams(target="json:dumpz")
    with pytest.raises(ValueError, match="timeout"):
        PipelineParams(url="http://x/a", timeout=0)
    p = PipelineParams(url="http://u:pw@x/a?token=abc", version="3")
    assert p.url == "http://***@x/a?token=***" and p.raw_url == "http://u:pw@x/a?token=abc"
    # how it's called (timeout, retries, headers) is not stored; the setup fields are, at
    # their defaults too
    setup = {"setup": None, "setup_url": None, "setup_version": None}
    assert p.to_dict() == {"target": None, "url": p.url, "version": "3", **setup}
    assert PipelineParams.from_dict(p.to_dict()) == p
    assert get_strategy("pipeline").params is PipelineParams
    assert PipelineAnswer.parse("x").answer == "x"
    parsed = PipelineAnswer.parse({"answer": "a", "contexts": ["t", {"text": "u", "doc_id": 3}]})
    assert parsed.contexts[1].doc_id == "3"
    for bad, field in (
        ({"answer": None}, "answer"),
        ({"answer": "a", "contexts": "t"}, "contexts"),
        ([1], "the answer"),
        ({"answer": "a", "usage": {"completion_tokens": -1}}, "usage.completion_tokens"),
    ):
        with pytest.raises(MalformedAnswer, match=field):
            PipelineAnswer.parse(bad)


def test_retrieval_scores_match_the_shared_metrics():
    docs = tuple(Document(f"d{i}", f"text {i}") for i in range(4))
    example = Example("q", "?", ("a",), docs, {"qrels": {"d2": 2, "d3": 1}})
    from ragbench.strategies.pipeline.answer import Context

    contexts = [Context("x", "d1"), Context("y", "d2"), Context("z", "d2"), Context("w", "d3")]
    scores = retrieval_scores(contexts, example)
    assert scores["hit@1"] == 0.0 and scores["mrr@10"] == 0.5 and scores["recall@5"] == 1.0
    # ranked documents d1, d2, d3 (d2 once: its first rank); gains d2=2, d3=1 (as ranx's ndcg)
    dcg = 2 / math.log2(3) + 1 / math.log2(4)
    assert scores["ndcg@5"] == pytest.approx(dcg / (2 + 1 / math.log2(3)), abs=1e-12)
    # ranks unknown: a context in none of the example's documents
    assert retrieval_scores([Context("x")], example) == dict.fromkeys(scores)
    assert retrieval_scores([contexts[1], Context("x", "uuid")], example) == dict.fromkeys(scores)
    assert retrieval_scores(contexts, Example("q", "?", ("a",), docs, {})) == {}  # no judgements


def test_contexts_with_the_pipelines_own_ids_are_found_by_text():
    # llama-index's readers give nodes made-up document ids: the text says which document it is
    from ragbench.strategies.pipeline.answer import Context
    from ragbench.strategies.pipeline.strategy import _located

    docs = (Document("a.md", "alpha beta gamma"), Document("b.md", "delta epsilon zeta"))
    example = Example("q", "?", ("x",), docs, {"qrels": {"b.md": 1}})
    found = _located(Context("epsilon zeta", "7f3c-uuid"), example)
    assert (found.doc_id, found.span) == ("b.md", (6, 18))
    assert _located(Context("beta", "b.md"), example).doc_id == "b.md"  # an id of the run's: kept
    assert _located(Context("nowhere", "7f3c-uuid"), example).doc_id == "7f3c-uuid"
    assert retrieval_scores([found], example)["hit@1"] == 1.0
    # another reader's text: CRLF, runs of spaces, a line break for a space (whitespace aside)
    crlf = _located(Context("delta\r\n  epsilon\nzeta\r\n", "7f3c-uuid"), example)
    assert (crlf.doc_id, crlf.span) == ("b.md", (0, 18))
    # cleaned as the corpus is: a control character and decomposed accents (NFC)
    docs = (Document("c.md", "caf\u00e9 cr\u00e8me br\u00fbl\u00e9e"),)
    cleaned = _located(Context("cafe\u0301\x07 cre\u0300me", "x"), Example("q", "?", ("x",), docs))
    assert (cleaned.doc_id, cleaned.span) == ("c.md", (0, 10))


def test_a_pipeline_that_reports_no_contexts_has_no_retrieval_scores(tmp_path, monkeypatch):
    """A plain string answer says nothing of what it retrieved: NaN ranks and an unknown
    gold_hit with a note (was hit@k 0 and gold_hit False: "retrieval_miss" for every wrong
    answer), and a judge reads no context; ``contexts: []`` says it retrieved nothing: 0."""
    setup(tmp_path, monkeypatch)
    df = run(
        config(tmp_path, {"target": "mypipe:bare"}, {"target": "mypipe:empty"}), progress=False
    )
    bare = df[df.label.str.startswith("pipeline mypipe:bare")]
    empty = df[df.label.str.startswith("pipeline mypipe:empty")]
    assert len(bare) == len(empty) == 4 and (bare["string_match_all"] == 1.0).all()
    assert bare["hit@1"].isna().all() and bare["ndcg@10"].isna().all()
    assert bare["gold_hit"].isna().all() and bare["contexts"].isna().all()
    assert bare["retrieval_note"].str.contains("reported no contexts").all()
    assert (empty["hit@1"] == 0.0).all() and (empty["gold_hit"] == False).all()  # noqa: E712
    strategy = get_strategy("pipeline")
    from ragbench.experiment.results import RECORDS, read_records

    records = read_records(Path(df.attrs["run_dir"]) / RECORDS).values()
    by_label = {r.params.label().split(" v=")[0]: r for r in records if r.strategy == "pipeline"}
    assert strategy.contexts(by_label["pipeline mypipe:bare"]).text() is None  # nothing to judge
    assert strategy.contexts(by_label["pipeline mypipe:empty"]).text() == ""


def test_the_judge_reads_the_recorded_contexts():
    from ragbench.strategies.contexts import ContextUnavailable
    from ragbench.types import Record

    strategy = get_strategy("pipeline")
    params = PipelineParams(url="http://x/a")
    record = Record(
        "q", "pipeline", params, "a", meta={"contexts": [{"text": "one"}, {"text": "two"}]}
    )
    assert strategy.contexts(record).text() == "one\n\ntwo"
    assert strategy.contexts(record).texts() == ["one", "two"]
    cut = Record("q", "pipeline", params, "a", meta={"contexts": [], "contexts_truncated": True})
    with pytest.raises(ContextUnavailable):
        strategy.contexts(cut).text()


def test_a_changed_module_is_reloaded_in_process(tmp_path, monkeypatch):
    folder = tmp_path / "m"
    folder.mkdir()
    monkeypatch.delitem(sys.modules, "versioned", raising=False)
    (folder / "versioned.py").write_text("def answer(q):\n    return 'one'\n")
    monkeypatch.syspath_prepend(str(folder))
    from ragbench.strategies.pipeline.strategy import open_pipeline

    a = PipelineParams(target="versioned:answer")
    assert open_pipeline(a).obj("?") == "one"
    (folder / "versioned.py").write_text(
        textwrap.dedent("""\
        __version__ = "2.0"
        def answer(q):
            return 'two, longer'
    """)
    )
    b = PipelineParams(target="versioned:answer")
    assert b.version == "2.0" and a.version.startswith("sha256:")
    assert open_pipeline(b).obj("?") == "two, longer"


def test_a_module_from_the_working_directory_is_reloaded_and_a_new_one_imported(
    tmp_path, monkeypatch
):
    # the working directory is searched for the import only (not left on sys.path): a reload,
    # and a module of the same name imported afresh from another folder, must find theirs
    from ragbench.strategies.pipeline.target import resolve

    monkeypatch.delitem(sys.modules, "cwdpipe", raising=False)
    first, second = tmp_path / "first", tmp_path / "second"
    for folder, said in ((first, "one"), (second, "other")):
        folder.mkdir()
        (folder / "cwdpipe.py").write_text(f"def answer(q):\n    return {said!r}\n")
    monkeypatch.chdir(first)
    assert resolve("cwdpipe:answer")[0]("?") == "one"
    (first / "cwdpipe.py").write_text("def answer(q):\n    return 'edited'\n")
    assert resolve("cwdpipe:answer")[0]("?") == "edited"  # reloaded from the working directory
    del sys.modules["cwdpipe"]  # as a test (or a notebook) drops it, then works elsewhere
    monkeypatch.chdir(second)
    assert resolve("cwdpipe:answer")[0]("?") == "other"
    del sys.modules["cwdpipe"]  # no other test finds it


def test_a_target_in_the_config_folder(tmp_path, monkeypatch):
    from ragbench.strategies.pipeline.target import imports_from

    (tmp_path / "beside_config.py").write_text("def answer(q):\n    return 'here'\n")
    monkeypatch.delitem(sys.modules, "beside_config", raising=False)
    with pytest.raises(ValueError, match="cannot import 'beside_config'"):
        PipelineParams(target="beside_config:answer")
    with imports_from(tmp_path):  # the hook for the config file's folder
        assert PipelineParams(target="beside_config:answer").version.startswith("sha256:")
    assert str(tmp_path) not in sys.path


# A pipeline that answers only from what its setup hook handed it (the run's corpus).
INDEXED = """
import json

from ragbench.llm.fake import answer_from_prompt

SETUPS = {setups!r}
HELD = {{}}


def index(documents, corpus):
    HELD.update(docs=list(documents), corpus=corpus)
    with open(SETUPS, "a") as f:
        f.write(json.dumps({{"corpus": corpus, "docs": [[d.id, d.text] for d in documents]}}) + "\\n")


def answer(question, example_id, corpus):
    assert corpus == HELD["corpus"], "asked about another corpus than the one set up"
    key = question.rstrip("?").rsplit(" ", 1)[-1]
    docs = sorted(HELD["docs"], key=lambda d: key not in d.text)[:2]
    text = answer_from_prompt("\\n\\n".join(d.text for d in docs) + "\\nQuestion: " + question)
    return {{"answer": text, "contexts": [{{"text": d.text, "doc_id": d.id}} for d in docs]}}
"""


def test_the_setup_hook_indexes_the_run_corpus(tmp_path, monkeypatch):
    from ragbench.analysis import verdict
    from ragbench.datasets.corpus.file import corpus_fingerprint, read_documents

    module = setup(tmp_path, monkeypatch)  # mypipe: answers from its own copy of the corpus
    setups = tmp_path / "setups.jsonl"
    (module.parent / "idxpipe.py").write_text(INDEXED.format(setups=str(setups)))
    monkeypatch.delitem(sys.modules, "idxpipe", raising=False)
    points = [
        {"target": "idxpipe:answer", "setup": "idxpipe:index"},
        {"target": "mypipe:answer"},
        {"target": "idxpipe:answer", "setup": "mypipe:boom"},
    ]
    cfg = config(tmp_path, *points, metrics=["string_match_all", "noise_sensitivity"])
    df = run(cfg, progress=False)
    docs = read_documents(tmp_path / "corpus.jsonl")
    calls = [json.loads(line) for line in setups.read_text().splitlines()]
    # once for the shared corpus: exactly its documents, ids and texts, and its fingerprint
    assert calls == [{"corpus": corpus_fingerprint(docs), "docs": [[d.id, d.text] for d in docs]}]
    indexed = df[df.label.str.contains("setup=idxpipe:index")]
    assert len(indexed) == 4 and indexed["error"].isna().all()
    assert (indexed["string_match_all"] == 1.0).all() and indexed["gold_hit"].all()
    assert (indexed["pipeline_index"] == "ragbench corpus").all()
    stored = json.loads(indexed["params"].iloc[0])
    assert stored["setup"] == "idxpipe:index" and stored["setup_version"].startswith("sha256:")
    own = df[df.label.str.startswith("pipeline mypipe:answer")]
    assert (own["pipeline_index"] == "own index").all()
    failed = df[df.label.str.contains("setup=mypipe:boom")]
    assert failed["error"].str.contains("pipeline setup 'mypipe:boom' failed on corpus").all()
    assert failed["error"].str.contains("RuntimeError: index is down").all()
    # one shared corpus: no document outside it to add as a distractor
    assert indexed["noise_sensitivity"].isna().all()
    assert indexed["noise_note"].str.startswith("no distractors").all()
    assert own["noise_note"].str.contains("own index").all()
    text = str(verdict(df, metric="string_match_all"))
    assert f"{own['label'].iloc[0]} answered from its own index, not the run's documents." in text
    assert text.count("answered from its own index") == 1
    run(cfg, progress=False)  # resumed: the failed rows are retried, the good ones not set up
    assert len(setups.read_text().splitlines()) == 1


class IndexService(BaseHTTPRequestHandler):
    """POST /setup: keep the corpus; POST /answer: the `answer` pipeline over what it keeps."""

    corpus: dict = {}
    seen: list = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.send_response(405)
        self.end_headers()

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        IndexService.seen.append((self.path, self.headers.get("X-Token")))
        if self.path == "/setup":
            IndexService.corpus = body
            self.send_response(204)
            self.end_headers()
            return
        assert body["corpus"] == IndexService.corpus["corpus"]
        key = body["question"].rstrip("?").rsplit(" ", 1)[-1]
        doc = next(d for d in IndexService.corpus["documents"] if key in d["text"])
        data = json.dumps(
            {"answer": KEYS[key], "contexts": [{"text": doc["text"], "doc_id": doc["id"]}]}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_an_http_service_with_a_setup_url(tmp_path, monkeypatch):
    from ragbench.datasets.corpus.file import corpus_fingerprint, read_documents

    corpus(tmp_path)
    server = ThreadingHTTPServer(("127.0.0.1", 0), IndexService)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("PIPE_TOKEN", "tok-setup-7654321")
    IndexService.seen = []
    params = {
        "url": base + "/answer",
        "setup_url": base + "/setup",
        "version": "1",
        "headers_env": {"X-Token": "PIPE_TOKEN"},
        "retries": 0,
    }
    try:
        df = run(config(tmp_path, params), progress=False)
    finally:
        server.shutdown()
        server.server_close()
    pipe = df[df.strategy == "pipeline"]
    assert pipe["error"].isna().all() and (pipe["string_match_all"] == 1.0).all()
    assert (pipe["pipeline_index"] == "ragbench corpus").all() and pipe["gold_hit"].all()
    docs = read_documents(tmp_path / "corpus.jsonl")
    assert IndexService.corpus["corpus"] == corpus_fingerprint(docs)
    assert IndexService.corpus["documents"] == [d.to_dict() for d in docs]
    posts = [p for p, _ in IndexService.seen]
    assert posts == ["/setup"] + ["/answer"] * 4  # the corpus once, before its questions
    assert {t for _, t in IndexService.seen} == {"tok-setup-7654321"}


def test_setup_params():
    p = PipelineParams(target="json:dumps", setup="json:loads")
    assert p.setup_version == p.version and p.indexes_corpus  # json's __version__ for both
    assert p.to_dict()["setup"] == "json:loads" and PipelineParams.from_dict(p.to_dict()) == p
    assert p.label().endswith(" setup=json:loads")
    assert PipelineParams(target="json:dumps").to_dict()["setup"] is None  # stored, at default
    u = PipelineParams(url="http://h/a", setup_url="http://u:pw@h/setup")
    assert u.setup_url == "http://***@h/setup" and u.raw_setup_url == "http://u:pw@h/setup"
    assert "pw" not in json.dumps(u.to_dict()) and u.to_dict()["setup_version"] is None
    for bad, match in (
        ({"target": "json:dumps", "setup": "json.loads"}, "module:attribute"),
        ({"target": "json:dumps", "setup_url": "http://h/s"}, "beside a url"),
        (
            {"url": "http://h/a", "setup": "json:loads", "setup_url": "http://h/s"},
            "at most one of setup",
        ),
        ({"target": "json:dumps", "setup": "json:nope"}, "has no attribute"),
    ):
        with pytest.raises(ValueError, match=match):
            PipelineParams(**bad)


def test_url_userinfo_beside_a_headers_env_authorization_warns_and_sends_the_header(
    monkeypatch, caplog
):
    """httpx would turn the URL's user:password into Basic auth over the Authorization header
    headers_env names, silently: the header is sent, the userinfo dropped, with a warning (as the
    OpenAI backend does)."""
    seen = []

    class Auth(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            seen.append(self.headers.get("Authorization"))
            data = json.dumps({"answer": "ok"}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Auth)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("PIPE_AUTH", "Bearer header-token-123456")
    url = f"http://me:url-pw-987654@127.0.0.1:{server.server_address[1]}/answer"
    try:
        with caplog.at_level("WARNING", logger="ragbench.strategies.pipeline.http"):
            both = PipelineParams(url=url, headers_env={"Authorization": "PIPE_AUTH"}, retries=0)
            pipeline_http.post(both, "q", "id", None)
            pipeline_http.post(PipelineParams(url=url, retries=0), "q", "id", None)  # no header
    finally:
        server.shutdown()
        server.server_close()
    assert seen[0] == "Bearer header-token-123456"
    assert seen[1] == "Basic " + base64.b64encode(b"me:url-pw-987654").decode()
    warned = [r.getMessage() for r in caplog.records]
    assert (
        len(warned) == 1 and "carries user:password but headers_env sets Authorization" in warned[0]
    )
    assert "url-pw-987654" not in warned[0] and "***@127.0.0.1" in warned[0]
