"""Lazy string registries: ``"name": "package.module:attr"``.

Registering a backend never imports it, so ``import ragbench`` stays light and optional heavy
dependencies (torch, faiss, vLLM clients) load only when a config names them.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Iterable
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


class Registry:
    def __init__(self, kind: str, entries: dict[str, str] | None = None) -> None:
        self.kind = kind
        self._entries: dict[str, str | Any] = dict(entries or {})

    def register(self, name: str, target: str | Any) -> None:
        self._entries[name] = target

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def check(self, name: str) -> str:
        if name not in self._entries:
            raise unknown(self.kind, name, self._entries)
        return name

    def get(self, name: str) -> Any:
        target = self._entries[self.check(name)]
        if isinstance(target, str):
            module, _, attr = target.partition(":")
            target = getattr(importlib.import_module(module), attr)
            self._entries[name] = target
        return target
