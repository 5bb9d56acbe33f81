"""CUDA backend: load_inline with cuda_sources; events timed after a device-wide synchronisation."""

from __future__ import annotations

import ctypes
import functools

import torch

from musacoder.backends.base import DEVICE_FATAL, GpuBackend

# Kernel-name fragments of PyTorch's and vendor libraries' own kernels; everything else is the candidate's.
# (Specific prefixes only: a candidate's own kernel may well be called `gemm_kernel`.)
LIBRARY_KERNELS = ("at::", "at_cuda_detail", "c10::", "cutlass", "cublas", "cudnn", "xmma", "ampere_", "volta_",
                   "turing_", "hopper_", "sm80_", "sm90_", "sm100_", "gemmSN", "gemmk1", "gemv2", "gemvx", "dot_kernel",
                   "Memcpy", "Memset", "triton_poi", "triton_red", "triton_per", "triton_tem", "nvjet", "splitKreduce",
                   "cutensor", "cufft", "curand")


class CudaBackend(GpuBackend):
    name = "cuda"
    device_type = "cuda"
    arch_env_var = "TORCH_CUDA_ARCH_LIST"
    fatal_errors = (*DEVICE_FATAL, "CUDA error: unknown error")

    @property
    def rt(self):
        return torch.cuda

    def flush_cache(self) -> None:
        """Persisting L2 lines first made normal again: a candidate that marked its own data persisting (an
        access-policy window on its stream) could otherwise keep it cached through the flush on a device whose flush
        spares them (on an H100 the flush alone evicts them: docs/verifier.md)."""
        reset = _reset_persisting_l2()
        if reset is not None:
            reset()
        super().flush_cache()

    def versions(self) -> dict[str, str]:
        return {**super().versions(), "cuda": str(torch.version.cuda)}

    def kernel_profile(self, fn, args, own_kernels: list[str] | None = None) -> dict | None:
        from torch.profiler import ProfilerActivity

        prof, _ = self.profile_kernels(fn, args, own_kernels, ProfilerActivity.CUDA,
                                       lambda t: t == torch.autograd.DeviceType.CUDA, LIBRARY_KERNELS)
        return prof


@functools.cache
def _reset_persisting_l2():
    """The driver's cuCtxResetPersistingL2Cache (the calling thread's context is torch's primary one), or None where
    the driver has none; its result is not checked: where there is no set-aside (MIG), there is nothing to reset."""
    try:
        return ctypes.CDLL("libcuda.so.1").cuCtxResetPersistingL2Cache
    except (OSError, AttributeError):
        return None
