"""The OpenAI-compatible backend: the client class, its HTTP transport, and the pure payloads."""
