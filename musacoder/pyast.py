"""`ast.parse` behind one process-wide lock.

CPython 3.11 keeps the AST constructor's recursion depth per interpreter, not per thread: two threads parsing at once
can fail with "SystemError: AST constructor recursion depth mismatch" (CPython gh-106905). Reward functions, the
pool's admission threads and synthesis all parse Python in threads (seen in CI: a task failed to load while four
threads called the KernelBench entry point)."""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse(source: str, filename: str = "<unknown>", mode: str = "exec") -> ast.AST:
    with _LOCK:
        return ast.parse(source, filename, mode)
