"""The end-to-end proof on the embedded models: your own pipeline beside long context, offline.

docs/pipeline.md's llama-index query engine over a folder (ragbench's ingest, the MiniLM embedder and
FAISS behind ragbench's llama-index retriever adapter), answering with the embedded SmolLM2 as
its ``LLM`` (a ``CustomLLM`` whose usage a ``TokenCountingHandler`` reads); a
plain Python function over its own index and the same model; and that page's HTTP service
serving that engine from a real loopback server. Each runs through ``ragbench.run`` beside
``long_context`` on SmolLM2, and every pipeline row carries its tokens, dollars (the price
sheet), the contexts it read and the retrieval metrics against the questions' evidence, on the
same example ids as long context. The page's snippets are the files the test imports.

Three short documents and three questions: about a minute on two CPU cores.
"""

from __future__ import annotations

import re
import sys
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from ragbench.experiment.runner import run

pytestmark = pytest.mark.slow

PIPELINE_PAGE = Path(__file__).resolve().parents[1] / "docs" / "pipeline.md"
_SNIPPET = re.compile(r"<!-- docs-pipeline: (\S+) -->\n```\w*\n(.*?)```", re.DOTALL)
DOCS = {
    "lighthouse.md": "# The lighthouse\n\nThe lighthouse keeper is Ada Quill. She has kept the "
    "light on Gull Point since the winter storms of 1998, and she lives in the white cottage "
    "below the tower.",
    "ferry.txt": "The harbour ferry leaves at 06:40 from pier 3 every morning and returns at "
    "18:15. A ticket costs 12 euros for adults; children under ten travel free.",
    "market.txt": "The fish market opens on Saturdays at seven. Fresh herring and smoked "
    "mackerel are sold from the stalls along the quay until noon.",
}
QUESTIONS = (
    "id,question,answers,evidence\n"
    "keeper,Who is the lighthouse keeper?,Ada Quill,The lighthouse keeper is Ada Quill\n"
    "ferry,When does the harbour ferry leave?,06:40,The harbour ferry leaves at 06:40\n"
    "market,On which day does the fish market open?,Saturdays,The fish market opens on Saturdays\n"
)

# The user's other code: the embedded model as a llama-index LLM, and a plain function.
PIPELINES = '''
import functools
import threading

from llama_index.core.llms import CompletionResponse, CustomLLM, LLMMetadata
from llama_index.core.llms.callbacks import llm_completion_callback

from ragbench.datasets.corpus.docs import ingest
from ragbench.experiment.question_gen.generate import load_model
from ragbench.retrieval import build_index
from ragbench.types import GenerationRequest

MODEL = {"backend": "hf", "name": "smollm2-135m-instruct", "threads": 1, "cache": False}
_lock = threading.Lock()  # one model, called from the runner's and the service's threads


@functools.cache
def model():
    llm = load_model(MODEL)
    # calibrated to 1,232 tokens (the suite's longest SmolLM2 request, test_hf's 1k needle: one
    # calibration file serves every such test of a session), not the default 2,048
    llm.cost_rates(longest=1232)
    return llm


@functools.cache
def index():
    documents = ingest(["handbook"]).documents  # the ids ragbench's corpus has: the file names
    _, dense = build_index(documents, retriever="dense", embedder="minilm", splitter="sentence",
                           chunk_size=64, chunk_overlap=0, tokenizer="whitespace")
    return dense


def generate(prompt):
    with _lock:
        return model().generate([GenerationRequest(prompt=prompt, max_new_tokens=32)])[0]


class SmolLM(CustomLLM):
    """The embedded model as a llama-index LLM; its usage in ``raw`` for the token counter."""

    @property
    def metadata(self):
        return LLMMetadata(context_window=8192, num_output=32, model_name=model().name)

    @llm_completion_callback()
    def complete(self, prompt, formatted=False, **kwargs):
        c = generate(prompt)
        usage = {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens}
        return CompletionResponse(text=c.text, raw={"usage": usage})

    @llm_completion_callback()
    def stream_complete(self, prompt, formatted=False, **kwargs):
        raise NotImplementedError


def answer(question, example_id):
    hits = index().retrieve([question], 2)[0]
    context = "\\n\\n".join(h.chunk.text for h in hits)
    c = generate(f"Answer from the text.\\n\\n{context}\\n\\nQuestion: {question}\\nAnswer:")
    return {
        "answer": c.text,
        "contexts": [{"text": h.chunk.text, "doc_id": h.chunk.doc_id, "id": h.chunk.id,
                      "span": [h.chunk.start, h.chunk.end], "score": h.score} for h in hits],
        "usage": {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens},
    }
'''


def docs_snippets() -> dict[str, str]:
    return dict(_SNIPPET.findall(PIPELINE_PAGE.read_text(encoding="utf-8")))


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """The folder as a corpus with its questions; the page's modules and the user's other code
    importable from the working directory; SmolLM2 as the page's engine's LLM; the service
    serving."""
    from llama_index.core import Settings
    from llama_index.core.callbacks import CallbackManager, TokenCountingHandler

    import ragbench.strategies.pipeline.strategy as pipeline_strategy
    from ragbench.datasets.corpus.docs import ingest
    from ragbench.datasets.corpus.file import write_documents

    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "handbook"
    folder.mkdir()
    for name, text in DOCS.items():
        (folder / name).write_text(text + "\n", encoding="utf-8")
    write_documents(tmp_path / "corpus.jsonl", ingest([folder]).documents)
    (tmp_path / "questions.csv").write_text(QUESTIONS, encoding="utf-8")
    snippets = docs_snippets()
    assert set(snippets) == {"handbook_rag.py", "handbook_service.py"}
    for name, text in {**snippets, "handbook_pipelines.py": PIPELINES}.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
        monkeypatch.delitem(sys.modules, name.removesuffix(".py"), raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    import handbook_pipelines

    counter = TokenCountingHandler(
        tokenizer=lambda t: range(handbook_pipelines.model().count_tokens(t))
    )
    manager = CallbackManager([counter])
    monkeypatch.setattr(Settings, "_callback_manager", manager)
    monkeypatch.setattr(pipeline_strategy, "_opened", {})  # no engine another test built
    import handbook_rag  # the page's engine: SmolLM2 as its `LLM`, in place of MockLLM

    monkeypatch.setattr(handbook_rag, "LLM", handbook_pipelines.SmolLM(callback_manager=manager))
    import handbook_service  # the page's service: it builds its engine on import

    server = ThreadingHTTPServer(("127.0.0.1", 0), handbook_service.Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield tmp_path, f"http://127.0.0.1:{server.server_address[1]}/answer"
    server.shutdown()
    server.server_close()


def test_query_engine_function_and_service_beside_long_context_on_smollm2(workspace):
    folder, url = workspace
    config = {
        "name": "pipelines-smollm2",
        "dataset": {
            "name": "corpus",
            "params": {
                "corpus": str(folder / "corpus.jsonl"),
                "questions": str(folder / "questions.csv"),
            },
        },
        "model": {
            "backend": "hf",
            "name": "smollm2-135m-instruct",
            "max_new_tokens": 32,
            "threads": 1,
            "cache": False,
        },
        "strategies": [
            {"name": "long_context", "params": {"overflow": "error"}},
            {"name": "pipeline", "params": {"target": "handbook_rag:engine"}},
            {"name": "pipeline", "params": {"target": "handbook_pipelines:answer"}},
            {"name": "pipeline", "params": {"url": url, "version": "1", "retries": 0}},
        ],
        "metrics": ["contains"],
        "price_sheet": "example-hosted-api",
        "output_dir": str(folder / "results"),
    }
    df = run(config, progress=False)
    assert df["error"].isna().all(), df["error"].dropna().tolist()
    ids = sorted(df.loc[df["strategy"] == "long_context", "example_id"])
    assert ids == ["ferry", "keeper", "market"]
    # (kind, contexts per answer, usage reported: the service reports none, so it is counted)
    kinds = {
        "handbook_rag:engine": ("query_engine", 3, True),
        "handbook_pipelines:answer": ("function", 2, True),
        url: ("http", 3, False),
    }
    for target, (kind, k, reported) in kinds.items():
        rows = df[df["label"].str.startswith(f"pipeline {target}")]
        assert sorted(rows["example_id"]) == ids, target  # the same questions as long context
        assert (rows["pipeline_kind"] == kind).all()
        # SmolLM2's own token counts (reported, or counted with its tokenizer), priced
        assert (rows["prompt_tokens"] > 0).all() and (rows["completion_tokens"] > 0).all()
        assert (rows["usage_estimated"] != reported).all(), target
        assert rows["dollars"].notna().all() and (rows["dollars"] > 0).all(), target
        # the contexts it read, in the folder's documents, scored against the evidence
        assert (rows["contexts"].map(len) == k).all(), target
        docs = rows["contexts"].map(lambda cs: {c["doc_id"] for c in cs})
        assert docs.map(lambda d: d <= set(DOCS)).all(), target
        for name in ("hit@1", "hit@5", "recall@5", "mrr@10", "ndcg@10"):
            assert rows[name].notna().all(), (target, name)
        assert (rows["hit@1"] == 1.0).all() and rows["gold_hit"].all(), target  # MiniLM finds it
        assert rows["prediction"].str.len().gt(0).all()
    engine = df[df["label"].str.startswith("pipeline handbook_rag:engine")]
    # the engine's usage is its TokenCountingHandler's: the prompt holds the contexts it read
    texts = engine["contexts"].map(lambda cs: sum(len(c["text"].split()) for c in cs))
    assert (engine["prompt_tokens"] > texts).all()
    lc = df[df["strategy"] == "long_context"]
    assert (lc["prompt_tokens"] > 0).all() and lc["dollars"].notna().all()
    stored = (Path(df.attrs["run_dir"]) / "records.jsonl").read_text(encoding="utf-8")
    assert stored.count('"contexts"') >= 9  # kept in the run folder, not only in the table
