"""Task types: what kind of answer a question expects, and the instruction a prompt gives for it.

A dataset sets ``meta["task_type"]`` (a questions file may set it per question); the prompts
(``strategies.prompts``) read the instruction from here, so datasets never import strategies.
"""

from __future__ import annotations

from ragbench.registry import Choice, Registry

# task type -> the answer instruction every prompt (long context, RAG, closed book) gives
INSTRUCTIONS = {
    "needle": "Answer with the requested value only.",
    "qa": "Answer with a short phrase, no explanation.",
}

TASK_TYPES = Registry("task type", {name: Choice(text) for name, text in INSTRUCTIONS.items()})
