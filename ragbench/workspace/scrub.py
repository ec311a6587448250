"""Scrubbing text before it is shown outside the machine: credentials and absolute paths.

``scrub`` is what ``ragbench.workspace.render`` applies to a rendered page before it is written: every
credential ``ragbench.secrets`` recognises (URL userinfo, ``api_key = ...`` pairs, bearer tokens,
key shapes, values of credential-named environment variables) becomes ``***`` and the machine's
absolute paths (``machine_paths``: venv, repo root, $HOME, extra folders such as the notebook's)
become placeholders. Its parts are used on their own too (``ragbench.workspace.kernels`` redacts notebook
outputs with them): ``redact_keeping_links`` (``secrets.redact_text`` that leaves links without
credentials spelled as written, HTML-escaped ones included), ``by_html_part`` (HTML edited as
HTML, each <script> body as the JavaScript it is: masked, never escaped) and
``outside_data_uris`` (an edit applied around embedded base64 images, never inside them).
"""

from __future__ import annotations

import html
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from ragbench import secrets


def machine_paths(extra: Iterable[str | os.PathLike] = ()) -> list[tuple[str, str]]:
    """(absolute path, placeholder) pairs, longest first (the venv is inside the repo, the repo
    inside $HOME). ``extra`` folders (the notebook's) count only outside those three."""
    pairs = [(sys.prefix, "$VENV")]
    root = repo_root()
    if root is not None:
        pairs.append((str(root), "$REPO"))
    home = os.path.expanduser("~")
    pairs.append((home, "~"))
    pairs = [(p, r) for p, r in pairs if len(p) > 1]
    for path in map(Path, extra):
        if not any(path.is_relative_to(p) for p, _ in pairs) and len(str(path)) > 1:
            pairs.append((str(path), "$RUN_DIR"))
    return sorted(dict(pairs).items(), key=lambda pr: len(pr[0]), reverse=True)


def repo_root() -> Path | None:
    """The checkout that holds this package (pyproject.toml beside ragbench/), if any."""
    here = Path(__file__).resolve().parents[2]
    return here if (here / "pyproject.toml").exists() else None


def scrub(
    text: str,
    environ: Mapping[str, str] | None = None,
    extra_paths: Iterable[str | os.PathLike] = (),
) -> str:
    """Replace credentials with *** (``secrets.redact_text``: the values of credential-named
    variables in ``environ``, default ``os.environ``, included) and absolute machine paths with
    placeholders.

    Embedded base64 images are left alone: their alphabet contains "/" and must not be edited."""
    paths = machine_paths(extra_paths)

    def edit(part: str, escaped: bool) -> str:
        return outside_data_uris(
            part,
            lambda text: _scrub_paths(redact_keeping_links(text, environ, escaped=escaped), paths),
        )

    return by_html_part(text, edit)


# A <script> element: its body is JavaScript, never HTML-escaped (``&&`` must not become
# ``&amp;&amp;``, nor a link's ``&`` an ``&amp;``)
_SCRIPT = re.compile(r"(<script\b[^>]*>)(.*?)(</script\s*>)", re.IGNORECASE | re.DOTALL)


def by_html_part(text: str, edit: Callable[[str, bool], str]) -> str:
    """``edit(part, escaped)`` applied to each part of an HTML text: ``escaped=True`` for the
    markup and its text (HTML-escaped), ``False`` for the body of each <script> element (raw
    JavaScript). A script scrubbed as HTML would have its masked links escaped back, ``&``
    turned ``&amp;``: a syntax error or a wrong URL in the page's interactive views."""
    parts = _SCRIPT.split(text)  # html, <script ...>, body, </script>, html, ...
    return "".join(edit(part, i % 4 != 2) for i, part in enumerate(parts))


# A URL in the page, as ``secrets`` finds them.
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>()\[\]{}\\`]+")


def redact_keeping_links(
    text: str,
    environ: Mapping[str, str] | None = None,
    escaped: bool = False,
    known: Iterable[str] = (),
) -> str:
    """``secrets.redact_text`` that leaves links without credentials as written.

    ``redact_text`` rebuilds every URL with a query string, which re-encodes it and breaks an
    HTML-escaped link (``?a=1&amp;b=2`` becomes ``?a=1&amp%3Bb=2``). Here a URL that carries no
    credential (no userinfo, no credential-named query parameter) keeps its spelling and only
    has secret values masked in it; one that does is redacted (``escaped``: the text is HTML, so
    the URL is unescaped first and escaped back; a <script>'s body is not HTML: see
    ``by_html_part``). ``known``: more values to mask (``secrets.redact_text``)."""
    known = tuple(known)
    parts = _URL.split(text)
    urls = _URL.findall(text)
    out = [secrets.redact_text(parts[0], environ, known)]
    for url, after in zip(urls, parts[1:], strict=True):
        plain = html.unescape(url) if escaped else url
        if secrets.redact_url(plain) != _requoted(plain):  # userinfo or a secret query value
            redacted = secrets.redact_text(plain, environ, known)
            out.append(html.escape(redacted, quote=False) if escaped else redacted)
        else:  # without its "://" redact_text sees no URL: values, pairs, shapes only
            hidden = url.replace("://", "\0", 1)
            out.append(secrets.redact_text(hidden, environ, known).replace("\0", "://"))
        out.append(secrets.redact_text(after, environ, known))
    return "".join(out)


def _requoted(url: str) -> str:
    """The URL as ``secrets.redact_url`` spells one it leaves alone (its query re-encoded)."""
    from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
    except ValueError:
        return ""
    query = "&".join(
        f"{quote(k, safe='')}={quote(v, safe='')}"
        for k, v in parse_qsl(parts.query, keep_blank_values=True)
    )
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))


_DATA_URI = re.compile(r"(data:[\w/+.-]+;base64,[A-Za-z0-9+/=\n]+)")


def outside_data_uris(text: str, edit: Callable[[str], str]) -> str:
    """``edit`` applied to the text between the base64 data: URIs (embedded images), which are
    kept byte for byte: a redaction or path rule must never touch their alphabet."""
    parts = _DATA_URI.split(text)
    for i in range(0, len(parts), 2):  # odd indices are the data URIs captured by the split
        parts[i] = edit(parts[i])
    return "".join(parts)


def _literal(replacement: str) -> Callable[[re.Match[str]], str]:
    """``re.sub``'s replacement of every match by ``replacement`` as it is (no escapes read)."""
    return lambda _match: replacement


def _scrub_paths(text: str, paths: list[tuple[str, str]]) -> str:
    for path, placeholder in paths:
        for form in {path, html.escape(path), json.dumps(path)[1:-1]}:
            # whole path components only: /work/main must not touch /work/mainline
            text = re.sub(re.escape(form) + r"(?![\w.-])", _literal(placeholder), text)
    return text
