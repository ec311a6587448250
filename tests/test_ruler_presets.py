"""RULER's 13 named configurations: RULER's own values, the generators they drive, fwe, the
names accepted by `data`, configs and `list`, and the RULER-layout table."""

from __future__ import annotations

import inspect
import math
import re
from collections import Counter

import pandas as pd
import pytest

from ragbench.analysis.ruler import ALL_TASKS, AVERAGE, ruler_table, ruler_text
from ragbench.datasets import DATASETS, RULER_PRESETS, build_dataset, check_params
from ragbench.datasets._validate import DatasetParamError
from ragbench.datasets.ruler.fwe import NOISE_WORD, iter_fwe, zeta, zeta_counts
from ragbench.datasets.ruler.presets import (
    PRESETS,
    RULER_COMMIT,
    SOURCE,
    TASK_FACTS,
    dataset_name,
    iter_preset,
)
from ragbench.datasets.ruler.tasks import CWE_INSTRUCTION, build

WS = "whitespace"

# The oracle: scripts/synthetic.yaml of NVIDIA/RULER, copied verbatim (same commit as the module
# cites): https://github.com/NVIDIA/RULER/blob/c3f5e3b4f87f97e048793bb510a3a6b19a46bf3a/scripts/synthetic.yaml
ORACLE_COMMIT = "c3f5e3b4f87f97e048793bb510a3a6b19a46bf3a"
SYNTHETIC_YAML = {
    "niah_single_1": {
        "task": "niah",
        "args": {
            "type_haystack": "noise",
            "type_needle_k": "words",
            "type_needle_v": "numbers",
            "num_needle_k": 1,
            "num_needle_v": 1,
            "num_needle_q": 1,
        },
    },
    "niah_single_2": {
        "task": "niah",
        "args": {
            "type_haystack": "essay",
            "type_needle_k": "words",
            "type_needle_v": "numbers",
            "num_needle_k": 1,
            "num_needle_v": 1,
            "num_needle_q": 1,
        },
    },
    "niah_single_3": {
        "task": "niah",
        "args": {
            "type_haystack": "essay",
            "type_needle_k": "words",
            "type_needle_v": "uuids",
            "num_needle_k": 1,
            "num_needle_v": 1,
            "num_needle_q": 1,
        },
    },
    "niah_multikey_1": {
        "task": "niah",
        "args": {
            "type_haystack": "essay",
            "type_needle_k": "words",
            "type_needle_v": "numbers",
            "num_needle_k": 4,
            "num_needle_v": 1,
            "num_needle_q": 1,
        },
    },
    "niah_multikey_2": {
        "task": "niah",
        "args": {
            "type_haystack": "needle",
            "type_needle_k": "words",
            "type_needle_v": "numbers",
            "num_needle_k": 1,
            "num_needle_v": 1,
            "num_needle_q": 1,
        },
    },
    "niah_multikey_3": {
        "task": "niah",
        "args": {
            "type_haystack": "needle",
            "type_needle_k": "uuids",
            "type_needle_v": "uuids",
            "num_needle_k": 1,
            "num_needle_v": 1,
            "num_needle_q": 1,
        },
    },
    "niah_multivalue": {
        "task": "niah",
        "args": {
            "type_haystack": "essay",
            "type_needle_k": "words",
            "type_needle_v": "numbers",
            "num_needle_k": 1,
            "num_needle_v": 4,
            "num_needle_q": 1,
        },
    },
    "niah_multiquery": {
        "task": "niah",
        "args": {
            "type_haystack": "essay",
            "type_needle_k": "words",
            "type_needle_v": "numbers",
            "num_needle_k": 1,
            "num_needle_v": 1,
            "num_needle_q": 4,
        },
    },
    "vt": {
        "task": "variable_tracking",
        "args": {"type_haystack": "noise", "num_chains": 1, "num_hops": 4},
    },
    "cwe": {
        "task": "common_words_extraction",
        "args": {"freq_cw": 30, "freq_ucw": 3, "num_cw": 10},
    },
    "fwe": {"task": "freq_words_extraction", "args": {"alpha": 2.0}},
    "qa_1": {"task": "qa", "args": {"dataset": "squad"}},
    "qa_2": {"task": "qa", "args": {"dataset": "hotpotqa"}},
}
# scripts/data/synthetic/constants.py (tokens_to_generate) and scripts/eval/synthetic/constants.py
# (metric_fn) at the same commit
ORACLE_TASKS = {
    "niah": (128, "string_match_all"),
    "variable_tracking": (30, "string_match_all"),
    "common_words_extraction": (120, "string_match_all"),
    "freq_words_extraction": (50, "string_match_all"),
    "qa": (32, "string_match_part"),
}
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
NEEDLE = re.compile(r"One of the special magic (\w+) for (\S+) is: (\S+)\.")


def test_presets_equal_rulers_synthetic_yaml():
    assert RULER_COMMIT == ORACLE_COMMIT and ORACLE_COMMIT in SOURCE
    assert tuple(PRESETS) == tuple(SYNTHETIC_YAML) == RULER_PRESETS  # RULER's order, all 13
    for name, entry in SYNTHETIC_YAML.items():
        preset = PRESETS[name]
        assert (preset.task, preset.args) == (entry["task"], entry["args"]), name
        assert (preset.tokens_to_generate, preset.metric) == ORACLE_TASKS[entry["task"]], name
    assert TASK_FACTS == ORACLE_TASKS


def test_preset_parameters_are_the_generators_defaults():
    sig = inspect.signature(DATASETS.get("ruler/niah_single_3"))
    defaults = {k: p.default for k, p in sig.parameters.items()}
    assert defaults["value_type"] == "uuids" and defaults["haystack"] == "essays"
    assert inspect.signature(DATASETS.get("ruler/fwe")).parameters["alpha"].default == 2.0
    assert inspect.signature(DATASETS.get("ruler/qa_2")).parameters["format"].default == "hotpotqa"
    with pytest.raises(ValueError, match="did you mean 'num_keys'"):
        check_params("ruler/niah_multikey_1", {"num_kyes": 2})


@pytest.mark.parametrize(
    ("name", "foreign"),
    [
        ("ruler/niah_single", "num_hops"),
        ("ruler/niah_single", "freq_cw"),
        ("ruler/vt", "value_type"),
        ("ruler/vt", "haystack"),
        ("ruler/variable_tracking", "num_keys"),
        ("ruler/common_words", "haystack"),
        ("ruler/cwe", "num_hops"),
        ("ruler/niah_single_1", "num_chains"),
    ],
)
def test_a_task_refuses_the_parameters_only_other_tasks_read(name, foreign):
    with pytest.raises(ValueError, match=f"unknown parameter '{foreign}'") as err:
        check_params(name, {foreign: 3})
    valid = str(err.value).split("valid: ")[1].split(", ")
    assert foreign not in valid and "seed" in valid  # this task's parameters, not every task's


def test_a_task_called_directly_refuses_other_tasks_parameters():
    with pytest.raises(DatasetParamError, match="'num_hops': not read by ruler/niah_single"):
        build("niah_single", context_lengths=[600], num_examples=1, tokenizer=WS, num_hops=3)


# (preset, haystack, key pattern, value pattern, answers, keys in the context)
NIAH = [
    ("niah_single_1", "noise", r"[a-z]+-[a-z]+", r"\d{7}", 1, 1),
    ("niah_single_2", "essays", r"[a-z]+-[a-z]+", r"\d{7}", 1, 1),
    ("niah_single_3", "essays", r"[a-z]+-[a-z]+", UUID, 1, 1),
    ("niah_multikey_1", "essays", r"[a-z]+-[a-z]+", r"\d{7}", 1, 4),
    ("niah_multikey_2", "needles", r"[a-z]+-[a-z]+", r"\d{7}", 1, None),  # many filler needles
    ("niah_multikey_3", "needles", UUID, UUID, 1, None),
    ("niah_multivalue", "essays", r"[a-z]+-[a-z]+", r"\d{7}", 4, 4),
    ("niah_multiquery", "essays", r"[a-z]+-[a-z]+", r"\d{7}", 4, 4),
]


@pytest.mark.parametrize(("name", "haystack", "key", "value", "n_answers", "n_needles"), NIAH)
def test_niah_presets_build_rulers_configuration(name, haystack, key, value, n_answers, n_needles):
    [e] = build_dataset(f"ruler/{name}", context_lengths=[700], num_examples=1, tokenizer=WS)
    assert e.id == f"ruler-{name}-L700-0000" and e.meta["task"] == f"ruler/{name}"
    assert e.documents[0].id == f"{e.id}/context"
    assert all(d == e.documents[0].id for d, _, _ in e.meta["evidence"])
    assert e.meta["haystack"] == haystack and e.meta["tokens_to_generate"] == 128
    assert e.meta["ruler_metric"] == "string_match_all"
    assert len(e.answers) == n_answers and all(re.fullmatch(value, a) for a in e.answers)
    needles = NEEDLE.findall(e.documents[0].text)
    assert all(re.fullmatch(key, k) and re.fullmatch(value, v) for _, k, v in needles)
    if n_needles is not None:
        assert len(needles) == n_needles
    else:
        assert len(needles) > 5  # the haystack is needles with other keys
    assert e.meta["context_tokens"] <= 700 - 200


def test_vt_and_cwe_presets_and_rulers_short_context_frequencies():
    [vt] = build_dataset("ruler/vt", context_lengths=[600], num_examples=1, tokenizer=WS)
    assert vt.meta["haystack"] == "noise" and len(vt.answers) == 5  # 1 chain of 4 hops
    assert vt.meta["chains"] == 1 and vt.meta["tokens_to_generate"] == 30

    def counts(example):  # in the list asked about: after the worked example
        listing = example.documents[0].text.rsplit(CWE_INSTRUCTION + "\n", 1)[1]
        words = Counter(re.findall(r"\d+\. ([a-z]+)", listing))
        return {words[a] for a in example.answers}, set(words.values()) - {
            words[example.answers[0]]
        }

    short, long = build_dataset(
        "ruler/cwe", context_lengths=[1000, 4096], num_examples=1, tokenizer=WS
    )
    assert len(short.answers) == len(long.answers) == 10
    assert counts(short) == ({6}, {1})  # below 4096 tokens RULER uses 6x and 1x
    assert counts(long) == ({30}, {3})  # synthetic.yaml's freq_cw and freq_ucw
    [chosen] = build_dataset(
        "ruler/cwe", context_lengths=[1000], num_examples=1, tokenizer=WS, freq_cw=8
    )
    assert counts(chosen) == ({8}, {1})  # an explicit value wins; the other stays RULER's


def test_cwe_has_rulers_worked_example_in_front_of_the_list():
    [e] = build_dataset("ruler/cwe", context_lengths=[1000], num_examples=1, tokenizer=WS)
    text = e.documents[0].text
    shot, real = text.split("\n" + CWE_INSTRUCTION + "\n")
    # RULER's few-shot block: the template around a short list, its question, the answer
    assert shot.startswith(CWE_INSTRUCTION + "\n1. ")
    listing, answer = shot.split(
        "\nQuestion: What are the 10 most common words in the above list? Answer: The top 10 "
        "words that appear most often in the list are: "
    )
    common = re.findall(r"\d+\. ([a-z]+)", answer)
    assert answer == " ".join(f"{i + 1}. {w}" for i, w in enumerate(common)) and len(common) == 10
    worked = Counter(re.findall(r"\d+\. ([a-z]+)", listing))
    assert len(worked) == 20 and {worked[w] for w in common} == {3}  # below 4096: 20 words, 3x/1x
    assert set(worked.values()) == {3, 1}
    # the evidence spans still point at the common words of the real list, after the example
    assert {text[s:t] for _, s, t in e.meta["evidence"]} == set(e.answers)
    assert min(s for _, s, _ in e.meta["evidence"]) > len(shot)
    assert e.meta["context_tokens"] <= 1000 - 200 and e.meta["context_tokens"] > 1000 - 200 - 40
    assert e.meta["worked_examples"] == 1 and e.meta["final_context_length_buffer"] == 200
    [long] = build_dataset("ruler/cwe", context_lengths=[4096], num_examples=1, tokenizer=WS)
    shot = long.documents[0].text.split("\n" + CWE_INSTRUCTION + "\n")[0]
    assert len(set(re.findall(r"\d+\. ([a-z]+)", shot))) == 40  # from 4096: 40 words, 10x/3x
    [none] = build_dataset(
        "ruler/cwe", context_lengths=[1000], num_examples=1, tokenizer=WS, num_fewshot=0
    )
    assert none.documents[0].text.startswith(CWE_INSTRUCTION + "\n1. ")
    with pytest.raises(DatasetParamError, match="the worked example takes .* or num_fewshot: 0"):
        build_dataset("ruler/cwe", context_lengths=[400], num_examples=1, tokenizer=WS)
    # the generic task keeps its plain list
    [plain] = build_dataset(
        "ruler/common_words", context_lengths=[1000], num_examples=1, tokenizer=WS
    )
    assert (
        plain.documents[0].text.startswith("1. ") and CWE_INSTRUCTION not in plain.documents[0].text
    )


def test_zeta_and_counts_hand_checked():
    assert zeta(2.0) == pytest.approx(math.pi**2 / 6, abs=1e-12)
    assert zeta(4.0) == pytest.approx(math.pi**4 / 90, abs=1e-12)
    # floor(100 * k^-2 / 1.6449...): 60.8, 15.2, 6.75, 3.80, 2.43, 1.69, 1.24, 0.95
    assert zeta_counts(100, 8, 2.0) == [60, 15, 6, 3, 2, 1, 1, 0]


def test_fwe_tiny_seeded_example_hand_checked():
    """60 whitespace tokens, 5 words: N=72 words fit (N=73 gives 44+11+4+2+1 = 62 > 60) and
    floor(72 k^-2 / zeta(2)) = 43, 10, 4, 2, 1; the answer is ranks 2-4, the noise excluded."""
    [e] = iter_fwe(context_lengths=[260], num_examples=1, tokenizer=WS, vocab_size=5)
    text = e.documents[0].text
    counts = Counter(text.split())
    assert e.meta["num_words"] == 72 and e.meta["context_tokens"] == 60 == len(text.split())
    assert sorted(counts.values(), reverse=True) == [43, 10, 4, 2, 1]
    assert counts[NOISE_WORD] == 43
    top3 = [w for w, _ in counts.most_common() if w != NOISE_WORD][:3]
    assert list(e.answers) == top3 and [counts[w] for w in top3] == [10, 4, 2]
    assert all(re.fullmatch(r"[a-z]{6}", w) for w in e.answers)
    spans = [text[s:end] for _, s, end in e.meta["evidence"]]
    assert len(spans) == 16 and Counter(spans) == {w: counts[w] for w in top3}
    assert e.meta["ruler_metric"] == "string_match_all" and e.meta["tokens_to_generate"] == 50


def test_fwe_preset_sizes_and_determinism():
    first = build_dataset("ruler/fwe", context_lengths=[1200], num_examples=2, tokenizer=WS)
    again = build_dataset("ruler/fwe", context_lengths=[1200], num_examples=2, tokenizer=WS)
    assert first == again and first[0].answers != first[1].answers
    for e in first:
        assert e.id.startswith("ruler-fwe-L1200-") and e.meta["vocab_size"] == (1200 - 50) // 50
        assert 1000 - 10 <= e.meta["context_tokens"] <= 1000
        counts = Counter(e.documents[0].text.split())
        assert [w for w, _ in counts.most_common(4)][1:] == list(e.answers)
    other = build_dataset("ruler/fwe", context_lengths=[1200], num_examples=1, tokenizer=WS, seed=7)
    assert other[0].answers != first[0].answers


def test_fwe_refuses_a_context_without_a_distinct_top_three():
    with pytest.raises(ValueError, match="no distinct top three"):
        list(iter_fwe(context_lengths=[220], num_examples=1, tokenizer=WS, vocab_size=6))
    with pytest.raises(DatasetParamError, match="'alpha'"):
        list(iter_fwe(context_lengths=[600], tokenizer=WS, alpha=1.0))
    with pytest.raises(DatasetParamError, match="vocabulary of 3 words"):
        list(iter_fwe(context_lengths=[210], final_context_length_buffer=10, tokenizer=WS))


def test_names_accepted_by_the_registry_and_configs():
    from ragbench.experiment.config.sections import DatasetConfig

    for name in [
        "ruler/niah_multikey",
        "ruler/niah_single_1",
        "ruler/vt",
        "ruler/qa",
        "ruler/qa_1",
    ]:
        assert DatasetConfig(name=name, params={"context_lengths": [600]}).name == name
        assert dataset_name(name) == dataset_name(name.removeprefix("ruler/")) == name
    with pytest.raises(ValueError, match="did you mean 'ruler/niah_single_1'"):
        DatasetConfig(name="ruler/niah_singel_1")
    with pytest.raises(KeyError, match="did you mean 'niah_single_1'"):
        dataset_name("niah_singel_1")
    with pytest.raises(KeyError, match="unknown RULER preset"):
        list(iter_preset("niah"))


def test_list_data_and_configs_share_the_names(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from ragbench.cli import app
    from ragbench.cli.listing import entries

    listed = dict(entries("datasets"))
    for name in RULER_PRESETS:
        assert listed[f"ruler/{name}"].startswith(f"RULER {name}:"), listed[f"ruler/{name}"]
    assert "ruler/niah_multikey" in listed and "ruler/qa" in listed
    assert "repeated noise" in listed["ruler/niah_single_1"]
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    for task in ["ruler/niah_multikey", "ruler/niah_single_3", "vt", "ruler/fwe"]:
        args = ["data", "ruler", task, "--context-lengths", "700", "--num-examples", "1"]
        result = runner.invoke(app, [*args, "--tokenizer", WS, "--out", "x.jsonl"])
        assert result.exit_code == 0, result.output
        short = task.removeprefix("ruler/")
        assert f'"task":"ruler/{short}"' in (tmp_path / "x.jsonl").read_text()
    result = runner.invoke(
        app,
        [
            "data",
            "ruler",
            "niah_single_3",
            "--context-lengths",
            "700",
            "--num-examples",
            "1",
            "--tokenizer",
            WS,
            "--out",
            "u.jsonl",
        ],
    )
    assert result.exit_code == 0 and re.search(UUID, (tmp_path / "u.jsonl").read_text())
    result = runner.invoke(app, ["data", "ruler", "ruler/niah_singel_1"])
    assert result.exit_code == 2 and "did you mean 'niah_single_1'" in result.output
    result = runner.invoke(app, ["data", "ruler", "qa_1", "--tokenizer", WS])
    assert result.exit_code == 2 and "'path'" in result.output and "SQuAD" in result.output


def _table_rows():
    rows = []
    for label in ["long_context", "rag"]:
        for task, metric in [
            ("ruler/niah_single_1", "string_match_all"),
            ("ruler/qa_1", "string_match_part"),
        ]:
            for length in [1024, 2048]:
                for i in range(2):
                    rows.append(
                        {
                            "label": label,
                            "strategy": label,
                            "params": "{}",
                            "task": task,
                            "context_length": length,
                            "ruler_metric": metric,
                            "error": None,
                            "string_match_all": 0.25 * i,
                            "string_match_part": float(length == 1024),
                        }
                    )
    rows[-1]["error"], rows[-1]["string_match_part"] = "timeout", float("nan")
    return pd.DataFrame(rows)


def test_ruler_table_layout_and_per_task_metric():
    table = ruler_table(_table_rows())
    assert list(table.columns) == [1024, 2048, AVERAGE]
    assert list(table.index) == [
        ("long_context", "niah_single_1"),
        ("long_context", "qa_1"),
        ("long_context", ALL_TASKS),
        ("rag", "niah_single_1"),
        ("rag", "qa_1"),
        ("rag", ALL_TASKS),
    ]
    lc = table.loc["long_context"]
    assert lc.loc["niah_single_1"].tolist() == [12.5, 12.5, 12.5]  # string_match_all, in %
    assert lc.loc["qa_1"].tolist() == [100.0, 0.0, 50.0]  # string_match_part
    assert lc.loc[ALL_TASKS].tolist() == [56.25, 6.25, 31.25]
    assert "1 records without a score" in table.attrs["notes"][0]
    same = ruler_table(_table_rows(), metric="string_match_all")
    assert same.loc[("long_context", "qa_1"), 1024] == 12.5
    with pytest.raises(ValueError, match="add it to the config's metrics"):
        ruler_table(_table_rows().drop(columns="string_match_part"))
    with pytest.raises(ValueError, match="no 'task' column"):
        ruler_table(_table_rows().drop(columns="task"))


def test_ruler_table_rows_follow_rulers_order():
    # niah_multivalue and fwe are both presets and generic tasks: their place is the preset's
    tasks = ["ruler/qa_1", "ruler/fwe", "ruler/niah_multivalue", "ruler/vt", "ruler/niah_single_1"]
    rows = [
        {
            "label": "lc",
            "strategy": "lc",
            "params": "{}",
            "task": t,
            "context_length": 1024,
            "ruler_metric": "string_match_all",
            "error": None,
            "string_match_all": 1.0,
        }
        for t in tasks
    ]
    table = ruler_table(pd.DataFrame(rows))
    assert [t for _, t in table.index][:-1] == [
        "niah_single_1",
        "niah_multivalue",
        "vt",
        "fwe",
        "qa_1",
    ]  # RULER's synthetic.yaml order


def test_ruler_text_prints_every_score_with_two_decimals():
    rows = [
        {
            "label": "lc",
            "strategy": "lc",
            "params": "{}",
            "task": "ruler/niah_single_1",
            "context_length": n,
            "ruler_metric": "string_match_all",
            "error": None,
            "string_match_all": score,
        }
        for n, scores in ((600, [1.0, 1.0]), (1200, [1.0, 0.875]))
        for score in scores
    ]
    table = ruler_table(pd.DataFrame(rows))
    text = ruler_text(table)
    [row] = [line for line in text.splitlines() if "niah_single_1" in line]
    assert row.split()[-3:] == ["100.00", "93.75", "96.88"]  # not 100.0 beside 93.75
    assert text.splitlines()[-1] == table.attrs["notes"][0]
