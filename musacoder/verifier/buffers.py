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
import math
import secrets
from contextlib import nullcontext
from pathlib import Path

import torch

from musacoder.proc.scratch import shm_root
from musacoder.verifier.protocol import TensorRef

DTYPE_NAMES = {str(d): d for d in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64,
                                   torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64)}


def device_ipc(device_type: str) -> bool:
    """Whether buffers for this device cross processes as device memory (CUDA IPC); else as host shared memory."""
    return device_type == "cuda"


def new_pool(device: torch.device):
    """cuda: a memory pool for one job's candidate-visible buffers (None elsewhere). A CUDA IPC handle opens the whole
    allocation a block lives in, a 2 MiB segment holding many small blocks, so a candidate that maps its input can read
    every other block of that segment: the reference's output among them (exploit 39). Buffers from their own pool
    share no segment with the judge's own; the judge drops the pool when the job ends."""
    return torch.cuda.MemPool() if device_ipc(device.type) else None


def alloc(shape, dtype: torch.dtype, device: torch.device, directory: Path,
          pool=None) -> tuple[torch.Tensor, TensorRef]:
    """A new zeroed contiguous tensor the judge owns, and the reference a subject opens it with (`pool`: the CUDA
    memory pool to allocate from)."""
    shape = [int(s) for s in shape]
    if not device_ipc(device.type):
        path = directory / secrets.token_hex(8)
        n = math.prod(shape)
        t = torch.from_file(str(path), shared=True, size=max(n, 1), dtype=dtype)[:n].view(shape)
        return t, TensorRef(kind="shm", shape=shape, dtype=str(dtype), path=str(path))
    index = torch.cuda.current_device() if device.index is None else device.index  # use_mem_pool needs an index
    with torch.cuda.use_mem_pool(pool, index) if pool is not None else nullcontext():
        t = torch.zeros(shape, dtype=dtype, device=device)
    from torch.multiprocessing.reductions import reduce_tensor

    _, args = reduce_tensor(t)
    return t, TensorRef(kind="cuda", shape=shape, dtype=str(dtype), ipc=[_enc(a) for a in args])


def prefix_view(t: torch.Tensor, ref: TensorRef, shape, dtype: torch.dtype) -> tuple[torch.Tensor, TensorRef] | None:
    """A buffer of `shape` in the first elements of buffer `t` (same dtype, contiguous), and its reference: the same
    file or the same CUDA IPC share (no new share, no new consumer count), opened with another shape. None when it does
    not fit. A smaller shape variant reuses the task shape's buffers this way instead of holding its own."""
    shape = [int(x) for x in shape]
    n = math.prod(shape)
    if dtype != t.dtype or not t.is_contiguous() or n > t.numel() or n == 0:
        return None
    v = t.reshape(-1)[:n].view(shape)
    if ref.kind == "shm":
        return v, TensorRef(kind="shm", shape=shape, dtype=ref.dtype, path=ref.path)
    ipc = list(ref.ipc)
    strides, acc = [], 1
    for x in reversed(shape):
        strides.append(acc)
        acc *= x
    ipc[1], ipc[2] = shape, strides[::-1]  # rebuild_cuda_tensor's size and stride; offset and storage as before
    return v, TensorRef(kind="cuda", shape=shape, dtype=ref.dtype, ipc=ipc)


def poison(t: torch.Tensor, seed: int) -> None:
    """Overwrite a judge-owned output buffer before a subject writes it: NaN for floats, random bits from `seed` (a
    secret) otherwise, so a subject that writes nothing leaves values that match no reference and no previous run."""
    if t.numel() == 0:
        return
    if t.is_floating_point() or t.is_complex():
        t.fill_(float("nan"))
    else:
        gen = torch.Generator(device=t.device).manual_seed(seed)
        t.random_(0, 2, generator=gen) if t.dtype == torch.bool else t.random_(generator=gen)


# torch's CUDA IPC counter file (RefcountedMapAllocator): a 64-byte header, then CUDA_IPC_REF_COUNTER_FILE_SIZE
# int64 counts. Checked against the file's size before any count is read or written.
_HEADER, _COUNTS = 64, 10000


def _count_at(ref: TensorRef) -> tuple[Path, int] | None:
    if ref.kind != "cuda" or not ref.ipc[11]:  # an empty tensor has no block and no count
        return None
    path = shm_root() / _dec(ref.ipc[11]).decode().lstrip("/")
    try:
        if path.stat().st_size != _HEADER + 8 * _COUNTS:
            return None
    except OSError:
        return None
    return path, _HEADER + 8 * int(_dec(ref.ipc[12]))


def ipc_count(ref: TensorRef) -> int | None:
    """cuda: the consumer count torch keeps for this buffer (None: not cuda, or no counter file of torch's layout)."""
    at = _count_at(ref)
    if at is None:
        return None
    with open(at[0], "rb") as f:
        f.seek(at[1])
        return int.from_bytes(f.read(8), "little", signed=True)


def disown(ref: TensorRef) -> int | None:
    """cuda, once no subject maps the buffer any more (each has let go, or its process is dead): set its consumer count
    to 0, so the block is freed when the judge drops it; returns the count found. torch frees a shared block only at
    exactly 0 (measured on torch 2.11: the count is unsigned): a share gives one count, both subjects map the one
    share and each returns a count on release (-1: kept forever), and a subject killed while mapping returns none
    (1: kept). Either kept a KernelBench-size job's 18 GiB in the judge, which was then recycled after every job."""
    at = _count_at(ref)
    if at is None:
        return None
    with open(at[0], "r+b") as f:
        f.seek(at[1])
        found = int.from_bytes(f.read(8), "little", signed=True)
        f.seek(at[1])
        f.write((0).to_bytes(8, "little", signed=True))
    return found


def open_ref(ref: TensorRef) -> torch.Tensor:
    dtype = DTYPE_NAMES[ref.dtype]
    n = math.prod(ref.shape)
    if ref.kind == "shm" and ref.readonly:
        # mapped PROT_READ: a write to a candidate's own inputs faults (its process dies) instead of landing; torch
        # has no read-only from_file, numpy's memmap does, and torch shares its memory
        import warnings

        import numpy as np

        arr = np.memmap(ref.path, mode="r", dtype=_NUMPY[ref.dtype], shape=(max(n, 1),))[:n].reshape(ref.shape)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "not writable": that is the point
            t = torch.from_numpy(arr)
        return t if t.dtype == dtype else t.view(dtype)  # bfloat16: numpy has none, its bits as uint16
    if ref.kind == "shm":
        return torch.from_file(ref.path, shared=True, size=max(n, 1), dtype=dtype)[:n].view(ref.shape)
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    return rebuild_cuda_tensor(*[_dec(a) for a in ref.ipc])


_NUMPY = {"torch.float32": "float32", "torch.float16": "float16", "torch.float64": "float64", "torch.int64": "int64",
          "torch.int32": "int32", "torch.int16": "int16", "torch.int8": "int8", "torch.uint8": "uint8",
          "torch.bool": "bool", "torch.complex64": "complex64", "torch.bfloat16": "uint16"}
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
