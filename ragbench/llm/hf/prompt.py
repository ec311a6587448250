"""How the transformers backend turns a request into prompt text: shared by ``HFModel`` and the
dry run (``ragbench.experiment.dry_run``), which must count the same tokens without loading weights."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ragbench.models import ModelPreset
from ragbench.types import GenerationRequest

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def is_instruct(
    tokenizer: PreTrainedTokenizerBase,
    preset: ModelPreset | None = None,
    instruct: bool | None = None,
) -> bool:
    """An explicit ``instruct`` wins; else the preset's flag; else "the tokenizer has a chat
    template"."""
    if instruct is not None:
        return instruct
    if preset is not None:
        return bool(preset.instruct)
    return bool(getattr(tokenizer, "chat_template", None))


# the tokenizer is left untyped: transformers types apply_chat_template's result as a union
def render(tokenizer: Any, instruct: bool, request: GenerationRequest) -> tuple[str, bool]:
    """The full prompt text and whether the tokenizer adds its special tokens to it."""
    if instruct:
        messages = [{"role": "system", "content": request.system}] if request.system else []
        messages.append({"role": "user", "content": request.prompt})
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return text, False  # the template writes its own special tokens
    return (f"{request.system}\n\n{request.prompt}" if request.system else request.prompt), True
