"""Needle in a haystack, compatible with Kamradt's LLMTest_NeedleInAHaystack (``needlehaystack``).

For each (context length, depth percent) the reference harness trims the haystack to
``context_length - final_context_length_buffer - needle tokens`` tokens, walks back from the token
at ``depth_percent`` of that haystack to the previous sentence end, and inserts the needle there.
We do the same with a named tokenizer, but cut and insert by character offsets, so the essay text
is kept byte-for-byte (decoding token ids would re-space it), then re-count the assembled context
and correct the haystack length until it holds ``context_length - buffer`` tokens.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ragbench.datasets._validate import (
    DatasetParamError,
    choice_param,
    int_list_param,
    int_param,
    number_list_param,
)
from ragbench.datasets.haystack import Haystack, load_haystack, sentence_start_before
from ragbench.registry import unknown
from ragbench.tokenizers import Tokenizer, get_tokenizer
from ragbench.types import Document, Example

KAMRADT_NEEDLE = (
    "\nThe best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a "
    "sunny day.\n"
)
KAMRADT_QUESTION = "What is the best thing to do in San Francisco?"
KAMRADT_ANSWER = "eat a sandwich and sit in Dolores Park on a sunny day"
DEFAULT_TOKENIZER = "smollm2-135m-instruct"
SPACINGS = ("linear", "sigmoid")


def linear_spacing(lo: float, hi: float, n: int) -> list[int]:
    """``np.round(np.linspace(lo, hi, n)).astype(int)``, as the reference harness spaces a grid."""
    import numpy as np

    return [int(v) for v in np.round(np.linspace(lo, hi, num=n, endpoint=True)).astype(int)]


def depth_grid(n: int, spacing: str = "linear", lo: float = 0, hi: float = 100) -> list[float]:
    """Depth percents with ``n`` points, linear or sigmoid spaced exactly like the reference.

    The reference's sigmoid maps x -> 100 / (1 + exp(0.1 (x - 50))) (0 and 100 stay), which
    crowds points near both ends, rounded to 3 decimals.
    """
    import numpy as np

    if n < 1:
        raise ValueError(f"depth intervals must be >= 1, got {n}")
    if spacing == "linear":
        return [float(v) for v in linear_spacing(lo, hi, n)]
    if spacing == "sigmoid":
        out = []
        for x in np.linspace(lo, hi, n):
            if x in (0, 100):
                out.append(float(x))
            else:
                out.append(float(np.round(100 / (1 + np.exp(0.1 * (x - 50))), 3)))
        return out
    raise unknown("depth spacing", spacing, SPACINGS)


@dataclass(frozen=True)
class Placement:
    """A context with the needle placed; offsets are characters in ``text``."""

    text: str
    needle_start: int  # span of the stripped needle text
    needle_end: int
    context_tokens: int
    haystack_tokens: int  # haystack tokens the needle was placed among
    depth_tokens: int  # context tokens before the insertion point
    depth_tokens_target: int  # the token position the depth percent asked for


def place_needle(
    haystack: Haystack,
    tokenizer: Tokenizer,
    needle: str,
    context_length: int,
    depth_percent: float,
    final_context_length_buffer: int = 200,
) -> Placement:
    """Place ``needle`` at ``depth_percent`` of a ``context_length - buffer`` token context."""
    core = needle.strip()
    if not core:
        raise ValueError("the needle text is empty")
    if not 0 <= depth_percent <= 100:
        raise ValueError(f"depth percent must be within [0, 100], got {depth_percent}")
    if haystack.contains(core):
        raise ValueError(f"haystack {haystack.name!r} already contains the needle text")
    target = context_length - final_context_length_buffer
    needle_tokens = tokenizer.count(needle)
    if target <= needle_tokens:
        raise ValueError(
            f"context length {context_length} leaves {target} tokens after the "
            f"{final_context_length_buffer}-token buffer: no room for a {needle_tokens}-token needle"
        )
    n_hay = target - needle_tokens
    best: Placement | None = None
    for _ in range(6):  # the first pass is usually exact; joins can shift a count by a token
        placement = _assemble(haystack, tokenizer, needle, n_hay, depth_percent)
        if placement.context_tokens <= context_length and (
            best is None
            or abs(placement.context_tokens - target) < abs(best.context_tokens - target)
        ):
            best = placement
        if placement.context_tokens == target or n_hay + target - placement.context_tokens < 1:
            break
        n_hay += target - placement.context_tokens
    assert best is not None, "needle placement overshot the requested context length"
    return best


def _assemble(
    haystack: Haystack, tokenizer: Tokenizer, needle: str, n_hay: int, depth_percent: float
) -> Placement:
    hay, offsets = haystack.take(tokenizer, n_hay)
    target_index = int(n_hay * (depth_percent / 100))
    pos = len(hay) if depth_percent == 100 else sentence_start_before(hay, offsets, target_index)
    inserted = needle
    if pos > 0 and not needle[:1].isspace():
        inserted = " " + inserted
    if pos < len(hay) and not needle[-1:].isspace() and not hay[pos].isspace():
        inserted = inserted + " "
    text = hay[:pos] + inserted + hay[pos:]
    start = pos + inserted.index(needle.strip())
    end = start + len(needle.strip())
    return Placement(
        text=text,
        needle_start=start,
        needle_end=end,
        context_tokens=tokenizer.count(text),
        haystack_tokens=n_hay,
        depth_tokens=tokenizer.count(text[:pos]),
        depth_tokens_target=n_hay if depth_percent == 100 else target_index,
    )


def example_id(context_length: int, depth_percent: float) -> str:
    return f"niah-L{context_length}-D{depth_percent:g}"


NEEDLE_MODES = ("literal", "nonliteral")
# NoLiMa-style pair (Modarressi et al. 2025): the question names Dresden, the needle its opera
# house; only world knowledge links them. The answer is the character's name.
NONLITERAL = (
    "\nActually, Yuki lives next to the Semper Opera House.\n",
    "Which character has been to Dresden?",
    "Yuki",
)
_STOPWORDS = frozenset(
    [
        "a",
        "an",
        "the",
        "of",
        "in",
        "on",
        "at",
        "to",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "has",
        "have",
        "had",
        "do",
        "does",
        "did",
        "what",
        "which",
        "who",
        "whom",
        "whose",
        "when",
        "where",
        "why",
        "how",
        "and",
        "or",
        "but",
        "for",
        "with",
        "by",
        "from",
        "as",
        "that",
        "this",
        "it",
        "its",
        "next",
    ]
)


@functools.cache
def _stemmer() -> Any:
    import snowballstemmer

    return snowballstemmer.stemmer("english")


def _word_keys(word: str) -> set[str]:
    """A word's Snowball (Porter 2) stem, plus the stem without an agent "-er" ("singer" ->
    "sing", "baker" -> "bake"), which the stemmer keeps."""
    stem = _stemmer().stemWord(word)
    if stem.endswith("er") and len(stem) >= 5:
        return {stem, stem[:-2], stem[:-1]}
    return {stem}


def shared_content_words(needle: str, question: str) -> set[str]:
    """Content words (not stopwords, 3+ letters, lower-cased) of the question whose stem a word
    of the needle shares: "paints"/"painted", "sings"/"singer", "cooked"/"cooking" all match."""

    def words(text: str) -> dict[str, set[str]]:
        found = re.findall(r"[A-Za-z]+", text.lower())
        return {w: _word_keys(w) for w in found if len(w) >= 3 and w not in _STOPWORDS}

    in_needle = set().union(*words(needle).values())
    return {w for w, keys in words(question).items() if keys & in_needle}


def iter_niah(
    context_lengths: Sequence[int] = (1024, 2048, 4096),
    depth_percents: Sequence[float] | None = None,
    depth_intervals: int = 5,
    depth_spacing: str = "linear",
    needle: str = KAMRADT_NEEDLE,
    question: str = KAMRADT_QUESTION,
    answer: str | None = None,
    haystack: str = "essays",
    tokenizer: str = DEFAULT_TOKENIZER,
    final_context_length_buffer: int = 200,
    seed: int | None = None,
    needle_mode: str = "literal",
) -> Iterator[Example]:
    """Yield one Example per (context length, depth percent), lengths outer.

    ``depth_percents`` wins over ``depth_intervals``/``depth_spacing``. ``answer`` defaults to the
    Kamradt answer for the Kamradt needle, else the needle text. ``seed`` (None = sorted essay
    order, as the reference) shuffles the haystack's file order reproducibly. ``haystack``: a
    source name, a folder, or your corpus file (``.jsonl``).

    ``needle_mode="nonliteral"`` (NoLiMa, Modarressi et al. 2025): the question shares no content
    word with the needle, so finding it takes an association, not string matching; with the
    default needle it uses ``NONLITERAL``, and a given needle/question pair that shares a content
    word is refused (the test would be literal after all).
    """
    choice_param("needle_mode", needle_mode, NEEDLE_MODES)
    buffer = int_param("final_context_length_buffer", final_context_length_buffer, lo=0)
    why = f"more than final_context_length_buffer, {buffer}"
    context_lengths = int_list_param("context_lengths", context_lengths, lo=buffer + 1, why=why)
    if depth_percents is not None:
        depth_percents = number_list_param("depth_percents", depth_percents, 0, 100)
    else:
        int_param("depth_intervals", depth_intervals, lo=1)
        choice_param("depth_spacing", depth_spacing, SPACINGS)
    if needle_mode == "nonliteral":
        if needle == KAMRADT_NEEDLE and question == KAMRADT_QUESTION:
            needle, question, answer = NONLITERAL
        shared = shared_content_words(needle, question)
        if shared:
            raise ValueError(
                f"needle_mode='nonliteral': the question shares {sorted(shared)} with the "
                "needle; reword it so that only an association links them"
            )
    depths = (
        [float(d) for d in depth_percents]
        if depth_percents is not None
        else depth_grid(depth_intervals, depth_spacing)
    )
    if answer is None:
        answer = KAMRADT_ANSWER if needle == KAMRADT_NEEDLE else needle.strip()
    tok = get_tokenizer(tokenizer)
    room = buffer + tok.count(needle)  # place_needle needs more than this
    for length in context_lengths:
        if length <= room:
            raise DatasetParamError(
                "context_lengths",
                f"{length} leaves no room for the {room - buffer}-token needle after the "
                f"{buffer}-token final_context_length_buffer; valid: integers > {room}",
            )
    hay = load_haystack(haystack, seed=seed)
    for length in context_lengths:
        for depth in depths:
            p = place_needle(hay, tok, needle, int(length), depth, final_context_length_buffer)
            ex_id = example_id(int(length), depth)
            doc = Document(id=f"{ex_id}/haystack", text=p.text)
            haystack_part = max(1, p.context_tokens - tok.count(needle))  # reference's base
            meta = {
                "task": "niah",
                "needle_mode": needle_mode,
                "tokenizer": tok.name,
                "haystack": hay.name,
                "seed": seed,
                "context_length": int(length),
                "final_context_length_buffer": final_context_length_buffer,
                "context_tokens": p.context_tokens,
                "depth_percent": depth,
                "depth_percent_actual": round(100 * p.depth_tokens / haystack_part, 3),
                "depth_tokens": p.depth_tokens,
                "depth_tokens_target": p.depth_tokens_target,
                "needle": needle,
                "needle_start": p.needle_start,
                "needle_end": p.needle_end,
                "evidence": [[doc.id, p.needle_start, p.needle_end]],
            }
            yield Example(ex_id, question, (answer,), (doc,), meta)


@functools.wraps(iter_niah)  # same signature, so build_dataset can check parameters
def build(**params) -> list[Example]:
    return list(iter_niah(**params))


def count_niah(
    context_lengths: Sequence[int] = (1024, 2048, 4096),
    depth_percents: Sequence[float] | None = None,
    depth_intervals: int = 5,
    **_: object,
) -> int:
    """How many examples :func:`iter_niah` yields (for progress bars)."""
    n_lengths = 1 if isinstance(context_lengths, int) else len(context_lengths)
    return n_lengths * (len(depth_percents) if depth_percents is not None else depth_intervals)
