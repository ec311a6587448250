"""``python -m ragbench.cli``: the same command as ``ragbench``."""

from ragbench.cli import app

app()
