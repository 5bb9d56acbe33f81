"""The backend interface. A MUSA backend implements the same methods over torch_musa's `musa` device."""

from __future__ import annotations

import platform
import time
from abc import ABC, abstractmethod

import torch


class Timer(ABC):
    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def stop(self) -> float:
        """Milliseconds since start(), after a device-wide synchronisation (so side streams count)."""


class HostTimer(Timer):
    def __init__(self, sync):
        self._sync = sync
        self._t0 = 0.0

    def start(self):
        self._sync()
        self._t0 = time.perf_counter()

    def stop(self) -> float:
        self._sync()
        return (time.perf_counter() - self._t0) * 1e3


class Backend(ABC):
    name: str = ""
    device_type: str = ""
    # Namespaces of ops that belong to PyTorch itself; any other op namespace seen in forward is the candidate's own.
    torch_namespaces = ("aten", "prims", "prim", "quantized", "_quantized", "mkldnn", "quantized_decomposed",
                        "_c10d_functional", "c10d", "inductor", "_inductor", "cudnn", "torchvision")

    @abstractmethod
    def available(self) -> bool: ...

    def device(self, index: int = 0) -> torch.device:
        return torch.device(self.device_type, index)

    @abstractmethod
    def synchronize(self) -> None: ...

    @abstractmethod
    def timer(self) -> Timer: ...

    def flush_cache(self) -> None:
        """Evict the last-level cache between timed runs (no-op where not worth it)."""

    def poison(self, nbytes: int) -> None:
        """Leave NaN-filled freed memory in the allocator so uninitialised outputs show as garbage."""

    def check_build(self, kwargs: dict) -> str | None:
        """An error message if these load_inline arguments do not suit this backend."""
        return None

    def build_env(self) -> dict[str, str]:
        """Environment for compile workers (which must not grab the device)."""
        return {}

    def is_fatal(self, exc: BaseException) -> bool:
        """True when the error leaves the process unusable (sticky device error): replace the worker."""
        return False

    def device_name(self) -> str:
        return platform.processor() or platform.machine()

    def versions(self) -> dict[str, str]:
        return {"torch": torch.__version__, "python": platform.python_version()}

    def install_launch_hook(self, counter) -> None:
        """Count launches of kernels that do not go through load_inline (Triton); no-op by default."""

    def kernel_profile(self, fn, args) -> dict | None:
        """Run fn(*args) under a profiler: {'own_kernels', 'kernels', 'share', 'names'}; None if unsupported."""
        return None

    def peak_rates(self) -> dict[str, float]:
        """Measured ceilings for the speed-of-light estimate: bytes/s and flop/s."""
        dev = self.device()
        n = 64 * 2**20 // 4 if self.device_type == "cpu" else 512 * 2**20 // 4
        a = torch.empty(n, device=dev).uniform_()
        b = torch.empty_like(a)
        m = 1024 if self.device_type == "cpu" else 8192
        x = torch.rand(m, m, device=dev)
        rates = {}
        for key, fn, work in (("bytes_per_s", lambda: b.copy_(a), 2 * a.numel() * 4),
                              ("flops_per_s", lambda: torch.mm(x, x), 2 * m**3)):
            fn()
            t = self.timer()
            best = float("inf")
            for _ in range(5):
                t.start()
                fn()
                best = min(best, t.stop())
            rates[key] = work / (best / 1e3)
        return rates
