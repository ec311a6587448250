"""Multi-hop generated questions: one question whose answer needs two passages, each passage's
evidence located in its own document.

``question_gen.generate_questions(..., hops=2)`` (``ragbench data questions --multi-hop``) drives
these pure functions exactly as it drives the single-passage ones: batches, the closed-book
check, near-duplicates and the cost are the driver's. The reference is RAGAS's multi-hop
*specific* query synthesizer: it pairs chunks whose extracted entities overlap and asks the LLM
for a query that combines the tagged segments (``<1-hop>``, ``<2-hop>``). Here, with no model
to extract entities and every step checkable:

1. Pairs (``pair_passages``): the seeded passages of ``retrieval.passages.sample_passages``;
   each, in that order, is paired with the passage of another document (of the same one when the
   corpus has one) sharing the rarest key words with it: the score is the sum over shared words
   of ``1 / df`` (df: passages holding the word), so a name or a number two passages share
   outweighs a word many share. Key words are lower-cased words of 3+ characters (or numbers)
   that are not stopwords; a word in more than a tenth of the passages (and more than two) links
   nothing in particular and is skipped. A passage is in one pair at most; ties go to the
   earlier passage in the seeded order. Same corpus and seed: the same pairs.
2. The request (``pair_request``): both texts, the words they share, and one worked bridge
   question in the two-line format of single-passage generation (small models copy a format
   that is shown); the instructions and the example are the shared prompt prefix.
3. The checks (``check_pair_reply``), each a reason in the report: the single-passage ones
   (``format``, ``not_a_question``, ``answer_too_long``), the answer found in one of the two
   passages (``answer_not_in_passage``: that one is the answer's hop, the other the bridge),
   ``answer_in_question``, and ``single_hop``: the question must draw on the bridge passage (a
   content word of it, matched by stem as the NIAH guard matches, found in the bridge passage
   and not in the answer's), or one passage alone would answer it (when both passages hold the
   answer, it must draw on each one's partner).
4. Evidence: the answer's sentence (as for one passage) and the bridge passage's sentence
   holding most of the words the question took from it: two quotes, in passage order, which
   the ``corpus`` dataset locates again as two ``[doc_id, start, end]`` spans in two places;
   ``meta.evidence_spans`` keeps the exact spans, ``meta.passages`` both passages.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ragbench.datasets.niah import shared_content_words
from ragbench.datasets.question_text import (
    Passage,
    evidence_quote,
    find_span,
    passage_id,
    read_reply,
    sentence_spans,
)
from ragbench.metrics.normalize import normalize_answer
from ragbench.types import GenerationRequest

REASONS = ("single_hop",)  # the reason only two-passage questions have
SHARED_SHOWN = 3  # shared words named in the request
MULTIHOP_TEMPLATE = (
    "Write one question that needs both texts to answer, and its answer, a short phrase copied "
    "word for word from one of the texts. Reply in exactly this format:\n"
    "Question: <the question>\n"
    "Answer: <the answer>\n\n"
    "Text 1: The white tower was built by Ada Quill.\n"
    "Text 2: Ada Quill was born in Dover.\n"
    "Both mention: ada, quill\n"
    "Question: Where was the builder of the white tower born?\n"
    "Answer: Dover\n\n"
    "Text 1: {first}\n"
    "Text 2: {second}\n"
    "Both mention: {shared}\n"
)
_PREFIX = MULTIHOP_TEMPLATE[: MULTIHOP_TEMPLATE.index("Text 1: {first}")]
STOPWORDS = frozenset(
    [
        "the",
        "and",
        "for",
        "are",
        "was",
        "were",
        "been",
        "being",
        "has",
        "have",
        "had",
        "does",
        "did",
        "doing",
        "not",
        "but",
        "nor",
        "its",
        "his",
        "her",
        "their",
        "them",
        "they",
        "this",
        "that",
        "these",
        "those",
        "with",
        "from",
        "into",
        "onto",
        "over",
        "under",
        "than",
        "then",
        "there",
        "here",
        "what",
        "which",
        "who",
        "whom",
        "whose",
        "when",
        "where",
        "why",
        "how",
        "all",
        "any",
        "each",
        "some",
        "such",
        "more",
        "most",
        "other",
        "also",
        "only",
        "own",
        "same",
        "very",
        "can",
        "will",
        "just",
        "should",
        "would",
        "could",
        "may",
        "might",
        "must",
        "shall",
        "about",
        "above",
        "after",
        "again",
        "against",
        "before",
        "below",
        "between",
        "both",
        "during",
        "further",
        "once",
        "our",
        "ours",
        "out",
        "off",
        "through",
        "until",
        "upon",
        "while",
        "you",
        "your",
        "yours",
        "she",
        "him",
        "himself",
        "herself",
        "itself",
        "themselves",
        "one",
        "two",
    ]
)
_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class PassagePair:
    """Two passages asked about together, and the key words they share (rarest first)."""

    first: Passage
    second: Passage
    shared: tuple[str, ...]


def pair_id(pair: PassagePair) -> str:
    return f"{passage_id(pair.first)}+{passage_id(pair.second)}"


# --------------------------------------------------------------------------- pairs


def key_words(text: str) -> frozenset[str]:
    """Lower-cased words of 3+ characters, or numbers, that are not stopwords."""
    words = _WORD.findall(text.lower())
    return frozenset(w for w in words if (len(w) >= 3 or w.isdigit()) and w not in STOPWORDS)


def pair_passages(passages: Sequence[Passage]) -> Iterator[PassagePair]:
    """Pairs of passages sharing rare key words, in the passages' (seeded) order (see the module
    docstring). Lazy: a large corpus is paired only as far as the questions asked need."""
    words = [key_words(p.text) for p in passages]
    postings: dict[str, list[int]] = {}
    for i, ws in enumerate(words):
        for w in ws:
            postings.setdefault(w, []).append(i)
    cap = max(2, len(passages) // 10)
    several_documents = len({p.doc_id for p in passages}) > 1
    used: set[int] = set()
    for i, passage in enumerate(passages):
        if i in used:
            continue
        scores: dict[int, float] = defaultdict(float)
        for w in sorted(words[i]):  # sorted: the float sums are the same in every process
            if len(postings[w]) <= cap:
                for j in postings[w]:
                    scores[j] += 1.0 / len(postings[w])
        candidates = [
            j
            for j in scores
            if j != i
            and j not in used
            and (passages[j].doc_id != passage.doc_id or not several_documents)
        ]
        if not candidates:
            continue
        j = max(candidates, key=lambda j: (scores[j], -j))
        shared = sorted(words[i] & words[j], key=lambda w: (len(postings[w]), w))
        used |= {i, j}
        yield PassagePair(passage, passages[j], tuple(shared))


# --------------------------------------------------------------------------- request, reply


def pair_request(pair: PassagePair, max_new_tokens: int = 64) -> GenerationRequest:
    prompt = MULTIHOP_TEMPLATE.format(
        first=pair.first.text,
        second=pair.second.text,
        shared=", ".join(pair.shared[:SHARED_SHOWN]),
    )
    return GenerationRequest(
        prompt=prompt, max_new_tokens=max_new_tokens, prefix=_PREFIX, id=pair_id(pair)
    )


def bridge_sentence(passage: Passage, question: str, words: set[str]) -> tuple[int, int] | None:
    """The span (in ``passage.text``) of its sentence holding most of ``words`` (question words
    matched by stem), the first on a tie; None when no sentence holds one."""
    best, best_n = None, 0
    for s, e in sentence_spans(passage.text):
        n = len(shared_content_words(passage.text[s:e], question) & words)
        if n > best_n:
            best, best_n = (s, e), n
    return best


def check_pair_reply(
    pair: PassagePair, reply: str, max_answer_words: int
) -> dict[str, object] | str:
    """The question row for ``reply`` to ``pair``, or the reason it is rejected."""
    parsed = read_reply(reply, max_answer_words)
    if isinstance(parsed, str):
        return parsed
    question, answer = parsed
    hops = (pair.first, pair.second)
    found = [(k, span) for k, p in enumerate(hops) if (span := find_span(answer, p.text))]
    if not found:
        return "answer_not_in_passage"
    k, span = found[0]  # hops[k] holds the answer; the other one is the bridge
    home, bridge = hops[k], hops[1 - k]
    answer = home.text[span[0] : span[1]]  # the document's own spelling, not the model's
    if f" {normalize_answer(answer)} " in f" {normalize_answer(question)} ":
        return "answer_in_question"

    def drawn(h: int) -> set[str]:  # question words only the other passage has
        other = hops[1 - h].text
        return shared_content_words(other, question) - shared_content_words(hops[h].text, question)

    if any(not drawn(h) for h, _ in found):  # a passage with the answer answers it alone
        return "single_hop"
    link = bridge_sentence(bridge, question, drawn(k))
    if link is None:
        return "single_hop"
    quotes = [link, link]
    quotes[k] = evidence_quote(home.text, *span)
    spans = [[p.doc_id, p.start + q[0], p.start + q[1]] for p, q in zip(hops, quotes, strict=True)]
    return {
        "question": question,
        "answers": [answer],
        "evidence": [p.text[q[0] : q[1]] for p, q in zip(hops, quotes, strict=True)],
        "task_type": "qa",
        "meta": {
            "source": "generated",
            "hops": 2,
            "answer_span": [home.doc_id, home.start + span[0], home.start + span[1]],
            "evidence_spans": spans,
            "passages": [[p.doc_id, p.start, p.end] for p in hops],
            "shared_words": list(pair.shared[:SHARED_SHOWN]),
        },
    }
