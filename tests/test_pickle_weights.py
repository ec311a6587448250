"""Pickle-based ``.bin`` weights are refused for embedders and cross-encoders as they are for the
LLM (unpickling can run code hidden in the file), before anything loads, with the same opt-in
(``allow_pickle_weights``). The planted file would touch a marker if it were ever unpickled."""

from __future__ import annotations

import pathlib
import pickle
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ragbench.cli import app
from ragbench.experiment.config.run import load_config
from ragbench.experiment.config.text import ConfigError
from ragbench.retrieval.embedders.base import get_embedder
from ragbench.retrieval.retrievers import BM25Retriever, RerankRetriever
from ragbench.types import Chunk


class Planted:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.touch, (self.marker,)


def planted_folder(root: Path, sub: str = "") -> tuple[Path, Path]:
    """(a model folder whose only weights are a pickle, the marker that pickle would touch)."""
    folder = root / "planted-model"
    marker = root / "UNPICKLED"
    target = folder / sub if sub else folder
    target.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text("{}")
    (target / "pytorch_model.bin").write_bytes(pickle.dumps(Planted(marker)))
    return folder, marker


def test_an_embedder_folder_of_pickle_weights_is_refused(tmp_path):
    folder, marker = planted_folder(tmp_path)
    with pytest.raises(ValueError) as info:
        get_embedder(str(folder))
    msg = str(info.value)
    assert msg.startswith(f"embedder {folder} has weights only as pickle files (pytorch_model.bin)")
    assert "allow_pickle_weights: true" in msg and "embedder_params" in msg and "\n" not in msg
    assert get_embedder(str(folder), allow_pickle_weights=True).label == "planted-model"
    assert not marker.exists()


def test_a_module_folder_of_pickle_weights_is_refused_too(tmp_path):
    folder, marker = planted_folder(tmp_path, sub="2_Dense")
    (folder / "model.safetensors").write_bytes(b"")  # the root is safe, its Dense module is not
    with pytest.raises(ValueError, match=r"pickle files \(2_Dense/pytorch_model.bin\)"):
        get_embedder(str(folder))
    assert not marker.exists()


def test_a_cross_encoder_folder_of_pickle_weights_is_refused(tmp_path):
    folder, marker = planted_folder(tmp_path)
    base = BM25Retriever([Chunk(id="c0", doc_id="d0", text="a tide table", start=0, end=12)])
    with pytest.raises(ValueError) as info:
        RerankRetriever(base, str(folder))
    assert str(info.value).startswith(f"cross-encoder {folder} has weights only as pickle files")
    assert "retriever_params.allow_pickle_weights: true" in str(info.value)
    RerankRetriever(base, str(folder), allow_pickle_weights=True)  # trusted: built (lazy load)
    assert not marker.exists()


CONFIG = """\
name: t
dataset:
  name: niah
  params: {{context_lengths: [400], tokenizer: whitespace}}
model: {{backend: fake, name: fake}}
retrieval:
  embedder: {embedder}
  tokenizer: whitespace
{extra}strategies: [rag]
"""


def test_the_config_refuses_them_before_a_run_folder_exists(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder, marker = planted_folder(tmp_path)
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG.format(embedder=folder, extra=""))
    with pytest.raises(ConfigError, match=rf"^{path}:6: retrieval: embedder {folder} has weights"):
        load_config(path)
    result = CliRunner().invoke(app, ["run", str(path)])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert "allow_pickle_weights" in result.output and not (tmp_path / "data").exists()
    trusted = f"  embedder_params: {{{folder}: {{allow_pickle_weights: true}}}}\n"
    path.write_text(CONFIG.format(embedder=folder, extra=trusted))
    load_config(path)
    rerank = f"  retriever: rerank\n  retriever_params: {{cross_encoder: {folder}}}\n"
    path.write_text(CONFIG.format(embedder="hash", extra=rerank))
    with pytest.raises(ConfigError, match=rf"retrieval: cross-encoder {folder} has weights only"):
        load_config(path)
    rerank = rerank.replace("}\n", ", allow_pickle_weights: true}\n")
    path.write_text(CONFIG.format(embedder="hash", extra=rerank))
    load_config(path)
    assert not marker.exists()
