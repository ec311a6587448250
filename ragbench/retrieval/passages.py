"""Passages to ask questions about: the corpus chunked with the ``sentence`` splitter (whitespace
tokens), passages too short to ask about dropped, in a seeded order. Question generation
(``experiment.question_gen``) asks about them one batch at a time; what a passage is, and the
text functions over it, are ``datasets.question_text``'s.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from ragbench.datasets.question_text import Passage
from ragbench.retrieval.chunking import chunk_documents
from ragbench.types import Document


def sample_passages(
    documents: Sequence[Document],
    *,
    seed: int = 0,
    passage_tokens: int = 128,
    min_passage_words: int = 8,
) -> list[Passage]:
    """Every passage of the corpus long enough to ask about, in a seeded order."""
    if passage_tokens < 8:
        raise ValueError(f"passage_tokens must be >= 8, got {passage_tokens}")
    chunks = chunk_documents(documents, "sentence", passage_tokens, 0, "whitespace")
    passages = [
        Passage(c.doc_id, c.start, c.end, c.text)
        for c in chunks
        if len(c.text.split()) >= min_passage_words
    ]
    random.Random(seed).shuffle(passages)  # a local RNG: nothing else's randomness moves it
    return passages
