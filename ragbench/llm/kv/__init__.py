"""KV-cache variants for the transformers backend: one class each in a registry (variants.py), SnapKV (snapkv.py), attention sinks (sinks.py)."""
