"""Preflight: a long-context prompt over the window stops the run before its model loads.

Under the ``error`` overflow policy a long-context example whose prompt does not fit the window
can only fail. Found late, that costs the model load and one error row per example (a 26.6k-token
corpus on an 8k model: every record). Found here, it costs a tokenizer: ``check_window`` builds
every long-context prompt the run would send, for the strategy points that read the whole
context (``Strategy.context == FULL_CONTEXT``) under ``error``, and counts it as the dry run does
(``ragbench.experiment.dry_run.prompt_counter``: the backend's tokenizer and chat template, no
weights; or the ``llm`` the caller already holds). Any over the window raise ``OverWindowError``
naming how many, the longest prompt, the window and the valid overflow policies.

Points that cut (``truncate_*``) are not checked: they fit by construction, and their records say
what the cut kept (``strategies.fit.kept_facts``). Self-Route's long-context branch runs only for
the questions its RAG call declines, so it is not checked either.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ragbench.experiment.config.run import RunConfig
from ragbench.experiment.dry_run import Counter, PromptCounter, prompt_counter
from ragbench.llm.base import ContextOverflowError
from ragbench.strategies import FULL_CONTEXT, Resources, get_strategy
from ragbench.strategies.fit import long_context_prompt
from ragbench.strategies.params import StrategyParams
from ragbench.strategies.prompts import OVERFLOW, OVERFLOW_ERROR
from ragbench.types import Example


class OverWindowError(ValueError):
    """Long-context prompts of the run do not fit the model's window under the ``error`` overflow
    policy; raised before the model is loaded. ``count`` examples, the ``longest`` prompt (tokens),
    the ``window`` (tokens, the answer included) and the ``example_ids``."""

    def __init__(self, message: str, count: int, longest: int, window: int, example_ids: list):
        super().__init__(message)
        self.count, self.longest, self.window, self.example_ids = (
            count,
            longest,
            window,
            example_ids,
        )


@dataclass(frozen=True)
class Overflow:
    """One long-context prompt over the window: its example, variant and size (tokens)."""

    example_id: str
    label: str
    prompt_tokens: int
    window: int
    new_tokens: int  # the answer's tokens it had to leave room for (a cot point: its reasoning)


def checked(params: StrategyParams) -> bool:
    """Whether a strategy point can only fail over the window: it reads the whole context and
    its overflow policy is ``error``."""
    reads_all = get_strategy(params.strategy).context == FULL_CONTEXT
    return reads_all and getattr(params, "overflow", None) == OVERFLOW_ERROR


class _Memo:
    """``counter`` with ``count_tokens`` memoised by the text's hash (only the counts are kept):
    questions on one shared corpus count it once."""

    def __init__(self, counter: Counter) -> None:
        self.counter, self.name = counter, getattr(counter, "name", "model")
        self.context_window = counter.context_window
        self._counts: dict[tuple[int, int], int] = {}

    def count_tokens(self, text: str) -> int:
        key = (len(text), hash(text))
        if key not in self._counts:
            self._counts[key] = self.counter.count_tokens(text)
        return self._counts[key]

    def prompt_tokens(self, request: Any) -> int:
        return self.counter.prompt_tokens(request)


def over_window(cfg: RunConfig, examples: Sequence[Example], llm: object = None) -> list[Overflow]:
    """The long-context prompts of the run (``checked`` points) that do not fit, counted by
    ``llm`` when given (a model the caller holds), else by the dry run's counter (no weights).
    Builds no counter when no point is checked."""
    points = [p for p in cfg.points if checked(p)]
    if not points or not examples:
        return []
    counter = llm if llm is not None else PromptCounter(prompt_counter(cfg))
    res = Resources(
        # a token counter, not an LLM: the checked prompts are built, never generated
        llm=_Memo(counter),  # type: ignore[arg-type]
        max_new_tokens=cfg.model.max_new_tokens,
        prompt_budget=cfg.prompt_budget,
    )
    out = []
    for example in examples:
        # the points of one cot value build the same prompt (the policy is error for all)
        for cot in sorted({bool(getattr(p, "cot", False)) for p in points}):
            same = [p for p in points if bool(getattr(p, "cot", False)) == cot]
            try:
                long_context_prompt(example, res, OVERFLOW_ERROR, cot=cot)
            except ContextOverflowError as exc:
                new = exc.max_new_tokens
                out += [
                    Overflow(example.id, p.label(), exc.prompt_tokens, exc.window, new)
                    for p in same
                ]
    return out


def check_window(cfg: RunConfig, examples: Sequence[Example], llm: object = None) -> None:
    """Raise ``OverWindowError`` when a long-context prompt of the run does not fit under the
    ``error`` overflow policy (``over_window``); do nothing otherwise."""
    over = over_window(cfg, examples, llm)
    if over:
        raise OverWindowError(*_message(cfg, over, len(examples)))


def _message(cfg: RunConfig, over: list[Overflow], n_examples: int) -> tuple:
    ids = list(dict.fromkeys(o.example_id for o in over))
    labels = ", ".join(dict.fromkeys(o.label for o in over))
    worst = max(over, key=lambda o: o.prompt_tokens)
    longest, window, answer = worst.prompt_tokens, worst.window, worst.new_tokens
    budget = "max_new_tokens" if answer == cfg.model.max_new_tokens else "a cot reasoning call's"
    if cfg.prompt_budget and cfg.prompt_budget + cfg.model.max_new_tokens == window:  # it binds
        limit = f"the run's prompt_budget allows {cfg.prompt_budget:,}"
    else:
        limit = (
            f"the {window:,}-token context window of {cfg.model.name} leaves {window - answer:,} "
            f"after the {answer} answer tokens ({budget})"
        )
    policies = " | ".join(OVERFLOW)
    message = (
        f"{len(ids)} of {n_examples} examples are over the window for {labels} (overflow "
        f"policy {OVERFLOW_ERROR!r}): the longest prompt is {longest:,} tokens; {limit}. "
        "Nothing was run; no model was loaded. Set the strategy's overflow "
        f"policy ({policies}){_hint(cfg)}, or use a model with a longer window (model.params "
        "context_window) or RAG; `ragbench run --dry-run` shows the over_window count per variant"
    )
    return message, len(ids), longest, window, ids


def _hint(cfg: RunConfig) -> str:
    """``, e.g. --set strategies[i].params.overflow=truncate_middle`` for the first whole-context
    strategy left at ``error`` (none when its overflow is a grid axis)."""
    for i, s in enumerate(cfg.strategies):
        if get_strategy(s.name).context != FULL_CONTEXT:
            continue
        if s.params.get("overflow", OVERFLOW_ERROR) == OVERFLOW_ERROR:
            return f", e.g. --set strategies[{i}].params.overflow=truncate_middle"
    return ""
