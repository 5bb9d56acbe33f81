"""CPU backend: C++ extensions through load_inline (cpp_sources only, OpenMP allowed)."""

from __future__ import annotations

import platform

import torch

from musacoder.backends.base import Backend, HostTimer


class CpuBackend(Backend):
    name = "cpu"
    device_type = "cpu"

    def available(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def timer(self):
        return HostTimer(self.synchronize)

    def check_build(self, kwargs: dict) -> str | None:
        if kwargs.get("cuda_sources") or kwargs.get("with_cuda"):
            return "the cpu backend builds C++ only: pass cpp_sources, not cuda_sources"
        return None

    def device_name(self) -> str:
        try:
            for line in open("/proc/cpuinfo"):
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()} x{torch.get_num_threads()} threads"
        except OSError:
            pass
        return platform.machine()
