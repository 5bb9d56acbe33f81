"""Tensors shared between the judge and a subject process without copying through a pipe.

cpu: a file in a shared-memory directory mapped by both (`torch.from_file(shared=True)`); the candidate's sandbox may
write only its own directory. cuda: a CUDA IPC handle of memory the judge allocated (torch's own storage sharing).
Any other device (musa) uses the cpu way: torch's storage sharing (torch.multiprocessing.reductions) handles CUDA
storage only, and torch_musa's own IPC has not been tried, so the buffers are host files and the subject stages them
through its device (subject.py). Only references cross as JSON; the judge owns every buffer and frees it when the
job ends.
"""

from __future__ import annotations

import base64
import os
import secrets
import shutil
import tempfile
from pathlib import Path

import torch

from musacoder.verifier.protocol import TensorRef

DTYPE_NAMES = {str(d): d for d in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64,
                                   torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64)}


def shm_root() -> Path:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def new_dir(prefix: str, shared_memory: bool = True) -> Path:
    """A private directory: in shared memory where buffers live as files (cpu), else in the temporary directory."""
    root = shm_root() if shared_memory else Path(tempfile.gettempdir())
    d = root / f"musacoder-{prefix}-{os.getpid()}-{secrets.token_hex(6)}"
    d.mkdir(mode=0o700)
    return d


def remove_dir(d: Path | None) -> None:
    if d is not None:
        shutil.rmtree(d, ignore_errors=True)


def sweep(pid: int) -> None:
    """Remove the directories a killed process created (named with its pid): a judge killed by its pool never runs
    its own clean-up, and what it left in shared memory would hold RAM until the host restarts."""
    for root in {shm_root(), Path(tempfile.gettempdir())}:
        for d in root.glob(f"musacoder-*-{pid}-*"):
            remove_dir(d)


def device_ipc(device_type: str) -> bool:
    """Whether buffers for this device cross processes as device memory (CUDA IPC); else as host shared memory."""
    return device_type == "cuda"


def alloc(shape, dtype: torch.dtype, device: torch.device, directory: Path) -> tuple[torch.Tensor, TensorRef]:
    """A new zeroed contiguous tensor the judge owns, and the reference a subject opens it with."""
    shape = [int(s) for s in shape]
    if not device_ipc(device.type):
        path = directory / secrets.token_hex(8)
        n = 1
        for s in shape:
            n *= s
        t = torch.from_file(str(path), shared=True, size=max(n, 1), dtype=dtype)[:n].view(shape)
        return t, TensorRef(kind="shm", shape=shape, dtype=str(dtype), path=str(path))
    t = torch.zeros(shape, dtype=dtype, device=device)
    from torch.multiprocessing.reductions import reduce_tensor

    _, args = reduce_tensor(t)
    return t, TensorRef(kind="cuda", shape=shape, dtype=str(dtype), ipc=[_enc(a) for a in args])


def disown(ref: TensorRef, consumers: int = 2) -> None:
    """cuda, once no subject maps the buffer any more (each has let go, or its process is dead): take back the counts
    its consumers did not return. torch's CUDA IPC frees a shared block only when the count it set to 1 on sharing is
    back to 0, and a consumer killed while mapping it never decrements: that kept a KernelBench-size output (6 GiB)
    allocated in the judge after each job and the worker was recycled. A count below 0 is harmless (the next
    sharing sets it to 1)."""
    if ref.kind != "cuda":
        return
    handle, offset = _dec(ref.ipc[11]), _dec(ref.ipc[12])
    for _ in range(consumers if handle else 0):  # an empty tensor has no block and no count
        torch.UntypedStorage._release_ipc_counter_cuda(handle, offset)


def open_ref(ref: TensorRef) -> torch.Tensor:
    dtype = DTYPE_NAMES[ref.dtype]
    n = 1
    for s in ref.shape:
        n *= s
    if ref.kind == "shm":
        return torch.from_file(ref.path, shared=True, size=max(n, 1), dtype=dtype)[:n].view(ref.shape)
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    return rebuild_cuda_tensor(*[_dec(a) for a in ref.ipc])


_CLASSES = {"Tensor": torch.Tensor, "UntypedStorage": torch.UntypedStorage, "TypedStorage": torch.TypedStorage}


def _enc(a):
    if isinstance(a, bytes):
        return {"b64": base64.b64encode(a).decode()}
    if isinstance(a, torch.dtype):
        return {"dtype": str(a)}
    if isinstance(a, type):
        return {"cls": a.__name__}
    if isinstance(a, torch.Size):
        return list(a)
    return a


def _dec(a):
    if isinstance(a, dict):
        if "b64" in a:
            return base64.b64decode(a["b64"])
        if "dtype" in a:
            return DTYPE_NAMES[a["dtype"]]
        return _CLASSES[a["cls"]]
    if isinstance(a, list):
        return tuple(a)
    return a
