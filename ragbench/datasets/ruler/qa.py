"""RULER's QA tasks: a question's gold paragraphs hidden among distractor paragraphs up to the
target length (``qa_1``: SQuAD, ``qa_2``: HotpotQA, or your own QA file).

Following NVIDIA/RULER's ``scripts/data/synthetic/qa.py`` (commit c3f5e3b):

- the paragraph pool is every distinct paragraph of the file, sorted (lines 77-78, 101-102);
  SQuAD paragraphs are their context text, HotpotQA ones ``"{title}\\n{sentences joined}"``;
- SQuAD questions are the answerable ones, in file order, each with its own paragraph; the other
  paragraphs of its article are the first distractors (``more_context``, lines 82-91); a HotpotQA
  question brings all its context paragraphs (two gold, eight distractors: lines 107-111);
- distractors come first from ``more_context``, then drawn at random from the rest of the file
  (lines 130-137); all paragraphs are shuffled and rendered as ``"Document {i}:\\n{paragraph}"``
  joined by blank lines (lines 116, 143-145);
- question ``i`` of the file is example ``i`` at every length (line 200), and RULER scores
  with ``string_match_part`` (any gold answer in the prediction).

Each paragraph is one ``Document`` (id ``p<pool index>``, title ``Document {i}:``), so the
long-context prompt reads exactly RULER's context and retrieval can be judged per paragraph.
Evidence spans are the gold text inside its paragraph: SQuAD's answer spans, HotpotQA's
supporting-fact sentences, or a ragbench JSONL file's own ``meta.evidence``. Sizing is
ragbench's: the most distractors whose context fits ``context_length -
final_context_length_buffer`` tokens (``haystack.fit``); RULER bisects on the paragraph count
once and reuses it. A file too small to fill a length is an error, never a shorter context (RULER
repeats its paragraphs instead), and so is a missing ``path``: nothing is downloaded.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Iterator, Sequence

from ragbench.datasets._validate import (
    DatasetParamError,
    choice_param,
    int_param,
    lengths_param,
    nonempty,
)
from ragbench.datasets.formats import read_examples
from ragbench.datasets.haystack import fit
from ragbench.datasets.hotpotqa import load_hotpotqa
from ragbench.datasets.importers import load_squad
from ragbench.datasets.niah import DEFAULT_TOKENIZER
from ragbench.datasets.ruler.tasks import context_meta
from ragbench.tokenizers import get_tokenizer
from ragbench.types import Document, Example, join_documents

FORMATS = ("squad", "hotpotqa", "jsonl")
# RULER scripts/data/synthetic/constants.py, lines 49-53 ('qa'); qa.py line 116
INSTRUCTION = (
    "Answer the question based on the given documents. Only give me the answer and do not "
    "output any other words."
)
DOCUMENT_TITLE = "Document {i}:"
ANSWER_PREFIX = "Answer:"
TOKENS_TO_GENERATE = 32  # constants.py line 50
METRIC = "string_match_part"  # RULER scripts/eval/synthetic/constants.py, lines 46-48
WHERE_TO_GET = {
    "squad": "a SQuAD JSON (RULER's qa_1 uses SQuAD 2.0 dev, dev-v2.0.json)",
    "hotpotqa": "a HotpotQA JSON (RULER's qa_2 uses hotpot_dev_distractor_v1.json)",
    "jsonl": "a ragbench JSONL of questions with their gold documents",
}


def _load(path: str, format: str) -> tuple[list[Example], list[Example]]:
    """(questions, every example): SQuAD 2.0's unanswerable questions are not asked (RULER
    skips them) but their paragraphs stay in the pool."""
    if format == "squad":
        everything = load_squad(path, unanswerable="keep")
        asked = [e for e in everything if not e.meta.get("unanswerable")]
        return nonempty(path, asked, "no answerable SQuAD questions"), everything
    if format == "hotpotqa":
        everything = load_hotpotqa(path)
    else:
        everything = nonempty(path, read_examples(path), "no examples (an empty JSONL file)")
    return everything, everything


def _render(doc: Document, format: str) -> tuple[str, int]:
    """A paragraph as RULER writes it, and where the document's own text starts in it."""
    if format == "squad" or not doc.title:
        return doc.text, 0
    return f"{doc.title}\n{doc.text}", len(doc.title) + 1


class _Pool:
    """Every distinct paragraph of the file, sorted (RULER's ``total_docs``), and which pool
    paragraphs each SQuAD article holds (its questions' ``more_context``)."""

    def __init__(self, examples: list[Example], format: str) -> None:
        texts = {_render(d, format)[0] for e in examples for d in e.documents}
        self.texts = sorted(texts)
        self.index = {t: i for i, t in enumerate(self.texts)}
        self.article: dict[str, list[int]] = {}
        if format == "squad":  # importer ids are "{article}-{paragraph}"
            for e in examples:
                for d in e.documents:
                    group = self.article.setdefault(d.id.rpartition("-")[0], [])
                    if self.index[d.text] not in group:
                        group.append(self.index[d.text])

    def gold(self, example: Example, format: str) -> tuple[list[int], list[list]]:
        """The question's own paragraphs (pool indices) and its evidence spans in them."""
        own, where = [], {}
        for d in example.documents:
            text, shift = _render(d, format)
            where[d.id] = (self.index[text], shift)
            if self.index[text] not in own:
                own.append(self.index[text])
        spans = []
        for doc_id, s, e in example.meta.get("evidence", []):
            if doc_id in where:
                p, shift = where[doc_id]
                spans.append([f"p{p}", s + shift, e + shift])
        return own, spans

    def more(self, example: Example, own: list[int]) -> list[int]:
        groups = {d.id.rpartition("-")[0] for d in example.documents}
        return [p for g in sorted(groups) for p in self.article.get(g, []) if p not in own]


def iter_qa(
    path: str | None = None,
    format: str = "squad",
    context_lengths: int | Sequence[int] = (4096,),
    num_examples: int = 10,
    tokenizer: str = DEFAULT_TOKENIZER,
    final_context_length_buffer: int = 200,
    seed: int = 42,
) -> Iterator[Example]:
    """Yield ``num_examples`` questions of the QA file ``path`` (in ``format``) per context
    length, each among distractor paragraphs filling the length (see the module docstring)."""
    choice_param("format", format, FORMATS)
    if not path:
        raise DatasetParamError(
            "path",
            f"RULER's QA tasks are built from a QA file: set `path` to "
            f"{WHERE_TO_GET[format]}; nothing is downloaded",
        )
    lengths, buffer = lengths_param(context_lengths, final_context_length_buffer)
    int_param("num_examples", num_examples)
    tok = get_tokenizer(tokenizer)
    questions, everything = _load(str(path), format)
    if len(questions) < num_examples:
        raise DatasetParamError(
            "num_examples", f"{num_examples} questions asked, but {path} has {len(questions)}"
        )
    pool = _Pool(everything, format)
    for length in lengths:
        for i, question in enumerate(questions[:num_examples]):
            rng = random.Random(f"{seed}/qa/{format}/{length}/{i}")  # str seeds are stable
            yield _example(
                pool,
                question,
                format=format,
                tok=tok,
                length=length,
                buffer=buffer,
                rng=rng,
                path=str(path),
                i=i,
                seed=seed,
            )


def _example(pool, question, *, format, tok, length, buffer, rng, path, i, seed) -> Example:
    own, evidence = pool.gold(question, format)
    more = pool.more(question, own) if format == "squad" else []
    taken = set(own) | set(more)
    rest = [p for p in range(len(pool.texts)) if p not in taken]
    rng.shuffle(more)
    rng.shuffle(rest)
    extra = more + rest
    state = rng.getstate()

    def build(n: int) -> tuple[str, tuple[Document, ...]]:
        picked = own + extra[:n]
        r = random.Random()
        r.setstate(state)
        r.shuffle(picked)
        docs = tuple(
            Document(id=f"p{p}", text=pool.texts[p], title=DOCUMENT_TITLE.format(i=k + 1))
            for k, p in enumerate(picked)
        )
        return join_documents(docs), docs

    budget = length - buffer
    own_tokens = tok.count(build(0)[0])
    if own_tokens > budget:
        raise ValueError(
            f"question {question.id!r}: its own paragraphs take {own_tokens} tokens, more than "
            f"context length {length} leaves ({budget}); use a longer context length"
        )
    guess = budget * len(own) // max(1, own_tokens) - len(own)
    try:
        n, text, docs = fit(build, tok, budget, guess, limit=len(extra))
    except ValueError:
        raise ValueError(
            f"{path}: its {len(pool.texts)} paragraphs cannot fill context length {length} "
            f"({budget} tokens); use a shorter context length or a larger file"
        ) from None
    ex_id = f"ruler-qa-L{length}-{i:04d}"
    gold_ids = sorted({d for d, _, _ in evidence})
    haystack = f"{format} paragraphs (distractors from the same file)"
    meta = {
        "task": "ruler/qa",
        "source": format,
        "question_id": question.id,
        **context_meta(tok, haystack, seed, length, buffer, text),
        "instruction": INSTRUCTION,
        "answer_prefix": ANSWER_PREFIX,
        "evidence": evidence,
        "gold_doc_ids": gold_ids,
        "num_docs": len(docs),
        "ruler_metric": METRIC,
        "tokens_to_generate": TOKENS_TO_GENERATE,
        "task_type": "qa",
    }
    return Example(ex_id, question.question, question.answers, docs, meta)


@functools.wraps(iter_qa)  # same signature, so build_dataset can check parameters
def build(**params) -> list[Example]:
    """RULER's QA task over your QA file (``path``, ``format``: squad, hotpotqa or jsonl)."""
    return list(iter_qa(**params))
