"""Every call's intermediates kept alive while a block's calls are captured as one CUDA graph.

Captured back to back, a call's intermediates are freed into the graph's pool as it returns and a later call's
tensors take those addresses, so the intermediates chain through memory that other calls' outputs also use, and
where that chain starts differs by capture: one reference's 1,024-call graph of a three-op elementwise task ran at
7.2 or at 8.3 us a call, fixed by its capture (H200, docs/benchmarks.md). Held until the capture ends, each call's
intermediates take addresses of their own, as a lone call's do after do_bench's cache flush, and the figure no longer
depends on the placement (8.72-8.76 us in four captures). Both sides of the verifier and the calibration's ground
truth capture this way.

What it sees are the dispatcher's ops, Python's and native code's alike (an extension's `torch::empty` too). A
candidate's own buffer reused across calls (a workspace made in `__init__`) is not an op of the capture: it stays at
one address, L2-hot from call to call, which gains at most what every reference had before this (examples:
exploit_74). The bytes held are reported, so a block's memory plan counts them (timing.plan_calls).
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class KeepAlive(TorchDispatchMode):
    """While active, holds every op's outputs; `held_bytes` is what they occupy beyond the storages it is told to
    leave out (inputs, the block's own outputs); leaving the block drops them."""

    def __init__(self):
        super().__init__()
        self.held: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.held.append(out)
        return out

    def held_bytes(self, leave_out=()) -> int:
        seen = {t.untyped_storage().data_ptr() for t in tree_leaves(list(leave_out)) if isinstance(t, torch.Tensor)}
        total = 0
        for t in tree_leaves(self.held):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                if storage.data_ptr() not in seen:  # views and in-place results share a storage: counted once
                    seen.add(storage.data_ptr())
                    total += storage.nbytes()
        return total

    def release(self) -> None:
        self.held.clear()


def keep_alive_warmed(device) -> contextlib.AbstractContextManager:
    """A keep-alive to warm up with, where captures will need one (a CUDA device), else nothing: a process's first
    dispatch mode imports torch._dynamo, a second or more that must not fall inside a bounded probe."""
    return KeepAlive() if device is not None and device.type == "cuda" else contextlib.nullcontext()
