"""Generated questions: single- and multi-hop question/answer pairs asked of an LLM over a corpus."""
