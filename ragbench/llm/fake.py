"""A deterministic LLM with no weights, for tests and notebooks without a model.

It answers from its prompt the way a perfect reader of needle tasks would, so pipeline tests
check real behaviour (a RAG run that drops the needle's chunk really gets "unanswerable"):

- RULER needles: "One of the special magic numbers for quiet-lake is: 4817263." answers a
  question naming ``quiet-lake`` with ``4817263`` (all values for the key, comma-separated);
- a key-less needle ("The special magic number is 7463343.") answers a question about the
  special magic number;
- a definitional sentence answers "What is the X?": "The best thing to do in San Francisco is eat
  a sandwich ..." answers Kamradt's question with "eat a sandwich ...";
- otherwise "unanswerable". ``answer_fn(request) -> str`` replaces all of this.

Accounting is real for its tokenizer (whitespace tokens) and simulated for time: a fixed prefill
and decode throughput, flagged ``meta["simulated_timing"]``; with ``sleep=True`` a call also
waits those simulated seconds (summed over its requests), so executors and kills can be exercised
on a model that takes time without computing anything (``benchmarks/scale.py``, the Ray tests).
It changes no answer or record, so it is not part of the identity. KV-cache variants
(``GenerationRequest.kv`` other than plain) are an error unless ``simulate_kv_cache=True``
(tests of the plumbing only): then they answer like the plain cache, flagged
``meta["simulated_kv_cache"]``, with no measured KV bytes and, as on the transformers backend,
no prefix reuse. A request whose ``prefix`` was seen earlier in the same batch reports that
prefix as cached prompt tokens, like a prefix-caching server; with ``prefix_cache_size`` > 0 the
last that many prefixes are kept across calls too (like ``HFModel``'s prefix cache).
With ``serial=True`` a call's requests run one after another, as on a backend with one slot:
each waits (``queue_seconds``) for the simulated time of those before it in its call.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections import OrderedDict
from collections.abc import Callable

from ragbench.llm.base import LLM
from ragbench.llm.kv.variants import refuse_variants, variants_run
from ragbench.tokenizers import WhitespaceTokenizer
from ragbench.types import Completion, GenerationRequest

UNANSWERABLE = "unanswerable"

_KEYED = re.compile(
    r"special magic (?P<kind>[a-z]+?)s? for (?P<key>[\w\-. ]+?) (?:is|are):?\s+(?P<value>[^\s,;]+?)"
    r"(?=[.,;]?(?:\s|$))",
    re.IGNORECASE,
)
_KEYLESS = re.compile(
    r"special magic (?P<kind>[a-z]+?)s? (?:is|are):?\s+(?P<value>[^\s,;]+?)(?=[.,;]?(?:\s|$))",
    re.IGNORECASE,
)
_WHAT_IS = re.compile(r"^\s*what (?:is|are) (?:the )?(?P<subject>.+?)\s*\??\s*$", re.IGNORECASE)


def split_question(prompt: str) -> tuple[str, str]:
    """(context, question): the text after the last "Question:" label (up to the line's end), else
    the last non-empty line; the context is everything before it."""
    idx = prompt.rfind("Question:")
    if idx >= 0:
        question = prompt[idx + len("Question:") :].split("\n", 1)[0].strip()
        return prompt[:idx], question
    lines = prompt.rstrip().rsplit("\n", 1)
    if len(lines) == 1:
        return "", lines[0].strip()
    return lines[0], lines[1].strip()


def answer_from_prompt(prompt: str) -> str:
    """The default answer: see the module docstring. Pure; ``FakeLLM`` calls it per request."""
    context, question = split_question(prompt)
    q = question.lower()
    keyed: dict[str, list[str]] = {}
    for m in _KEYED.finditer(context):
        keyed.setdefault(m["key"].strip().lower(), []).append(m["value"])
    # longest key first, so "lake" does not shadow "quiet-lake"
    for key in sorted(keyed, key=len, reverse=True):
        if re.search(rf"(?<![\w-]){re.escape(key)}(?![\w-])", q):
            return ", ".join(dict.fromkeys(keyed[key]))
    if "magic" in q and not keyed:
        values = [m["value"] for m in _KEYLESS.finditer(context)]
        if values:
            return ", ".join(dict.fromkeys(values))
    what = _WHAT_IS.match(question)
    if what:
        subject = re.escape(what["subject"].strip())
        found = re.search(rf"\b(?:the )?{subject} (?:is|are) (?P<x>[^.\n]+)", context, re.I)
        if found:
            return found["x"].strip()
    return UNANSWERABLE


class FakeLLM(LLM):
    """Deterministic stand-in for a model: see the module docstring."""

    # no weights, no architecture: whitespace tokens, an architecture preset from the config,
    # and kv_cache variants only simulated (simulate_kv_cache=True)
    capabilities = LLM.capabilities.replace(
        simulates_kv_cache=True, needs_preset=True, default_tokenizer="whitespace"
    )

    def __init__(
        self,
        model: str = "fake",  # the name it reports (``name``), like every backend's ``model=``
        *,
        context_window: int = 8192,
        answer_fn: Callable[[GenerationRequest], str] | None = None,
        prefill_tokens_per_second: float = 1000.0,  # simulated; roughly SmolLM2 on a laptop CPU
        decode_tokens_per_second: float = 50.0,
        simulate_kv_cache: bool = False,  # accept kv_cache variants (tests only; flagged)
        prefix_cache_size: int = 0,  # prefixes kept across calls (0: within a call only)
        sleep: bool = False,  # really wait the simulated seconds (executor benchmarks, kill tests)
        serial: bool = False,  # a call's requests one after another: each queues behind the others
    ) -> None:
        if not isinstance(model, str):
            raise TypeError(f"model must be a name (str), got {model!r}")
        if prefill_tokens_per_second <= 0 or decode_tokens_per_second <= 0:
            raise ValueError("simulated throughputs must be > 0 tokens/s")
        self.context_window, self.name, self.answer_fn = context_window, model, answer_fn
        self.prefill_tps, self.decode_tps = prefill_tokens_per_second, decode_tokens_per_second
        self.simulate_kv_cache = simulate_kv_cache
        self.prefix_cache_size = prefix_cache_size
        self._kept: OrderedDict[str, None] = OrderedDict()  # the cached prefixes, oldest first
        self.sleep, self.serial = sleep, serial
        self._tok = WhitespaceTokenizer()
        self.calls = 0  # generate() batches served; tests use it to see cache hits

    def count_tokens(self, text: str) -> int:
        return self._tok.count(text)

    def identity(self) -> dict[str, object]:
        fn = self.answer_fn
        return {
            "backend": "fake",
            "model": self.name,
            "answer_fn": f"{fn.__module__}.{fn.__qualname__}" if fn else "answer_from_prompt",
            "throughput": [self.prefill_tps, self.decode_tps],
            # only when set: it changes the records' queue, and other fakes keep their identity
            **({"serial": True} if self.serial else {}),
        }

    def _generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        supported = variants_run(self.capabilities, {"simulate_kv_cache": self.simulate_kv_cache})
        refuse_variants(requests, "fake", supported)  # what validation checks configs against
        self.calls += 1
        seen_prefixes: set[str] = set(self._kept)
        out = [self._one(r, seen_prefixes) for r in requests]
        plain = [r for r in requests if r.kv is None]  # variants run alone (as on hf)
        for prefix in (r.prefix for r in plain if r.prefix and self.prefix_cache_size > 0):
            self._kept[prefix] = None
            self._kept.move_to_end(prefix)
            while len(self._kept) > self.prefix_cache_size:
                self._kept.popitem(last=False)
        if self.serial:  # one slot: each request waits for the ones before it in the call
            waited = 0.0
            for i, c in enumerate(out):
                out[i] = dataclasses.replace(c, queue_seconds=waited)
                waited += c.prefill_seconds + c.decode_seconds
        if self.sleep:
            time.sleep(sum(c.prefill_seconds + c.decode_seconds for c in out))
        return out

    def _one(self, request: GenerationRequest, seen_prefixes: set[str]) -> Completion:
        text = self.answer_fn(request) if self.answer_fn else answer_from_prompt(request.prompt)
        for s in request.stop:
            if s and s in text:
                text = text[: text.index(s)]
        finish = "stop"
        spans = self._tok.offsets(text)
        if len(spans) > request.max_new_tokens:
            text, finish = text[: spans[request.max_new_tokens - 1][1]], "length"
        prompt_tokens = self.prompt_tokens(request)
        cached = 0
        if request.prefix and request.kv is None:  # a KV variant reuses no prefix
            if request.prefix in seen_prefixes:
                cached = min(self.count_tokens(request.prefix), prompt_tokens)
            seen_prefixes.add(request.prefix)
        completion_tokens = max(1, len(spans[: request.max_new_tokens]))  # at least an EOS
        return Completion(
            text=text,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_prompt_tokens=cached,
            prefill_seconds=(prompt_tokens - cached) / self.prefill_tps,
            decode_seconds=completion_tokens / self.decode_tps,
            finish_reason=finish,
            model=self.name,
            meta={
                "simulated_timing": True,
                **({"simulated_kv_cache": request.kv.name} if request.kv is not None else {}),
            },
        )
