"""Multi-document QA in the "lost in the middle" layout (Liu et al., 2023).

Each example has ``num_docs`` passages; exactly one holds the answer and its position is a
parameter, so accuracy can be plotted against where the gold document sits. Liu et al. used
NQ-open with retrieved Wikipedia passages; to stay offline and exact we write a synthetic fact
("The access code for the quiet-harbor vault is 4823911.") into one essay passage and use other
essay passages as distractors. With several positions, each example keeps the same question and
the same documents and only the gold document moves, as in the paper's protocol.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Iterator, Sequence
from pathlib import Path

from ragbench.datasets._validate import DatasetParamError, int_param
from ragbench.datasets.haystack import haystack_files, normalize_space, sentences
from ragbench.datasets.niah import DEFAULT_TOKENIZER
from ragbench.datasets.ruler.tasks import random_text, wordlist
from ragbench.registry import unknown
from ragbench.tokenizers import get_tokenizer
from ragbench.types import Document, Example, join_documents

NAMED_POSITIONS = ("start", "middle", "end")
# (fact sentence, question, value kind): the fact is the evidence; the value is the answer
FACTS = (
    (
        "The access code for the {key} vault is {value}.",
        "What is the access code for the {key} vault?",
        "number",
    ),
    (
        "The {key} expedition set sail from the port of {value}.",
        "From which port did the {key} expedition set sail?",
        "place",
    ),
    (
        "The {key} society was founded by a chemist named {value}.",
        "Who founded the {key} society?",
        "person",
    ),
)
PLACE_SUFFIXES = ("ton", "ford", "haven", "bury", "mouth", "wick")


def resolve_position(position: int | str, num_docs: int) -> int:
    """A gold index in [0, num_docs): an int, or "start" / "middle" / "end"."""
    if isinstance(position, str) and not position.lstrip("-").isdigit():
        if position not in NAMED_POSITIONS:
            raise unknown("gold position", position, NAMED_POSITIONS)
        return {"start": 0, "middle": (num_docs - 1) // 2, "end": num_docs - 1}[position]
    index = int(position)
    if not 0 <= index < num_docs:
        raise ValueError(f"gold position {index} is outside 0..{num_docs - 1} ({num_docs} docs)")
    return index


@functools.lru_cache(maxsize=4)
def passages(source: str = "essays", words: int = 100) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(title, sentences) passages of about ``words`` words, cut at sentence ends, in file order."""
    out = []
    for name, text in haystack_files(source):
        title = Path(name).stem
        chunk: list[str] = []
        count = 0
        for sent in sentences(normalize_space(text)):
            chunk.append(sent)
            count += len(sent.split())
            if count >= words:
                out.append((title, tuple(chunk)))
                chunk, count = [], 0
        if count >= words // 2:  # keep a tail only if it is a real passage
            out.append((title, tuple(chunk)))
    return tuple(out)


def _value(rng: random.Random, kind: str) -> str:
    if kind == "number":
        return random_text(rng, "numbers")
    noun = rng.choice(wordlist("nounlist"))
    if kind == "place":
        return noun.capitalize() + rng.choice(PLACE_SUFFIXES)
    return f"{rng.choice(wordlist('nounlist')).capitalize()} {noun.capitalize()}son"


def iter_multidoc(
    num_docs: int = 10,
    gold_position: int | str | Sequence[int | str] = NAMED_POSITIONS,
    num_examples: int = 10,
    words_per_doc: int = 100,
    haystack: str = "essays",
    tokenizer: str = DEFAULT_TOKENIZER,
    seed: int = 0,
) -> Iterator[Example]:
    """Yield ``num_examples`` questions x each gold position (examples outer, positions inner)."""
    int_param("num_docs", num_docs)
    int_param("num_examples", num_examples)
    int_param("words_per_doc", words_per_doc)
    if isinstance(gold_position, int | str):
        gold_position = [gold_position]
    if not isinstance(gold_position, list | tuple) or not gold_position:
        raise DatasetParamError(
            "gold_position",
            f"expected an index, start/middle/end or a list of them, got {gold_position!r}",
        )
    try:
        positions = [resolve_position(p, num_docs) for p in gold_position]
    except (ValueError, TypeError) as exc:
        raise DatasetParamError("gold_position", str(exc)) from None
    pool = passages(str(haystack), words_per_doc)
    if len(pool) < num_docs:
        raise ValueError(
            f"haystack {haystack!r} yields {len(pool)} passages of ~{words_per_doc} words; "
            f"{num_docs} documents are needed"
        )
    tok = get_tokenizer(tokenizer)
    for i in range(num_examples):
        rng = random.Random(f"{seed}/multidoc/{i}")  # str seeds are stable across runs
        picked = rng.sample(range(len(pool)), num_docs)
        gold_idx, distractor_idx = picked[0], picked[1:]
        fact_t, question_t, kind = FACTS[rng.randrange(len(FACTS))]
        texts = [" ".join(pool[p][1]) for p in picked]
        while True:  # the key must occur nowhere else, so the fact is the only evidence
            key, value = random_text(rng, "words"), _value(rng, kind)
            if not any(key in t or value in t for t in texts):
                break
        fact = fact_t.format(key=key, value=value)
        gold_sents = list(pool[gold_idx][1])
        cut = rng.randint(0, len(gold_sents))
        before = " ".join(gold_sents[:cut])
        gold_text = " ".join([*gold_sents[:cut], fact, *gold_sents[cut:]])
        start = len(before) + (1 if before else 0)
        gold = Document(
            id=f"multidoc-{i:04d}-gold-p{gold_idx}",
            text=gold_text,
            title=pool[gold_idx][0],
            meta={"passage": gold_idx, "gold": True},
        )
        distractors = [
            Document(id=f"p{p}", text=" ".join(pool[p][1]), title=pool[p][0], meta={"passage": p})
            for p in distractor_idx
        ]
        for pos in positions:
            docs = (*distractors[:pos], gold, *distractors[pos:])
            ex_id = f"multidoc-N{num_docs}-P{pos}-{i:04d}"
            meta = {
                "task": "multidoc",
                "tokenizer": tok.name,
                "haystack": str(haystack),
                "seed": seed,
                "num_docs": num_docs,
                "gold_position": pos,
                "gold_doc_id": gold.id,
                "context_tokens": tok.count(join_documents(docs)),
                "fact": fact,
                "evidence": [[gold.id, start, start + len(fact)]],
            }
            question = question_t.format(key=key)
            yield Example(ex_id, question, (value,), docs, meta)


@functools.wraps(iter_multidoc)  # same signature, so build_dataset can check parameters
def build(**params) -> list[Example]:
    return list(iter_multidoc(**params))


def count_multidoc(
    gold_position: int | str | Sequence[int | str] = NAMED_POSITIONS,
    num_examples: int = 10,
    **_: object,
) -> int:
    n_pos = 1 if isinstance(gold_position, int | str) else len(gold_position)
    return n_pos * num_examples
