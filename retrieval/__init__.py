"""Embedding, vector search, context assembly and the chat turn. Knows nothing of HTTP."""
