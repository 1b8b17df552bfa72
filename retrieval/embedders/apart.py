"""Model conversions run in a process of their own.

A service's first start converts its models (the transformer to ONNX, e5's 4-bit file to
a graph and a word table, a graph to 8 bits, MiniLM's vocabulary to word vectors): torch,
the model built in it and the exporter's buffers take hundreds of MiB, and a process
keeps most of them after it is done (freed blocks stay in the allocator; modules stay
imported). Converted in a child process, they are given back when the child ends, and
the service holds only what it loads from the converted files: the same resident memory
on the first start as on every later one (bench/RESULTS.md measured +560 MiB the first
time without this).

The child is spawned, not forked: a fork would copy the parent's threads' locks (ONNX
Runtime's and the event loop's) in whatever state they were.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

# Two embedders built at once in one process (tests, a benchmark) convert a file once.
_CONVERT_LOCK = threading.Lock()


def run_apart(function: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
    """`function(*args, **kwargs)` in a new child process, its result or its exception
    (both pickled back) here. `function` must be importable by its module and name."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(function, *args, **kwargs).result()


def convert_once(
    targets: Sequence[Path], function: Callable[P, None], /, *args: P.args, **kwargs: P.kwargs
) -> None:
    """`function(*args, **kwargs)` apart (`run_apart`) unless every one of `targets`, the
    files it writes (atomically), is there already."""
    if all(target.exists() for target in targets):
        return
    with _CONVERT_LOCK:
        if not all(target.exists() for target in targets):
            run_apart(function, *args, **kwargs)
