"""Text cleaning for corpora and dedup: ``clean_text`` and the normalised form that
``corpus`` hashes and shingles.

- ``clean_text``: mojibake repair with ftfy (conservative settings: no quote uncurling, no HTML
  unescaping, no width/ligature folding), control characters but ``\\n`` and ``\\t`` replaced by
  a space (never joining the words they separate; a BOM is deleted), line breaks (vertical tab
  and form feed too) unified, Unicode spaces -> ``" "``, runs of spaces collapsed, trailing
  spaces stripped, at most one blank line in a row, NFC.
- ``normalize_for_hash``: cleaned, casefolded, all whitespace collapsed to single spaces.

Both run on whole documents (a 50 MB text file is one string), so each step makes at most one
new copy of the text at a time: no list of words, no ``re.sub`` match on every plain space (it
keeps a piece per match), ``casefold`` slice by slice.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from typing import Any

# C0 controls but \t \n \r, vertical tab and form feed (line breaks): ftfy would delete them,
# joining the words they separate ("Plain\x00text"), so they become spaces before it runs
_C0_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # Cc left after ftfy except \t \n
_BOM = "\ufeff"  # a zero-width no-break space: nothing to separate, deleted
_LINE_BREAKS = re.compile(r"\r\n|[\r\x0b\x0c\x85\u2028\u2029]")
# any whitespace but newline and tab (incl. NBSP, U+3000); a lone " " is left as it is
_SPACES = re.compile(r"[^\S\n\t]{2,}|[^\S\n\t ]")
_TRAILING = re.compile(r"[ \t]+\n")
_BLANK_LINES = re.compile(r"\n{3,}")
_NON_SPACE = re.compile(r"\S")
_WHITESPACE = re.compile(r"\s{2,}|[^\S ]")  # runs str.split() splits on, a lone " " excepted
_SLICE = 1 << 20  # characters casefolded or hashed at a time (not one big temporary copy)


def clean_text(text: str) -> str:
    import ftfy

    config = ftfy.TextFixerConfig(
        unescape_html=False,
        uncurl_quotes=False,
        fix_latin_ligatures=False,
        fix_character_width=False,
        normalization="NFC",
    )
    text = ftfy.fix_text(_C0_CONTROL.sub(" ", text).replace("\x0b", "\n"), config)
    text = _LINE_BREAKS.sub("\n", text)
    text = _CONTROL.sub(" ", text).replace(_BOM, "")
    text = _SPACES.sub(" ", text)
    text = _TRAILING.sub("\n", text)
    text = _BLANK_LINES.sub("\n\n", text)
    return unicodedata.normalize("NFC", text.strip())


def normalize_for_hash(text: str) -> str:
    """Cleaned, casefolded, all whitespace collapsed to single spaces."""
    # == " ".join(clean_text(text).casefold().split()) in slices cut after a non-space: on a
    # big text split() makes an object per word, re.sub one per match, and casefold() takes
    # 12 bytes per character at once; it folds each character alone (unlike lower()).
    cleaned = clean_text(text)
    parts = [_WHITESPACE.sub(" ", part.casefold()) for part in _slices(cleaned)]
    del cleaned
    return "".join(parts).strip()


def _slices(text: str) -> Iterator[str]:
    """``text`` in slices of about ``_SLICE`` characters, none cutting a run of whitespace."""
    start = 0
    while start < len(text):
        after = _NON_SPACE.search(text, start + _SLICE - 1)
        end = after.end() if after else len(text)
        yield text[start:end]
        start = end


def update_sha256(digest: Any, text: str) -> None:
    """digest.update(text.encode()) slice by slice (the same bytes, no full-size copy)."""
    for i in range(0, len(text), _SLICE):
        digest.update(text[i : i + _SLICE].encode("utf-8"))
