"""Backends behind one interface: device, synchronise, timing, cache flush, build checks, launch accounting."""

from __future__ import annotations

from musacoder.backends.base import Backend


def resolve(name: str) -> str:
    """The backend `auto` stands for here (cuda when a GPU is present, else cpu); other names as given. The one place
    that decides it, so the CLI, pools, bench and training agree (torch imported here, not at module import)."""
    if name != "auto":
        return name
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def get_backend(name: str = "auto") -> Backend:
    name = resolve(name)
    if name == "cpu":
        from musacoder.backends.cpu import CpuBackend

        return CpuBackend()
    if name == "cuda":
        from musacoder.backends.cuda import CudaBackend

        return CudaBackend()
    if name == "triton":
        from musacoder.backends.triton import TritonBackend

        return TritonBackend()
    raise ValueError(f"unknown backend {name!r} (cpu, cuda, triton; musa is planned)")


__all__ = ["Backend", "get_backend", "resolve"]
