"""Third-party log messages once per run: a library called for every question (a llama-index
pipeline logging "`llama-index-readers-file` package not found" each time it builds a reader)
would print the same line hundreds of times. During a run (``once_per_run``) a message logged
again by the same non-ragbench logger at the same level is dropped, and the run ends with one
line saying how many repeats were dropped. ragbench's own messages are never dropped."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)


class OnceFilter(logging.Filter):
    """Passes a third-party record the first time its (logger, level, message) is seen."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[str, int, str]] = set()
        self.dropped: Counter[str] = Counter()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "ragbench" or record.name.startswith("ragbench."):
            return True
        try:
            key = (record.name, record.levelno, record.getMessage())
        except Exception:  # a record whose args do not format: let logging report it
            return True
        if key in self.seen:
            self.dropped[record.name] += 1
            return False
        self.seen.add(key)
        return True


def _handlers() -> set[logging.Handler]:
    """Every handler a record can reach now: the root's, each logger's own, the last resort."""
    found = set(logging.getLogger().handlers)
    for logger in list(logging.Logger.manager.loggerDict.values()):
        if isinstance(logger, logging.Logger):
            found.update(logger.handlers)
    if logging.lastResort is not None:
        found.add(logging.lastResort)
    return found


@contextmanager
def once_per_run() -> Iterator[None]:
    """Within the block, repeated third-party log messages are shown once (module docstring).
    Each handler gets its own filter: a record reaches every handler, and each shows it once."""
    filters = {handler: OnceFilter() for handler in _handlers()}
    for handler, once in filters.items():
        handler.addFilter(once)
    try:
        yield
    finally:
        dropped: Counter[str] = Counter()
        for handler, once in filters.items():
            handler.removeFilter(once)
            dropped |= once.dropped  # the most any one handler dropped, per logger
        if dropped:
            repeats = ", ".join(f"{name} ({n})" for name, n in sorted(dropped.items()))
            log.warning(
                "repeated third-party log messages were shown once; repeats dropped: %s", repeats
            )
