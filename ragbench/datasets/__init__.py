"""Datasets: generators (NIAH, RULER tasks, lost-in-the-middle multi-doc QA) and file importers.

``build_dataset(name, **params) -> list[Example]`` is what the experiment runner calls. Names are
lazy registry entries, so importing this package loads no generator, tokenizer or word list.

``corpus`` is the shared-corpus shape: a corpus file (``ragbench data docs``) and a questions
file, every question over the same documents (``datasets.shared_corpus``).

Add a dataset: write a module with a ``build(**params) -> list[Example]`` function whose
examples carry ``meta["task"]`` and ``meta["evidence"]`` spans, then register it below.
"""

from __future__ import annotations

import inspect

from ragbench.registry import Registry, UnknownNameError, did_you_mean
from ragbench.types import Example

RULER_TASKS = (
    "niah_single",
    "niah_multikey",
    "niah_multivalue",
    "niah_multiquery",
    "variable_tracking",
    "common_words",
)
# RULER's 13 named task configurations (``ruler_presets``: its synthetic.yaml, with RULER's
# defaults); three share a name with a task above and replace it with identical defaults
RULER_PRESETS = (
    "niah_single_1",
    "niah_single_2",
    "niah_single_3",
    "niah_multikey_1",
    "niah_multikey_2",
    "niah_multikey_3",
    "niah_multivalue",
    "niah_multiquery",
    "vt",
    "cwe",
    "fwe",
    "qa_1",
    "qa_2",
)

DATASETS = Registry(
    "dataset",
    {
        "niah": "ragbench.datasets.niah:build",
        "multidoc": "ragbench.datasets.multidoc:build",
        "file": "ragbench.datasets.formats:load_file",
        "corpus": "ragbench.datasets.corpus.shared:build",
        # importers of public suites' own files (also `ragbench data import NAME`)
        "longbench-v2": "ragbench.datasets.longbench_v2:build",
        "flashrag": "ragbench.datasets.flashrag:build",
        "hf": "ragbench.datasets.hf_local:load_hf",
        **{f"ruler/{task}": f"ragbench.datasets.ruler.tasks:{task}" for task in RULER_TASKS},
        "ruler/qa": "ragbench.datasets.ruler.qa:build",
        **{f"ruler/{name}": f"ragbench.datasets.ruler.presets:{name}" for name in RULER_PRESETS},
    },
    descriptions={
        f"ruler/{task}": f"RULER-style {task} task, every parameter open (RULER's own: the presets)"
        for task in RULER_TASKS
        if task not in RULER_PRESETS
    },
)


class UnknownParamError(ValueError):
    """A parameter dataset ``name`` does not take; ``key`` names it (a config reports it at
    ``dataset.params.<key>``)."""

    def __init__(self, name: str, key: str, valid: list[str]):
        super().__init__(f"dataset {name!r}: unknown parameter {key!r}; {did_you_mean(key, valid)}")
        self.key = key


def check_params(name: str, params: dict[str, object]) -> None:
    """Raise ValueError naming the valid parameters when ``params`` don't fit dataset ``name``."""
    fn = DATASETS.get(name)
    sig = inspect.signature(fn)  # follows __wrapped__ to the generator's real signature
    valid = [
        n for n, p in sig.parameters.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    open_ended = len(valid) < len(sig.parameters)  # e.g. "file": options go to the importer
    for key in params:
        if key not in valid and not open_ended:
            raise UnknownParamError(name, key, valid)
    try:
        sig.bind(**params)
    except TypeError as exc:
        raise ValueError(f"dataset {name!r}: {exc}; parameters: {', '.join(valid)}") from None


# what ``ragbench data import FORMAT`` writes for a format that is not a dataset of its own
_IMPORTED_AS = {"beir": "{name: corpus, params: {corpus: ..., questions: ...}}"}


def check_name(name: str) -> str:
    """``name`` if it is a dataset; else a did-you-mean error, which for a file format that is
    not a dataset (``longbench``, ``ruler``, ``squad``...) says how its files run: dataset
    ``file``, as ``ragbench data import`` wrote them or as shipped, with ``format``."""
    from ragbench.datasets.formats import IMPORTERS  # lazy: loads no importer on import

    if name in DATASETS or name not in IMPORTERS:
        return DATASETS.check(name)
    imported = _IMPORTED_AS.get(name, "{name: file, params: {path: OUT.jsonl}}")
    raise UnknownNameError(
        f"unknown dataset {name!r}: {name} is a file format, not a dataset; run what "
        f"`ragbench data import {name}` wrote as the dataset it printed ({imported}), or the "
        f"original file as {{name: file, params: {{path: FILE, format: {name}}}}}"
    )


def build_dataset(name: str, **params: object) -> list[Example]:
    """Build (or load) dataset ``name`` with ``params``; unknown names list the valid ones."""
    check_params(name, params)
    return list(DATASETS.get(name)(**params))


def dataset_names() -> list[str]:
    return DATASETS.names()


__all__ = [
    "DATASETS",
    "RULER_PRESETS",
    "RULER_TASKS",
    "UnknownParamError",
    "build_dataset",
    "check_name",
    "check_params",
    "dataset_names",
]
