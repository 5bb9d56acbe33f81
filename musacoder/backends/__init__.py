"""Backends behind one interface: device, synchronise, timing, cache flush, build checks, launch accounting."""

from __future__ import annotations

from musacoder.backends.base import Backend


def get_backend(name: str = "auto") -> Backend:
    if name == "auto":
        import torch

        name = "cuda" if torch.cuda.is_available() else "cpu"
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


__all__ = ["Backend", "get_backend"]
