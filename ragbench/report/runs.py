"""Run folders as one results table for people: ``ragbench.load(run_dir)`` (or several).

One folder: its ``results.parquet`` (another schema's refused) with the question text beside each
record (``question``, from ``questions.parquet``: ``experiment.evidence``), a ``run`` column (the
folder's name) and a ``model`` column (the manifest's model name). Several folders: their tables
one below the other, each label prefixed by its run (``"run-a: rag k=3"``; the label as the run
wrote it stays in ``run_label``), so a summary, verdict or paired table over them counts every
(question, variant) once, never a question twice under one label. To pair two runs question by
question use ``report.compare_runs`` (``ragbench diff``).

What a folder lacks (one written before questions and chunk texts were kept) is said in
``df.attrs["missing"]`` (``{run: [what, ...]}``), never guessed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragbench.experiment.evidence import CHUNKS, QUESTIONS, read_questions
from ragbench.schema import read_folder_table

if TYPE_CHECKING:
    import pandas as pd

RUN_SEPARATOR = ": "  # between a run's name and a label in a several-run table


class RunFolderError(FileNotFoundError):
    """A path that is not a readable ragbench run folder; the message says why."""


def run_folder(path: str | PathLike[str]) -> Path:
    """``path`` as a run folder (a ``results.parquet`` given: its folder), or RunFolderError."""
    folder = Path(path).expanduser()
    if folder.is_file() and folder.name == "results.parquet":
        folder = folder.parent
    if not folder.is_dir():
        raise RunFolderError(f"{path}: no such run folder")
    if not (folder / "results.parquet").exists():
        raise RunFolderError(
            f"{path}: no results.parquet (is it a ragbench run folder? a run writes it when it "
            "ends; an interrupted one: run the command that started it again to resume)"
        )
    return folder


def manifest_of(folder: Path) -> dict[str, Any]:
    """The folder's manifest (empty when it has none or it is unreadable)."""
    try:
        data = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def run_names(folders: Sequence[Path]) -> list[str]:
    """A short, distinct name per folder: its name, or with its parents where two share one."""
    names = [f.name for f in folders]
    depth = 1
    while len(set(names)) < len(names) and depth < 8:
        depth += 1
        names = ["/".join(f.resolve().parts[-depth:]) for f in folders]
    if len(set(names)) < len(names):  # the same folder twice
        names = [f"{n}#{i + 1}" for i, n in enumerate(names)]
    return names


def _one(folder: Path, name: str) -> tuple[Any, list[str]]:
    """One folder's table with ``question``, ``run`` and ``model``; and what it lacks."""
    import pandas as pd

    df = read_folder_table(folder)
    missing = []
    questions = read_questions(folder)
    if questions is None:
        missing.append(f"question texts ({QUESTIONS})")
        df.insert(1, "question", pd.Series([None] * len(df), dtype=object))
    else:
        text = dict(zip(questions["example_id"], questions["question"], strict=True))
        df.insert(1, "question", [text.get(i) for i in df["example_id"]])
    if not (folder / CHUNKS).exists():
        missing.append(f"chunk texts ({CHUNKS})")
    model = ((manifest_of(folder).get("config") or {}).get("model") or {}).get("name")
    df.insert(0, "run", name)
    df.insert(1, "model", model)
    return df, missing


def load(runs: str | PathLike[str] | Sequence[str | PathLike[str]]) -> pd.DataFrame:
    """The results table of one run folder, or of several one below the other (module
    docstring): one row per record, with ``run``, ``model`` and ``question`` beside it.
    ``df.attrs``: ``run_dirs`` ({run: folder}) and ``missing`` ({run: [what it lacks]})."""
    import pandas as pd

    paths = [runs] if isinstance(runs, str | PathLike) else list(runs)
    if not paths:
        raise ValueError("ragbench.load: no run folder given")
    folders = [run_folder(p) for p in paths]
    names = run_names(folders)
    frames, missing = [], {}
    for folder, name in zip(folders, names, strict=True):
        df, lacks = _one(folder, name)
        if lacks:
            missing[name] = lacks
        frames.append(df)
    if len(frames) == 1:
        out = frames[0]
    else:
        for df in frames:
            df.insert(df.columns.get_loc("label") + 1, "run_label", df["label"])
            df["label"] = df["run"] + RUN_SEPARATOR + df["run_label"]
        out = pd.concat(frames, ignore_index=True, sort=False)
    out.attrs["run_dirs"] = {n: str(f) for n, f in zip(names, folders, strict=True)}
    out.attrs["missing"] = missing
    return out
