"""RULER-style synthetic tasks (Hsieh et al., 2024; templates follow NVIDIA/RULER's scripts).

Retrieval: ``niah_single``, ``niah_multikey`` (distractor needles), ``niah_multivalue`` (one key,
all values required), ``niah_multiquery`` (several keys asked at once). Multi-hop:
``variable_tracking``. Aggregation: ``common_words``. The first family is what retrieval is good
at; the last two need the whole context.

Every example is built from a local ``random.Random`` seeded by (seed, task, length, index), and
sized like RULER does: a binary search for the most haystack units (haystack tokens, noise
sentences, filler needles, words) whose context still fits ``context_length -
final_context_length_buffer`` tokens of the named tokenizer. Keys and variable names are drawn
unique, so each appears exactly once; evidence spans of the needles are in ``meta["evidence"]``.
Words come from wonderwords' lists, as in RULER. RULER's other tasks (``fwe``: ``ruler_fwe``; qa
over SQuAD / HotpotQA: ``ruler_qa``) and its 13 named configurations (``ruler_presets``) build on
these.
"""

from __future__ import annotations

import functools
import inspect
import random
import string
import uuid
from collections.abc import Callable, Iterator, Sequence
from importlib import resources
from typing import Any

from ragbench.datasets import RULER_TASKS
from ragbench.datasets._validate import (
    DatasetParamError,
    choice_param,
    int_param,
    lengths_param,
)
from ragbench.datasets.haystack import (
    NOISE_SENTENCE,
    fit,
    load_haystack,
    normalize_space,
    sentences,
)
from ragbench.datasets.niah import DEFAULT_TOKENIZER, linear_spacing
from ragbench.registry import did_you_mean, unknown
from ragbench.tokenizers import Tokenizer, get_tokenizer
from ragbench.types import Document, Example

TASKS = RULER_TASKS  # the registry names them without importing this module
VALUE_TYPES = ("words", "numbers", "uuids")
HAYSTACKS = ("essays", "noise", "needles")
DEPTHS = linear_spacing(0, 100, 40)
# RULER's tokens_to_generate (scripts/data/synthetic/constants.py lines 26, 32, 38); all three
# families are scored with string_match_all (scripts/eval/synthetic/constants.py lines 34-42)
TOKENS_TO_GENERATE = {"variable_tracking": 30, "common_words": 120}  # the NIAH family: 128

NEEDLE = "One of the special magic {type_v} for {key} is: {value}."
NIAH_INSTRUCTION = (
    "Some special magic {type_v} are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {type_v} afterwards."
)
NIAH_QUESTION = (
    "What are all the special magic {type_v} for {query} mentioned in the provided text?"
)
NIAH_ANSWER_PREFIX = "The special magic {type_v} for {query} mentioned in the provided text are"
VT_INSTRUCTION = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text."
)
VT_QUESTION = "Find all variables that are assigned the value {query} in the text above."
VT_ANSWER_PREFIX = (
    "According to the chain(s) of variable assignment in the text above, {num_v} variables are "
    "assigned the value {query}, they are:"
)
CWE_INSTRUCTION = (
    "Below is a numbered list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often."
)
CWE_QUESTION = "What are the {num_cw} most common words in the above list?"
CWE_ANSWER_PREFIX = "The top {num_cw} words that appear most often in the list are:"


@functools.lru_cache(maxsize=4)
def wordlist(name: str) -> tuple[str, ...]:
    """Sorted single lowercase words from a wonderwords list (``nounlist``, ``adjectivelist``...)."""
    text = (resources.files("wonderwords.assets") / f"{name}.txt").read_text(encoding="utf-8")
    return tuple(
        sorted({w.strip() for w in text.split("\n") if w.strip().isalpha() and w.strip().islower()})
    )


@functools.lru_cache(maxsize=1)
def word_pool() -> tuple[str, ...]:
    """RULER cwe's words: wonderwords' nouns, adjectives and verbs, deduplicated and sorted."""
    names = ("nounlist", "adjectivelist", "verblist")
    return tuple(sorted({w for name in names for w in wordlist(name)}))


def random_text(rng: random.Random, kind: str) -> str:
    """A random key or value: "adjective-noun" words, a 7-digit number or a UUID (as RULER)."""
    if kind == "words":
        return f"{rng.choice(wordlist('adjectivelist'))}-{rng.choice(wordlist('nounlist'))}"
    if kind == "numbers":
        return str(rng.randint(1_000_000, 9_999_999))
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    raise unknown("value type", kind, VALUE_TYPES)


def _unique(rng: random.Random, kind: str, n: int, taken: set[str]) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        item = random_text(rng, kind)
        # no key may contain another (e.g. "red-cat" in "tired-cat"), so each occurs once
        if not any(item in t or t in item for t in taken):
            out.append(item)
            taken.add(item)
    return out


def _join(parts: list[tuple[str, int | None]], sep: str) -> tuple[str, dict[int, tuple[int, int]]]:
    """Join text parts; return the text and the char span of each part tagged with an index."""
    text, spans, pos = [], {}, 0
    for i, (part, tag) in enumerate(parts):
        if i:
            text.append(sep)
            pos += len(sep)
        if tag is not None:
            spans[tag] = (pos, pos + len(part))
        text.append(part)
        pos += len(part)
    return "".join(text), spans


def _insert(
    rng: random.Random, fillers: list[str], items: list[str]
) -> list[tuple[str, int | None]]:
    """Insert items among fillers at sorted random slots, keeping the items' order (RULER)."""
    slots = sorted(rng.sample(range(len(fillers) + len(items)), len(items)))
    parts: list[tuple[str, int | None]] = [(f, None) for f in fillers]
    for tag, slot in enumerate(slots):
        parts.insert(slot, (items[tag], tag))
    return parts


def _essay_parts(rng, hay_text: str, needles: list[str]) -> list[tuple[str, int | None]]:
    """RULER's essay haystack: needles go between sentences at depths drawn from DEPTHS."""
    sents = sentences(normalize_space(hay_text))
    cuts = sorted(int(len(sents) * d / 100) for d in rng.sample(DEPTHS, len(needles)))
    parts: list[tuple[str, int | None]] = []
    last = 0
    for tag, cut in enumerate(cuts):
        parts += [(s, None) for s in sents[last:cut]]
        parts.append((needles[tag], tag))
        last = cut
    return parts + [(s, None) for s in sents[last:]]


def _niah(rng, tok, budget, *, haystack, key_type, value_type, num_keys, num_values, num_queries):
    """Build one NIAH-family context: returns (text, evidence spans, question fields, answers)."""
    num_keys = max(num_keys, num_queries)
    taken: set[str] = set()
    keys = _unique(rng, key_type, num_keys, taken)
    values = [_unique(rng, value_type, num_values, taken) for _ in keys]
    type_v = value_type
    needles, owners = [], []
    for k, (key, vals) in enumerate(zip(keys, values, strict=True)):
        for v in vals:
            needles.append(NEEDLE.format(type_v=type_v, key=key, value=v))
            owners.append(k)
    order = list(range(len(needles)))
    rng.shuffle(order)
    needles, owners = [needles[i] for i in order], [owners[i] for i in order]
    queried = list(range(num_queries))  # keys[0:q] are asked, the rest are distractors
    state = rng.getstate()
    # essays, or your own corpus file (`ragbench data docs` output): prose to hide needles in
    prose = haystack == "essays" or str(haystack).endswith(".jsonl")
    hay = load_haystack(haystack) if prose else None

    def build(n: int):
        r = random.Random()
        r.setstate(state)
        if hay is not None:  # prose
            parts = _essay_parts(r, hay.take(tok, n)[0] if n else "", needles)
            return _join(parts, " ")
        if haystack == "noise":
            return _join(_insert(r, [NOISE_SENTENCE] * n, needles), "\n")
        fill_keys = _unique(r, key_type, n, set(taken))
        fillers = [
            NEEDLE.format(type_v=type_v, key=k, value=random_text(r, value_type)) for k in fill_keys
        ]
        return _join(_insert(r, fillers, needles), "\n")

    if haystack not in HAYSTACKS and not prose:
        raise unknown("RULER haystack", haystack, [*HAYSTACKS, "<corpus.jsonl>"])
    unit = 1 if prose else tok.count(NOISE_SENTENCE)
    n, text, spans = fit(build, tok, budget, budget // unit)
    evidence = [spans[i] for i, owner in enumerate(owners) if owner in queried]
    for key in keys:
        if text.count(key) != num_values:  # an essay happened to contain a key: never ambiguous
            raise ValueError(f"key {key!r} occurs {text.count(key)} times; try another seed")
    query_keys = [keys[q] for q in queried]
    answers = [v for q in queried for v in values[q]]
    if len(answers) == 1:  # RULER's singular wording for one answer
        type_v = type_v[:-1]
    query = (
        query_keys[0]
        if len(query_keys) == 1
        else ", ".join(query_keys[:-1]) + ", and " + query_keys[-1]
    )
    fields = {"type_v": type_v, "query": query}
    extra = {"keys": query_keys, "distractor_keys": keys[num_queries:], "units": n}
    return text, evidence, fields, answers, extra


def _variable_tracking(rng, tok, budget, *, num_chains, num_hops):
    """Chains "VAR A = 12345", "VAR B = VAR A", ... among noise; asks for every name of chain 0."""
    names: list[str] = []
    while len(names) < num_chains * (num_hops + 1):
        name = "".join(rng.choices(string.ascii_uppercase, k=5))
        if name not in names:
            names.append(name)
    values = rng.sample(range(10000, 100000), num_chains)
    chains = []
    for c in range(num_chains):
        vs = names[c * (num_hops + 1) : (c + 1) * (num_hops + 1)]
        chains.append(
            [f"VAR {vs[0]} = {values[c]}"]
            + [f"VAR {vs[j + 1]} = VAR {vs[j]}" for j in range(num_hops)]
        )
    # interleave the chains at random, each chain's statements in order
    turns = [c for c in range(num_chains) for _ in range(num_hops + 1)]
    rng.shuffle(turns)
    statements: list[str] = []
    gold: list[int] = []  # the queried chain's statements, by position
    seen = [0] * num_chains
    for c in turns:
        if c == 0:
            gold.append(len(statements))
        statements.append(chains[c][seen[c]])
        seen[c] += 1
    state = rng.getstate()

    def build(n: int):
        r = random.Random()
        r.setstate(state)
        return _join(_insert(r, [NOISE_SENTENCE] * n, statements), "\n")

    n, text, spans = fit(build, tok, budget, budget // tok.count(NOISE_SENTENCE))
    evidence = [spans[i] for i in gold]
    fields = {"query": str(values[0]), "num_v": num_hops + 1}
    return text, evidence, fields, names[: num_hops + 1], {"chains": num_chains, "units": n}


def _common_words(rng, tok, budget, *, num_cw, freq_cw, freq_ucw):
    """A numbered list: ``num_cw`` words ``freq_cw`` times each, the rest ``freq_ucw`` times."""
    pool = word_pool()
    if freq_cw <= freq_ucw:
        raise ValueError(f"freq_cw ({freq_cw}) must exceed freq_ucw ({freq_ucw})")
    state = rng.getstate()

    def build(n: int):
        r = random.Random()
        r.setstate(state)
        words = r.sample(pool, num_cw + n)
        common = words[:num_cw]
        items = common * freq_cw + words[num_cw:] * freq_ucw
        r.shuffle(items)
        parts = [(f"{i + 1}. {w}", i if w in common else None) for i, w in enumerate(items)]
        text, spans = _join(parts, " ")
        # evidence: every occurrence of a common word (the word itself, not its number)
        ev = sorted((e - len(items[i]), e) for i, (_, e) in spans.items())
        return text, (common, ev)

    fixed = f"the {num_cw} common words x {freq_cw} (lower freq_cw)"
    guess = budget // (4 * freq_ucw)
    n, text, (common, evidence) = fit(build, tok, budget, guess, len(pool) - num_cw, fixed)
    fields = {"num_cw": num_cw}
    return text, evidence, fields, list(common), {"uncommon_words": n}


def context_meta(
    tok: Tokenizer, haystack: str, seed: int, length: int, buffer: int, text: str
) -> dict:
    """What every RULER example's meta says of its context: the tokenizer, the haystack, the
    seed, the context length asked for, the tokens kept free for the answer
    (``final_context_length_buffer``) and the tokens the context took."""
    return {
        "tokenizer": tok.name,
        "haystack": haystack,
        "seed": seed,
        "context_length": length,
        "final_context_length_buffer": buffer,
        "context_tokens": tok.count(text),
    }


def iter_ruler(
    task: str,
    context_lengths: int | Sequence[int] = (4096,),
    num_examples: int = 10,
    tokenizer: str = DEFAULT_TOKENIZER,
    final_context_length_buffer: int = 200,
    seed: int = 42,
    haystack: str | None = None,
    key_type: str = "words",
    value_type: str = "numbers",
    num_keys: int | None = None,
    num_values: int | None = None,
    num_queries: int | None = None,
    num_chains: int = 1,
    num_hops: int = 4,
    num_cw: int = 10,
    freq_cw: int | None = None,
    freq_ucw: int = 3,
) -> Iterator[Example]:
    """Yield ``num_examples`` examples of ``task`` per context length.

    Defaults follow RULER's standard configs: niah_single on essays with 7-digit numbers,
    multikey with 4 keys, multivalue with 4 values, multiquery with 4 keys asked; variable
    tracking with 1 chain of 4 hops; common words: 10 words x ``freq_cw`` among words x 3, where
    ``freq_cw`` defaults to RULER's 30 from 4k tokens and 10 below, so the list has room.
    """
    if task not in TASKS:
        raise unknown("RULER task", task, TASKS)
    context_lengths, buffer = lengths_param(context_lengths, final_context_length_buffer)
    int_param("num_examples", num_examples)
    choice_param("key_type", key_type, VALUE_TYPES)
    choice_param("value_type", value_type, VALUE_TYPES)
    counts = {"num_keys": num_keys, "num_values": num_values, "num_queries": num_queries}
    counts |= {"num_chains": num_chains, "num_hops": num_hops, "num_cw": num_cw}
    counts |= {"freq_cw": freq_cw, "freq_ucw": freq_ucw}
    for key, value in counts.items():
        if value is not None:
            int_param(key, value)
    tok = get_tokenizer(tokenizer)
    niah_defaults = {
        "niah_single": (1, 1, 1),
        "niah_multikey": (4, 1, 1),
        "niah_multivalue": (1, 4, 1),
        "niah_multiquery": (4, 1, 4),
    }
    for length in context_lengths:
        budget = int(length) - final_context_length_buffer
        for i in range(num_examples):
            ex_id = f"ruler-{task}-L{int(length)}-{i:04d}"
            rng = random.Random(f"{seed}/{task}/{int(length)}/{i}")  # str seeds are stable
            if task in niah_defaults:
                k, v, q = niah_defaults[task]
                hay = haystack or "essays"
                text, evidence, fields, answers, extra = _niah(
                    rng,
                    tok,
                    budget,
                    haystack=hay,
                    key_type=key_type,
                    value_type=value_type,
                    num_keys=num_keys or k,
                    num_values=num_values or v,
                    num_queries=num_queries or q,
                )
                templates: tuple[str, ...] = (NIAH_INSTRUCTION, NIAH_QUESTION, NIAH_ANSWER_PREFIX)
                if len(answers) == 1:
                    templates = tuple(
                        t.replace("Some", "A").replace("are all", "is").replace("are", "is")
                        for t in templates
                    )
            elif task == "variable_tracking":
                hay = "noise"
                text, evidence, fields, answers, extra = _variable_tracking(
                    rng, tok, budget, num_chains=num_chains, num_hops=num_hops
                )
                templates = (VT_INSTRUCTION, VT_QUESTION, VT_ANSWER_PREFIX)
            else:
                hay = "words"
                freq = freq_cw or (30 if int(length) >= 4096 else 10)  # RULER's, by length
                text, evidence, fields, answers, extra = _common_words(
                    rng, tok, budget, num_cw=num_cw, freq_ucw=freq_ucw, freq_cw=freq
                )
                templates = (CWE_INSTRUCTION, CWE_QUESTION, CWE_ANSWER_PREFIX)
            instruction, question, prefix = (t.format(**fields) for t in templates)
            doc = Document(id=f"{ex_id}/context", text=text)
            meta = {
                "task": f"ruler/{task}",
                **context_meta(tok, hay, seed, int(length), final_context_length_buffer, text),
                "instruction": instruction,
                "answer_prefix": prefix,
                "evidence": [[doc.id, s, e] for s, e in evidence],
                "ruler_metric": "string_match_all",
                "tokens_to_generate": TOKENS_TO_GENERATE.get(task, 128),
                **extra,
            }
            yield Example(ex_id, question, tuple(answers), (doc,), meta)


# what each task reads beside the common sizing parameters (``iter_ruler``'s first five): a
# task's builder takes only these, so another task's parameter is an error, not ignored
COMMON_PARAMS = (
    "context_lengths",
    "num_examples",
    "tokenizer",
    "final_context_length_buffer",
    "seed",
)
NIAH_PARAMS = ("haystack", "key_type", "value_type", "num_keys", "num_values", "num_queries")
TASK_PARAMS = {
    **{task: NIAH_PARAMS for task in TASKS if task.startswith("niah_")},
    "variable_tracking": ("num_chains", "num_hops"),
    "common_words": ("num_cw", "freq_cw", "freq_ucw"),
}


def task_signature(task: str) -> inspect.Signature:
    """``iter_ruler``'s signature cut to the parameters ``task`` reads (``check_params``)."""
    if task not in TASK_PARAMS:
        raise unknown("RULER task", task, TASKS)
    keep = COMMON_PARAMS + TASK_PARAMS[task]
    sig = inspect.signature(iter_ruler)
    return sig.replace(parameters=[p for p in sig.parameters.values() if p.name in keep])


def task_iterator(task: str) -> Callable[..., Iterator[Example]]:
    """``iter_ruler`` for ``task``, refusing the parameters only other tasks read."""
    sig = task_signature(task)

    def iterate(**params: Any) -> Iterator[Example]:
        for key in params:
            if key not in sig.parameters:
                raise DatasetParamError(
                    key, f"not read by ruler/{task}; {did_you_mean(key, sig.parameters)}"
                )
        return iter_ruler(task, **params)

    iterate.__name__ = f"iter_{task}"
    iterate.__signature__ = sig  # type: ignore[attr-defined]
    return iterate


def build(task: str, **params: object) -> list[Example]:
    return list(task_iterator(task)(**params))


def _task_builder(task: str) -> Callable[..., list[Example]]:
    def builder(**params: object) -> list[Example]:
        return build(task, **params)

    builder.__name__ = task
    builder.__doc__ = f"RULER {task} examples; see iter_ruler for the parameters."
    builder.__signature__ = task_signature(task)  # type: ignore[attr-defined]
    return builder


niah_single = _task_builder("niah_single")
niah_multikey = _task_builder("niah_multikey")
niah_multivalue = _task_builder("niah_multivalue")
niah_multiquery = _task_builder("niah_multiquery")
variable_tracking = _task_builder("variable_tracking")
common_words = _task_builder("common_words")
