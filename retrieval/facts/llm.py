"""The LLM fact extractor: the engine answers in JSON constrained by a schema (a grammar
in llama.cpp, structured output in vLLM). For capable models; the tiny default CPU
model uses the rule-based extractor. Its answer is checked like untrusted input."""

from __future__ import annotations

import json
from typing import Any

from retrieval.errors import EngineError
from retrieval.facts.model import CATEGORIES, CandidateFact, is_instruction, language_of
from retrieval.protocols import ChatMessage, SamplingParams, StructuredEngine

KEYS = (
    "name", "age", "occupation", "employer", "home", "hometown", "allergy", "diet", "avoid",
    "health", "likes", "dislikes", "favorite", "family", "pet",
)  # fmt: skip
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "facts": {
            "type": "array",
            "maxItems": 8,
            "items": {
                "type": "object",
                "properties": {
                    "category": {"type": "string", "enum": list(CATEGORIES)},
                    "key": {"type": "string", "enum": list(KEYS)},
                    "item": {"type": "string", "maxLength": 60},
                    "value": {"type": "string", "minLength": 1, "maxLength": 120},
                },
                "required": ["category", "key", "item", "value"],
            },
        }
    },
    "required": ["facts"],
}
ITEM_KEYS = frozenset(
    {"allergy", "avoid", "health", "likes", "dislikes", "favorite", "family", "pet"}
)


class LlmFactExtractor:
    name = "llm"

    def __init__(self, engine: StructuredEngine, instructions: str, max_tokens: int = 256) -> None:
        self._engine = engine
        self._instructions = instructions
        self._max_tokens = max_tokens

    async def extract(self, text: str) -> list[CandidateFact]:
        if is_instruction(text):
            return []
        messages = [ChatMessage("system", self._instructions), ChatMessage("user", text)]
        params = SamplingParams(max_tokens=self._max_tokens, temperature=0.0)
        raw = await self._engine.generate_json(messages, SCHEMA, params)
        try:
            answer = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise EngineError(f"the engine's facts are not JSON: {exc}") from exc
        return parse_facts(answer, language_of(text))


def parse_facts(answer: Any, language: str) -> list[CandidateFact]:
    """Candidate facts from the engine's JSON; anything malformed is left out."""
    items = answer.get("facts", []) if isinstance(answer, dict) else []
    facts: list[CandidateFact] = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        category, key = item.get("category"), item.get("key")
        value = str(item.get("value", "")).strip()
        detail = str(item.get("item", "")).strip()
        if category not in CATEGORIES or key not in KEYS or not value or is_instruction(value):
            continue
        subject = f"{key}:{detail or value}" if key in ITEM_KEYS else key
        facts.append(CandidateFact(category, subject, value, language))
    return facts
