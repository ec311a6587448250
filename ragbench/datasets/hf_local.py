"""Local Hugging Face datasets: ``save_to_disk`` folders, parquet and arrow files, by column mapping.

What can be read (with pyarrow, which ragbench depends on; the ``datasets`` library is not
needed, and not used when installed, so a file reads the same everywhere):

- a ``Dataset.save_to_disk`` folder: ``state.json`` lists its ``_data_files``, arrow IPC
  *stream* files (``data-00000-of-00001.arrow``, ...), read in that order; ``dataset_info.json``
  is not needed. ``save_to_disk`` writes the rows with any ``select``/``shuffle`` applied, so
  the files are the dataset; a ``state.json`` that names an indices file (old versions) is
  refused rather than read in the wrong order;
- a ``DatasetDict.save_to_disk`` folder: ``dataset_dict.json`` lists the splits, one folder
  each; ``split`` picks one (required when there are several);
- a ``.parquet`` file (what the Hub serves), or an ``.arrow`` file (stream or file format).

The mapping names columns: ``question`` and ``answers`` (required), and either ``context``
(each row's own context: a string, one document ``"{id}/context"``; or a list of strings, one
document each, ``"{id}/{j}"``) or ``corpus`` (every question over one shared corpus, through the
shared-corpus machinery as the ``corpus`` dataset does: a ragbench corpus ``.jsonl``, or a local
Hugging Face dataset read as above whose ``corpus_id`` / ``corpus_text`` / ``corpus_title``
columns, default ``id`` / ``text`` / ``title`` when present, make the documents). Optional:
``id_column`` (default ``id`` when the table has one, else the row index) and ``title_column``
(the context document's title). A nested column is addressed with a dotted path, as SQuAD's
``answers.text`` (a struct field; through a list of structs it gives the list of that field).
``answers`` may be a string (one answer) or a list of strings; an empty list keeps the question
unscored. The table's other scalar columns go to ``meta`` (e.g. HotpotQA's ``type`` and
``level``, to group results by).

Errors name the file, the row (``ds[i]``, counting from 0) and the column: a mapped column that
does not exist lists the available ones (dotted paths included); a value of the wrong type
(a null, a number where text is expected) names its row. An empty table is an error.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ragbench.datasets._validate import json_type, read_json_file
from ragbench.datasets.corpus.file import corpus_fingerprint, read_documents
from ragbench.datasets.questions import RESERVED_META, Question, to_examples
from ragbench.io import InputFileError
from ragbench.registry import did_you_mean, unknown
from ragbench.types import Document, Example

PathLike = str | os.PathLike
_META_SET = ("source", "task", "task_type", "row", "split")  # meta keys the importer sets


# --------------------------------------------------------------------------- reading tables


def read_table(path: PathLike, split: str | None = None) -> tuple[pa.Table, Path]:
    """(pyarrow Table, the file or folder it came from) for a local dataset (module docstring)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or folder")
    if path.is_dir() and (path / "dataset_dict.json").is_file():
        return read_table(path / _pick_split(path, split))
    if split is not None:
        msg = f"split {split!r} given, but this is not a DatasetDict folder (no dataset_dict.json)"
        raise InputFileError(path, None, msg)
    if path.is_dir():
        if not (path / "state.json").is_file():
            raise InputFileError(
                path,
                None,
                "not a save_to_disk folder (no state.json or dataset_dict.json); name a "
                ".parquet or .arrow file, or a folder written by save_to_disk",
            )
        tables = [_read_arrow(path / name) for name in _data_files(path / "state.json")]
        return (pa.concat_tables(tables) if len(tables) > 1 else tables[0]), path
    if path.suffix == ".parquet":
        try:
            return pq.read_table(path), path
        except pa.ArrowInvalid as exc:
            raise InputFileError(path, None, f"not a readable parquet file ({exc})") from None
    if path.suffix == ".arrow":
        return _read_arrow(path), path
    raise InputFileError(path, None, "expected a save_to_disk folder, a .parquet or an .arrow file")


def _pick_split(path: Path, split: str | None) -> str:
    splits = _json(path / "dataset_dict.json").get("splits")
    if not isinstance(splits, list) or not all(isinstance(s, str) for s in splits) or not splits:
        raise InputFileError(path / "dataset_dict.json", None, "expected a list of split names")
    if split is None:
        if len(splits) > 1:
            raise InputFileError(
                path, None, f"a DatasetDict with splits {', '.join(splits)}: choose one (split)"
            )
        return splits[0]
    if split not in splits:
        raise unknown("split", split, splits)
    return split


def _json(path: Path) -> dict:
    _, data = read_json_file(path)
    if not isinstance(data, dict):
        raise InputFileError(path, None, f"expected a JSON object, got {json_type(data)}")
    return data


def _data_files(state: Path) -> list[str]:
    data = _json(state)
    if data.get("_indices_data_files"):
        msg = "names an indices file (an old save_to_disk): save it again with a current version"
        raise InputFileError(state, None, msg, "_indices_data_files")
    files = data.get("_data_files")
    if (
        not isinstance(files, list)
        or not files
        or not all(isinstance(f, dict) and isinstance(f.get("filename"), str) for f in files)
    ):
        raise InputFileError(state, None, "expected a list of {filename: ...}", "_data_files")
    for f in files:
        if not (state.parent / f["filename"]).is_file():
            raise InputFileError(state, None, f"lists {f['filename']!r}, which is missing")
    return [f["filename"] for f in files]


def _read_arrow(path: Path) -> object:
    """An arrow IPC file: the stream format (what save_to_disk writes), else the file format."""
    with pa.memory_map(str(path)) as source:
        try:
            return pa.ipc.open_stream(source).read_all()
        except pa.ArrowInvalid:
            source.seek(0)
        try:
            return pa.ipc.open_file(source).read_all()
        except pa.ArrowInvalid as exc:
            raise InputFileError(path, None, f"not an arrow IPC file ({exc})") from None


# --------------------------------------------------------------------------- columns


def column_paths(schema: pa.Schema) -> list[str]:
    """Every column as a dotted path, struct fields included (``answers``, ``answers.text``)."""
    out: list[str] = []

    def walk(prefix: str, kind: pa.DataType) -> None:
        while pa.types.is_list(kind) or pa.types.is_large_list(kind):
            kind = kind.value_type
        if pa.types.is_struct(kind):
            for i in range(kind.num_fields):
                sub = kind.field(i)
                out.append(f"{prefix}.{sub.name}")
                walk(f"{prefix}.{sub.name}", sub.type)

    for top in schema:
        out.append(top.name)
        walk(top.name, top.type)
    return out


def _check_column(source: Path, column: str, available: list[str], role: str) -> None:
    if column not in available:
        raise InputFileError(
            source,
            None,
            f"no column {column!r} (mapped to {role}); {did_you_mean(column, available)}",
            role,
        )


def value_at(row: dict, column: str) -> object:
    """The value at dotted path ``column`` in ``row``; through a list, the list of each item's."""
    value: object = row
    for part in column.split("."):
        if isinstance(value, list):
            value = [item.get(part) if isinstance(item, dict) else None for item in value]
        elif isinstance(value, dict):
            value = value.get(part)
        else:
            return None
    return value


def _strings(value: object, what: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise ValueError(f"expected a string or a list of strings ({what}), got {_shown(value)}")


def _shown(value: object) -> str:
    if isinstance(value, list):
        bad = next((v for v in value if not isinstance(v, str)), None)
        return f"a list holding {json_type(bad) if _jsonable(bad) else type(bad).__name__}"
    return json_type(value) if _jsonable(value) else type(value).__name__


def _jsonable(value: object) -> bool:
    return value is None or isinstance(value, str | int | float | bool | list | dict)


# --------------------------------------------------------------------------- examples


def load_hf(
    path: PathLike,
    question: str,
    answers: str,
    context: str | None = None,
    corpus: PathLike | None = None,
    split: str | None = None,
    id_column: str | None = None,
    title_column: str | None = None,
    corpus_id: str = "id",
    corpus_text: str = "text",
    corpus_title: str | None = None,
) -> list[Example]:
    """A local Hugging Face dataset (save_to_disk folder, .parquet or .arrow), mapped by column.

    Columns: question, answers, and a context column or a shared corpus (see the module
    docstring)."""
    if (context is None) == (corpus is None):
        raise ValueError(
            "map either context (each row's own context column) or corpus (one shared corpus "
            "for every question), not both and not neither"
        )
    table, source = read_table(path, split)
    available = column_paths(table.schema)
    if id_column is None and "id" in table.column_names:
        id_column = "id"
    roles = {"question": question, "answers": answers, "context": context}
    roles |= {"id_column": id_column, "title_column": title_column}
    for role, column in roles.items():
        if column is not None:
            _check_column(source, column, available, role)
    if table.num_rows == 0:
        raise InputFileError(source, None, "no rows (an empty table)")
    mapped = {c.split(".")[0] for c in roles.values() if c is not None}
    rows = list(_rows(source, table, roles, mapped, split))
    if corpus is None:
        return [_with_context(r) for r in rows]
    documents = tuple(read_corpus(corpus, corpus_id, corpus_text, corpus_title))
    fingerprint = corpus_fingerprint(documents)
    questions = [Question(r.question, r.line, r.id, r.answers, meta=r.meta) for r in rows]
    return to_examples(questions, documents, source, corpus_fingerprint=fingerprint)


@dataclass(frozen=True)
class _Row:
    """One mapped row: the question's fields plus its own documents (context mode)."""

    id: str
    question: str
    answers: tuple[str, ...]
    line: int  # the row index + 1 (a Question's line, for the shared corpus's warnings)
    meta: dict[str, object] = field(default_factory=dict)
    documents: tuple[Document, ...] = ()


def _rows(
    source: Path, table: pa.Table, roles: dict[str, str | None], mapped: set[str], split: str | None
) -> Iterator[_Row]:
    first: dict[str, int] = {}
    for i, row in enumerate(table.to_pylist()):
        values = {}
        for role, column in roles.items():
            if column is None:
                continue
            try:
                values[role] = _checked(role, value_at(row, column))
            except ValueError as exc:
                raise InputFileError(source, None, f"row {i}: {exc}", column) from None
        qid = str(values.get("id_column", i))
        if qid in first:
            msg = f"row {i}: duplicate id {qid!r} (first in row {first[qid]})"
            raise InputFileError(source, None, msg, roles["id_column"] or "row index")
        first[qid] = i
        meta: dict[str, Any] = {
            k: v
            for k, v in row.items()
            if k not in mapped
            and k not in _META_SET
            and k not in RESERVED_META
            and isinstance(v, str | int | float | bool)
        }
        meta |= {"source": "hf", "row": i} | ({"split": split} if split else {})
        docs: tuple[Document, ...] = ()
        if "context" in values:
            texts, title = values["context"], values.get("title_column", "")
            ids = (
                [f"{qid}/{j}" for j in range(len(texts))] if len(texts) > 1 else [f"{qid}/context"]
            )
            docs = tuple(Document(d, t, title=title) for d, t in zip(ids, texts, strict=True))
        answers = tuple(a.strip() for a in values["answers"] if a.strip())
        yield _Row(qid, values["question"], answers, i + 1, meta, docs)


def _checked(role: str, value: object) -> Any:
    if role == "question":
        if not isinstance(value, str) or not value.strip():
            got = "an empty string" if isinstance(value, str) else _shown(value)
            raise ValueError(f"expected a question (a non-empty string), got {got}")
        return value.strip()
    if role == "answers":
        return _strings(value, "the gold answers")
    if role == "context":
        texts = _strings(value, "the context")
        if not texts or not any(t.strip() for t in texts):
            raise ValueError("empty context")
        return texts
    if role == "id_column":
        if not isinstance(value, str | int) or isinstance(value, bool) or str(value) == "":
            raise ValueError(f"expected an id (a string or an integer), got {_shown(value)}")
        return str(value)
    if not isinstance(value, str):  # title_column
        raise ValueError(f"expected a title (a string), got {_shown(value)}")
    return value


def _with_context(row: _Row) -> Example:
    meta = {**row.meta, "task": "hf", "task_type": "qa"}
    return Example(row.id, row.question, row.answers, row.documents, meta)


def read_corpus(
    path: PathLike, id_column: str = "id", text: str = "text", title: str | None = None
) -> list[Document]:
    """A shared corpus: a ragbench corpus ``.jsonl`` (``datasets.corpus_file``), or a local
    Hugging Face dataset whose ``id_column``, ``text`` and ``title`` (default: ``title`` when
    the table has it) columns make the documents, in table order."""
    if Path(path).suffix == ".jsonl":
        return read_documents(path)
    table, source = read_table(path)
    available = column_paths(table.schema)
    if title is None and "title" in table.column_names:
        title = "title"
    for role, column in (("corpus_id", id_column), ("corpus_text", text), ("corpus_title", title)):
        if column is not None:
            _check_column(source, column, available, role)
    if table.num_rows == 0:
        raise InputFileError(source, None, "no rows (an empty corpus)")
    docs = []
    for i, row in enumerate(table.to_pylist()):
        values = [value_at(row, c) if c else "" for c in (id_column, text, title)]
        for column, value in zip((id_column, text, title), values, strict=True):
            if column and not (isinstance(value, str | int) and not isinstance(value, bool)):
                raise InputFileError(
                    source, None, f"row {i}: expected a string, got {_shown(value)}", column
                )
        if not str(values[1]).strip():
            raise InputFileError(source, None, f"row {i}: empty document text", text)
        docs.append(Document(str(values[0]), str(values[1]), title=str(values[2] or "")))
    seen: dict[str, int] = {}
    for i, d in enumerate(docs):
        if d.id in seen:
            msg = f"row {i}: duplicate document id {d.id!r} (first in row {seen[d.id]})"
            raise InputFileError(source, None, msg, id_column)
        seen[d.id] = i
    return docs
