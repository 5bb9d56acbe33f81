"""Backends behind one interface: device, synchronise, timing, cache flush, build checks, launch accounting.

Importing this package imports neither torch nor torch_musa (the CLI imports `BackendError` from here and keeps
`--help` fast).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from musacoder.backends.base import Backend

_CLASSES = {"cpu": "cpu.CpuBackend", "cuda": "cuda.CudaBackend", "triton": "triton.TritonBackend",
            "musa": "musa.MusaBackend", "musa-on-cuda": "musa_on_cuda.MusaOnCudaBackend"}
NAMES = tuple(_CLASSES)


class BackendError(ValueError):
    """An unknown backend, or one this machine cannot run; the CLI prints it as one `error:` line."""


def musa_loaded() -> bool:
    """Whether torch_musa is already part of this process's torch: `torch.version.musa` set, or `torch.musa`
    registered. torch's device-backend autoload does that on `import torch` wherever torch_musa is installed (unless
    TORCH_DEVICE_BACKEND_AUTOLOAD=0). Never imports torch_musa itself: importing it where it is broken or absent is
    slow or fails, and `auto` must stay cheap and harmless on every machine."""
    import torch

    return getattr(torch.version, "musa", None) is not None or hasattr(torch, "musa")


def resolve(name: str) -> str:
    """The backend `auto` stands for here: musa when torch_musa is loaded and sees a device, else cuda when a GPU is
    present, else cpu. Other names as given, checked: BackendError for an unknown one, or for musa where torch_musa
    does not import. The one place that decides it, so the CLI, pools, bench and training agree (torch imported
    here, not at module import)."""
    if name == "auto":
        import torch

        if musa_loaded() and torch.musa.is_available():
            return "musa"
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name not in _CLASSES:
        raise BackendError(f"unknown backend {name!r} (auto, {', '.join(NAMES)})")
    if name == "musa":
        try:
            importlib.import_module("torch_musa")
        except Exception as e:  # absent, or refusing this torch version: either way no musa here
            raise BackendError(f"backend musa needs torch_musa, which does not import here ({type(e).__name__}: "
                               f"{e}); install it with the MUSA SDK (docs/musa.md), or verify MUSA code on an NVIDIA "
                               "GPU with --backend musa-on-cuda") from None
    return name


def get_backend(name: str = "auto") -> Backend:
    module, cls = _CLASSES[resolve(name)].rsplit(".", 1)
    return getattr(importlib.import_module(f"musacoder.backends.{module}"), cls)()


def __getattr__(name: str):
    if name == "Backend":  # the interface, imported on first use so that importing the package stays torch-free
        from musacoder.backends.base import Backend

        return Backend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def available_bytes(backend: str, worker_mem_gb: float = 0.0) -> int:
    """Memory a run can use: free device memory on a GPU backend (cuda, triton, musa, musa-on-cuda); else available
    RAM, capped by the worker limit."""
    if backend != "cpu":
        rt = get_backend(backend).rt  # torch.cuda, or torch_musa's torch.musa
        if rt.is_available():
            return rt.mem_get_info()[0]
    import psutil

    avail = psutil.virtual_memory().available
    return min(avail, int(worker_mem_gb * 2**30)) if worker_mem_gb > 0 else avail


__all__ = ["Backend", "BackendError", "NAMES", "available_bytes", "get_backend", "musa_loaded", "resolve"]
