"""The benchmark suites added for RULER and the local Hugging Face importer on the embedded model.

One slow test: SmolLM2-135M (offline) answers one example of each of ``ruler/fwe``,
``ruler/cwe`` (with its worked example), ``ruler/qa_1`` (SQuAD), ``ruler/qa_2`` (HotpotQA) and a
``save_to_disk`` folder imported by ``hf``, with closed book, long context and RAG on the same
example: every record is generated without error, long context reads the document (its prompt
is the longest) and RAG reads less of it. LongBench v2 and FlashRAG have their own slow tests
(test_official_prompts.py, test_importers_v2.py); RULER's NIAH presets, test_ruler_qa.py.
"""

from __future__ import annotations

import pytest
from test_importers_v2 import SQUAD_ROWS, save_to_disk
from test_ruler_qa import hotpot_file, squad_file

from ragbench.experiment.config.run import load_config
from ragbench.experiment.resources import load_model
from ragbench.experiment.runner import run

MODEL = {
    "backend": "hf",
    "name": "smollm2-135m-instruct",
    "max_new_tokens": 24,
    "cache": False,
    "threads": 1,
}


@pytest.mark.slow
def test_new_suites_run_on_the_embedded_model(tmp_path):
    one = {"num_examples": 1}
    datasets = {
        "ruler/fwe": {"context_lengths": [800], **one},
        "ruler/cwe": {"context_lengths": [1200], **one},
        "ruler/qa_1": {"path": str(squad_file(tmp_path)), "context_lengths": [600], **one},
        "ruler/qa_2": {"path": str(hotpot_file(tmp_path)), "context_lengths": [1200], **one},
        "hf": {
            "path": str(save_to_disk(tmp_path / "squad", SQUAD_ROWS[:1])),
            "question": "question",
            "answers": "answers.text",
            "context": "context",
        },
    }
    llm = None
    for name, params in datasets.items():
        cfg = load_config(
            {
                "name": name.replace("/", "-"),
                "dataset": {"name": name, "params": params},
                "model": MODEL,
                "retrieval": {"retriever": "bm25", "chunk_size": 64, "chunk_overlap": 8},
                "strategies": [
                    "closed_book",
                    "long_context",
                    {"name": "rag", "params": {"top_k": 2}},
                ],
                "metrics": ["string_match_all", "string_match_part"],
                "output_dir": str(tmp_path / "results"),
            }
        )
        llm = llm or load_model(cfg.model)  # one model for every dataset
        df = run(cfg, progress=False, llm=llm)
        assert len(df) == 3 and df["error"].isna().all(), (name, df["error"].tolist())
        assert df["example_id"].nunique() == 1, name  # the same example for each strategy
        tokens = df.set_index("strategy")["prompt_tokens"]
        assert tokens["long_context"] > tokens["rag"] > tokens["closed_book"], (name, tokens)
        assert (df["completion_tokens"] > 0).all(), name
