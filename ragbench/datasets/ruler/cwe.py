"""RULER cwe as RULER builds it: the word list after an in-context worked example.

RULER's ``common_words_extraction.py`` (NVIDIA/RULER at ``ruler_presets.RULER_COMMIT``,
``generate_input_output``) puts ``num_fewshot`` (default 1) solved lists before every input:
the task's template (``prepare.py``: the template plus its ``answer_prefix``) around a short
list, so its question and " Answer: The top 10 words that appear most often in the list are:",
then a space and the answer ``1. w1 2. w2 ...``; then a newline and the input itself (the
template around the real list). A worked list has 40
words, the 10 common ones 10 times each and the rest 3 times (below 4096 tokens: 20 words, 3
and 1), drawn from the same word pool as the real list.

``iter_cwe`` builds ``ruler/common_words`` examples (``ruler.iter_ruler``) with room left for
the worked examples, then puts them, and the template's instruction line, in front of the list
in the document: the document reads as RULER's input without its final question, which the
prompt asks. Evidence spans move with the text. The RULER ``cwe`` preset uses it; the generic
``ruler/common_words`` dataset has no worked example.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import replace

from ragbench.datasets._validate import DatasetParamError, int_param, lengths_param
from ragbench.datasets.niah import DEFAULT_TOKENIZER
from ragbench.datasets.ruler import tasks as ruler
from ragbench.tokenizers import get_tokenizer
from ragbench.types import Example

SHORT_LENGTH = 4096  # common_words_extraction.py: below it, smaller lists (worked and real)
WORKED = {True: (20, 3, 1), False: (40, 10, 3)}  # short? -> (words, common x, uncommon x)
MIN_LIST_TOKENS = 100  # below this the real list cannot hold the common words repeated


def worked_examples(rng: random.Random, num_cw: int, num_fewshot: int, short: bool) -> str:
    """``num_fewshot`` solved lists, newline-separated, as RULER renders its few-shot block:
    the instruction, the numbered list, the question and answer prefix, a space and the
    numbered answer."""
    n_words, freq_cw, freq_ucw = WORKED[short]
    question = ruler.CWE_QUESTION.format(num_cw=num_cw)
    prefix = ruler.CWE_ANSWER_PREFIX.format(num_cw=num_cw)
    blocks = []
    for _ in range(num_fewshot):
        words = rng.sample(ruler.word_pool(), max(n_words, num_cw + 1))
        common = words[:num_cw]
        items = common * freq_cw + words[num_cw:] * freq_ucw
        rng.shuffle(items)
        listing = " ".join(f"{i + 1}. {w}" for i, w in enumerate(items))
        answer = " ".join(f"{i + 1}. {w}" for i, w in enumerate(common))
        blocks.append(
            f"{ruler.CWE_INSTRUCTION}\n{listing}\nQuestion: {question} Answer: {prefix} {answer}"
        )
    return "\n".join(blocks)


def iter_cwe(  # the sizing parameters of every RULER task first (tasks.COMMON_PARAMS)
    context_lengths: int | Sequence[int] = (4096,),
    num_examples: int = 10,
    tokenizer: str = DEFAULT_TOKENIZER,
    final_context_length_buffer: int = 200,
    seed: int = 42,
    num_cw: int = 10,
    freq_cw: int | None = None,
    freq_ucw: int = 3,
    num_fewshot: int = 1,
) -> Iterator[Example]:
    """``ruler/common_words`` examples with ``num_fewshot`` worked examples in front of the
    list (0: none), sized so the whole document keeps to the context length."""
    lengths, buffer = lengths_param(context_lengths, final_context_length_buffer)
    int_param("num_examples", num_examples)
    int_param("num_fewshot", num_fewshot, lo=0)
    tok = get_tokenizer(tokenizer)
    for length in lengths:
        heads = []
        for i in range(num_examples):
            rng = random.Random(f"{seed}/cwe-worked/{length}/{i}")  # str seeds are stable
            shots = worked_examples(rng, num_cw, num_fewshot, length < SHORT_LENGTH)
            heads.append((shots + "\n" if shots else "") + ruler.CWE_INSTRUCTION + "\n")
        reserve = max(tok.count(h) for h in heads)  # every list leaves room for the longest
        if length - buffer - reserve < MIN_LIST_TOKENS:
            raise DatasetParamError(
                "context_lengths",
                f"{length} leaves no room for the list: the worked example takes {reserve} "
                f"tokens and final_context_length_buffer {buffer}; use lengths of at least "
                f"{buffer + reserve + MIN_LIST_TOKENS}, or num_fewshot: 0",
            )
        built = ruler.iter_ruler(
            "common_words",
            [length],
            num_examples,
            tokenizer,
            buffer + reserve,
            seed,
            num_cw=num_cw,
            freq_cw=freq_cw,
            freq_ucw=freq_ucw,
        )
        for head, example in zip(heads, built, strict=True):
            yield _prefixed(example, head, buffer, num_fewshot, tok.count)


def _prefixed(example: Example, head: str, buffer: int, shots: int, count) -> Example:
    """``example`` with ``head`` in front of its one document's text, evidence moved."""
    [doc] = example.documents
    text = head + doc.text
    evidence = [[d, s + len(head), e + len(head)] for d, s, e in example.meta["evidence"]]
    meta = {**example.meta, "evidence": evidence, "context_tokens": count(text)}
    meta |= {"final_context_length_buffer": buffer, "worked_examples": shots}
    return replace(example, documents=(replace(doc, text=text),), meta=meta)
