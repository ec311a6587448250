"""Judge prompt templates (versioned YAML shipped in ``ragbench/data/judge_prompts``) and the
strict parser of their replies.

Reply format: one line ``Verdict: <LABEL>`` with a label the template names (``CORRECT`` /
``INCORRECT``). The verdict comes first and alone, as llama-index's CorrectnessEvaluator puts its
score on the first line: small judges ramble, and a verdict at the end of a long reasoning is the
part a token limit cuts (``answer-relevancy-v1`` adds one ``Question: ...`` line after it,
read by ``parse_question``). Unlike RAGAS (JSON lists of statements and verdicts, several calls per
answer) one call gives one binary verdict: cheap enough to repeat ``samples`` times, which is
what the agreement numbers need.

Parsing is strict about *what* is said and lenient about *how* (as lm-evaluation-harness's
regex filters are): case, markdown emphasis, quotes and trailing text are ignored, a bare label
as the reply's first word is accepted ("CORRECT." after a prompt ending in "Verdict:"), but two
different verdicts, or none, make the reply unreadable (``None``): the caller retries and then
records the judgement as unscored, never as 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

import yaml

from ragbench.io import InputFileError, load_yaml, yaml_problem
from ragbench.registry import Registry

PACKAGE_DIR = "data/judge_prompts"
# the template each judge metric uses unless ``judge.prompts`` names another is the metric's own
# (``metric.JudgeMetric.prompt``)
_FIELDS = {"name", "metric", "labels", "system", "user", "retry"}


@dataclass(frozen=True)
class JudgePrompt:
    """One versioned judge template: what the judge reads and the labels it may answer."""

    name: str  # "correct-v1": recorded in every judged record (meta ``<metric>_prompt``)
    metric: str  # the judge metric it scores
    labels: tuple[tuple[str, int], ...]  # (LABEL, score) pairs, e.g. (("CORRECT", 1), ...)
    system: str
    user: str
    retry: str  # appended after an unreadable reply; takes {attempt}

    def render(self, attempt: int = 1, **fields: str) -> str:
        """The user prompt; ``attempt`` > 1 appends the retry reminder (a different prompt, so
        a greedy or cached judge can answer differently)."""
        text = self.user.format(**fields)
        return text + self.retry.format(attempt=attempt) if attempt > 1 else text

    def parse(self, reply: str) -> int | None:
        return parse_verdict(reply, dict(self.labels))


def _yaml_path(name: str) -> bool:
    """A judge prompt beyond the shipped ones: a YAML file of the same shape."""
    return name.endswith((".yaml", ".yml")) or Path(name).exists()


# the shipped templates by name -> their YAML file; a path to a YAML file names one too
JUDGE_PROMPTS = Registry(
    "judge prompt",
    {
        p.name.removesuffix(".yaml"): p
        for p in resources.files("ragbench").joinpath(PACKAGE_DIR).iterdir()
        if p.name.endswith(".yaml")
    },
    other="<path.yaml>",
    accepts=_yaml_path,
)


def available_prompts() -> list[str]:
    """Names of the shipped templates, sorted."""
    return JUDGE_PROMPTS.names()


@lru_cache(maxsize=32)
def load_prompt(name_or_path: str) -> JudgePrompt:
    """A shipped template by name (``correct-v1``) or a YAML file of the same shape."""
    path = Path(name_or_path)
    if name_or_path not in JUDGE_PROMPTS and _yaml_path(name_or_path):
        if not path.is_file():
            raise FileNotFoundError(f"judge prompt file {name_or_path!r} does not exist")
        text, where = path.read_text(encoding="utf-8"), str(path)
    else:
        res = JUDGE_PROMPTS.get(name_or_path)  # an unknown name: did-you-mean over them
        text, where = res.read_text(encoding="utf-8"), f"ragbench/{PACKAGE_DIR}/{name_or_path}"
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        line, problem = yaml_problem(exc)
        raise InputFileError(where, line, f"invalid YAML: {problem}") from None
    return parse_prompt(data, where)


def parse_prompt(data: object, where: str = "<judge prompt>") -> JudgePrompt:
    if not isinstance(data, dict):
        raise ValueError(f"{where}: a judge prompt must be a YAML mapping")
    missing, extra = _FIELDS - set(data), set(data) - _FIELDS
    if missing or extra:
        raise ValueError(
            f"{where}: judge prompt fields must be {sorted(_FIELDS)}; "
            f"missing {sorted(missing)}, unknown {sorted(extra)}"
        )
    labels = data["labels"]
    if (
        not isinstance(labels, dict)
        or len(labels) < 2
        or not all(isinstance(k, str) and k.strip() for k in labels)
        or not all(v in (0, 1) for v in labels.values())
    ):
        raise ValueError(f"{where}: labels must map at least two words to a score 0 or 1")
    return JudgePrompt(
        name=str(data["name"]),
        metric=str(data["metric"]),
        labels=tuple((str(k).upper(), int(v)) for k, v in labels.items()),
        system=str(data["system"]),
        user=str(data["user"]),
        retry=str(data["retry"]),
    )


_NOISE = re.compile(r"[*_`#>\"'“”‘’\[\]()]")  # markdown and quotes around a verdict


def parse_verdict(reply: str, labels: dict[str, int]) -> int | None:
    """The score of the one verdict in ``reply``, or None if it has none or several.

    Accepted: ``Verdict: CORRECT`` anywhere (any case, markdown and quotes ignored, ``:``/``=``/
    ``-`` as separator), every such line agreeing; else a bare label as the first word. Labels
    are whole words, so ``INCORRECT`` never reads as ``CORRECT``.
    """
    text = _NOISE.sub(" ", reply or "")
    names = sorted(labels, key=len, reverse=True)  # longest first: INCORRECT before CORRECT
    alternatives = "|".join(re.escape(n) for n in names)
    found = re.findall(rf"\bverdict\s*[:=\-]?\s*({alternatives})\b", text, re.IGNORECASE)
    if not found:
        first = re.match(rf"\s*({alternatives})\b", text, re.IGNORECASE)
        found = [first.group(1)] if first else []
    scores = {labels[f.upper()] for f in found}
    return scores.pop() if len(scores) == 1 else None


_AROUND = " *_`\"'“”‘’"  # markdown and quotes around a generated question
_QUESTION = re.compile(r"^[\s*_#>]*question[\s*_]*[:=\-]\s*(?P<q>.*?)\s*$", re.I | re.M)


def parse_question(reply: str, labels: dict[str, int]) -> tuple[int, str] | None:
    """(verdict, question) of a reply that states one verdict (``parse_verdict``) and one
    ``Question: ...`` line (any case, markdown and quotes around it ignored; the same question
    repeated is one); None when either is missing, or two different questions are given."""
    verdict = parse_verdict(reply, labels)
    if verdict is None:
        return None
    found = {" ".join(m["q"].strip(_AROUND).split()) for m in _QUESTION.finditer(reply or "")}
    found.discard("")
    return (verdict, found.pop()) if len(found) == 1 else None
