"""RULER's frequent words extraction (``fwe``): find the three most frequent coded words.

An aggregation task, like common words, but with a Zipf-like distribution instead of two fixed
frequencies. Following NVIDIA/RULER's ``scripts/data/synthetic/freq_words_extraction.py``
(commit c3f5e3b, lines 74-107): a vocabulary of ``vocab_size`` random ``coded_wordlen``-letter
lowercase "words" (sorted, then shuffled), the top-ranked one replaced by the noise word
``"..."``; the word of rank k appears ``floor(num_words * k**-alpha / zeta(alpha))`` times; the
words are shuffled and joined by spaces. The answer is the words of ranks 2-4 (``vocab[1:4]``);
RULER scores it with ``string_match_all``. ``vocab_size`` defaults to RULER's
``(max_seq_length - tokens_to_generate) // 50`` (lines 113-114), i.e. ``(context_length - 50)
// 50``. The haystack is the coded text itself: there is no filler.

Sizing is ragbench's: the most ``num_words`` whose text fits ``context_length -
final_context_length_buffer`` tokens (``haystack.fit``), where RULER steps ``num_words`` by
``max_len // 32``. A context so short that ranks 2-5 do not get four distinct counts has no
well-defined top three and is an error. Every occurrence of an answer word is an evidence span.
"""

from __future__ import annotations

import functools
import math
import random
import string
from collections.abc import Iterator, Sequence

from ragbench.datasets._validate import DatasetParamError, int_param, lengths_param
from ragbench.datasets.haystack import fit
from ragbench.datasets.niah import DEFAULT_TOKENIZER
from ragbench.datasets.ruler.tasks import context_meta
from ragbench.tokenizers import get_tokenizer
from ragbench.types import Document, Example

# RULER scripts/data/synthetic/constants.py, lines 43-47 ('freq_words_extraction')
HAYSTACK = "none (the coded words are the context)"
INSTRUCTION = (
    "Read the following coded text and track the frequency of each coded word. Find the three "
    "most frequently appeared coded words."
)
QUESTION = (
    "Do not provide any explanation. Please ignore the dots '....'. What are the three most "
    "frequently appeared words in the above coded text?"
)
ANSWER_PREFIX = (
    "Answer: According to the coded text above, the three most frequently appeared words are:"
)
TOKENS_TO_GENERATE = 50  # constants.py line 44
NOISE_WORD = "..."  # freq_words_extraction.py line 81: the top-ranked word is noise
METRIC = "string_match_all"  # RULER scripts/eval/synthetic/constants.py, lines 43-45


def zeta(alpha: float) -> float:
    """Riemann zeta(alpha) for alpha > 1 (scipy.special.zeta, which RULER calls, without scipy):
    a partial sum plus the Euler-Maclaurin tail, accurate to ~1e-12."""
    n = 1000
    head = math.fsum(k**-alpha for k in range(1, n))
    return head + n ** (1 - alpha) / (alpha - 1) + n**-alpha / 2 + alpha * n ** (-alpha - 1) / 12


def zeta_counts(num_words: int, vocab_size: int, alpha: float) -> list[int]:
    """How often the word of each rank k = 1..vocab_size appears: ``floor(num_words * k**-alpha
    / zeta(alpha))`` (freq_words_extraction.py lines 86-88)."""
    z = zeta(alpha)
    return [int(num_words * k**-alpha / z) for k in range(1, vocab_size + 1)]


def coded_vocab(rng: random.Random, vocab_size: int, wordlen: int) -> list[str]:
    """``vocab_size`` distinct random lowercase words, sorted then shuffled, the first replaced
    by the noise word (freq_words_extraction.py lines 76-81)."""
    words: set[str] = set()
    while len(words) < vocab_size:
        words.add("".join(rng.choices(string.ascii_lowercase, k=wordlen)))
    vocab = sorted(words)
    rng.shuffle(vocab)
    vocab[0] = NOISE_WORD
    return vocab


def _text(rng_state, vocab: list[str], counts: list[int]) -> tuple[str, list[tuple[int, int]]]:
    """The shuffled coded text and the character spans of every answer word (ranks 2-4)."""
    words = [w for w, c in zip(vocab, counts, strict=True) for _ in range(c)]
    r = random.Random()
    r.setstate(rng_state)
    r.shuffle(words)
    answers, spans, pos = set(vocab[1:4]), [], 0
    for w in words:
        if w in answers:
            spans.append((pos, pos + len(w)))
        pos += len(w) + 1
    return " ".join(words), spans


def iter_fwe(  # the sizing parameters of every RULER task first (tasks.COMMON_PARAMS)
    context_lengths: int | Sequence[int] = (4096,),
    num_examples: int = 10,
    tokenizer: str = DEFAULT_TOKENIZER,
    final_context_length_buffer: int = 200,
    seed: int = 42,
    alpha: float = 2.0,
    vocab_size: int | None = None,
    coded_wordlen: int = 6,
) -> Iterator[Example]:
    """Yield ``num_examples`` fwe examples per context length (RULER's defaults: alpha 2.0,
    6-letter words, ``(context_length - 50) // 50`` of them)."""
    lengths, buffer = lengths_param(context_lengths, final_context_length_buffer)
    int_param("num_examples", num_examples)
    int_param("coded_wordlen", coded_wordlen)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or alpha <= 1:
        raise DatasetParamError(
            "alpha", f"expected a number > 1 (zeta diverges at 1), got {alpha!r}"
        )
    if vocab_size is not None:
        int_param("vocab_size", vocab_size, lo=5)
    tok = get_tokenizer(tokenizer)
    for length in lengths:
        budget = length - buffer
        size = vocab_size or (length - TOKENS_TO_GENERATE) // 50
        if size < 5:
            raise DatasetParamError(
                "context_lengths",
                f"{length} gives a vocabulary of {size} words (RULER's "
                "(length - 50) // 50); the top three plus noise need 5: use a longer length",
            )
        for i in range(num_examples):
            ex_id = f"ruler-fwe-L{length}-{i:04d}"
            rng = random.Random(f"{seed}/fwe/{length}/{i}")  # str seeds are stable
            vocab = coded_vocab(rng, size, coded_wordlen)
            state = rng.getstate()

            def build(n: int, vocab=vocab, state=state):
                counts = zeta_counts(n, len(vocab), alpha)
                text, spans = _text(state, vocab, counts)
                return text, (spans, counts)

            per_word = max(1, tok.count(" ".join(vocab[1:11])) // 10)
            n, text, (spans, counts) = fit(build, tok, budget, budget // per_word)
            if not counts[1] > counts[2] > counts[3] > max(counts[4:], default=0):
                raise ValueError(
                    f"fwe at {length} tokens: ranks 2-5 appear {counts[1:5]} times, so there is "
                    f"no distinct top three; use a longer context length (alpha {alpha})"
                )
            doc = Document(id=f"{ex_id}/context", text=text)
            meta = {
                "task": "ruler/fwe",
                **context_meta(tok, HAYSTACK, seed, length, buffer, text),
                "instruction": INSTRUCTION,
                "answer_prefix": ANSWER_PREFIX,
                "evidence": [[doc.id, s, e] for s, e in spans],
                "num_words": n,
                "vocab_size": size,
                "alpha": alpha,
                "counts": counts[:5],
                "ruler_metric": METRIC,
                "tokens_to_generate": TOKENS_TO_GENERATE,
            }
            yield Example(ex_id, QUESTION, tuple(vocab[1:4]), (doc,), meta)


@functools.wraps(iter_fwe)  # same signature, so build_dataset can check parameters
def build(**params) -> list[Example]:
    return list(iter_fwe(**params))
