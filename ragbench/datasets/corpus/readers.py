"""File readers for ``ragbench data docs``: PDF, HTML, Markdown, DOCX and plain text -> text.

Why these readers, not llama-index's ``SimpleDirectoryReader`` or markitdown: ragbench needs to
know exactly which characters each reader produced, so that page offsets and evidence spans refer
to the text that is written. ``SimpleDirectoryReader`` returns one llama-index Document per PDF
page with its own metadata and file-type fallbacks (an unknown type is silently read as text);
markitdown rewrites everything as Markdown and pulls in a dozen converters. Each reader here is
one small maintained library used directly, and returns the pieces it read (a PDF's pages), so
the caller cleans each piece and knows where it starts:

- PDF: pypdf (pure Python, no system libraries), ``extract_text`` page by page. The title is the
  PDF's ``/Title`` metadata when set, else the file name. Encrypted PDFs are read when they open
  with an empty password, otherwise reported.
- HTML: beautifulsoup4 with the standard-library parser (same tree on every machine). Scripts,
  styles and ``<head>`` are dropped; block elements become paragraph breaks, table cells are
  joined by " | "; whitespace inside ``<pre>`` is kept. Title: ``<title>``, else the first
  ``<h1>``.
- Markdown: the source text as is (a model reads Markdown well, and a quote copied from the file
  is found verbatim). A leading YAML front-matter block (between ``---`` lines) is removed; its
  ``title`` is the title, else the first heading after it. A block that is not valid YAML, or is
  a list rather than a mapping, is removed too, with a warning naming the file and the problem
  (it was meant as front matter; its lines are not the text nor the title). A block that reads
  as plain text (a thematic break, a paragraph and a setext underline) is kept as Markdown.
- DOCX: python-docx, body paragraphs and tables in document order (headers, footers and
  footnotes are left out: they repeat on every page). Title: the core property, else the first
  paragraph styled ``Title``.
- Plain text: UTF-8 (a BOM is allowed). Another encoding is reported rather than guessed, so no
  text is silently mis-decoded.

A reader raises on a file it cannot read; ``ragbench.datasets.corpus.docs`` reports it and moves on.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ragbench.io import load_yaml, yaml_problem

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Parsed:
    """What a reader got from one file: its pieces of text in order (a PDF's pages, one piece
    for the other formats) and a title ("" when the file names none)."""

    pieces: tuple[str, ...]
    title: str = ""
    meta: dict = field(default_factory=dict)


class UnreadableFile(Exception):
    """A file whose content cannot be turned into text; the message is the reason."""


# --------------------------------------------------------------------------- PDF


def read_pdf(path: Path) -> Parsed:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    # pypdf logs each repair it makes ("EOF marker not found", ...); a file it cannot read is
    # reported once with the reason below, so its warnings would only repeat that
    quiet = logging.getLogger("pypdf")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        reader = PdfReader(path)
        if reader.is_encrypted and not reader.decrypt(""):
            raise UnreadableFile("encrypted PDF (needs a password)")
        pages = tuple(page.extract_text() or "" for page in reader.pages)
        info = reader.metadata
    except PdfReadError as exc:
        raise UnreadableFile(f"not a readable PDF ({exc})") from None
    finally:
        quiet.setLevel(level)
    title = str(info.title).strip() if info is not None and info.title else ""
    return Parsed(pages, title, {"pages": len(pages)})


# --------------------------------------------------------------------------- HTML

_SKIP_TAGS = {"script", "style", "noscript", "template", "head", "svg", "iframe", "object"}
_BLOCK_TAGS = set(
    [
        "address",
        "article",
        "aside",
        "blockquote",
        "body",
        "caption",
        "dd",
        "details",
        "dialog",
        "div",
        "dl",
        "dt",
        "fieldset",
        "figcaption",
        "figure",
        "footer",
        "form",
        "h1",
        "h2",
        "h3",
        "h4",
        "h5",
        "h6",
        "header",
        "hr",
        "html",
        "li",
        "main",
        "nav",
        "ol",
        "p",
        "pre",
        "section",
        "summary",
        "table",
        "tbody",
        "tfoot",
        "thead",
        "tr",
        "ul",
    ]
)
_HTML_SPACE = re.compile(r"[ \t\n\r\f]+")  # HTML's own whitespace, not NBSP


class _TextBuilder:
    """Text as a browser lays it out, roughly: collapsed spaces, breaks between blocks."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.pending = 0  # newlines owed before the next text

    def breaks(self, n: int) -> None:
        self.pending = max(self.pending, n)

    def text(self, s: str, pre: bool = False) -> None:
        if not pre:
            s = _HTML_SPACE.sub(" ", s)
            if self.pending or not self.parts or self.parts[-1].endswith(" "):
                s = s.lstrip(" ")
        if not s:
            return
        if self.pending and self.parts:
            self.parts[-1] = self.parts[-1].rstrip(" ")
            self.parts.append("\n" * self.pending)
        self.pending = 0
        self.parts.append(s)


def _walk_html(node, out: _TextBuilder, pre: bool = False) -> None:
    from bs4 import NavigableString, Tag
    from bs4.element import PreformattedString

    for child in node.children:
        if isinstance(child, PreformattedString):  # comments, doctype, CDATA, processing instr.
            continue
        if isinstance(child, NavigableString):
            out.text(str(child), pre)
            continue
        if not isinstance(child, Tag) or child.name in _SKIP_TAGS:
            continue
        name = child.name
        if name == "br":
            out.breaks(1)
        elif name in ("td", "th"):
            if child.find_previous_sibling(("td", "th")) is not None:
                out.text(" | ")
            _walk_html(child, out, pre)
        elif name in _BLOCK_TAGS:
            out.breaks(1 if name in ("li", "tr", "dt", "dd") else 2)
            _walk_html(child, out, pre or name == "pre")
            out.breaks(1 if name in ("li", "tr", "dt", "dd") else 2)
        else:
            _walk_html(child, out, pre)


def read_html(path: Path) -> Parsed:
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(path.read_bytes(), "html.parser")  # bytes: honours <meta charset>
    title_tag = soup.find("title") or soup.find("h1")
    title = _HTML_SPACE.sub(" ", title_tag.get_text()).strip() if title_tag else ""
    out = _TextBuilder()
    _walk_html(soup, out)
    return Parsed(("".join(out.parts),), title)


# --------------------------------------------------------------------------- Markdown

_FRONT_MATTER = re.compile(r"\A---[ \t]*\n(.*?\n)(?:---|\.\.\.)[ \t]*(?:\n|\Z)", re.DOTALL)
_ATX_HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.+?)[ \t#]*$", re.MULTILINE)
_SETEXT_HEADING = re.compile(r"^ {0,3}(\S[^\n]*)\n {0,3}(?:=+|-+)[ \t]*$", re.MULTILINE)


def read_markdown(path: Path) -> Parsed:
    text = read_text_file(path)
    title = ""
    match = _FRONT_MATTER.match(text)
    if match:
        problem = ""
        try:
            front = load_yaml(match.group(1))  # aliases bounded: a document is untrusted
        except yaml.YAMLError as exc:
            line, what = yaml_problem(exc)  # the block's line; the file's is one more
            where = f"line {line + 1}: " if line is not None else ""
            front, problem = None, f"is not valid YAML ({where}{what})"
        if isinstance(front, list):
            problem = "is a YAML list, not a mapping of keys (title: ...)"
        if isinstance(front, dict):
            text = text[match.end() :]
            title = str(front.get("title") or "").strip()
        elif problem:  # front matter gone wrong: neither text nor a title ("- b")
            text = text[match.end() :]
            log.warning(
                "%s: front matter %s; left out of the text, not used as the title", path, problem
            )
        # else a scalar: a thematic break and a paragraph, Markdown kept as it is
    if not title:
        headings = [m for m in (_ATX_HEADING.search(text), _SETEXT_HEADING.search(text)) if m]
        if headings:
            title = min(headings, key=lambda m: m.start()).group(1).strip()
    return Parsed((text,), title)


# --------------------------------------------------------------------------- DOCX


def read_docx(path: Path) -> Parsed:
    import zipfile

    import docx
    from docx.opc.exceptions import PackageNotFoundError
    from docx.table import Table
    from docx.text.paragraph import Paragraph

    try:
        document = docx.Document(str(path))
    except (zipfile.BadZipFile, PackageNotFoundError):  # python-docx: not a zip at all
        raise UnreadableFile("not a DOCX file (not a zip archive)") from None
    blocks: list[str] = []
    title = ""
    for element in document.element.body.iterchildren():
        tag = element.tag.rsplit("}", 1)[-1]
        if tag == "p":
            paragraph = Paragraph(element, document)
            blocks.append(paragraph.text)
            style = paragraph.style.name if paragraph.style is not None else ""
            if not title and style == "Title":
                title = paragraph.text.strip()
        elif tag == "tbl":  # one block, one line per row
            rows = []
            for row in Table(element, document).rows:
                seen, cells = set(), []
                for cell in row.cells:  # a merged cell is returned once per grid column
                    if id(cell._tc) not in seen:
                        seen.add(id(cell._tc))
                        cells.append(" ".join(cell.text.split()))
                rows.append(" | ".join(cells))
            blocks.append("\n".join(rows))
    core_title = (document.core_properties.title or "").strip()
    text = "\n\n".join(b for b in blocks if b.strip())
    return Parsed((text,), core_title or title)


# --------------------------------------------------------------------------- plain text


def read_text_file(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UnreadableFile(
            f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
            "convert it to UTF-8 first"
        ) from None


def read_text(path: Path) -> Parsed:
    return Parsed((read_text_file(path),))


# --------------------------------------------------------------------------- registry

READERS: dict[str, tuple[str, Callable[[Path], Parsed]]] = {
    ".pdf": ("pdf", read_pdf),
    ".html": ("html", read_html),
    ".htm": ("html", read_html),
    ".xhtml": ("html", read_html),
    ".md": ("markdown", read_markdown),
    ".markdown": ("markdown", read_markdown),
    ".docx": ("docx", read_docx),
    ".txt": ("text", read_text),
    ".text": ("text", read_text),
    ".rst": ("text", read_text),
}
SUPPORTED = tuple(sorted(READERS))


def reader_for(path: Path) -> tuple[str, Callable[[Path], Parsed]] | None:
    """(format name, reader) for a file's extension (any case), or None when unsupported."""
    return READERS.get(path.suffix.lower())
