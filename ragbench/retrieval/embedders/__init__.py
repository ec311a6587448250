"""Text embedders: sentence-transformers, ONNX, HTTP and hashing, their precision, and the on-disk embedding cache."""
