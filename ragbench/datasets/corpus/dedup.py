"""Corpus preparation: text cleaning, exact dedup and MinHash-LSH near-duplicate removal.

- ``clean_text`` (``datasets.cleaning``): mojibake repair with ftfy, control
  characters removed, spaces and line breaks unified, NFC.
- Exact duplicates: sha256 of the normalised text (cleaned, casefolded, whitespace collapsed).
- Near duplicates: datasketch ``MinHash`` over word 5-gram shingles, candidates from
  ``MinHashLSH``, confirmed when the estimated Jaccard similarity is >= ``threshold``.
  ``Deduplicator`` takes one text at a time and holds only the kept texts' sketches; a big
  text is shingled and hashed in batches, so memory stays a few times the text's size.
- Items are visited in order and compared only with items already kept, so the first occurrence
  is always the one kept and a rerun with the same parameters drops the same ids. Every drop is
  reported with its reason (``exact`` or ``near``), the kept id it duplicates and the estimate.

``dedup_documents`` works on a list of Documents (e.g. a BEIR corpus) and never edits text.
``dedup_file`` works on a ragbench JSONL file of Examples. A record repeated verbatim (same id,
same content, e.g. a file concatenated twice) is dropped and counted (``repeated_records``); two
records with the same id and different content are an error naming the file and both lines.
It cleans each example's text
(question, answers, document titles and texts; ``meta["evidence"]`` spans are moved to the
cleaned text, and a document whose spans cannot be moved is left as it was) and drops an example
when its *question* normalises to the same text as an earlier kept example's and its *context*
(the joined documents) is an exact or near duplicate of that example's. Matching on the context
alone (``key="context"``) would drop every SQuAD question after the first on a paragraph, which
is rarely what a data pipeline means. Do not dedup generated needle sweeps: the points of a depth
sweep share question and haystack, so all but the first per length are near duplicates; when
near duplicates are more than ``NEAR_DROP_WARN`` of the items, a warning is logged (and put in the
report's ``warnings``) with the count and the threshold. Only
``meta["evidence"]`` spans are moved by cleaning; other offsets in ``meta`` (e.g. NIAH's
``needle_start``) are not, so pass ``clean=False`` for files whose offsets must stay exact.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import re
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any, NotRequired, TypedDict

from ragbench.datasets.corpus.cleaning import (
    clean_text,
    normalize_for_hash,
    update_sha256,
)
from ragbench.datasets.formats import fingerprint, read_examples, write_examples
from ragbench.registry import unknown
from ragbench.types import Document, Example

log = logging.getLogger(__name__)

SHINGLE_WORDS = 5
NEAR_DROP_WARN = 0.2  # warn when near duplicates are more than this share of the items
DEDUP_KEYS = ("question+context", "context")
_WORD = re.compile(r"\w+")
HASH_BATCH = 4096  # shingles per MinHash.update_batch: it builds a (batch x num_perm) array


# --------------------------------------------------------------------------- cleaning


def _move_span(old: str, new: str, start: int, end: int, slack: int = 16) -> tuple[int, int] | None:
    """Where old[start:end] lies in new == clean_text(old), or None if it cannot be found."""
    piece = clean_text(old[start:end])
    if not piece:
        return None
    expect = len(clean_text(old[:start]))
    hits = [
        new.find(piece, max(0, expect - slack)),
        new.rfind(piece, 0, expect + slack + len(piece)),
    ]
    hits = [h for h in hits if h >= 0 and abs(h - expect) <= slack + 1]
    if not hits:
        return None
    best = min(hits, key=lambda h: abs(h - expect))
    return best, best + len(piece)


def _clean_document(doc: Document, spans: list[tuple[int, int]]):
    """(cleaned document, moved spans) or (doc, spans) unchanged when a span cannot be moved."""
    text = clean_text(doc.text)
    title = clean_text(doc.title)
    if text == doc.text:
        return replace(doc, title=title), spans, True
    moved = [_move_span(doc.text, text, s, e) for s, e in spans]
    if any(m is None for m in moved):
        return replace(doc, title=title), spans, False
    return replace(doc, text=text, title=title), moved, True


def clean_example(example: Example) -> tuple[Example, list[str]]:
    """Clean question, answers and documents; returns (example, ids of documents left as-is)."""
    evidence = [list(span) for span in example.meta.get("evidence", [])]
    docs, skipped = [], []
    for doc in example.documents:
        mine = [i for i, span in enumerate(evidence) if span[0] == doc.id]
        new_doc, spans, ok = _clean_document(doc, [(evidence[i][1], evidence[i][2]) for i in mine])
        for i, (s, e) in zip(mine, spans, strict=True):
            evidence[i] = [doc.id, s, e]
        docs.append(new_doc)
        if not ok:
            skipped.append(doc.id)
    meta = dict(example.meta)
    if "evidence" in meta:
        meta["evidence"] = evidence
    return (
        replace(
            example,
            question=clean_text(example.question),
            answers=tuple(clean_text(a) for a in example.answers),
            documents=tuple(docs),
            meta=meta,
        ),
        skipped,
    )


# --------------------------------------------------------------------------- dedup


def shingles(text: str, n: int = SHINGLE_WORDS) -> set[str]:
    """Word n-grams of the normalised text; a text shorter than n words is one shingle."""
    return _shingles(normalize_for_hash(text), n)


def _shingles(normalised: str, n: int = SHINGLE_WORDS) -> set[str]:
    return set(_iter_shingles(normalised, n))


def _iter_shingles(normalised: str, n: int = SHINGLE_WORDS) -> Iterator[str]:
    """The shingles of ``_shingles`` one at a time (repeats included), never all words at once."""
    window: deque[str] = deque(maxlen=n)
    for match in _WORD.finditer(normalised):
        window.append(match.group())
        if len(window) == n:
            yield " ".join(window)
    if 0 < len(window) < n:
        yield " ".join(window)


def _sketch(normalised: str, make: Any) -> Any:
    """MinHash of the shingles (None: no words), in batches: a minimum ignores order and repeats,
    so this equals one ``update_batch`` of the set, without its (shingles x num_perm) array."""
    sketch, shingles_ = None, _iter_shingles(normalised)
    while batch := list(itertools.islice(shingles_, HASH_BATCH)):
        sketch = sketch or make()
        sketch.update_batch([g.encode("utf-8") for g in batch])
    return sketch


class Drop(TypedDict):
    """Why a text is dropped: an ``exact`` or ``near`` duplicate of the kept text
    ``duplicate_of`` (its index), at estimated Jaccard similarity ``jaccard``."""

    reason: str
    duplicate_of: int
    jaccard: float


class DroppedRow(TypedDict):
    """One dropped record or document of a report: its id, and the id of the kept one it
    duplicates."""

    id: str
    reason: str
    duplicate_of: str
    jaccard: float


class DedupReport(TypedDict):
    """What deduplication kept and dropped, and why (``_report``); ``dedup_file`` adds the
    file's facts (the ``NotRequired`` keys)."""

    n_in: int
    n_kept: int
    exact_duplicates: int
    near_duplicates: int
    dropped: list[DroppedRow]
    params: dict  # threshold, num_perm, seed, shingle_words (and the examples' key)
    warnings: list[str]
    repeated_records: NotRequired[int]
    repeated_lines: NotRequired[list[int]]
    input: NotRequired[str]
    output: NotRequired[str]
    cleaned: NotRequired[bool]
    examples_changed_by_cleaning: NotRequired[int]
    documents_not_cleaned: NotRequired[list[str]]
    fingerprint_in: NotRequired[str]
    fingerprint_out: NotRequired[str]


class Deduplicator:
    """``find_duplicates`` one text at a time, for a stream of documents: ``add`` says whether
    a text duplicates an earlier kept one; only the kept texts' sketches are held (num_perm
    integers each), never the texts."""

    def __init__(self, threshold: float = 0.8, num_perm: int = 128, seed: int = 1) -> None:
        from datasketch import MinHash, MinHashLSH

        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {threshold}")
        if num_perm < 2:
            raise ValueError(f"num_perm must be >= 2, got {num_perm}")
        try:
            self.lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
        except ValueError as exc:  # datasketch finds no banding for thresholds near 1 ("b < 2")
            raise ValueError(
                f"MinHash LSH cannot use threshold {threshold} with num_perm {num_perm} ({exc}); "
                "use a threshold <= 0.98"
            ) from None
        self.threshold, self.num_perm, self.seed = threshold, num_perm, seed
        template = MinHash(num_perm=num_perm, seed=seed)
        shared = {"permutations": template.permutations}  # generated once, not once per text
        if hasattr(template, "scheme"):  # datasketch >= 2.0 wants the scheme with permutations
            shared["scheme"] = template.scheme
        self._make = lambda: MinHash(num_perm=num_perm, seed=seed, **shared)
        self.kept_by_hash: dict[str, int] = {}
        self.sketches: dict[int, tuple[str, object]] = {}  # kept index -> (group, sketch)
        self.drops: dict[int, Drop] = {}
        self.count = 0

    def add(self, text: str, group: str = "") -> Drop | None:
        """None when ``text`` is kept, else its drop ({"reason", "duplicate_of", "jaccard"})."""
        i, self.count = self.count, self.count + 1
        normalised, digest_ = normalize_for_hash(text), hashlib.sha256(f"{group}\0".encode())
        update_sha256(digest_, normalised)
        digest = digest_.hexdigest()
        if digest in self.kept_by_hash:
            return self._drop(i, "exact", self.kept_by_hash[digest], 1.0)
        sketch = _sketch(normalised, self._make)
        best: tuple[int, float] | None = None
        for key in self.lsh.query(sketch) if sketch is not None else ():
            j = int(key)
            other_group, other = self.sketches[j]
            if other_group != group:
                continue
            estimate = float(sketch.jaccard(other))
            if estimate >= self.threshold and (best is None or j < best[0]):
                best = (j, estimate)
        if best is not None:
            return self._drop(i, "near", best[0], round(best[1], 4))
        self.kept_by_hash[digest] = i
        if sketch is not None:
            self.sketches[i] = (group, sketch)
            self.lsh.insert(str(i), sketch)
        return None

    def _drop(self, i: int, reason: str, of: int, jaccard: float) -> Drop:
        self.drops[i] = {"reason": reason, "duplicate_of": of, "jaccard": jaccard}
        return self.drops[i]


def find_duplicates(
    texts: Sequence[str],
    *,
    threshold: float = 0.8,
    num_perm: int = 128,
    seed: int = 1,
    groups: Sequence[str] | None = None,
) -> dict[int, Drop]:
    """{index: {"reason", "duplicate_of" (index), "jaccard"}} for every text to drop.

    A text is compared only with earlier *kept* texts (of the same group when ``groups`` is
    given), so the first occurrence always survives.
    """
    if groups is not None and len(groups) != len(texts):
        raise ValueError("groups must have one entry per text")
    dedup = Deduplicator(threshold, num_perm, seed)
    for i, text in enumerate(texts):
        dedup.add(text, groups[i] if groups is not None else "")
    return dedup.drops


def _near_drop_warning(near: int, total: int, what: str, threshold: float) -> str | None:
    """The heavy-drop warning, or None when near duplicates are at most ``NEAR_DROP_WARN``."""
    if not total or near / total <= NEAR_DROP_WARN:
        return None
    higher = min(round((1 + threshold) / 2, 2), 0.98)  # datasketch LSH refuses 0.99 and up
    advice = f"; if they are distinct, use a higher threshold (e.g. {higher:g})"
    advice = advice if higher > threshold else ""
    return (
        f"near-duplicate dedup dropped {near} of {total} {what} ({near / total:.0%}) at MinHash "
        f"threshold {threshold:g}: generated corpora (e.g. NIAH depth sweeps) are near duplicates "
        f"by construction{advice}"
    )


def _report(ids: Sequence[str], drops: dict[int, Drop], params: dict, what: str) -> DedupReport:
    dropped: list[DroppedRow] = [
        {
            "id": ids[i],
            "reason": d["reason"],
            "duplicate_of": ids[d["duplicate_of"]],
            "jaccard": d["jaccard"],
        }
        for i, d in sorted(drops.items())
    ]
    near = sum(d["reason"] == "near" for d in drops.values())
    warning = _near_drop_warning(near, len(ids), what, params["threshold"])
    if warning:
        log.warning(warning)
    return {
        "n_in": len(ids),
        "n_kept": len(ids) - len(drops),
        "exact_duplicates": sum(d["reason"] == "exact" for d in drops.values()),
        "near_duplicates": near,
        "dropped": dropped,
        "params": params,
        "warnings": [warning] if warning else [],
    }


def dedup_documents(
    docs: Sequence[Document], threshold: float = 0.8, num_perm: int = 128, seed: int = 1
) -> tuple[list[Document], DedupReport]:
    """(kept documents in order, report). Text is compared normalised but never edited."""
    drops = find_duplicates(
        [d.text for d in docs], threshold=threshold, num_perm=num_perm, seed=seed
    )
    kept = [d for i, d in enumerate(docs) if i not in drops]
    return kept, documents_report([d.id for d in docs], drops, threshold, num_perm, seed)


def documents_report(
    ids: Sequence[str],
    drops: dict[int, Drop],
    threshold: float,
    num_perm: int,
    seed: int,
) -> DedupReport:
    """``dedup_documents``' report for documents ``ids`` (in order) and their ``drops``."""
    params = {"threshold": threshold, "num_perm": num_perm, "seed": seed}
    params["shingle_words"] = SHINGLE_WORDS
    return _report(ids, drops, params, "documents")


def dedup_examples(
    examples: Sequence[Example],
    threshold: float = 0.8,
    num_perm: int = 128,
    seed: int = 1,
    *,
    key: str = "question+context",
) -> tuple[list[Example], DedupReport]:
    """(kept examples in order, report); see the module docstring for what counts as a duplicate."""
    if key not in DEDUP_KEYS:
        raise unknown("dedup key", key, DEDUP_KEYS)
    groups = (
        [normalize_for_hash(e.question) for e in examples] if key == "question+context" else None
    )
    texts = [e.context for e in examples]
    drops = find_duplicates(texts, threshold=threshold, num_perm=num_perm, seed=seed, groups=groups)
    params = {"threshold": threshold, "num_perm": num_perm, "seed": seed, "key": key}
    params["shingle_words"] = SHINGLE_WORDS
    kept = [e for i, e in enumerate(examples) if i not in drops]
    return kept, _report([e.id for e in examples], drops, params, "examples")


def read_examples_with_repeats(path: str | os.PathLike) -> tuple[list[Example], list[int]]:
    """(examples, lines of verbatim repeats) of a ragbench JSONL file, read as strictly as
    ``formats.read_examples`` except that a record equal to an earlier one with its id is
    skipped (its line is returned); a same-id record with other content is an InputFileError
    naming both lines."""
    repeats: list[int] = []
    return read_examples(path, repeats=repeats), repeats


def dedup_file(
    path: str | os.PathLike,
    out_path: str | os.PathLike,
    threshold: float = 0.8,
    num_perm: int = 128,
    seed: int = 1,
    *,
    clean: bool = True,
    key: str = "question+context",
) -> DedupReport:
    """Clean (optional) and deduplicate a ragbench JSONL file; write the result atomically.

    Returns stats: counts (``n_in`` counts every record, ``repeated_records`` the verbatim
    repeats dropped, see ``read_examples_with_repeats``), the dropped ids with reasons, which documents cleaning
    left as-is (their evidence spans could not be moved), warnings and both fingerprints.
    """
    examples, repeats = read_examples_with_repeats(path)
    fingerprint_in = fingerprint(examples)
    cleaned, changed, skipped = examples, 0, []
    if clean:
        cleaned = []
        for e in examples:
            new, left = clean_example(e)
            changed += new != e
            skipped += [f"{e.id}:{doc_id}" for doc_id in left]
            cleaned.append(new)
    kept, report = dedup_examples(cleaned, threshold, num_perm, seed, key=key)
    write_examples(out_path, kept)
    report["n_in"] += len(repeats)
    report |= {"repeated_records": len(repeats), "repeated_lines": repeats}
    report |= {"input": str(path), "output": str(out_path), "cleaned": clean}
    report |= {"examples_changed_by_cleaning": changed, "documents_not_cleaned": skipped}
    report |= {"fingerprint_in": fingerprint_in, "fingerprint_out": fingerprint(kept)}
    return report
