"""Relational storage: the source of truth for users, sessions, messages and embeddings."""
