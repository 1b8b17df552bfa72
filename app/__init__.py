"""HTTP API, settings, CLI and process wiring of the memchat service."""
