"""Adapters of memchat to application frameworks, one module per framework, each an
extra of the `memchat-client` distribution: `memchat.integrations.langchain`
(`memchat-client[langchain]`), `memchat.integrations.llamaindex`
(`memchat-client[llamaindex]`). Nothing here imports a framework: only importing one of
those modules does."""
