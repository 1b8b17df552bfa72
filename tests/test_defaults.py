"""One set of defaults: the retrieval layer's config objects default to what the service
runs with (the settings' defaults), so a test that builds one bare runs the service's
configuration."""

from __future__ import annotations

import inspect

from app.runtime import chat_config, knowledge_config, retrieval_config, window_config
from app.settings import Settings
from retrieval.chat.config import ChatConfig
from retrieval.engines.llamacpp import LlamaCppEngine
from retrieval.engines.vllm import VllmEngine
from retrieval.knowledge.base import KnowledgeConfig
from retrieval.prompt.budget import ContextBudget
from retrieval.search.memory import RetrievalConfig
from retrieval.window.keeper import WindowConfig


def test_config_objects_default_to_the_settings_defaults() -> None:
    settings = Settings()
    assert retrieval_config(settings.retrieval) == RetrievalConfig()
    assert chat_config(settings) == ChatConfig()
    assert window_config(settings.chat) == WindowConfig()
    assert knowledge_config(settings.knowledge) == KnowledgeConfig()


def test_budget_shares_default_to_the_settings_defaults() -> None:
    chat = Settings().chat
    budget = ContextBudget(8192, 256)
    assert (budget.memory_share, budget.facts_share, budget.summary_share) == (
        chat.memory_share,
        chat.facts_share,
        chat.summary_share,
    )


def defaults(function: object) -> dict[str, object]:
    return {
        name: p.default
        for name, p in inspect.signature(function).parameters.items()  # type: ignore[arg-type]
        if p.default is not inspect.Parameter.empty
    }


def test_engine_adapters_default_to_the_settings_defaults() -> None:
    engine = Settings().engine
    llamacpp = defaults(LlamaCppEngine)
    assert (llamacpp["timeout_s"], llamacpp["num_slots"]) == (engine.timeout_s, engine.num_slots)
    vllm = defaults(VllmEngine)
    for name in (
        "connect_timeout_s",
        "tokenize_timeout_s",
        "connect_attempts",
        "backoff_base_s",
        "failure_threshold",
        "reset_after_s",
        "isolate_tenant_cache",
    ):
        assert vllm[name] == getattr(engine.vllm, name), name
    assert vllm["timeout_s"] == engine.timeout_s
