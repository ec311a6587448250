"""Credentials never reach disk: one redaction for everything ragbench stores or shows.

A secret can enter through a URL (``http://user:PASSWORD@host/v1``, ``?api_key=...``), a config
or backend parameter (``api_key``, ``headers``), or the environment (``OPENAI_API_KEY``). Every
place that writes a config, URL, model identity, error message, log line, notebook or HTML page
passes it through this module:

- ``redact(obj)``: a copy of a config-like value (dicts, lists, strings) with the value of every
  field named like a credential, every header value, URL userinfo and secret query parameters
  replaced by ``***``;
- ``redact_url(url)``: one URL, without its userinfo and with secret query values masked;
- ``redact_text(text)``: free text (errors, logs, notebook sources, HTML): URLs as above (a
  malformed one's ``//user:password@`` too), ``name = value`` / ``"name": "value"`` pairs whose
  name looks like a credential, bearer tokens, well-known key shapes, and every secret value this
  process has seen (``remember``) or that the environment holds under a credential-like name;
- ``mask_code_literals(text)``: for source code (notebook code cells, before ``redact_text``),
  a quoted literal assigned to a credential name masked whatever it looks like;
- ``code_secrets(text)``: the credentials a piece of code spells out, which a notebook masks
  in its outputs too (``redact_text(..., known=...)``): a short key a cell printed has no shape
  the patterns know;
- ``fill_masked_url(url, env_var, key)``: a URL stored redacted (``http://***@host/v1?token=***``),
  with its credentials restored from the full URL in ``env_var`` (a run config written by
  ``ragbench compare`` keeps none).

Hand-written because no maintained library covers this mix (URL userinfo, config trees, free
text); the name test works on words, so ``max_new_tokens`` or ``tokenizer`` are not credentials
while ``api_key``, ``X-Api-Key``, ``access_token`` and ``PASSWORD`` are.
"""

from __future__ import annotations

import html
import json
import logging
import os
import re
import sys
import threading
from collections.abc import Iterable, Mapping
from typing import Any, overload
from urllib.parse import parse_qsl, quote, unquote, urlsplit

MASK = "***"
# words that make a name a credential (compared with each word of the name); not "pwd": $PWD
# is the working directory
SECRET_WORDS = frozenset(
    {
        "key",
        "apikey",
        "token",
        "secret",
        "password",
        "passwd",
        "passphrase",
        "authorization",
        "auth",
        "credential",
        "credentials",
        "cookie",
        "signature",
        "sig",
        "bearer",
    }
)
# headers that carry no credential; their values ("application/json") must not be masked in
# every later text of the process
PLAIN_HEADERS = frozenset(
    {
        "accept",
        "accept-encoding",
        "accept-language",
        "cache-control",
        "connection",
        "content-encoding",
        "content-type",
        "user-agent",
    }
)
MIN_ENV_SECRET_LEN = 8  # environment values shorter than this are too common to mask everywhere
MIN_REMEMBERED_LEN = 4
# What a local server's docs tell users to pass as a key it does not check (vLLM's "EMPTY",
# "none", "dummy"): no secret, and masking it everywhere would turn every later "none" in an
# error, a table or a report into "***"
PLACEHOLDER_KEYS = frozenset({"none", "null", "empty", "dummy", "placeholder", "not-needed"})
# Well-known key shapes, caught even when typed into a cell rather than read from anywhere.
SECRET_SHAPES = re.compile(
    r"\b(?:sk-[A-Za-z0-9_-]{20,}|hf_[A-Za-z0-9]{30,}|gh[pousr]_[A-Za-z0-9]{30,}|AKIA[0-9A-Z]{16})\b"
)
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>()\[\]{}\\`]+")
# HTTP auth schemes as sent ("Authorization: Bearer x"); case-sensitive, so prose such as
# "a 1000-token context" or "basic setup" is left alone
_BEARER = re.compile(r"\b(Bearer|bearer|Basic)\s+[A-Za-z0-9._~+/=-]{6,}")
# a name whose last word is a credential word (both patterns below start with it)
_NAME = (
    r"(?P<name>\b[\w-]*?(?:api[_-]?key|access[_-]?key|secret[_-]?key|secret|token|password|passwd"
    r"|passphrase|authorization|credentials?))"
)
# name <sep> value, in code (api_key = "x"), YAML (api_key: x), JSON ("api_key": "x") and JSON
# inside JSON (\"api_key\": \"x\", as in an .ipynb): the name's last word is a credential word.
_PAIR = re.compile(
    _NAME + r"(?P<sep>(?:\\?[\"'])?\s*[:=]\s*(?:\\?[\"'])?)"
    r"(?P<value>[^\s\"'\\,;}\])]{4,})",
    re.IGNORECASE,
)
_WORDS = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
# ``//user:password@`` in text the URL pattern misses (``http//u:p@host``, ``//u:p@host``): the
# userinfo is masked wherever it appears
_USERINFO = re.compile(r"(?<=//)(?P<user>[^\s/@:'\"<>()\[\]{}]*):(?P<password>[^\s/@'\"<>]+)@")
# in code: a quoted literal assigned to (or keyed by) a credential name, ``api_key = "x"``,
# ``OpenAI(api_key='x')``, ``{"X-Api-Key": "x"}``, ``os.environ["HF_TOKEN"] = "x"``,
# ``api_key: str = "x"``: masked whatever it looks like (the quotes make it a value, not prose)
_CODE_PAIR = re.compile(
    _NAME + r"(?P<sep>\\?[\"']?\]?\s*(?::\s*\w+\s*=|[:=])\s*)"
    r"(?P<quote>\\?[\"'])(?P<value>(?:(?!(?P=quote)).){1,4000}?)(?P=quote)",
    re.IGNORECASE,
)

_remembered: set[str] = set()
_lock = threading.Lock()


def is_secret_name(name: str) -> bool:
    """``api_key``, ``X-Api-Key``, ``OPENAI_API_KEY``, ``accessToken``, ``password``: True;
    ``max_new_tokens``, ``tokenizer``, ``keywords``: False."""
    words = [w.lower() for w in _WORDS.findall(str(name))]
    return any(w in SECRET_WORDS for w in words) or "apikey" in "".join(words)


def names_a_credential(name: str) -> bool:
    """A name whose last word is a credential word (``api_key``, ``HF_TOKEN``, ``X-Api-Key``,
    ``password``): its value is a credential whatever its type. ``is_secret_name`` also holds
    for ``eos_token_id`` or ``num_key_value_heads``, whose numbers are not."""
    words = [w.lower() for w in _WORDS.findall(str(name))]
    if not words:
        return False
    return words[-1] in SECRET_WORDS or "".join(words[-2:]) == "apikey"


def remember(*values: str | None) -> None:
    """Mask these values in every later ``redact_text`` of this process (a key or password the
    process was given, so that an error message quoting it cannot leak it); a placeholder key
    (``PLACEHOLDER_KEYS``, any case) is not one."""
    with _lock:
        _remembered.update(
            v
            for v in values
            if isinstance(v, str)
            and len(v) >= MIN_REMEMBERED_LEN
            and v.strip().lower() not in PLACEHOLDER_KEYS
        )


def state(environ: Mapping[str, str] | None = None) -> tuple[frozenset[str], frozenset[str]]:
    """What ``redact_text`` masks besides its text's own patterns and ``known``: the remembered
    values and the environment's credentials, as a hashable snapshot (a memo of redactions keys on
    it: a value remembered or exported later changes it)."""
    with _lock:
        remembered = frozenset(_remembered)
    return remembered, frozenset(env_secret_values(environ))


def collect(obj: object) -> None:
    """``remember`` every credential inside a config-like value: fields named like credentials,
    header values, URL passwords and secret query values."""
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            if isinstance(v, str) and (is_secret_name(k) or str(k).lower() == "headers"):
                remember(v)
            elif str(k).lower() == "headers" and isinstance(v, Mapping):
                remember(*header_secrets(v))
            else:
                collect(v)
    elif isinstance(obj, list | tuple):
        for v in obj:
            collect(v)
    elif isinstance(obj, str) and "//" in obj:
        remember(*url_secrets(obj))


def url_secrets(text: str) -> list[str]:
    """The passwords and secret query values of the URLs in ``text`` (a malformed URL's
    ``//user:password@`` too)."""
    found: list[str | None] = []
    for m in _URL.finditer(text):
        try:
            parts = urlsplit(m.group(0))
        except ValueError:  # a bad port or bracket: the pattern below still finds userinfo
            continue
        found.append(parts.password)
        found += [v for k, v in parse_qsl(parts.query) if is_secret_name(k)]
    found += [m.group("password") for m in _USERINFO.finditer(text)]
    return [v for v in found if v]


def code_secrets(text: str) -> set[str]:
    """The credentials source code spells out: quoted literals assigned to credential names
    (``api_key = "sk-..."``, what ``mask_code_literals`` masks) and the passwords and secret query
    values of its URLs, those that look like credentials (``_looks_like_a_credential``: not
    ``"EMPTY"``). A notebook masks them in its outputs too: a cell that prints the key it set
    shows it in no form the patterns know (short, of no known shape, in no environment)."""
    literals = [m.group("value") for m in _CODE_PAIR.finditer(text)] if text else []
    return {
        v
        for v in [*literals, *url_secrets(text or "")]
        if v != MASK and len(v) >= MIN_REMEMBERED_LEN and _looks_like_a_credential(v)
    }


def header_secrets(headers: Mapping[str, object]) -> list[str]:
    """The header values that may be credentials: all but those of ``PLAIN_HEADERS``."""
    return [str(v) for k, v in headers.items() if str(k).lower() not in PLAIN_HEADERS]


def env_secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """Values of environment variables named like credentials, >= 8 characters."""
    environ = os.environ if environ is None else environ
    return [v for k, v in environ.items() if is_secret_name(k) and len(v) >= MIN_ENV_SECRET_LEN]


def redact_url(url: str) -> str:
    """The URL without userinfo and with the values of secret query parameters masked. Only
    those parts change: everything else stays as written (an HTML link's ``&amp;`` included)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return MASK
    out = url
    if "@" in parts.netloc:
        userinfo = parts.netloc.rsplit("@", 1)[0]
        out = out.replace(f"//{userinfo}@", f"//{MASK}@", 1)
    if parts.query:
        out = _QUERY_PAIR.sub(
            lambda m: (
                f"{m.group(1)}{m.group(2)}={MASK}"
                if is_secret_name(unquote(m.group(2))) and m.group(3)
                else m.group(0)
            ),
            out,
        )
    return out


# name=value in a query string (after ? & or ;): the value is masked when the name is secret
_QUERY_PAIR = re.compile(r"([?&;])([^=&;#?]+)=([^&#;]*)")


def redact_text(
    text: str, environ: Mapping[str, str] | None = None, known: Iterable[str] = ()
) -> str:
    """Free text with every credential this module can recognise replaced by ``***``; ``known``:
    more values to mask, as remembered ones are (a notebook's, from its code: ``code_secrets``)."""
    if not text:
        return text
    with _lock:
        values = set(_remembered)
    values.update(env_secret_values(environ))
    values.update(v for v in known if len(v) >= MIN_REMEMBERED_LEN)
    for value in sorted(values, key=len, reverse=True):
        for form in {value, quote(value, safe=""), html.escape(value), json.dumps(value)[1:-1]}:
            text = text.replace(form, MASK)
    text = _URL.sub(lambda m: redact_url(m.group(0)), text)
    text = _USERINFO.sub(f"{MASK}@", text)
    text = _BEARER.sub(lambda m: f"{m.group(1)} {MASK}", text)
    text = _PAIR.sub(_mask_pair, text)
    return SECRET_SHAPES.sub(MASK, text)


def mask_code_literals(text: str) -> str:
    """Source code's rule: a quoted literal assigned to a credential name is masked whatever it
    looks like (``api_key = "plainword"`` too); an empty one is left."""
    if not text:
        return text
    return _CODE_PAIR.sub(
        lambda m: (
            m.group(0)
            if m.group("value") == MASK
            else f"{m.group('name')}{m.group('sep')}{m.group('quote')}{MASK}{m.group('quote')}"
        ),
        text,
    )


@overload
def fill_masked_url(url: str, env_var: str, key: str) -> str: ...
@overload
def fill_masked_url(url: None, env_var: str, key: str) -> None: ...
def fill_masked_url(url: str | None, env_var: str, key: str) -> str | None:
    """``url`` as given, or, when its credentials were masked on disk (its userinfo or a query
    value reads ``***``), the full URL from the environment variable ``env_var``, which must
    redact to the same text. Else a ValueError naming ``key``, the variable and the command-line
    alternative (the message shows the masked URL only)."""
    if not isinstance(url, str) or MASK not in url:
        return url
    full = os.environ.get(env_var, "")
    if full and MASK not in full and redact_url(full) == redact_url(url):
        collect(full)
        return full
    why = f"${env_var} holds another URL ({redact_url(full)})" if full else f"${env_var} is not set"
    raise ValueError(
        f"{key}: {url} has its credentials masked (ragbench stores none) and {why}; set "
        f"{env_var} to the full URL, or give it on the command line "
        f"(ragbench run CONFIG --set {key}=URL)"
    )


def _mask_pair(m: re.Match) -> str:
    value = m.group("value")
    if value.startswith(MASK) or _is_number(value) or not _looks_like_a_credential(value):
        return m.group(0)
    return f"{m.group('name')}{m.group('sep')}{MASK}"


def _looks_like_a_credential(value: str) -> bool:
    """Keys and passwords carry digits or symbols, or are long; a plain word after a name is
    prose ("api_key: repeated values", "token: required"), not a credential. Values this process
    was given are masked whatever they look like (``remember``)."""
    core = value.rstrip(".:")
    return len(core) >= 16 or any(not c.isalpha() for c in core)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def redact(obj: object) -> Any:
    """A copy of a config-like value that is safe to store: credential-named fields and every
    header value masked, strings redacted with ``redact_text``. A field whose name ends in a
    credential word (``names_a_credential``) is masked whatever its value's type (a dict, a
    list, a number); other non-string values stay (``eos_token_id: 2``)."""
    if isinstance(obj, Mapping):
        out: dict[object, object] = {}
        for k, v in obj.items():
            if str(k).lower() == "headers" and isinstance(v, Mapping):
                out[k] = {h: MASK for h in v}
            elif (
                is_secret_name(k)
                and isinstance(v, str)
                and v
                or names_a_credential(k)
                and _is_a_value(v)
            ):
                out[k] = MASK
            else:
                out[k] = redact(v)
        return out
    if isinstance(obj, list | tuple):
        return type(obj)(redact(v) for v in obj)
    if isinstance(obj, str):
        return redact_text(obj)
    return obj


def _is_a_value(v: object) -> bool:
    """Anything but nothing: None, a bool and empty containers hold no credential."""
    return v is not None and not isinstance(v, bool) and v != "" and v != [] and v != {}


class RedactingFilter(logging.Filter):
    """A logging filter that masks credentials in every record it passes (the CLI installs it on
    its handler, so log lines on screen and in redirected log files are safe)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact_text(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time (as logging's last-resort handler does),
    not the stream of the moment it was installed, which a test runner may have closed since."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.setStream assigns it; nothing to keep
        pass


def install_log_redaction(level: int = logging.WARNING) -> None:
    """Log to stderr through ``RedactingFilter`` (idempotent): what ``ragbench`` commands use."""
    root = logging.getLogger()
    if any(isinstance(f, RedactingFilter) for h in root.handlers for f in h.filters):
        return
    handler = _StderrHandler()
    handler.setLevel(level)
    handler.setFormatter(logging.Formatter("%(levelname)s: %(name)s: %(message)s"))
    handler.addFilter(RedactingFilter())
    root.addHandler(handler)
    if root.level == logging.NOTSET or root.level > level:
        root.setLevel(level)
