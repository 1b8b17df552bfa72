"""memchat's Python client: `MemchatClient`, `AsyncMemchatClient`, the API's bodies
(`memchat.types`) and its errors (`memchat.errors`). The LangChain and LlamaIndex
adapters are in `memchat.integrations`, each imported on its own."""

from memchat.answers import RetryPolicy
from memchat.client import AsyncMemchatClient, MemchatClient
from memchat.types import HistoryMessage

__all__ = ["AsyncMemchatClient", "HistoryMessage", "MemchatClient", "RetryPolicy"]
