"""Which variant of run A is which of run B (``report.compare_runs``, ``ragbench diff``).

Matching, in this order; each pair says which rule made it, so it can be checked:

1. ``given``: the pairs the caller names (``{label in A: label in B}``, or ``--pair``).
2. ``same label``: a label both runs have (what changed is outside the labels: the model, the
   price sheet, the dataset's size).
3. ``nearest``: of the rest, a variant of A and one of B of the same strategy whose parameters
   differ only in parameters that differ between the runs (for that strategy, the set of values
   the parameter takes in A is not the set it takes in B: ``chunk_size`` {64} and {32}), when
   each is the other's one nearest such variant (fewest differing parameters); repeated until
   nothing more pairs. ``rag k=1 ... chunk=64`` pairs with ``rag k=1 ... chunk=32``, and
   ``rag k=4 ... chunk=64`` with ``rag k=4 ... chunk=32``, never across ``k``: both runs have
   k=1 and k=4, so ``top_k`` is not a parameter that differs between them. When A has k=1 and
   k=4 and B only k=1, ``top_k`` differs between the runs too, and B's k=1 pairs with A's k=1,
   its one nearest (one parameter apart against two).

A variant left over is listed with why (no variant of its strategy in the other run differs from
it only in what differs between the runs, or two are as near): name its counterpart in the
pairs. Nothing is read from label text: the parameters are the ``params`` column's, as the
strategy's parameter class reads them (``strategies.params``: defaults filled in).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ragbench.registry import did_you_mean, unknown
from ragbench.strategies import params_from_dict

if TYPE_CHECKING:
    import pandas as pd

RULES = ("given", "same label", "nearest")


class MatchError(ValueError):
    """Pairs that cannot be used (a text that is no ``LABEL_A=LABEL_B``, a label paired twice)."""


def show_value(value: object) -> str:
    """A setting's or parameter's value as a person reads it: text bare, the rest as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def value_key(value: object) -> str:
    """A value as comparable text (a mapping's key order does not matter)."""
    return json.dumps(value, sort_keys=True, default=str)


@dataclass(frozen=True)
class Match:
    """A variant of A paired with one of B: the rule that paired them (one of ``RULES``) and
    what differs between the two (``chunk_size: 64 -> 32``; ``strategy: rag -> long_context``)."""

    a_label: str
    b_label: str
    rule: str
    differs: tuple[str, ...] = ()

    def __str__(self) -> str:
        why = self.rule + (f": {', '.join(self.differs)}" if self.differs else "")
        return f"{self.a_label} = {self.b_label}  [{why}]"


@dataclass(frozen=True)
class Unmatched:
    """A variant of one run (``side``: "A" or "B") with no counterpart, and why."""

    side: str
    label: str
    why: str


@dataclass(frozen=True)
class Variant:
    """A label with its strategy and every parameter (defaults filled in, as ``to_dict``)."""

    label: str
    strategy: str
    params: Mapping[str, object]


def _params(strategy: str, text: Any) -> dict[str, Any]:
    """A row's ``params`` (JSON text) as its strategy's class reads them, defaults filled in
    (a table written before a parameter existed names it too); as stored when the class does
    not read them (a strategy this install does not know)."""
    raw = json.loads(text) if isinstance(text, str) else dict(text or {})
    try:
        return params_from_dict(strategy, raw).to_dict()
    except (ValueError, KeyError, TypeError):
        return raw


def variants(table: pd.DataFrame) -> list[Variant]:
    """The run's variants in config (first-seen) order."""
    first = table.drop_duplicates("label")
    params = first["params"] if "params" in first else [None] * len(first)
    return [
        Variant(str(label), str(strategy), _params(str(strategy), p))
        for label, strategy, p in zip(first["label"], first["strategy"], params, strict=True)
    ]


def _free(va: list[Variant], vb: list[Variant]) -> dict[str, set[str]]:
    """Per strategy, the parameters that differ between the runs: the set of values one takes
    over the strategy's variants in A is not the set it takes in B."""

    def values(vs: list[Variant], strategy: str, name: str) -> set[str]:
        return {value_key(v.params.get(name)) for v in vs if v.strategy == strategy}

    out: dict[str, set[str]] = {}
    for strategy in {v.strategy for v in va} & {v.strategy for v in vb}:
        names = {n for v in [*va, *vb] if v.strategy == strategy for n in v.params}
        out[strategy] = {n for n in names if values(va, strategy, n) != values(vb, strategy, n)}
    return out


def _differs(a: Variant, b: Variant) -> tuple[str, ...]:
    """What differs between two variants: the strategy, else each parameter, ``name: a -> b``."""
    if a.strategy != b.strategy:
        return (f"strategy: {a.strategy} -> {b.strategy}",)
    names = list(dict.fromkeys([*a.params, *b.params]))
    return tuple(
        f"{n}: {show_value(a.params.get(n))} -> {show_value(b.params.get(n))}"
        for n in names
        if value_key(a.params.get(n)) != value_key(b.params.get(n))
    )


def _distance(a: Variant, b: Variant, free: dict[str, set[str]]) -> int | None:
    """How many parameters ``a`` and ``b`` differ in, or None when they may not pair: another
    strategy, or a parameter differs that does not differ between the runs."""
    if a.strategy != b.strategy:
        return None
    names = {
        n
        for n in [*a.params, *b.params]
        if value_key(a.params.get(n)) != value_key(b.params.get(n))
    }
    return len(names) if names <= free.get(a.strategy, set()) else None


def _candidates(a: Variant, others: list[Variant], free: dict[str, set[str]]) -> dict[str, int]:
    """The variants ``a`` may pair with, by label, and their distance to it."""
    out = {}
    for b in others:
        d = _distance(a, b, free)
        if d is not None:
            out[b.label] = d
    return out


def _nearest(distances: dict[str, dict[str, int]]) -> dict[str, list[str]]:
    """For each key, the labels at its smallest distance."""
    out = {}
    for label, row in distances.items():
        low = min(row.values(), default=None)
        out[label] = [other for other, d in row.items() if d == low]
    return out


def _match_nearest(
    rest_a: list[Variant], rest_b: list[Variant], free: dict[str, set[str]]
) -> tuple[list[Match], list[Unmatched]]:
    """Rule 3 (module docstring): mutual one-nearest pairs, repeated until none is left; what
    remains is unmatched, with why."""
    matches: list[Match] = []
    while True:
        da = {a.label: _candidates(a, rest_b, free) for a in rest_a}
        db: dict[str, dict[str, int]] = {b.label: {} for b in rest_b}
        for a_label, row in da.items():
            for b_label, d in row.items():
                db[b_label][a_label] = d
        near_a, near_b = _nearest(da), _nearest(db)
        new = [(a, n[0]) for a, n in near_a.items() if len(n) == 1 and near_b[n[0]] == [a]]
        if not new:
            break
        by_a, by_b = {v.label: v for v in rest_a}, {v.label: v for v in rest_b}
        for a, b in new:
            matches.append(Match(a, b, "nearest", _differs(by_a[a], by_b[b])))
        paired_a, paired_b = {a for a, _ in new}, {b for _, b in new}
        rest_a = [v for v in rest_a if v.label not in paired_a]
        rest_b = [v for v in rest_b if v.label not in paired_b]
    left = [Unmatched("A", a, _why(near, "B")) for a, near in near_a.items()]
    left += [Unmatched("B", b, _why(near, "A")) for b, near in near_b.items()]
    return matches, left


def _why(near: list[str], other: str) -> str:
    """Why a variant stayed unmatched, given its nearest candidates in the ``other`` run."""
    if not near:
        return (
            f"no variant of its strategy left unpaired in {other} differs from it only in "
            "parameters that differ between the runs"
        )
    if len(near) > 1:
        return f"as near to {len(near)} variants of {other}: {'; '.join(near)}"
    return f"its nearest in {other}, {near[0]}, is as near to another variant"


def split_pair(
    text: str, labels_a: list[str], labels_b: list[str], names: tuple[str, str] = ("A", "B")
) -> tuple[str, str]:
    """``LABEL_A=LABEL_B`` (``--pair``) as its two labels. Labels hold ``=`` themselves
    (``rag k=1``), so the text is cut at the one ``=`` with a label of A on its left and a label
    of B on its right (spaces around it allowed); none or several: an error naming the labels.
    ``names``: the two runs' names, for the message."""
    cuts = [(text[:i].strip(), text[i + 1 :].strip()) for i, ch in enumerate(text) if ch == "="]
    good = [(x, y) for x, y in cuts if x in labels_a and y in labels_b]
    if len(good) == 1:
        return good[0]
    if good:
        raise MatchError(
            f"--pair {text!r} reads as {len(good)} pairs of labels; give pairs= as a mapping "
            "{label_a: label_b}"
        )
    if not cuts:
        raise MatchError(f"--pair {text!r}: expected LABEL_A=LABEL_B")
    for side, found, labels in (
        (1, [y for x, y in cuts if x in labels_a], labels_b),
        (0, [x for x, y in cuts if y in labels_b], labels_a),
    ):
        if found:  # one side is a label of its run: the other is the unknown one
            raise MatchError(
                f"--pair {text!r}: unknown label of run {'AB'[side]} ({names[side]}) "
                f"{found[0]!r}; {did_you_mean(found[0], labels)}"
            )
    raise MatchError(
        f"--pair {text!r}: no label of run A ({names[0]}) before an '=' and of run B "
        f"({names[1]}) after it; A's: {', '.join(labels_a)}; B's: {', '.join(labels_b)}"
    )


def given_pairs(
    pairs: Mapping[str, str] | Iterable[str] | None,
    labels_a: list[str],
    labels_b: list[str],
    names: tuple[str, str] = ("A", "B"),
) -> dict[str, str]:
    """``pairs`` (a mapping, or ``LABEL_A=LABEL_B`` texts) checked: a label of its run each,
    each used once; an unknown one is an error naming the valid ones."""
    if not pairs:
        return {}
    if isinstance(pairs, Mapping):
        items = [(str(x), str(y)) for x, y in pairs.items()]
    else:
        items = [split_pair(t, labels_a, labels_b, names) for t in pairs]
    for index, labels in ((0, labels_a), (1, labels_b)):
        for item in items:
            if item[index] not in labels:
                kind = f"label of run {'AB'[index]} ({names[index]})"
                raise unknown(kind, item[index], labels)
    out: dict[str, str] = {}
    for x, y in items:
        if x in out or y in out.values():
            raise MatchError(f"pairs: {x if x in out else y!r} is paired twice")
        out[x] = y
    return out


def match_variants(
    va: list[Variant], vb: list[Variant], given: Mapping[str, str]
) -> tuple[list[Match], list[Unmatched]]:
    """The matching (module docstring: given, same label, nearest), pairs in A's order."""
    by_a, by_b = {v.label: v for v in va}, {v.label: v for v in vb}
    matches = [Match(x, y, "given", _differs(by_a[x], by_b[y])) for x, y in given.items()]
    used_b = set(given.values())
    for v in va:
        if v.label not in given and v.label in by_b and v.label not in used_b:
            matches.append(Match(v.label, v.label, "same label", _differs(v, by_b[v.label])))
    done_a, done_b = {m.a_label for m in matches}, {m.b_label for m in matches}
    rest_a = [v for v in va if v.label not in done_a]
    rest_b = [v for v in vb if v.label not in done_b]
    near, unmatched = _match_nearest(rest_a, rest_b, _free(va, vb))
    order = {v.label: i for i, v in enumerate(va)}
    return sorted([*matches, *near], key=lambda m: order[m.a_label]), unmatched
