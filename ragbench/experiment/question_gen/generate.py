"""Generated questions: ask an LLM for question/answer pairs over sampled passages of a corpus.

``ragbench data questions CORPUS --n N --out FILE`` (and notebook 05) when a user has documents
but no questions. The pipeline is pure logic around one ``LLM`` (any backend, usually wrapped in
the completion cache), so tests script the model with ``FakeLLM(answer_fn=...)``:

1. Passages: the corpus chunked with the retrieval splitter (``sentence``, whole sentences up to
   ``passage_tokens`` whitespace tokens; every chunk keeps its character span in its document),
   passages under ``min_passage_words`` dropped (a title or a table cell makes poor questions),
   then put in a seeded order (``random.Random(seed)``); at most one question per passage, so
   the questions spread over the corpus instead of piling up on one paragraph.
2. One request per passage in a strict two-line format (``Question: ...`` / ``Answer: ...``),
   shown by one worked example (SmolLM2-135M ignored the format when it was only described:
   5 of 5 replies unparseable on the test folder, 0 of 5 with the example), parsed robustly
   (``parse_reply``: labels in any case, markdown emphasis, numbering, both on one line);
   anything else is rejected as ``format``.
3. Checks, each a reason in the report: the question ends with "?" (``not_a_question``); the
   answer is short (``answer_too_long``); the answer is *found in its passage*
   (``answer_not_in_passage``: verbatim, else ignoring case and whitespace runs, never inside a
   word), and its span is recorded; the question does not contain the answer
   (``answer_in_question``: it would grade a restatement as correct).
4. ``drop_closed_book``: the question is asked with no context, exactly as the ``closed_book``
   strategy asks it (same prompt, stop and ``max_new_tokens``, so a run over the same model and
   cache gets the same answers for free); a correct answer (``closed_book_metric``) drops it
   (``closed_book``): what the model knows by heart does not separate RAG from long context.
5. Near-duplicate questions (``duplicate``): normalised-token Jaccard against every question
   kept so far, computed exactly. Not the corpus's MinHash: questions are a dozen words, so the
   word 5-gram shingles MinHash uses here share almost nothing after a one-word change, and with
   hundreds of questions the exact pairwise comparison costs nothing and has no estimation error.

Passages are tried in order, one batch at a time, until ``n`` questions are kept or the passages
run out (``max_passages``, by default 5 per question). ``hops=2`` (``--multi-hop``) asks about
pairs of passages from two documents instead, for a question whose answer needs both
(``question_gen_multihop``: the pairing, the request, the checks, the two evidence spans); the
closed-book check, de-duplication and accounting are the same. Same corpus, model, parameters
and cache: the same file, byte for byte. The output is a questions JSONL file
(``datasets.questions``): ``evidence`` is the sentence of the passage holding the answer (a quote
the ``corpus`` dataset locates again and turns into ``[doc_id, start, end]`` spans) and ``meta``
keeps the exact ``answer_span`` and ``passage`` spans, and the generating model.

Steps 1 to 3 and the Jaccard of step 5 are pure text functions in ``datasets.question_text``;
this module is the driver around the model: the batches, the closed-book
check, de-duplication against the kept questions, the cost accounting (``Usage``) and the files
(``write_questions``, ``questions_file``, ``load_model``).
"""

from __future__ import annotations

import itertools
import logging
import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ragbench.cost import money
from ragbench.cost.prices import PriceSheet, resource_seconds
from ragbench.cost.prices import price_sheet as load_sheet
from ragbench.datasets.corpus.file import read_documents
from ragbench.datasets.question_text import (
    check_reply,
    generation_request,
    jaccard,
    passage_id,
    tokens,
)
from ragbench.datasets.task_types import INSTRUCTIONS
from ragbench.experiment import resources
from ragbench.experiment.config.sections import ModelConfig
from ragbench.experiment.config.text import explain_validation_error
from ragbench.experiment.question_gen import multihop
from ragbench.io import atomic_write_text, dumps_canonical
from ragbench.llm.base import LLM
from ragbench.metrics.answer import get_metric
from ragbench.retrieval.passages import sample_passages
from ragbench.strategies.prompts import ANSWER_STOP, CLOSED_BOOK_TEMPLATE, clean_answer
from ragbench.types import Completion, Document, GenerationRequest

log = logging.getLogger(__name__)
PathLike = str | os.PathLike

PASSAGES_PER_QUESTION = 5  # default cap on passages tried per question requested
REASONS = (
    "format",
    "not_a_question",
    "answer_too_long",
    "answer_not_in_passage",
    "answer_in_question",
    *multihop.REASONS,
    "duplicate",
    "closed_book",
)


# --------------------------------------------------------------------------- accounting


@dataclass
class Usage:
    """LLM use of one step: the accounting of every completion, cache hits included (their
    original cost: what the file cost to make), and how many were served from the cache."""

    calls: int = 0
    cache_hits: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    dollars: float | None = None  # with a price sheet only

    def add(self, completions: Sequence[Completion], sheet: PriceSheet | None = None) -> None:
        for c in completions:
            self.calls += 1
            self.cache_hits += bool(c.cached)
            self.prompt_tokens += c.prompt_tokens
            self.cached_prompt_tokens += c.cached_prompt_tokens
            self.completion_tokens += c.completion_tokens
            # each one's own share of device time: a batch's latency counted once, not per row
            self.seconds += resource_seconds(c)
            if sheet is not None:
                self.dollars = (self.dollars or 0.0) + money.dollars(
                    sheet, money.Usage.of(c), resource_seconds(c)
                )

    def describe(self) -> str:
        text = (
            f"{self.calls} calls ({self.cache_hits} from the cache), {self.prompt_tokens:,} "
            f"prompt tokens ({self.cached_prompt_tokens:,} cached), {self.completion_tokens:,} "
            f"completion tokens, {self.seconds:.1f} device seconds"
        )
        return text + ("" if self.dollars is None else f", ${self.dollars:.6f}")


@dataclass
class GeneratedQuestions:
    """What ``generate_questions`` kept, why it dropped the rest, and what it cost."""

    rows: list[dict[str, Any]]
    n_requested: int
    passages_tried: int = 0  # with hops=2: passage pairs
    passages_available: int = 0  # passages (with hops=2 paired as they are tried)
    unit: str = "passages"  # what was tried: passages, or passage pairs
    rejected: Counter = field(default_factory=Counter)  # reason -> count
    rejections: list[dict[str, object]] = field(default_factory=list)  # passage, reason, reply
    usage: dict[str, Usage] = field(default_factory=dict)  # "generate", "closed_book"

    def summary(self) -> str:
        why = ", ".join(f"{n} {r}" for r, n in sorted(self.rejected.items())) or "none"
        lines = [
            f"kept {len(self.rows)} of {self.n_requested} questions requested from "
            f"{self.passages_tried} {self.unit} tried ({self.passages_available} passages "
            f"available); rejected: {why}"
        ]
        lines += [f"LLM cost, {step}: {u.describe()}" for step, u in self.usage.items()]
        return "\n".join(lines)


# --------------------------------------------------------------------------- the pipeline


def _closed_book_request(question: str, max_new_tokens: int) -> GenerationRequest:
    """Exactly the ``closed_book`` strategy's request for a ``qa`` question (cache-compatible)."""
    prompt = CLOSED_BOOK_TEMPLATE.format(instruction=INSTRUCTIONS["qa"], question=question)
    return GenerationRequest(prompt=prompt, max_new_tokens=max_new_tokens, stop=ANSWER_STOP)


@dataclass(frozen=True)
class _Hops:
    """How one item is asked about, checked and named: a passage (``hops=1``) or a pair of
    passages of two documents (``hops=2``, ``question_gen_multihop``)."""

    request: Callable[[Any, int], GenerationRequest]  # (item, max_new_tokens) -> request
    check: Callable[[Any, str, int], dict[str, Any] | str]  # a row, or the reason it failed
    name: Callable[[Any], str]  # the item's id in the rejections
    unit: str  # what is tried: passages, or passage pairs


_ONE_HOP = _Hops(generation_request, check_reply, passage_id, "passages")
_TWO_HOPS = _Hops(
    multihop.pair_request, multihop.check_pair_reply, multihop.pair_id, "passage pairs"
)


@dataclass(frozen=True)
class _Candidate:
    """A reply that passed the checks, waiting for the closed-book check and de-duplication."""

    item: object  # the passage (or pair) asked about
    reply: str
    row: dict[str, Any]
    tokens: frozenset[str]  # the question's normalised tokens (``jaccard``)


@dataclass
class _Asker:
    """One ``generate_questions`` call's loop over its batches: the model, the settings, and what
    it has kept so far (``out``; the kept questions' tokens, for de-duplication)."""

    llm: LLM
    hops: _Hops
    out: GeneratedQuestions
    sheet: PriceSheet | None  # dollars in the usage (None: none)
    metric: Callable[..., float]  # the closed-book check's (``closed_book_metric``)
    max_new_tokens: int
    max_answer_words: int
    dedup_threshold: float
    drop_closed_book: bool
    closed_book_max_new_tokens: int
    kept_tokens: list[frozenset[str]] = field(default_factory=list)

    def ask(self, batch: Sequence[Any], bar: Any) -> None:
        """One batch: asked and checked, closed-book checked, de-duplicated, kept up to ``n``."""
        candidates = self._candidates(batch)
        self._keep(candidates, self._unknown(candidates), bar)

    def _reject(self, item: Any, reason: str, reply: str) -> None:
        self.out.rejected[reason] += 1
        self.out.rejections.append(
            {"passage": self.hops.name(item), "reason": reason, "reply": reply}
        )

    def _duplicate(self, toks: frozenset[str]) -> bool:
        """Whether a question is near a kept one (normalised-token Jaccard)."""
        return any(jaccard(toks, k) >= self.dedup_threshold for k in self.kept_tokens)

    def _candidates(self, batch: Sequence[Any]) -> list[_Candidate]:
        """The batch asked in one call; the replies that pass the checks and are no duplicate
        of a kept question (a duplicate costs no closed-book call)."""
        requests = [self.hops.request(item, self.max_new_tokens) for item in batch]
        completions = self.llm.generate(requests)
        self.out.usage["generate"].add(completions, self.sheet)
        self.out.passages_tried += len(batch)
        candidates = []
        for item, c in zip(batch, completions, strict=True):
            row = self.hops.check(item, c.text, self.max_answer_words)
            if isinstance(row, str):
                self._reject(item, row, c.text)
                continue
            toks = tokens(row["question"])
            if self._duplicate(toks):
                self._reject(item, "duplicate", c.text)  # of a kept one: no closed-book call
                continue
            candidates.append(_Candidate(item, c.text, row, toks))
        return candidates

    def _unknown(self, candidates: list[_Candidate]) -> list[bool]:
        """Per candidate: whether the model misses it with no context (``drop_closed_book``;
        otherwise every one passes)."""
        if not (self.drop_closed_book and candidates):
            return [True] * len(candidates)
        asks = [
            _closed_book_request(c.row["question"], self.closed_book_max_new_tokens)
            for c in candidates
        ]
        answers = self.llm.generate(asks)
        self.out.usage["closed_book"].add(answers, self.sheet)
        return [
            self.metric(clean_answer(a.text, c.row["question"]), c.row["answers"]) < 1.0
            for a, c in zip(answers, candidates, strict=True)
        ]

    def _keep(self, candidates: list[_Candidate], unknown: list[bool], bar: Any) -> None:
        """The candidates kept in order, until ``n``: those the model does not know by heart and
        that no question kept before them (this batch's included) duplicates."""
        out = self.out
        for ok, c in zip(unknown, candidates, strict=True):
            if len(out.rows) >= out.n_requested:
                break
            if not ok:
                self._reject(c.item, "closed_book", c.reply)
            elif self._duplicate(c.tokens):
                self._reject(c.item, "duplicate", c.reply)
            else:
                out.rows.append(c.row)
                self.kept_tokens.append(c.tokens)
                bar.update(1)


def _check_options(n: int, batch_size: int, hops: int, dedup_threshold: float) -> None:
    """``generate_questions``' numeric options checked before anything is read or asked."""
    if n < 1:
        raise ValueError(f"n must be >= 1 question, got {n}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if hops not in (1, 2):
        raise ValueError(f"hops must be 1 (one passage) or 2 (two passages), got {hops!r}")
    if not 0.0 < dedup_threshold <= 1.0:
        raise ValueError(f"dedup_threshold must be in (0, 1], got {dedup_threshold}")


def _todo(passages: list[Any], n_documents: int, *, hops: int, limit: int) -> list[Any]:
    """What will be tried, in order, at most ``limit``: passages, or (``hops=2``) passage pairs;
    a corpus with no pair to ask about is an error."""
    if hops == 1:
        return passages[:limit]
    todo = list(itertools.islice(multihop.pair_passages(passages), limit))
    if not todo:
        raise ValueError(
            f"no two passages of the corpus ({n_documents} documents) share a key word: "
            "nothing to ask a two-passage question about"
        )
    return todo


def generate_questions(
    documents: Sequence[Document],
    llm: LLM,
    n: int,
    *,
    seed: int = 0,
    passage_tokens: int = 128,
    min_passage_words: int = 8,
    max_passages: int | None = None,
    max_new_tokens: int = 64,
    max_answer_words: int = 12,
    dedup_threshold: float = 0.7,
    drop_closed_book: bool = False,
    closed_book_max_new_tokens: int = 32,
    closed_book_metric: str = "contains",
    batch_size: int = 8,
    price_sheet: PriceSheet | str | os.PathLike | None = None,
    progress: bool | None = False,
    hops: int = 1,
) -> GeneratedQuestions:
    """Up to ``n`` checked question rows (module docstring), in the order they were kept.

    ``max_passages`` bounds the passages tried (default ``5 * n``: with a small model most pairs
    fail the checks, and trying every passage of a large corpus would take hours); ``price_sheet`` (a
    ``PriceSheet``, name or path) adds dollars to the usage; ``progress``: a tqdm bar over kept
    questions (None: on a terminal); ``hops``: 1 (a passage per question) or 2 (a pair of
    passages of two documents per question; ``max_passages`` then bounds the pairs tried).
    """
    from tqdm.auto import tqdm

    _check_options(n, batch_size, hops, dedup_threshold)
    metric = get_metric(closed_book_metric)  # an unknown name fails before any call
    sheet = price_sheet
    if sheet is not None and not isinstance(sheet, PriceSheet):
        sheet = load_sheet(sheet)
    passages = sample_passages(
        documents, seed=seed, passage_tokens=passage_tokens, min_passage_words=min_passage_words
    )
    if not passages:
        raise ValueError(
            f"no passage of at least {min_passage_words} words in the corpus "
            f"({len(documents)} documents): nothing to ask about"
        )
    if max_passages is not None and max_passages < 1:
        raise ValueError(f"max_passages must be >= 1, got {max_passages}")
    limit = max_passages or PASSAGES_PER_QUESTION * n
    todo = _todo(passages, len(documents), hops=hops, limit=limit)
    how = _TWO_HOPS if hops == 2 else _ONE_HOP
    out = GeneratedQuestions([], n, passages_available=len(passages), unit=how.unit)
    out.usage = {"generate": Usage()} | ({"closed_book": Usage()} if drop_closed_book else {})
    asker = _Asker(
        llm,
        how,
        out,
        sheet,
        metric,
        max_new_tokens=max_new_tokens,
        max_answer_words=max_answer_words,
        dedup_threshold=dedup_threshold,
        drop_closed_book=drop_closed_book,
        closed_book_max_new_tokens=closed_book_max_new_tokens,
    )
    bar = tqdm(
        total=n, desc="questions", unit="q", disable=None if progress is None else not progress
    )
    for i in range(0, len(todo), batch_size):
        if len(out.rows) >= n:
            break
        asker.ask(todo[i : i + batch_size], bar)
        bar.set_postfix(passages=out.passages_tried, refresh=False)
    bar.close()
    for k, row in enumerate(out.rows, start=1):
        row["id"] = f"gen-{k}"
        row["meta"]["model"] = llm.name
    return out


# --------------------------------------------------------------------------- files


def write_questions(path: PathLike, rows: Sequence[dict[str, object]]) -> Path:
    """Atomically write rows as a questions JSONL file (canonical JSON, one row per line)."""
    if not rows:
        raise ValueError("no questions to write (a questions file may not be empty)")
    return atomic_write_text(path, "".join(dumps_canonical(r) + "\n" for r in rows))


def load_model(model: Mapping[str, object], cache: bool | None = None) -> LLM:
    """An LLM from a run config's ``model`` section (``notebook.model_block`` builds one), with the
    runs' completion cache (``cache_dir()/completions.sqlite``) unless the section says
    ``cache: false``: generated questions and later runs share its answers. Loaded as a run
    loads its model (``ragbench.experiment.resources.load_model``)."""
    try:
        m = ModelConfig(**model)
    except ValidationError as exc:  # one line per problem, not pydantic's dump
        raise ValueError(explain_validation_error(exc, "model", None, ModelConfig)) from None
    return resources.load_model(m if cache is None else m.model_copy(update={"cache": cache}))


def questions_file(
    corpus: PathLike,
    out: PathLike,
    n: int,
    model: Mapping[str, Any] | LLM,
    **options: Any,
) -> GeneratedQuestions:
    """Generate ``n`` questions over a corpus file and write them to ``out`` (what the CLI and
    notebook 05 call). ``model``: a config ``model`` section or a loaded LLM; ``options`` go to
    ``generate_questions``. Nothing kept is an error that says why every passage was rejected."""
    documents = read_documents(corpus)
    if isinstance(model, LLM):
        llm = model
    else:
        llm = load_model(model)
        # the closed-book check asks as the run will, so their answers are one cache entry
        options.setdefault("closed_book_max_new_tokens", ModelConfig(**model).max_new_tokens)
    result = generate_questions(documents, llm, n, **options)
    if not result.rows:
        raise ValueError(
            f"no question survived the checks; {result.summary()}; a small model rarely writes "
            "usable questions: write your own (a questions file: question, answers) or generate "
            "with a larger model"
        )
    if len(result.rows) < n:
        log.warning("only %d of %d questions: %s", len(result.rows), n, result.summary())
    write_questions(out, result.rows)
    return result
