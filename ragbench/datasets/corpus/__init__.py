"""Corpora: your documents read and ingested, cleaned, deduplicated, stored as one shared corpus file."""
