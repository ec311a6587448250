"""``noise_sensitivity`` (``ragbench.experiment.noise_pass``) on a small multidoc run with the fake
backend: a pipeline that indexes the run's corpus through its setup hook and answers with the
first document it holds, so its clean and noisy answers are known by hand (right exactly when the
gold passage is first; wrong once distractors are put in front); the built-in ``rag`` gets a
value; closed book, long context and a pipeline with its own index get None with a note; a rerun
does no work.
"""

from __future__ import annotations

import json
import sys
import threading
from base64 import b64encode
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ragbench.analysis import verdict
from ragbench.datasets.corpus.file import corpus_fingerprint
from ragbench.experiment.config.run import NOISE_DISTRACTORS as DISTRACTORS
from ragbench.experiment.noise_pass import distractors, pool
from ragbench.experiment.resources import load_examples
from ragbench.experiment.runner import run
from ragbench.types import Document, Example

# Answers with the first document it was handed (whole: its text holds the gold value or not).
PIPE = """
import json

SETUPS = {setups!r}
HELD = {{}}


def index(documents, corpus):
    HELD["docs"], HELD["corpus"] = list(documents), corpus
    with open(SETUPS, "a") as f:
        f.write(json.dumps({{"corpus": corpus, "ids": [d.id for d in documents]}}) + "\\n")


def first(question, example_id, corpus):
    assert corpus == HELD["corpus"], "asked about another corpus than the one set up"
    doc = HELD["docs"][0]
    return {{"answer": doc.text, "contexts": [{{"text": doc.text, "doc_id": doc.id}}]}}


def own(question):
    return "I only know my own documents"
"""


def config(tmp_path: Path) -> dict:
    return {
        "name": "t-noise",
        "dataset": {
            "name": "multidoc",
            "params": {
                "num_docs": 3,
                "num_examples": 4,
                "gold_position": ["start", "end"],
                "words_per_doc": 40,
            },
        },
        "model": {
            "backend": "fake",
            "name": "fake",
            "preset": "smollm2-135m-instruct",
            "cache": False,
        },
        "retrieval": {"retriever": "bm25"},
        "strategies": [
            "closed_book",
            "long_context",
            {"name": "rag", "params": {"top_k": 2}},
            {
                "name": "pipeline",
                "params": {"target": "firstpipe:first", "setup": "firstpipe:index"},
            },
            {"name": "pipeline", "params": {"target": "firstpipe:own"}},
        ],
        "metrics": ["string_match_all", "noise_sensitivity"],
        "output_dir": str(tmp_path / "results"),
    }


@pytest.fixture
def pipe(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "code"
    folder.mkdir()
    setups = tmp_path / "setups.jsonl"
    (folder / "firstpipe.py").write_text(PIPE.format(setups=str(setups)))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, "firstpipe", raising=False)
    return setups


def test_noise_sensitivity_by_hand(tmp_path, pipe):
    cfg = config(tmp_path)
    df = run(cfg, progress=False)
    assert df["error"].isna().all(), df["error"].dropna().tolist()
    examples = {e.id: e for e in load_examples(cfg)}
    texts = {d.id: d.text for e in examples.values() for d in e.documents}
    setups = [json.loads(line) for line in pipe.read_text().splitlines()]

    mine = df[df.label.str.contains("setup=firstpipe:index")].set_index("example_id")
    assert len(mine) == 8 and (mine["pipeline_index"] == "ragbench corpus").all()
    for ex_id, row in mine.iterrows():
        example = examples[ex_id]
        own_ids = [d.id for d in example.documents]
        gold_first = example.meta["gold_position"] == 0
        # clean: the first document is the gold passage exactly when it is put first
        assert row["string_match_all"] == float(gold_first)
        added = list(row["noise_distractor_ids"])
        assert len(added) == DISTRACTORS and not set(added) & set(own_ids)
        # noisy: the first document is a distractor, which holds no gold answer
        assert row["noise_prediction"] == texts[added[0]] and row["noise_score"] == 0.0
        assert row["noise_sensitivity"] == float(gold_first) - 0.0
        assert row["noise_metric"] == "string_match_all" and row["noise_llm_calls"] == 1
        # the setup hook got exactly the example's documents, then the noisy corpus, once each
        clean_id = corpus_fingerprint(example.documents)
        assert [s["ids"] for s in setups if s["corpus"] == clean_id] == [own_ids]
        noisy = [s["ids"] for s in setups if s["ids"] == added + own_ids]
        assert len(noisy) == 1
    assert len(setups) == 16  # 8 examples, each its own corpus, clean and noisy
    assert mine["noise_sensitivity"].mean() == 0.5  # 4 of 8 had the gold passage first

    rag = df[df.strategy == "rag"]
    assert (
        rag["noise_sensitivity"].notna().all() and rag["noise_prediction"].map(type).eq(str).all()
    )
    assert (rag["noise_prompt_tokens"] > 0).all() and (rag["llm_calls"] == 1).all()
    assert rag["noise_distractor_ids"].map(len).eq(DISTRACTORS).all()
    for label, why in (
        ("closed_book", "reads no documents"),
        ("long_context", "reads the whole context"),
        ("pipeline firstpipe:own", "its own index"),
    ):
        rows = df[df.label.str.startswith(label)]
        assert len(rows) == 8 and rows["noise_sensitivity"].isna().all(), label
        assert rows["noise_note"].str.contains(why).all(), label

    # the verdict's conditions name the pipeline that read its own index, and only that one
    text = str(verdict(df, metric="string_match_all"))
    own_label = df[df.label.str.startswith("pipeline firstpipe:own")]["label"].iloc[0]
    assert f"{own_label} answered from its own index, not the run's documents." in text
    assert "setup=firstpipe:index answered" not in text

    # a rerun does no work: nothing generated, set up, answered again or appended
    records = Path(df.attrs["run_dir"]) / "records.jsonl"
    size = records.stat().st_size
    again = run(cfg, progress=False)
    assert records.stat().st_size == size and len(pipe.read_text().splitlines()) == 16
    manifest = json.loads((Path(again.attrs["run_dir"]) / "manifest.json").read_text())
    assert manifest["sessions"][-1]["pending"] == 0 and manifest["sessions"][-1]["noised"] == 0
    cols = ["example_id", "label", "noise_sensitivity", "noise_prediction"]
    assert again[cols].equals(df[cols])


def test_a_killed_noise_pass_resumes_where_it_stopped(tmp_path):
    cfg = config(tmp_path) | {"strategies": [{"name": "rag", "params": {"top_k": 2}}]}
    first = run(cfg, progress=False)
    records = Path(first.attrs["run_dir"]) / "records.jsonl"
    lines = records.read_text().splitlines(keepends=True)
    assert len(lines) == 16  # 8 generated, 8 appended again with their noise score
    records.write_text("".join(lines[:11]))  # killed after three noisy answers
    again = run(cfg, progress=False)
    assert len(records.read_text().splitlines()) == 16  # only the five missing were redone
    cols = ["example_id", "noise_sensitivity", "noise_prediction", "noise_distractor_ids"]
    assert again[cols].equals(first[cols])


def test_the_distractor_count_is_a_config_key(tmp_path):
    from ragbench.experiment.config.run import config_hash, load_config

    cfg = config(tmp_path) | {"strategies": [{"name": "rag", "params": {"top_k": 2}}]}
    assert config_hash(load_config(cfg)) == config_hash(load_config(cfg | {"noise_distractors": 5}))
    two = cfg | {"noise_distractors": 2}
    assert config_hash(load_config(two)) != config_hash(load_config(cfg))  # other answers
    plain = cfg | {"metrics": ["string_match_all"]}  # no noise metric: the count changes nothing
    assert config_hash(load_config(plain | {"noise_distractors": 2})) == config_hash(
        load_config(plain)
    )
    df = run(two, progress=False)
    assert df["noise_distractor_ids"].map(len).eq(2).all() and (df["noise_distractors"] == 2).all()
    with pytest.raises(Exception, match="noise_distractors"):
        load_config(cfg | {"noise_distractors": 0})


def test_distractors_are_other_examples_documents_without_the_answer():
    docs = [Document(f"d{i}", f"passage {i}" + (" holds 42" if i == 3 else "")) for i in range(8)]
    example = Example("q1", "?", ("42",), (docs[0], docs[1]))
    drawn = distractors(example, pool([example, Example("q2", "?", ("7",), tuple(docs))]), 4, 0)
    ids = [d.id for d in drawn]
    assert len(ids) == 4 and not {"d0", "d1", "d3"} & set(ids)  # own, and the one with "42"
    assert distractors(example, docs, 4, 0) == drawn  # seeded: the same draw every time
    others = {tuple(d.id for d in distractors(example, docs, 4, s)) for s in range(6)}
    assert len(others) > 1  # the seed matters
    assert distractors(example, docs[:2], 4, 0) == []  # nothing outside its corpus


class FirstDocService(BaseHTTPRequestHandler):
    """The `first` pipeline over HTTP: POST /setup keeps each corpus by id, POST /answer answers
    with the first document of the corpus it names; both refuse a request without the URL's
    credentials (which records never store)."""

    corpora: dict = {}

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.send_response(405)
        self.end_headers()

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.headers.get("Authorization") != "Basic " + b64encode(b"me:pw-noise-24").decode():
            self.send_response(401)
            self.end_headers()
            return
        if self.path == "/setup":
            FirstDocService.corpora[body["corpus"]] = body["documents"]
            data = b""
        else:
            data = json.dumps(
                {"answer": FirstDocService.corpora[body["corpus"]][0]["text"]}
            ).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_a_resumed_noise_pass_calls_an_endpoint_as_configured(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), FirstDocService)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://me:pw-noise-24@127.0.0.1:{server.server_address[1]}"
    params = {"url": base + "/answer", "setup_url": base + "/setup", "version": "1", "retries": 0}
    cfg = config(tmp_path) | {"strategies": [{"name": "pipeline", "params": params}]}
    try:
        first = run(cfg, progress=False)
        records = Path(first.attrs["run_dir"]) / "records.jsonl"
        lines = records.read_text().splitlines(keepends=True)
        records.write_text("".join(lines[:8]))  # the noise pass never ran
        again = run(cfg, progress=False)  # its params are the config's: credentials included
    finally:
        server.shutdown()
        server.server_close()
    assert "noise_error" not in again.columns or again["noise_error"].isna().all()
    assert "pw-noise-24" not in records.read_text()
    gold_first = again["example_id"].str.contains("-P0-").astype(float)
    assert (again["noise_sensitivity"] == gold_first).all()
    cols = ["example_id", "noise_sensitivity", "noise_prediction"]
    assert again[cols].equals(first[cols])


def test_noise_sensitivity_gets_a_bootstrap_interval_even_when_every_value_is_0_or_1():
    """A difference of scores can be negative: Wilson's interval (a proportion's) is wrong."""
    import pandas as pd

    from ragbench.metrics.answer import aggregate

    df = pd.DataFrame(
        {
            "label": ["rag"] * 6,
            "noise_sensitivity": [0.0, 1.0, 0.0, 0.0, 1.0, 0.0],
            "string_match_all": [0.0, 1.0, 0.0, 0.0, 1.0, 0.0],
        }
    )
    [noise] = aggregate(df, ["label"], "noise_sensitivity").to_dict("records")
    [plain] = aggregate(df, ["label"], "string_match_all").to_dict("records")
    assert noise["ci_method"] == "bootstrap" and plain["ci_method"] == "wilson"
    assert noise["mean"] == plain["mean"] == pytest.approx(1 / 3)
