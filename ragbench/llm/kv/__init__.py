"""KV-cache variants for the transformers backend: one class each in a registry (variants.py); the press base (press.py) with SnapKV (snapkv.py) and attention sinks (sinks.py) as its scores."""
