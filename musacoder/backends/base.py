"""The backend interface, and what the GPU backends share: torch.cuda and torch_musa's torch.musa have one API."""

from __future__ import annotations

import os
import platform
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path

import torch

# Sticky device errors, as CUDA words them; torch_musa prefixes the same runtime texts with "MUSA error:" (assumed
# identical wording: never seen on MUSA hardware).
DEVICE_FATAL = ("illegal memory access", "device-side assert", "unspecified launch failure", "illegal instruction",
                "misaligned address", "an illegal", "uncorrectable ECC", "context is destroyed", "launch timed out",
                "not permitted when stream is capturing")


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


class EventTimer(Timer):
    """Device events around the work, each end after a device-wide synchronisation (side streams count)."""

    def __init__(self, rt):
        self._rt = rt
        self._s = rt.Event(enable_timing=True)
        self._e = rt.Event(enable_timing=True)

    def start(self):
        self._rt.synchronize()
        self._s.record()

    def stop(self) -> float:
        self._rt.synchronize()  # device-wide: work on side streams is inside the measurement
        self._e.record()
        self._e.synchronize()
        return self._s.elapsed_time(self._e)


@dataclass
class Prepared:
    """A candidate as a backend verifies it: the code it builds and runs, notes for the feedback, and why it cannot
    build for the backend's target at all (empty: it can)."""

    code: str
    notes: list[str] = field(default_factory=list)
    refusal: str = ""


class Backend(ABC):
    name: str = ""
    device_type: str = ""
    emulated = False  # verdicts are about another platform's code, translated and verified on this one
    visible_devices_var = "CUDA_VISIBLE_DEVICES"  # hidden from processes that must not touch a device
    arch_env_var = ""  # where the extension builder reads the target architectures from
    # load_inline/load modules a candidate may build through (names in verifier.build.EXTENSION_APIS); the last one
    # is what this backend's builds run.
    extension_apis: tuple[str, ...] = ("torch",)
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

    def cache_bytes(self) -> int:
        """The last-level cache a timed call's inputs must not find warm: the host's largest cache level (sysfs)."""
        best = 0
        for size in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
            try:
                text = size.read_text().strip()
            except OSError:
                continue
            unit = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
            best = max(best, int(text.rstrip("KMG") or 0) * unit)
        return best or 32 * 2**20

    def free_bytes(self) -> int:
        """Memory a timing window may still take on this backend's device."""
        import psutil

        return psutil.virtual_memory().available

    def poison(self, nbytes: int) -> None:
        """Leave NaN-filled freed memory in the allocator so uninitialised outputs show as garbage."""

    def device_count(self) -> int:
        return 1

    def prepare(self, code: str) -> Prepared:
        """The candidate as this backend builds and runs it, with notes for its feedback. Runs in the caller's
        process next to the static checks, before anything is built; never touches a device."""
        return Prepared(code)

    def build_arguments(self, api: str, arguments: dict) -> dict:
        """A build request made through extension API `api`, as arguments of this backend's own loader."""
        return arguments

    def check_build(self, kwargs: dict) -> str | None:
        """An error message if these load_inline arguments do not suit this backend."""
        return None

    def light_build(self, arguments: dict) -> dict | None:
        """The same load_inline build with lighter headers, for the builder to try first (its failure is never
        reported: the candidate's own build follows); None where this backend has none for these arguments."""
        return None

    def light_library_problem(self, library: Path, light: dict) -> str | None:
        """Why a library that compiled from `light_build`'s arguments must not be used (the candidate's own build
        follows, as for one that did not compile); None where it may."""
        return None

    def compiler_env(self) -> dict[str, str]:
        """Environment for the loader's compile commands, set only while the builder runs them."""
        return {}

    def arch_env(self, capabilities: list[str]) -> dict[str, str]:
        """Build-target environment for compile workers, from the devices' capabilities ("9.0"); a setting the
        user made wins."""
        if not self.arch_env_var or not capabilities or self.arch_env_var in os.environ:
            return {}
        return {self.arch_env_var: ";".join(self.arch_name(c) for c in capabilities)}

    def arch_name(self, capability: str) -> str:
        return capability

    def disable_tf32(self) -> None:
        """TF32 off for reference and candidate alike (fp32 references must be fp32)."""
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

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


class GpuBackend(Backend):
    """A GPU backend over a torch device module with torch.cuda's API (`rt`: torch.cuda, torch.musa)."""

    fatal_errors: tuple[str, ...] = DEVICE_FATAL

    def __init__(self):
        self._flush_buf = None

    @property
    @abstractmethod
    def rt(self): ...

    def available(self) -> bool:
        return self.rt.is_available()

    def device_count(self) -> int:
        return self.rt.device_count()

    def synchronize(self) -> None:
        self.rt.synchronize()

    def timer(self):
        return EventTimer(self.rt)

    def flush_cache(self) -> None:
        if self._flush_buf is None:
            self._flush_buf = torch.empty(max(2 * self.cache_bytes(), 64 * 2**20) // 4, dtype=torch.float32,
                                          device=self.device_type)
        self._flush_buf.zero_()

    def cache_bytes(self) -> int:
        # torch_musa's properties have no L2 size: 25 MiB is over S4000's 24 MB
        return getattr(self.rt.get_device_properties(self.rt.current_device()), "L2_cache_size", 25 * 2**20)

    def free_bytes(self) -> int:
        return self.rt.mem_get_info()[0]

    def poison(self, nbytes: int) -> None:
        if nbytes > 0:
            torch.empty(nbytes // 4 + 1, dtype=torch.float32, device=self.device_type).fill_(float("nan"))

    def build_env(self) -> dict[str, str]:
        return {self.visible_devices_var: ""}

    def is_fatal(self, exc: BaseException) -> bool:
        msg = str(exc)
        if any(f in msg for f in self.fatal_errors):
            return True
        try:  # a sticky error shows on the next synchronisation
            self.rt.synchronize()
        except Exception:
            return True
        return False

    def device_name(self) -> str:
        return self.rt.get_device_name(0)

    def versions(self) -> dict[str, str]:
        v = super().versions()
        v["capability"] = "{}.{}".format(*self.rt.get_device_capability(0))
        return v

    def memory_state(self) -> tuple[int, int, int, int]:
        """(allocated, reserved, free, total) bytes after releasing the allocator's cache."""
        self.rt.empty_cache()
        free, total = self.rt.mem_get_info()
        return self.rt.memory_allocated(), self.rt.memory_reserved(), free, total

    def profile_kernels(self, fn, args, own_kernels, profiler, is_device_event, library_kernels) -> tuple[dict, int]:
        """Device time of the candidate's own kernels under `profiler` (a new torch profiler context), and how many
        device events it recorded. With `own_kernels` (the `__global__` names its library defines, from
        symbols.library_symbols) a kernel is its own by name; without, by the `library_kernels` substring heuristic
        (which misjudges own kernels whose argument types mention at::/c10::)."""
        from musacoder.backends.kernel_names import own_kernel

        with profiler as prof:
            fn(*args)
            self.synchronize()
        events = prof.events() if hasattr(prof, "events") else prof.function_events
        total = own = 0.0
        names, own_n, seen = set(), 0, 0
        for ev in events:
            if not is_device_event(ev.device_type):
                continue
            seen += 1
            dt = ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
            total += dt
            mine = own_kernel(ev.name, own_kernels) if own_kernels is not None else \
                not any(k in ev.name for k in library_kernels)
            if mine:
                own += dt
                own_n += 1
                names.add(ev.name[:80])
        return {"own_kernels": own_n, "share": (own / total) if total else 0.0, "names": sorted(names)[:8]}, seen
