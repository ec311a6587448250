"""RULER: the synthetic tasks, cwe, fwe and QA, and the 13 named configurations."""
