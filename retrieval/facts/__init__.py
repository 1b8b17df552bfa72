"""Key facts about a user: extracted from what the user says, kept current, pinned."""
