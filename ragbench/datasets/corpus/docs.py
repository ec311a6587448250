"""Ingest a folder of documents into a corpus file (``ragbench data docs``).

Steps, each stated so a corpus can be reproduced:

1. Discover: every PATH (a file or a folder, walked recursively). Hidden files and folders
   (a name starting with ``.``, e.g. ``.git``) are skipped. ``include``/``exclude`` globs apply
   to files found in folders, matched against the path relative to the folder and against the
   file name, ignoring case as file types do (``*`` also crosses ``/``; ``**/`` may match no
   folder); a folder matching an exclude glob is not entered. A file named as a PATH is always
   read, a symbolic link to one too (its id is the link's name). Files of other types are
   reported as unsupported. A symbolic link that leads back to itself is an error naming it,
   before any file is read. A link to a document is read under its own name; one that leads
   to a folder (not followed), to nothing or to a file of an unsupported type is reported as
   a skipped symbolic link, saying where it leads (its name tells nothing of that).
2. Read (``datasets.readers``): one reader per format; a file that cannot be read is reported
   with its path and reason and skipped, and so is one with no text (a scanned PDF).
3. Clean each piece (a PDF page) with ``corpus.clean_text``, then join the pieces with a blank
   line. Cleaning happens before joining, so ``meta["page_starts"]`` (the offset where each
   page starts in ``text``; an empty page starts where the next one does) refers to the text
   that is written, and so do evidence spans located later: nothing edits it afterwards.
4. Deduplicate with ``corpus.Deduplicator`` as each document is read (exact, then MinHash
   near duplicates; the first in corpus order is kept: the report is ``dedup_documents``') and
   report what was dropped.

``ingest(paths, out=...)`` writes each kept document to the corpus file as soon as it is read,
so memory holds one document (a few copies of the largest file's text), not the corpus;
without ``out`` it returns them all as a list.

Ids: each document's id is its path relative to the common folder of the PATHs (for one folder,
relative to that folder; for a file, its name), with ``/`` separators, so ids are unique and
independent of the machine. The corpus is in id order (code-point order), whatever order the
file system lists files in. ``meta`` holds ``source`` (the id), ``format``, ``sha256`` of the
file, and for PDFs ``pages`` and ``page_starts``. The title is the one the file names (see
``readers``), else the file name without its extension.
"""

from __future__ import annotations

import errno
import fnmatch
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragbench.datasets.corpus import readers
from ragbench.datasets.corpus.cleaning import clean_text
from ragbench.datasets.corpus.dedup import Deduplicator, DedupReport, documents_report
from ragbench.datasets.corpus.file import CorpusWriter, check_output, corpus_fingerprint
from ragbench.io import sha256_file
from ragbench.types import Document

PathLike = str | os.PathLike
PIECE_SEPARATOR = "\n\n"


@dataclass(frozen=True)
class Skipped:
    """A file that is not in the corpus, and why; ``unsupported``: not a document type;
    ``symlink``: a symbolic link in a folder that is not read (to a folder, to nothing, to a
    file of an unsupported type: its own name says nothing of what it leads to)."""

    path: str
    reason: str
    unsupported: bool = False
    symlink: bool = False


@dataclass
class IngestResult:
    documents: list[Document]  # the kept documents; empty when ``ingest`` wrote them (``out``)
    skipped: list[Skipped]
    dedup: DedupReport  # corpus.dedup_documents' report (dropped ids with reasons)
    files: int  # files considered (read, unreadable or unsupported)
    fingerprint: str = ""
    warnings: list[str] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)  # the kept documents' ids, in corpus order
    path: Path | None = None  # the corpus file ``ingest`` wrote (``out``)


# --------------------------------------------------------------------------- discovery


def _matches(rel: str, patterns: Sequence[str]) -> bool:
    """Whether the path ``rel`` (or its file name) matches a glob, ignoring case, as file types
    are told by extension whatever its case (``*.md`` matches ``NOTES.MD``)."""
    rel = rel.lower()
    name = rel.rsplit("/", 1)[-1]
    for pattern in patterns:
        pattern = pattern.lower()
        for p in {pattern, pattern.replace("**/", "")}:
            if fnmatch.fnmatchcase(rel, p) or fnmatch.fnmatchcase(name, p):
                return True
    return False


def _hidden(name: str) -> bool:
    return name.startswith(".")


def refuse_loop(path: Path) -> None:
    """A ValueError naming ``path`` when it is a symbolic link that leads back to itself."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError(
                f"{path}: symbolic link loop (it leads back to itself); remove or exclude it"
            ) from None


def discover(
    paths: Sequence[PathLike],
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    skip: Iterable[PathLike] = (),
) -> tuple[list[tuple[Path, str]], list[Skipped]]:
    """((file, id) to read in id order, the files and links not read: unsupported files, then
    symbolic links that lead to no document); see the module docstring. ``skip``: files never
    to read (the output file, when it lies in a scanned folder)."""
    roots = _checked_roots(paths)
    # a file named as a PATH is where it is named, a link too (its id is the link's name); a
    # folder is where it really is, as os.walk's folders resolve
    located = [r.resolve() if r.is_dir() else _located(r) for r in roots]
    base = Path(os.path.commonpath([r if r.is_dir() else r.parent for r in located]))
    never = {Path(p).resolve() for p in skip}
    found: dict[Path, str] = {}  # resolved file -> id; a file reached twice is read once
    links: list[Skipped] = []
    for root, real_root in zip(roots, located, strict=True):
        for file in _walk(root, real_root, include, exclude) if root.is_dir() else [root]:
            doc_id = _located(file).relative_to(base).as_posix()
            why = _unread_link(file)
            if why:
                links.append(Skipped(doc_id, why, symlink=True))
            elif (real := file.resolve()) not in never and real not in found:
                found[real] = doc_id
    chosen, unsupported = [], []
    for path, doc_id in sorted(found.items(), key=lambda x: x[1]):
        if readers.reader_for(path) is None:
            reason = f"unsupported type {path.suffix or '(no extension)'!r}"
            unsupported.append(Skipped(doc_id, reason, unsupported=True))
        else:
            chosen.append((path, doc_id))
    return chosen, unsupported + sorted(links, key=lambda s: s.path)


def _checked_roots(paths: Sequence[PathLike]) -> list[Path]:
    """The PATHs, each one that exists (a link to nothing, or a loop, is an error naming it)."""
    if not paths:
        raise ValueError("no PATH given: name files or folders to ingest")
    roots = [Path(p) for p in paths]
    for root in roots:
        refuse_loop(root)
        if root.is_symlink() and not root.exists():
            raise FileNotFoundError(
                f"{root}: symbolic link to {os.readlink(root)}, which does not exist"
            )
        if not root.exists():
            raise FileNotFoundError(f"{root}: no such file or folder")
    return roots


def _walk(
    root: Path, real_root: Path, include: Sequence[str], exclude: Sequence[str]
) -> Iterator[Path]:
    """The files of a folder (recursively) that ``include`` and ``exclude`` leave, hidden ones
    left out, and its links to folders (not entered: ``_unread_link`` says so)."""
    for folder, dirs, files in os.walk(root):
        rel_folder = (Path(folder).resolve()).relative_to(real_root).as_posix()
        rel_folder = "" if rel_folder == "." else rel_folder + "/"
        dirs[:] = sorted(
            d for d in dirs if not _hidden(d) and not _matches(rel_folder + d, exclude)
        )
        for name in sorted(files):
            rel = rel_folder + name
            if _hidden(name) or _matches(rel, exclude):
                continue
            if include and not _matches(rel, include):
                continue
            yield Path(folder) / name
        yield from (Path(folder) / d for d in dirs if (Path(folder) / d).is_symlink())


def _located(path: Path) -> Path:
    """``path`` absolute, its folders resolved but not its own name (a link stays the link)."""
    return path.parent.resolve() / path.name


def _unread_link(path: Path) -> str | None:
    """Why a symbolic link inside a folder is not read (None: it is not a link, or it leads to
    a document, read under the link's name): it leads to a folder (not followed: a walk that
    follows links can loop or leave the folder), to nothing, or to a file of an unsupported
    type, which the link's own name does not tell."""
    if not path.is_symlink():
        return None
    refuse_loop(path)
    target = os.readlink(path)
    if path.is_dir():
        return (
            f"symbolic link to a folder ({target}): not followed; name the folder itself to read it"
        )
    if not path.exists():
        return f"symbolic link to {target}, which does not exist"
    real = path.resolve()
    if readers.reader_for(real) is None:
        return f"symbolic link to {target}, a file of unsupported type {real.suffix or '(no extension)'!r}"
    return None


# --------------------------------------------------------------------------- reading


def assemble(pieces: Sequence[str]) -> tuple[str, list[int]]:
    """(text, start offset of each piece): pieces cleaned one by one, then joined."""
    parts: list[str] = []  # joined once at the end: no quadratic ``text +=`` over many pages
    length = 0
    starts: list[int] = []
    empty: list[int] = []  # indexes in starts of the empty pieces before the next text
    for piece in pieces:
        piece = clean_text(piece)
        if not piece:  # an empty page starts where the next page's text does
            empty.append(len(starts))
            starts.append(0)
            continue
        if parts:
            parts.append(PIECE_SEPARATOR)
            length += len(PIECE_SEPARATOR)
        for i in empty:
            starts[i] = length
        empty = []
        starts.append(length)
        parts.append(piece)
        length += len(piece)
    for i in empty:
        starts[i] = length
    text = parts[0] if len(parts) == 1 else "".join(parts)  # one piece: no copy
    return text, starts


def read_document(path: Path, doc_id: str) -> Document:
    """One file as a Document; raises ``readers.UnreadableFile`` (with the reason) when the
    file has no text or its reader fails."""
    found = readers.reader_for(path)
    if found is None:
        raise readers.UnreadableFile(f"unsupported type {path.suffix!r}")
    fmt, read = found
    parsed = read(path)
    title = clean_text(parsed.title) or path.stem
    text, starts = assemble(parsed.pieces)
    del parsed  # the text as read: one copy fewer while the document lives
    if not text:
        hint = " (a scanned PDF needs OCR first)" if fmt == "pdf" else ""
        raise readers.UnreadableFile(f"no text{hint}")
    meta: dict[str, Any] = {"source": doc_id, "format": fmt, "sha256": sha256_file(path)}
    if fmt == "pdf":
        meta |= {"pages": len(starts), "page_starts": starts}
    return Document(id=doc_id, text=text, title=title, meta=meta)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, readers.UnreadableFile):
        return str(exc)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return f"{type(exc).__name__}: {exc}"


# --------------------------------------------------------------------------- ingest


def ingest(
    paths: Sequence[PathLike],
    out: PathLike | None = None,
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    threshold: float = 0.8,
    skip: Iterable[PathLike] = (),
    progress: bool | None = False,
    on_skip: Callable[[Skipped], None] | None = None,
) -> IngestResult:
    """Discover, read, clean and deduplicate (module docstring); raise ValueError (one line)
    when nothing readable is found. ``progress``: a tqdm bar over bytes read (None: on a
    terminal). ``on_skip`` hears about each unreadable file as it happens.

    Without ``out`` every kept document is in memory (``documents``). With ``out``, each is
    written to that corpus file as soon as it is read (the bytes ``write_documents`` would
    write; the file appears whole or not at all), ``documents`` is empty and ``ids`` names what
    was written; ``out`` (a folder, say) and ``paths`` (a symbolic link loop) are checked
    before any file is read."""
    dedup = Deduplicator(threshold)
    if out is None:
        chosen, skipped = discover(paths, include, exclude, skip)
        documents: list[Document] = []
        result = _ingest(
            paths, chosen, skipped, dedup, documents.append, progress=progress, on_skip=on_skip
        )
        result.documents, result.fingerprint = documents, corpus_fingerprint(documents)
        return result
    check_output(out)
    chosen, skipped = discover(paths, include, exclude, [*skip, out])
    with CorpusWriter(out) as writer:
        result = _ingest(
            paths, chosen, skipped, dedup, writer.write, progress=progress, on_skip=on_skip
        )
    result.fingerprint, result.path = writer.fingerprint, writer.path
    return result


def _ingest(
    paths: Sequence[PathLike],
    chosen: list[tuple[Path, str]],
    skipped: list[Skipped],
    dedup: Deduplicator,
    keep: Callable[[Document], None],
    *,
    progress: bool | None,
    on_skip: Callable[[Skipped], None] | None,
) -> IngestResult:
    """Read ``chosen`` in order, handing each document that is no duplicate to ``keep``."""
    from tqdm.auto import tqdm

    for item in skipped:  # unsupported files are counted, not listed; links each say why
        if item.symlink and on_skip is not None:
            on_skip(item)
    sizes = [_size(path) for path, _ in chosen]
    read_ids: list[str] = []
    kept: list[str] = []
    disable = None if progress is None else not progress
    with tqdm(
        total=sum(sizes), desc="docs", unit="B", unit_scale=True, unit_divisor=1024, disable=disable
    ) as bar:
        for (path, doc_id), size in zip(chosen, sizes, strict=True):
            bar.set_postfix_str(doc_id, refresh=False)
            document = _read_or_skip(path, doc_id, skipped, on_skip)
            if document is not None:
                read_ids.append(doc_id)
                if dedup.add(document.text) is None:
                    keep(document)
                    kept.append(doc_id)
            del document  # before the next file is read: one document in memory at a time
            bar.update(size)
    files = len(chosen) + sum(s.unsupported for s in skipped)
    if not read_ids:
        raise ValueError(_nothing_readable(paths, skipped, files))
    report = documents_report(read_ids, dedup.drops, dedup.threshold, dedup.num_perm, dedup.seed)
    return IngestResult([], skipped, report, files, warnings=list(report["warnings"]), ids=kept)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:  # a dangling link: reported when it is read
        return 0


def _read_or_skip(
    path: Path, doc_id: str, skipped: list[Skipped], on_skip: Callable[[Skipped], None] | None
) -> Document | None:
    try:
        return read_document(path, doc_id)
    except MemoryError:
        raise
    except Exception as exc:
        # A damaged file makes parsers raise many kinds of error (pypdf, zipfile, lxml,
        # KeyError from a missing DOCX part, ...); one bad file must not stop the ingest,
        # and its reason is reported, never dropped.
        item = Skipped(doc_id, _reason(exc))
        skipped.append(item)
        if on_skip is not None:
            on_skip(item)
        return None


def _nothing_readable(paths: Sequence[PathLike], skipped: list[Skipped], files: int) -> str:
    where = ", ".join(str(p) for p in paths)
    if not files:
        return (
            f"no readable documents in {where}: no files found (hidden files and excluded "
            "paths are skipped)"
        )
    bad = [s for s in skipped if not s.unsupported and not s.symlink]
    links = sum(s.symlink for s in skipped)
    parts = []
    if bad:
        parts.append(f"{len(bad)} unreadable (first: {bad[0].path}: {bad[0].reason})")
    if unsupported := sum(s.unsupported for s in skipped):
        parts.append(f"{unsupported} of unsupported types")
    if links:
        parts.append(f"{links} symbolic links skipped")
    return (
        f"no readable documents in {where}: {files} files, {'; '.join(parts)}; "
        f"supported: {', '.join(readers.SUPPORTED)}"
    )
