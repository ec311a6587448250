"""Alternative text for the figures of a rendered report (``render.render_notebook``).

A figure in an executed notebook is a PNG with nothing said about it; nbconvert writes its
``<img>`` without ``alt`` and stamps "No description has been provided for this image" on it
(with a warning on every render). Screen-reader users of a shared report then hear nothing of
what a figure shows. ragbench's notebooks say it in the markdown above each plot (a section
heading, then what the figure shows), so a figure's alt text is that: ``Figure N: <heading> -
<first sentence of the text above>``, written into the output's ``metadata["image/png"]["alt"]``
(Jupyter's place for it), which the report template puts on the ``<img>``. An alt text the
notebook already gives (a ``display(..., metadata=...)`` of its own) is kept.
"""

from __future__ import annotations

import re
from typing import Any

MAX_CHARS = 250  # screen readers read alt text whole: a sentence, not a page
_MARKUP = re.compile(r"[*_`]|\[([^\]]*)\]\([^)]*\)|\$")  # emphasis, code, links (their text), math


def plain(text: str) -> str:
    """Markdown as one line of plain text: links keep their words, markup characters go."""
    text = _MARKUP.sub(lambda m: m.group(1) or "", text)
    return " ".join(text.split())


def first_sentence(paragraph: str) -> str:
    sentence = re.split(r"(?<=[.!?])\s", plain(paragraph), maxsplit=1)[0]
    return sentence.rstrip(":;")


def describe_figures(nb: Any) -> int:
    """Give every PNG output of ``nb`` without one an alt text from the markdown above it (the
    module docstring); returns how many were given one."""
    heading, lead, n, given = "", "", 0, 0
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            lines = [line.strip() for line in cell.source.splitlines() if line.strip()]
            heads = [line for line in lines if line.startswith("#")]
            body = [line for line in lines if not line.startswith("#")]
            heading = plain(heads[-1].lstrip("#")) if heads else heading
            lead = first_sentence(" ".join(body)) if body else ("" if heads else lead)
            continue
        for output in cell.get("outputs", []):
            if "image/png" not in output.get("data", {}):
                continue
            n += 1
            meta = output.setdefault("metadata", {}).setdefault("image/png", {})
            if meta.get("alt"):
                continue
            about = " - ".join(part for part in (heading, lead) if part)
            text = f"Figure {n}: {about}" if about else f"Figure {n} of this report"
            meta["alt"] = text if len(text) <= MAX_CHARS else text[: MAX_CHARS - 3] + "..."
            given += 1
    return given
