"""Corpus files (what ``ragbench data docs`` writes): JSONL, one document per line, canonical
JSON (sorted keys, no spaces), in the corpus order::

    {"id":"guide.pdf","meta":{"format":"pdf","page_starts":[0,812],...},"text":"...","title":"..."}

``id`` and ``text`` are required, ``title`` and ``meta`` optional; other fields are errors. Ids
are unique. ``corpus_fingerprint`` is the sha256 of exactly the bytes ``write_documents`` writes,
so ``sha256sum corpus.jsonl`` names the same corpus. The ``corpus`` dataset built from such a
file is ``datasets.shared_corpus``.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

from ragbench.datasets._validate import (
    FieldError,
    document_from_row,
    read_jsonl,
    refuse_duplicate_ids,
)
from ragbench.io import InputFileError, dumps_canonical, remove_stale_temps, temp_prefix
from ragbench.types import Document

PathLike = str | os.PathLike
_UMASK = os.umask(0)  # read once (as ragbench.io does): setting it is process-wide
os.umask(_UMASK)


def _lines(documents: Iterable[Document]) -> Iterator[str]:
    for d in documents:
        yield d.to_json() + "\n"


def write_documents(path: PathLike, documents: Iterable[Document]) -> Path:
    """Atomically write a corpus file; duplicate document ids are refused."""
    documents = list(documents)
    refuse_duplicate_ids((d.id for d in documents), "document", "a corpus")
    with CorpusWriter(path) as writer:
        for document in documents:
            writer.write(document)
    return writer.path


_TEXT_SLICE = 1 << 20  # characters of a document's text escaped and encoded at a time
_SENTINEL = "\x00ragbench:text\x00"  # stands in for the text: found once, then replaced


def line_chunks(document: Document) -> Iterator[bytes]:
    """The bytes of ``document.to_json() + "\\n"``, the text escaped and encoded slice by slice:
    JSON escapes each character on its own, and a whole-line string (plus its encoded copy) of
    a 50 MB text cost 4 copies of it."""
    text, line = document.text, ""
    if len(text) > _TEXT_SLICE:
        line = replace(document, text=_SENTINEL).to_json()
    if line.count(dumps_canonical(_SENTINEL)) != 1:  # a short text (or a title of the sentinel)
        yield (document.to_json() + "\n").encode("utf-8")
        return
    head, _, tail = line.partition(dumps_canonical(_SENTINEL))
    yield (head + '"').encode("utf-8")
    for i in range(0, len(text), _TEXT_SLICE):
        yield dumps_canonical(text[i : i + _TEXT_SLICE])[1:-1].encode("utf-8")
    yield ('"' + tail + "\n").encode("utf-8")


def check_output(path: PathLike) -> Path:
    """``path`` as a file that can be written, or a ValueError (one line) naming it: a folder,
    or a folder on the way that is a file. Checked before any work is done."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a folder: name the corpus file, e.g. {path / 'corpus.jsonl'}")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"{path}: {parent} is a file, not a folder")
            break
    return path


class CorpusWriter:
    """A corpus file written one document at a time (memory: one line), atomically: lines go
    to a hidden temporary file beside ``path``, renamed over it on success and removed on any
    error. ``fingerprint``: sha256 of the bytes written (``corpus_fingerprint``)."""

    def __init__(self, path: PathLike) -> None:
        self.path = check_output(path)
        self.count = 0
        self._digest = hashlib.sha256()
        self._ids: set[str] = set()
        self._file: BinaryIO | None = None
        self._tmp: Path | None = None

    def __enter__(self) -> CorpusWriter:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(self.path)  # what a writer killed mid-write left (`data docs` rerun)
        fd, tmp = tempfile.mkstemp(
            prefix=temp_prefix(self.path), suffix=".tmp", dir=self.path.parent
        )
        self._tmp = Path(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; a corpus is shared like any output
        self._file = os.fdopen(fd, "wb")
        return self

    def _open(self) -> tuple[BinaryIO, Path]:
        """The temporary file and its path (set by ``__enter__``)."""
        if self._file is None or self._tmp is None:
            raise RuntimeError("CorpusWriter writes inside its `with` block only")
        return self._file, self._tmp

    def write(self, document: Document) -> None:
        file, _ = self._open()
        if document.id in self._ids:
            refuse_duplicate_ids([document.id] * 2, "document", "a corpus")
        self._ids.add(document.id)
        for data in line_chunks(document):
            self._digest.update(data)
            file.write(data)
        self.count += 1

    @property
    def fingerprint(self) -> str:
        return self._digest.hexdigest()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        file, tmp = self._open()
        try:
            if kind is None:
                file.flush()
                os.fsync(file.fileno())
            file.close()
            if kind is None:
                os.replace(tmp, self.path)
        finally:
            tmp.unlink(missing_ok=True)  # gone already when renamed into place


def corpus_fingerprint(documents: Iterable[Document]) -> str:
    """sha256 of the canonical corpus bytes: equals ``sha256_file`` of ``write_documents``."""
    digest = hashlib.sha256()
    for line in _lines(documents):
        digest.update(line.encode("utf-8"))
    return digest.hexdigest()


def _document(row: object) -> Document:
    if isinstance(row, dict) and "question" in row and "text" not in row:  # an example
        raise FieldError(
            ("question",),
            "this is a ragbench dataset (an example a line), not a corpus file (a document a "
            "line: id, text, title, meta, as `ragbench data docs` writes)",
        )
    return document_from_row(row)


def read_documents(path: PathLike) -> list[Document]:
    """A corpus file, strictly: errors name the file, line and field; an empty file is one."""
    documents = read_jsonl(path, _document, id_field="id")
    if not documents:
        raise InputFileError(path, None, "no documents (an empty corpus file)")
    return documents
