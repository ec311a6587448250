"""Lazy string registries: ``"name": "package.module:attr"``.

Registering a backend never imports it, so ``import ragbench`` stays light and optional heavy
dependencies (torch, faiss, vLLM clients) load only when a config names them.

Every set of names in ragbench is a ``Registry`` (datasets, dataset importers, LLM backends,
retrievers, embedders, splitters, tokenizers, metrics), so every unknown name gets the same
did-you-mean error listing the valid choices. A registry can also be open-ended: ``other``
describes the names it accepts beyond its entries (``"<model folder or Hugging Face id>"``) and
``accepts`` recognises them; ``check`` lets those through, ``get`` serves entries only.

A set of plain choices (an order, a policy, a precision) registers ``Choice(description)``s, so
``ragbench list`` can say what each one means. ``target`` and ``items`` read the registered
targets without importing anything (``ragbench list`` describes ``"module:attr"`` targets from
their source).
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    choices = sorted(choices)
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.5)
    if not close:  # also match the family part: "smolm2" -> "smollm2-135m-instruct"
        family = {c.split("-")[0]: c for c in reversed(choices)}
        close = [family[m] for m in difflib.get_close_matches(name, family, n=1, cutoff=0.6)]
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"{hint}valid: {', '.join(choices)}"


class UnknownNameError(KeyError, ValueError):
    """An unknown registry name; the message lists the valid choices."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


def unknown(kind: str, name: str, choices: Iterable[str]) -> UnknownNameError:
    return UnknownNameError(f"unknown {kind} {name!r}; {did_you_mean(name, choices)}")


@dataclass(frozen=True)
class Choice:
    """An entry that is only a name (``"truncate_middle"``): what choosing it means."""

    description: str


class Registry:
    """Names -> targets: ``"module:attr"`` strings (imported on first ``get``) or objects.

    Iterating a registry yields its entry names, sorted.
    """

    def __init__(
        self,
        kind: str,
        entries: dict[str, object] | None = None,
        *,
        other: str | None = None,
        accepts: Callable[[str], bool] | None = None,
        descriptions: dict[str, str] | None = None,
    ) -> None:
        self.kind = kind
        self._entries: dict[str, str | object] = dict(entries or {})
        # what an entry is, where its target cannot say (a third-party class): ``ragbench list``
        self.descriptions: dict[str, str] = dict(descriptions or {})
        self.other = other  # how accepted names beyond the entries look, shown in errors
        self._accepts = accepts

    def register(self, name: str, target: str | object) -> None:
        self._entries[name] = target

    def unregister(self, name: str) -> object:
        """Remove entry ``name`` (a plugin or a test undoing its ``register``); returns its
        target."""
        if name not in self._entries:
            raise unknown(self.kind, name, self.choices())
        return self._entries.pop(name)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def in_order(self) -> list[str]:
        """The entry names in the order they were registered (a table listing them as added)."""
        return list(self._entries)

    def choices(self) -> list[str]:
        """What an error lists: the entry names, then ``other`` when the registry has it."""
        return [*self.names(), *([self.other] if self.other else [])]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __getitem__(self, name: str) -> Any:
        return self.get(name)

    def target(self, name: str) -> object:
        """What entry ``name`` was registered with (a ``"module:attr"`` string until its first
        ``get``), without importing it."""
        if name not in self._entries:
            raise unknown(self.kind, name, self.choices())
        return self._entries[name]

    def items(self) -> list[tuple[str, Any]]:
        """``(name, target)`` for every entry, sorted by name, without importing (see ``target``)."""
        return [(name, self._entries[name]) for name in self.names()]

    def check(self, name: str) -> str:
        """``name`` if it is an entry (or accepted beyond them); else a did-you-mean error."""
        if name not in self._entries and not (self._accepts is not None and self._accepts(name)):
            raise unknown(self.kind, name, self.choices())
        return name

    def get(self, name: str) -> Any:
        """The target of entry ``name``, imported on first use."""
        if name not in self._entries:
            raise unknown(self.kind, name, self.choices())
        target = self._entries[name]
        if isinstance(target, str):
            module, _, attr = target.partition(":")
            target = getattr(importlib.import_module(module), attr)
            self._entries[name] = target
        return target

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self.choices())})"
