"""The transformers backend: the model class, loading, prompts, scheduling, decode loops."""
