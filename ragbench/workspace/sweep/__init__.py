"""Papermill sweeps: the spec and its grid, one point's execution, the parallel resumable sweep."""
