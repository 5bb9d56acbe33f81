"""CUDA backend: load_inline with cuda_sources; events timed after a device-wide synchronisation."""

from __future__ import annotations

import ctypes
import functools
import os
import re
import shlex
import sys
from pathlib import Path

import torch

from musacoder.backends.base import DEVICE_FATAL, GpuBackend

# Kernel-name fragments of PyTorch's and vendor libraries' own kernels; everything else is the candidate's.
# (Specific prefixes only: a candidate's own kernel may well be called `gemm_kernel`.)
LIBRARY_KERNELS = ("at::", "at_cuda_detail", "c10::", "cutlass", "cublas", "cudnn", "xmma", "ampere_", "volta_",
                   "turing_", "hopper_", "sm80_", "sm90_", "sm100_", "gemmSN", "gemmk1", "gemv2", "gemvx", "dot_kernel",
                   "Memcpy", "Memset", "triton_poi", "triton_red", "triton_per", "triton_tem", "nvjet", "splitKreduce",
                   "cutensor", "cufft", "curand")

# The light build (docs/verifier.md, "Cold builds"): a load_inline `.cu`'s umbrella include, which adds torch's C++
# frontend (nn, optim, jit, ...) and pybind11/Python to what load_inline's own `#include <torch/types.h>` prefix gives,
# replaced in place (same line) by that prefix. Tried only for sources that name nothing the umbrella alone declares:
# no pybind11 or Python API, no `torch::` namespace or name of those headers (some, like `torch::cuda`, would
# otherwise resolve silently to ATen's `at::` one), and no preprocessor condition on a macro the candidate does not
# define itself (`__`-reserved ones, the compiler's and CUDA's, excepted): the umbrella's macros could change them.
_UMBRELLA = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]torch/(?:extension|torch|all)\.h[>"][ \t]*(?://.*)?$', re.M)
_UMBRELLA_ONLY = re.compile(r"\b(?:pybind11|py::|PYBIND11_\w*|Py_\w+|PyObject|torch::(?:autograd|cuda|data|enumtype|"
                            r"fft|jit|linalg|mps|nested|nn|optim|python|serialize|sparse|special|xpu|save|load|"
                            r"pickle_save|pickle_load|wrap_pybind_function)\b)")
_CONDITION = re.compile(r"^[ \t]*#[ \t]*(?:if|ifdef|ifndef|elif|elifdef|elifndef)\b(.*)$", re.M)
_DEFINED_HERE = re.compile(r"^[ \t]*#[ \t]*(?:define|undef)[ \t]+(\w+)", re.M)
_SAFE_MACROS = {"defined", "CUDART_VERSION", "CUDA_VERSION"}


# The lightest tier (MUSACODER_LIGHTEST=0 turns it off): a `.cu` that names, under `torch::` and `at::`, only what
# light_headers/torch/types.h declares gets that header in place of torch/types.h (the one its umbrella line and
# load_inline's own first line include), and no other `torch/` header.
LIGHT_HEADERS = Path(__file__).parent / "light_headers"
_LIGHTEST_FLAG = f"-I{LIGHT_HEADERS}"
_TORCH_MANGLED = re.compile(r"_ZN?K?(?:3c10|2at|5torch)")  # a symbol in namespace c10, at or torch


@functools.cache
def _torch_hash_tables() -> tuple:
    """The GNU hash tables of torch's shared libraries (kept open: a lookup reads the file)."""
    from elftools.elf.elffile import ELFFile

    folder = Path(torch.__file__).parent / "lib"
    tables = []
    for lib in sorted(folder.glob("lib*.so")):
        table = ELFFile(open(lib, "rb")).get_section_by_name(".gnu.hash")
        if table is not None:
            tables.append(table)
    return tuple(tables)


def _torch_defines(name: str) -> bool:
    return any((sym := t.get_symbol(name)) is not None and sym["st_shndx"] != "SHN_UNDEF"
               for t in _torch_hash_tables())


_LIGHTEST_NAMES = {"Tensor", "TensorOptions", "ScalarType", "Dtype", "Scalar", "Device", "DeviceType", "IntArrayRef",
                   "MemoryFormat", "Layout", "Half", "BFloat16", "empty", "empty_like", "empty_strided", "zeros",
                   "zeros_like", "ones", "ones_like", "full", "full_like", "dtype", "device", "nullopt", "optional",
                   "cuda"}  # at::cuda: declared by the candidate's own ATen/cuda include, as with the full header
_QUALIFIED = re.compile(r"\b(?:torch|at)\s*::\s*(\w+)")
_OTHER_TORCH_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]torch/(?!(?:extension|torch|all|types)\.h[>"])',
                                  re.M)


def lightest_fits(sources: list[str]) -> bool:
    """Whether the light `.cu` may take light_headers' torch/types.h: every `torch::`/`at::` name it uses is declared
    there (dtype constants `k...` too), and it includes no other torch header (one may expect the full types.h)."""
    text = "\n".join(sources)
    names = set(_QUALIFIED.findall(text))
    return (not _OTHER_TORCH_INCLUDE.search(text)
            and all(n in _LIGHTEST_NAMES or re.fullmatch(r"k[A-Z]\w*", n) for n in names))


def light_cuda_sources(sources: list[str]) -> list[str] | None:
    """`sources` with their umbrella includes made `#include <torch/types.h>`, or None where that is not tried (read
    as raw text, comments and strings included: a name there stops the light build too, never the reverse)."""
    text = "\n".join(sources)
    if not _UMBRELLA.search(text) or _UMBRELLA_ONLY.search(text):
        return None
    own = set(_DEFINED_HERE.findall(text)) | _SAFE_MACROS
    for condition in _CONDITION.findall(text):
        if any(not (w in own or w.startswith("__")) for w in re.findall(r"\b[A-Za-z_]\w*", condition)):
            return None
    return [_UMBRELLA.sub("#include <torch/types.h>", s) for s in sources]


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

    def light_build(self, arguments: dict) -> dict | None:
        sources = arguments.get("cuda_sources")
        light = light_cuda_sources([sources] if isinstance(sources, str) else list(sources or []))
        if light is None:
            return None
        out = {**arguments, "cuda_sources": light}
        if os.environ.get("MUSACODER_LIGHTEST", "1") != "0" and lightest_fits(light):
            # -I: searched before torch's -isystem folders, for the `.cu` only (nvcc's flags)
            out["extra_cuda_cflags"] = [*(arguments.get("extra_cuda_cflags") or []), _LIGHTEST_FLAG]
        return out

    def light_library_problem(self, library: Path, light: dict) -> str | None:
        """A lightest build whose library imports a torch symbol that torch's libraries do not define: a declaration
        of light_headers that differs from torch's own would fail only when the candidate's library is loaded."""
        if _LIGHTEST_FLAG not in (light.get("extra_cuda_cflags") or []):
            return None
        from elftools.elf.elffile import ELFFile

        with open(library, "rb") as f:
            dynsym = ELFFile(f).get_section_by_name(".dynsym")
            wanted = [sym.name for sym in (dynsym.iter_symbols() if dynsym else [])
                      if sym["st_shndx"] == "SHN_UNDEF" and _TORCH_MANGLED.match(sym.name)]
        missing = [name for name in wanted if not _torch_defines(name)]
        return f"imports {len(missing)} torch symbol(s) torch does not define, e.g. {missing[0]}" if missing else None

    def compiler_env(self) -> dict[str, str]:
        """nvcc with its host and device front ends side by side (verifier/nvcc_overlap.py), unless the user chose an
        nvcc of their own (PYTORCH_NVCC, e.g. behind ccache)."""
        from torch.utils.cpp_extension import CUDA_HOME

        if "PYTORCH_NVCC" in os.environ or not CUDA_HOME:
            return {}
        nvcc = os.path.join(CUDA_HOME, "bin", "nvcc")
        return {"PYTORCH_NVCC": shlex.join([sys.executable, "-m", "musacoder.verifier.nvcc_overlap", nvcc])}

    def kernel_profile(self, fn, args, own_kernels: list[str] | None = None) -> dict | None:
        # Kineto through the autograd profiler: torch.profiler.profile's first start asks hasattr(torch, "_inductor"),
        # which imports Inductor and Dynamo (~2-4 s in each fresh subject, the most of a cached verification)
        prof, _ = self.profile_kernels(fn, args, own_kernels,
                                       torch.autograd.profiler.profile(use_kineto=True, use_device="cuda"),
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
